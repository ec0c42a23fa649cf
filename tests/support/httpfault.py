"""Real HTTP servers for the remote tests and the benchmark, and a
fault-injecting proxy to put in front of them (stdlib only).

Nginx(tmp): Debian's nginx-light on a free port of 127.0.0.1, serving a
directory, every request in an access log as "$request $status
$body_bytes_sent" (requests() reads it back). Started and stopped by the
caller (a context manager); the port is free, the files are in tmp.
Nginx(tmp, tls=True) serves HTTPS instead, with a certificate for
127.0.0.1 and localhost signed by a CA made for it with openssl (its
`ca` file, which CURL_CA_BUNDLE points burnstore at); `log_format
authlog` ($scheme, whether TLS carried it, the Authorization header, the
request, the status) is defined for an `extra` access_log.

FaultProxy(port): a threaded HTTP/1.1 proxy on a free port of 127.0.0.1 to
127.0.0.1:port. Every request is forwarded on the client's own upstream
connection (keep-alive both ways), after `latency` seconds (one round trip
added a request); `rate` (bytes a second, 0: none) caps what each
connection relays, as object stores cap a connection. Faults are armed by setting `fault` (and `every`): the
n-th request after arming with n % every == 0 gets it, and only GETs that
carry a Range (not the opening bytes=0-... ones while `skip_open`):
  "drop"     half the body, then the connection closed
  "short"    the headers (Content-Length promised), fewer bytes, closed
  "500", "503"  that status, a small body
  "429"      429 with Retry-After: 1
  "full200"  the Range header removed: 200 with the whole body
  "stall"    the headers and half the body, then silence (the connection
             kept open) until the proxy closes
`min_len`: only ranges of at least that many bytes get the fault (0: any);
`min_start`: only ranges that start at or past that offset (0: any).
`faults` counts the faults given; `max_inflight` the most requests under
way at once (from the request's head to its answer's end). Stopped by
close() (a context manager).

Hostile(answer): a server of our own whose every answer is whatever the
test's function says (lies in Content-Range, validators that come and go,
objects swapped mid-read, endless bodies, stalls); range_answer() builds
the answer of an honest (or a lying) range server for it.
"""
import os
import shutil
import socket
import struct
import subprocess
import threading
import time

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listens(pid, ports):
    """Whether process pid itself holds a listening socket on each of ports."""
    want = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            port = int(f[1].rsplit(":", 1)[1], 16)
            if f[3] == "0A" and port in ports:  # 0A: LISTEN
                want[f[9]] = port
    held = set()
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in want:
            held.add(want[link[8:-1]])
    return held == set(ports)


def start_server(start, nports, what, timeout=30, tries=5):
    """Start a server on nports free ports of 127.0.0.1: start(ports) writes
    its configuration and returns its Popen (stderr piped). It is ready when
    that process itself listens on every port: a port chosen free can be
    taken by another program before the server binds it, and a connection
    would then reach that program (another test's server answering 404).
    A server that fails to bind is started again on other ports.
    Returns (proc, ports)."""
    err = ""
    for _ in range(tries):
        ports = [free_port() for _ in range(nports)]
        if len(set(ports)) < nports:
            continue
        proc = start(ports)
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None:
            if _listens(proc.pid, ports):
                return proc, ports
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if "in use" not in err and "EADDRINUSE" not in err:
            break
    raise RuntimeError("%s did not listen on 127.0.0.1 within %d s: %s" % (what, timeout, err[-500:]))


def stop_server(proc):
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class Nginx:
    """nginx on 127.0.0.1:PORT serving ROOT (ranges, ETags, If-Match)."""

    def __init__(self, tmp, extra="", tls=False):
        self.dir = os.path.join(tmp, "nginx-%d" % free_port())
        self.root = os.path.join(self.dir, "www")
        self.log = os.path.join(self.dir, "access.log")
        os.makedirs(os.path.join(self.dir, "tmp"), exist_ok=True)
        os.makedirs(self.root, exist_ok=True)
        self.port = None  # chosen when it starts
        self.extra = extra
        self.tls = tls
        self.ca = os.path.join(self.dir, "ca.pem")
        self.proc = None

    def _certs(self):
        """A CA, and a certificate for 127.0.0.1 and localhost it signs."""
        d = self.dir
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        with open(os.path.join(d, "san.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for cmd in (["req", "-x509"] + ec + ["-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                                             "-subj", "/CN=burnstore test CA"],
                    ["req"] + ec + ["-keyout", "srv.key", "-out", "srv.csr", "-subj",
                                    "/CN=127.0.0.1"],
                    ["x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                     "-CAcreateserial", "-out", "srv.pem", "-days", "2", "-extfile", "san.ext"]):
            subprocess.run(["openssl"] + cmd, cwd=d, check=True, capture_output=True, timeout=60)

    def __enter__(self):
        d = self.dir
        if self.tls:
            self._certs()
        conf = os.path.join(d, "nginx.conf")

        def start(ports):
            listen = "127.0.0.1:%d" % ports[0]
            if self.tls:
                listen += " ssl;\n    ssl_certificate %s/srv.pem;\n    ssl_certificate_key %s/srv.key" % (d, d)
            with open(conf, "w") as f:
                f.write("""daemon off;
master_process off;
worker_processes 1;
pid %(d)s/nginx.pid;
error_log %(d)s/error.log;
events { worker_connections 256; }
http {
  log_format counted '$request $http_range $status $body_bytes_sent';
  log_format authlog '$scheme tls=$https auth="$http_authorization" $request $status';
  access_log %(log)s counted;
  sendfile on;
  keepalive_requests 100000;
  client_body_temp_path %(d)s/tmp; proxy_temp_path %(d)s/tmp; fastcgi_temp_path %(d)s/tmp;
  uwsgi_temp_path %(d)s/tmp; scgi_temp_path %(d)s/tmp;
  server {
    listen %(listen)s;
    root %(root)s;
    %(extra)s
  }
}
""" % {"d": d, "listen": listen, "root": self.root, "log": self.log, "extra": self.extra})
            return subprocess.Popen([NGINX, "-c", conf, "-p", d], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE)
        self.proc, (self.port,) = start_server(start, 1, "nginx")
        return self

    def url(self, name, port=None):
        return "%s://127.0.0.1:%d/%s" % ("https" if self.tls else "http", port or self.port, name)

    def path(self, name):
        return os.path.join(self.root, name)

    def requests(self):
        """The access log: [(request line, status, body bytes)], and empties it."""
        out = []
        # nginx writes each line as the request ends (no buffer is configured)
        with open(self.log, "r+") as f:
            for line in f:
                p = line.rsplit(" ", 2)
                if len(p) == 3:
                    out.append((p[0], int(p[1]), int(p[2])))
            f.truncate(0)
        return out

    def close(self):
        stop_server(self.proc)

    def __exit__(self, *exc):
        self.close()
        return False


def _read_head(sock, buf):
    """Read up to the end of an HTTP head: (head bytes, rest) or (None, b"")."""
    while b"\r\n\r\n" not in buf:
        d = sock.recv(65536)
        if not d:
            return None, b""
        buf += d
    i = buf.index(b"\r\n\r\n") + 4
    return buf[:i], buf[i:]


def _headers(head):
    lines = head.decode("latin-1").split("\r\n")
    hs = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            hs[k.strip().lower()] = v.strip()
    return lines[0], hs


class _Server:
    """A listening socket on a free port of 127.0.0.1 and a thread that
    accepts, each connection served by self._serve(c) on a thread of its
    own; close() (a context manager) ends the accept, shuts every
    connection down and sets `stop` (which ends the stalls)."""

    def __init__(self, backlog):
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.closing = False
        self.conns = []
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(backlog)
        self.port = self.ls.getsockname()[1]
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.closing:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def url(self, name):
        return "http://127.0.0.1:%d/%s" % (self.port, name)

    def close(self):
        self.closing = True
        self.stop.set()
        try:
            self.ls.shutdown(socket.SHUT_RDWR)  # (wakes the accept; close alone does not)
        except OSError:
            pass
        self.ls.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self.thread.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class FaultProxy(_Server):
    def __init__(self, port, latency=0.0, rate=0):
        self.up = port
        self.latency = latency
        self.rate = rate
        self.fault = None
        self.every = 1
        self.etags = None  # (first, later): set_etags
        self.skip_open = True
        self.min_len = 0
        self.min_start = 0
        self.faults = 0
        self.count = 0
        self.inflight = self.max_inflight = 0
        _Server.__init__(self, 64)

    def arm(self, fault, every=1, min_len=0, min_start=0):
        with self.lock:
            self.fault, self.every, self.count, self.min_len = fault, every, 0, min_len
            self.min_start = min_start

    def set_etags(self, first, later):
        """Answer the opening request (Range: bytes=0-...) with ETag `first`
        and every later one with `later` (bytes, as sent: a hostile server's
        control characters too), dropping the client's If-Match and
        If-Unmodified-Since: a server that changed the object and ignores
        the conditions."""
        with self.lock:
            self.etags = (first, later)

    def _pick(self, line, hs):
        """The fault for this request, or None."""
        with self.lock:
            if not self.fault:
                return None
            rng = hs.get("range", "")
            if not line.startswith("GET ") or not rng:
                return None
            if self.skip_open and rng.startswith("bytes=0-"):
                return None
            if self.min_len or self.min_start:
                try:
                    a, b = rng.split("=", 1)[1].split("-")
                    if int(b) - int(a) + 1 < self.min_len or int(a) < self.min_start:
                        return None
                except ValueError:
                    return None
            self.count += 1
            if self.count % self.every:
                return None
            self.faults += 1
            return self.fault

    def _serve(self, c):
        u = [None]  # the upstream connection, kept across requests
        buf = b""
        try:
            while not self.closing:
                head, buf = _read_head(c, buf)
                if head is None:
                    return
                line, hs = _headers(head)
                with self.lock:
                    self.inflight += 1
                    self.max_inflight = max(self.max_inflight, self.inflight)
                try:
                    keep = self._one(c, head, line, hs, u)
                finally:
                    with self.lock:
                        self.inflight -= 1
                if not keep:
                    return
        except OSError:
            return
        finally:
            for s in (c, u[0]):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass

    def _one(self, c, head, line, hs, u):
        """Answer one request (u[0]: the upstream connection, made when
        needed); whether the client's connection stays open."""
        if self.latency:
            time.sleep(self.latency)
        fault = self._pick(line, hs)
        if fault in ("500", "503", "429"):
            body = b"fault\n"
            extra = "Retry-After: 1\r\n" if fault == "429" else ""
            c.sendall(("HTTP/1.1 %s Fault\r\nContent-Length: %d\r\n%s\r\n"
                       % (fault, len(body), extra)).encode() + body)
            return True
        if fault == "full200":
            head = b"\r\n".join(x for x in head.split(b"\r\n")
                                if not x.lower().startswith(b"range:"))
        etags = self.etags
        if etags:
            head = b"\r\n".join(x for x in head.split(b"\r\n") if not x.lower().startswith(
                (b"if-match:", b"if-unmodified-since:")))
        if u[0] is None:
            u[0] = socket.create_connection(("127.0.0.1", self.up))
            u[0].setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        u[0].sendall(head)
        rhead, rest = _read_head(u[0], b"")
        if rhead is None:
            return False
        if etags:
            tag = etags[0] if hs.get("range", "").startswith("bytes=0-") else etags[1]
            rhead = b"\r\n".join(b"ETag: " + tag if x.lower().startswith(b"etag:") else x
                                   for x in rhead.split(b"\r\n"))
        _, rhs = _headers(rhead)
        n = int(rhs.get("content-length", "0"))
        c.sendall(rhead)
        if fault == "stall":
            self._relay(u[0], c, rest, n // 2)
            self.stop.wait(3600)
            return False
        if fault in ("drop", "short"):
            # part of the body (drop: half; short: all but 1000 bytes)
            part = n // 2 if fault == "drop" else max(0, n - 1000)
            self._relay(u[0], c, rest, part)
            return False  # the connection closes: fewer bytes than promised
        self._relay(u[0], c, rest, n, self.rate)
        return True

    @staticmethod
    def _relay(u, c, rest, n, rate=0):
        """n bytes of body from u (rest already read) to c: spliced through
        a pipe in the kernel (no copy into Python, and the GIL released),
        so that the proxy's own CPU stays small next to what it measures:
        a relay in Python took about a core at 1 GB/s, shared by every
        connection, on the same cores as the client under test. With a
        rate, at most that many bytes a second (64 KiB at a time, then a
        sleep to keep to it)."""
        first = rest[:n]
        c.sendall(first)
        left = n - len(first)
        sent, t0 = len(first), time.monotonic()
        pr, pw = os.pipe()
        try:
            while left > 0:
                k = os.splice(u.fileno(), pw, min(left, 1 << 16))
                if not k:
                    raise OSError("upstream closed")
                left -= k
                sent += k
                while k:
                    k -= os.splice(pr, c.fileno(), k)
                if rate:
                    ahead = sent / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
        finally:
            os.close(pr)
            os.close(pw)


class Raw:
    """An answer sent exactly as given (its status line, headers and body
    bytes, in `parts` sent one after another, `pause` seconds between
    them), then `end`: "keep" (the connection serves the next request),
    "close", "reset" (an RST: SO_LINGER 0) or "stall" (silence until the
    server closes). For what range_answer cannot say: duplicated headers,
    blanks, bare LF, a header a byte at a time, an answer cut anywhere."""

    def __init__(self, *parts, end="keep", pause=0.0):
        self.parts = [p.encode("latin-1") if isinstance(p, str) else p for p in parts]
        self.end = end
        self.pause = pause

    def send(self, c, stop):
        """Sent on c; whether the connection goes on."""
        for i, p in enumerate(self.parts):
            if i and self.pause and stop.wait(self.pause):
                return False
            c.sendall(p)
        if self.end == "stall":
            stop.wait(3600)
        elif self.end == "reset":
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return self.end == "keep"


class Stall:
    """An answer's body that sends `first` bytes, then nothing (the
    connection kept open) until the server closes."""

    def __init__(self, first=b""):
        self.first = first


def range_answer(data, hs, total=None, etag=None, lastmod=None, extra=()):
    """The answer of a server that serves ranges of `data`: 206 with
    Content-Range "bytes A-B/TOTAL" (TOTAL: len(data), or the lie given),
    416 past the end, 200 without a Range; ETag and Last-Modified when given.
    Returns (status, [(name, value)], body)."""
    n = len(data) if total is None else total
    h = list(extra)
    if etag is not None:
        h.append(("ETag", etag))
    if lastmod is not None:
        h.append(("Last-Modified", lastmod))
    rng = hs.get("range", "")
    if not rng.startswith("bytes="):
        return 200, h, data
    a, b = rng[6:].split("-", 1)
    a = int(a)
    b = int(b) if b else n - 1
    if a >= n:
        return 416, h + [("Content-Range", "bytes */%d" % n)], b""
    b = min(b, n - 1)
    body = data[a:b + 1] if a < len(data) else b""
    # (a lying total: bytes past the data are zeros, as many as asked)
    body += b"\0" * (b + 1 - a - len(body))
    return 206, h + [("Content-Range", "bytes %d-%d/%d" % (a, b, n))], body


class Hostile(_Server):
    """An HTTP/1.1 server on a free port of 127.0.0.1 whose every answer
    is what `answer(method, path, headers, n)` returns (n: the request's
    number, from 1; headers: lower-case names): (status, [(name, value)],
    body), body being bytes, an iterable of byte chunks (an endless body:
    sent until the client hangs up or the server closes) or a Stall.
    Keep-alive; a thread a connection; `requests` records (method, path,
    headers) of each; `sent` counts body bytes. Stopped by close() (a
    context manager), which also ends the stalls."""

    def __init__(self, answer):
        self.answer = answer
        self.requests = []
        self.sent = 0
        _Server.__init__(self, 256)

    def _serve(self, c):
        buf = b""
        try:
            while not self.stop.is_set():
                head, buf = _read_head(c, buf)
                if head is None:
                    return
                line, hs = _headers(head)
                method, path = (line.split(" ") + ["", ""])[:2]
                with self.lock:
                    self.requests.append((method, path, hs))
                    n = len(self.requests)
                status, h, body = self.answer(method, path, hs, n)
                if isinstance(body, Raw):
                    if not body.send(c, self.stop):
                        return
                    continue
                out = "HTTP/1.1 %d X\r\n" % status
                endless = not isinstance(body, (bytes, Stall))
                for k, v in h:
                    out += "%s: %s\r\n" % (k, v)
                if isinstance(body, bytes):
                    out += "Content-Length: %d\r\n" % len(body)
                elif isinstance(body, Stall):
                    out += "Content-Length: %d\r\n" % (len(body.first) + 1000)
                else:
                    out += "Transfer-Encoding: chunked\r\n"
                c.sendall(out.encode("latin-1") + b"\r\n")
                if isinstance(body, Stall):
                    c.sendall(body.first)
                    self.stop.wait(3600)
                    return
                if not endless:
                    if method != "HEAD":
                        c.sendall(body)
                        with self.lock:
                            self.sent += len(body)
                    continue
                for chunk in body:
                    if self.stop.is_set():
                        return
                    c.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                    with self.lock:
                        self.sent += len(chunk)
                c.sendall(b"0\r\n\r\n")
        except OSError:
            return
        finally:
            try:
                c.close()
            except OSError:
                pass
