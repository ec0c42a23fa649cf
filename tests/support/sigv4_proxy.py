"""An AWS Signature Version 4 verifying proxy for the tests (stdlib only).

s3rver (the S3-compatible server the tests run) checks the access key id of
a V4 request but not its signature (its source: "Signature version 4
calculation is unimplemented"). This proxy sits between burnstore and it:
every request's signature is computed again here with the known secret, as
S3 does (the canonical URI is the path as sent, encoded once; the payload
hash is the x-amz-content-sha256 header), and a mismatch, a missing or
malformed Authorization, an unknown key, a scope of another region or
service, or a clock skew over 15 minutes answers 403 with S3's error XML.
A request that passes goes on to the server unchanged. `signature()` is
checked against AWS's published test vectors (support/test_sigv4.py);
`sign()` signs the tests' own uploads."""
import datetime
import hashlib
import hmac
import http.client
import http.server
import re
import sys
import threading
import urllib.parse

ALGO = "AWS4-HMAC-SHA256"
UNRESERVED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
AUTH_RE = re.compile(r"^AWS4-HMAC-SHA256 Credential=([^/,\s]+)/(\d{8})/([^/,\s]+)/([^/,\s]+)/"
                     r"aws4_request,\s*SignedHeaders=([a-z0-9;\-]+),\s*Signature=([0-9a-f]{64})$")
HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
       "upgrade"}


def _hmac(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def canonical_query(query):
    """AWS's canonical query string: each name and value decoded, encoded
    again (unreserved kept, %XX upper case), sorted by name then value."""
    if not query:
        return ""
    pairs = []
    for part in query.split("&"):
        k, _, v = part.partition("=")
        pairs.append((urllib.parse.quote(urllib.parse.unquote(k), safe=UNRESERVED),
                      urllib.parse.quote(urllib.parse.unquote(v), safe=UNRESERVED)))
    return "&".join("%s=%s" % kv for kv in sorted(pairs))


def canonical_request(method, path, query, headers, signed, payload_hash):
    """headers: [(name, value)] as received (any case, repeats kept)."""
    values = {}
    for k, v in headers:
        values.setdefault(k.lower(), []).append(" ".join(v.strip().split()))
    lines = ["%s:%s" % (h, ",".join(values.get(h, []))) for h in signed]
    return "\n".join([method, path, canonical_query(query)] + lines +
                     ["", ";".join(signed), payload_hash])


def signature(secret, amz_date, region, service, creq):
    """The hex signature of a canonical request."""
    scope = "%s/%s/%s/aws4_request" % (amz_date[:8], region, service)
    sts = "\n".join([ALGO, amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(("AWS4" + secret).encode(), amz_date[:8]), region), service),
                "aws4_request")
    return hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()


def sign(method, url, key_id, secret, region, headers=None, service="s3",
         payload_hash="UNSIGNED-PAYLOAD", now=None):
    """The headers that sign a request (Authorization, X-Amz-Date,
    x-amz-content-sha256 and the given ones)."""
    u = urllib.parse.urlsplit(url)
    amz_date = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    h = dict(headers or {})
    h["Host"] = u.netloc
    h["X-Amz-Date"] = amz_date
    if service == "s3":
        h["x-amz-content-sha256"] = payload_hash
    signed = sorted(k.lower() for k in h)
    creq = canonical_request(method, u.path or "/", u.query, list(h.items()), signed,
                             payload_hash)
    sig = signature(secret, amz_date, region, service, creq)
    h["Authorization"] = "%s Credential=%s/%s/%s/%s/aws4_request, SignedHeaders=%s, Signature=%s" % (
        ALGO, key_id, amz_date[:8], region, service, ";".join(signed), sig)
    return h


def verify(method, target, headers, key_id, secret, region, now=None):
    """None when the request's V4 signature is right, else why not."""
    auth = [v for k, v in headers if k.lower() == "authorization"]
    if len(auth) != 1:
        return "no Authorization header"
    m = AUTH_RE.match(auth[0].strip())
    if not m:
        return "a malformed Authorization header"
    kid, day, reg, service, signed, sig = m.groups()
    if kid != key_id:
        return "an unknown access key id"
    if reg != region or service != "s3":
        return "a scope of another region or service (%s/%s)" % (reg, service)
    signed = signed.split(";")
    if signed != sorted(signed) or "host" not in signed or "x-amz-date" not in signed:
        return "SignedHeaders unsorted or without host and x-amz-date"
    get = {k.lower(): v for k, v in headers}
    amz_date = get.get("x-amz-date", "")
    try:
        t = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(
            tzinfo=datetime.timezone.utc)
    except ValueError:
        return "no or a malformed X-Amz-Date"
    if amz_date[:8] != day:
        return "the scope's date is not X-Amz-Date's"
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if abs((now - t).total_seconds()) > 900:
        return "X-Amz-Date is more than 15 minutes off"
    payload = get.get("x-amz-content-sha256")
    if not payload or "x-amz-content-sha256" not in signed:
        return "x-amz-content-sha256 missing or not signed"
    for h in get:
        if h.startswith("x-amz-") and h not in signed:
            return "%s is not signed" % h
    path, _, query = target.partition("?")
    creq = canonical_request(method, path, query, headers, signed, payload)
    want = signature(secret, amz_date, region, "s3", creq)
    if not hmac.compare_digest(want, sig):
        return "SignatureDoesNotMatch"
    return None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _deny(self, why):
        p = self.server.proxy
        with p.lock:
            p.denied.append(why)
        body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code>"
                "<Message>%s</Message></Error>" % (
                    "SignatureDoesNotMatch" if why == "SignatureDoesNotMatch" else "AccessDenied",
                    why)).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _any(self):
        p = self.server.proxy
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        headers = list(self.headers.items())
        why = verify(self.command, self.path, headers, p.key_id, p.secret, p.region)
        with p.lock:
            p.requests += 1
        if why:
            return self._deny(why)
        with p.lock:
            p.passed += 1
            p.paths.append(self.path)
        up = http.client.HTTPConnection("127.0.0.1", p.upstream, timeout=60)
        try:
            up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in headers:
                if k.lower() not in HOP:
                    up.putheader(k, v)
            up.endheaders(body or None)
            r = up.getresponse()
            data = r.read()
            self.send_response(r.status)
            for k, v in r.getheaders():
                if k.lower() not in HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            up.close()

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _any


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # (a client gone: no noise)
            super().handle_error(request, client_address)


class SigV4Proxy:
    """A verifying proxy on a free port of 127.0.0.1 in front of
    127.0.0.1:upstream; a context manager (the server thread stops on exit).
    requests / passed / denied (the reasons) count what it saw; paths lists
    the request targets that passed."""

    def __init__(self, upstream, key_id, secret, region):
        self.upstream, self.key_id, self.secret, self.region = upstream, key_id, secret, region
        self.lock = threading.Lock()
        self.requests, self.passed, self.denied = 0, 0, []
        self.paths = []  # (the target of each request that passed, as sent)
        self.srv = _Server(("127.0.0.1", 0), _Handler)
        self.srv.proxy = self
        self.port = self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.srv.shutdown()
        self.srv.server_close()
        self.thread.join(timeout=10)
        return False
