"""s3:// against a real S3-compatible server (issue 20): s3rver (from the
npm registry, pinned by .ci/install-deps, run with node) on a free port of
127.0.0.1, behind tests/support/sigv4_proxy.py, which computes every
request's Signature V4 again with the known secret and answers 403 on a
mismatch (s3rver itself does not check V4 signatures). burnstore reaches it
through AWS_ENDPOINT_URL (path style), signing with libcurl's SigV4 from the
AWS_* variables. Checked: every tensor of a SafeTensors, a sharded index
(shards as keys beside it), a GGUF and a Burnpack read over s3:// equals a
local mount's, every request signed right; the CLI verbs; keys asked as
written (a doubled slash, '%', '+', UTF-8), a '.' or '..' segment refused
with nothing sent (issue 31); a wrong secret,
an unknown key and a missing key fail in one line naming the s3:// URL and
never the secret or the session token; the mount table and ps show the
s3:// URL only. Both servers are stopped in teardown, also on failure."""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
from bsmount import BIN, Mount, check, daemon_pid, run, run_tests  # noqa: E402
from sigv4_proxy import SigV4Proxy, sign  # noqa: E402
from test_remote import (BPK, NGINX, ST, Env, Nginx, run_bytes, start_server, stop_server,  # noqa: E402
                         same_as_local)

S3RVER = os.environ.get("BS_S3RVER", "/opt/burnstore-test-npm/node_modules/.bin/s3rver")
KEY_ID = SECRET = "S3RVER"  # s3rver's one account
REGION = "eu-west-3"
BUCKET = "models"
SESSION = "FwoGZXIvYXdzEJr-session-token-xyz"


class S3:
    """s3rver on a free port, the verifying proxy in front of it."""

    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "s3rver")
        os.makedirs(self.dir, exist_ok=True)
        self.port = None  # chosen when it starts
        self.proc = self.proxy = None

    def __enter__(self):
        def start(ports):
            return subprocess.Popen(
                [S3RVER, "-d", self.dir, "-a", "127.0.0.1", "-p", str(ports[0]), "--silent",
                 "--configure-bucket", BUCKET], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.proc, (self.port,) = start_server(start, 1, "s3rver")
        self.proxy = SigV4Proxy(self.port, KEY_ID, SECRET, REGION).__enter__()
        return self

    def endpoint(self):
        return "http://127.0.0.1:%d" % self.proxy.port

    def put(self, src, key):
        """Upload src as BUCKET/key, signed (through the proxy, which checks it)."""
        data = open(src, "rb").read()
        url = "%s/%s/%s" % (self.endpoint(), BUCKET, key)
        h = sign("PUT", url, KEY_ID, SECRET, REGION, payload_hash=hashlib.sha256(data).hexdigest())
        req = urllib.request.Request(url, data=data, method="PUT", headers=h)
        with urllib.request.urlopen(req, timeout=30) as r:
            check(r.status == 200, "upload %s: %d" % (key, r.status))

    def __exit__(self, *exc):
        if self.proxy:
            self.proxy.__exit__()
        stop_server(self.proc)
        return False


def aws_env(s3, **kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION=REGION,
               AWS_SESSION_TOKEN=SESSION, AWS_ENDPOINT_URL=s3.endpoint())
    env.update(kw)
    return env


def formats(tmp, s3):
    gguf = os.path.join(tmp, "model.gguf")
    r = run([BIN, "convert", "-q", ST, gguf])
    check(r.returncode == 0, "convert to GGUF: %s" % r.stderr)
    shard_dir = os.path.join(tmp, "sharded")
    os.makedirs(shard_dir)
    idx = os.path.join(shard_dir, "model.safetensors.index.json")
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=8KB", ST, idx])
    check(r.returncode == 0 and len(os.listdir(shard_dir)) >= 3, "shards: %s" % r.stderr)
    for f in os.listdir(shard_dir):
        s3.put(os.path.join(shard_dir, f), "llm/sharded/" + f)
    for local in (ST, gguf, BPK):
        s3.put(local, "llm/" + os.path.basename(local))
    before = s3.proxy.passed
    with Env(aws_env(s3)):
        for local in (ST, gguf, BPK):
            name = os.path.basename(local)
            same_as_local(tmp, "s3://%s/llm/%s" % (BUCKET, name), local, "s3-" + name)
        same_as_local(tmp, "s3://%s/llm/sharded/model.safetensors.index.json" % BUCKET, idx,
                      "s3-sharded")
    check(s3.proxy.passed - before >= 8, "the reads went through the verifying proxy (%d)"
          % (s3.proxy.passed - before))
    check(not s3.proxy.denied, "every request was signed right: %s" % s3.proxy.denied[:3])


def cli_verbs(tmp, s3):
    s3.put(ST, "cli/" + os.path.basename(ST))
    url = "s3://%s/cli/%s" % (BUCKET, os.path.basename(ST))
    env = aws_env(s3)
    for verb in (["ls"], ["info"], ["cat", "conv1.weight"], ["ls", "--json"]):
        a = run_bytes([BIN] + verb[:1] + [ST] + verb[1:])
        b = run_bytes([BIN] + verb[:1] + [url] + verb[1:], env=env)
        check(a.returncode == 0 and b.returncode == 0, "%s on s3://: %s" % (verb, b.stderr))
        check(a.stdout == b.stdout.replace(url.encode(), ST.encode()),
              "%s on s3:// prints what it prints locally" % verb)
    r = run([BIN, "diff", ST, url], env=env)
    check(r.returncode == 0, "diff of a file and its s3:// copy: same: %s" % r.stderr)
    out = os.path.join(tmp, "from-s3.safetensors")
    r = run([BIN, "convert", "-q", url, out], env=env)
    check(r.returncode == 0 and run([BIN, "diff", ST, out]).returncode == 0,
          "convert s3:// -> local: the same tensors: %s" % r.stderr)
    check(not s3.proxy.denied, "every request was signed right: %s" % s3.proxy.denied[:3])


def one_line(r, url, what, secret=None):
    lines = r.stderr.strip().splitlines()
    check(r.returncode != 0 and len(lines) == 1 and url in r.stderr,
          "%s: one line naming %s: %r" % (what, url, r.stderr))
    for s in (secret, SESSION, "amazonaws", "127.0.0.1"):
        if s:
            check(s not in r.stderr, "%s: %r is not in the error" % (what, s))


def refusals(tmp, s3):
    s3.put(ST, "auth/m.safetensors")
    url = "s3://%s/auth/m.safetensors" % BUCKET
    n = len(s3.proxy.denied)
    r = run([BIN, "ls", url], env=aws_env(s3, AWS_SECRET_ACCESS_KEY="wr0ngS3cret"))
    one_line(r, url, "a wrong secret", "wr0ngS3cret")
    check("403" in r.stderr and "AWS_SECRET_ACCESS_KEY" in r.stderr,
          "a wrong secret: 403 and what to check: %r" % r.stderr)
    check(s3.proxy.denied[n:] and all(d == "SignatureDoesNotMatch" for d in s3.proxy.denied[n:]),
          "the proxy refused the signature: %s" % s3.proxy.denied[n:])
    r = run([BIN, "ls", url], env=aws_env(s3, AWS_REGION="us-west-2"))
    one_line(r, url, "another region")
    r = run([BIN, "ls", url], env=aws_env(s3, AWS_ACCESS_KEY_ID="AKIAUNKNOWN"))
    one_line(r, url, "an unknown key id")
    missing = "s3://%s/auth/missing.safetensors" % BUCKET
    r = run([BIN, "ls", missing], env=aws_env(s3))
    one_line(r, missing, "a missing key")
    check("404" in r.stderr, "a missing key: 404: %r" % r.stderr)
    r = run([BIN, "ls", "s3://%s" % BUCKET], env=aws_env(s3))
    check(r.returncode != 0 and "s3://BUCKET/KEY" in r.stderr
          and len(r.stderr.strip().splitlines()) == 1, "no key: one line: %r" % r.stderr)
    # the mount: s3:// in the mount table and argv, no secret or token anywhere
    mnt = os.path.join(tmp, "mnt-s3")
    with Env(aws_env(s3)):
        with Mount(url, mnt) as m:
            pid = daemon_pid(m)
            cmdline = open("/proc/%d/cmdline" % pid, "rb").read() if pid else b""
            check(pid and url.encode() in cmdline and SESSION.encode() not in cmdline,
                  "the daemon's argv: %r" % cmdline)
            mounts = open("/proc/self/mounts").read()
            check(url in mounts and SESSION not in mounts, "the mount table shows the s3:// URL")
            for n in os.listxattr(m):
                v = os.getxattr(m, n)
                check(SESSION.encode() not in v and b"127.0.0.1" not in v,
                      "xattr %s holds no credential nor endpoint" % n)
            check(open(os.path.join(m, "conv1", "weight"), "rb").read()
                  == run_bytes([BIN, "cat", ST, "conv1.weight"]).stdout, "a tensor read")


def keys_as_written(tmp, s3):
    """Issue 31: an S3 key is asked as written, encoded once as SigV4's
    canonical URI has it (a doubled slash, '%', '+', a space, UTF-8, '...'),
    every request signed right; a '.' or '..' segment (also %2E) is refused
    in one line with nothing sent (libcurl removed them:
    s3://models/odd/../other/m was asked, signed, as /models/other/m)."""
    keys = ["odd/100%/x+y z/\u00e9/.../m.safetensors", "odd/a%2Fb/m+.safetensors"]
    for k in keys:
        s3.put(ST, urllib.parse.quote(k))
    s3.put(ST, "other/m.safetensors")
    env = aws_env(s3)
    want_ls = run([BIN, "ls", ST]).stdout
    want = run_bytes([BIN, "cat", ST, "conv1.weight"]).stdout
    # s3rver cannot hold a key with a doubled slash (its upload answers 404),
    # AWS can: the request reached the proxy as written, signed right
    double = "/%s/odd/a//b/m.safetensors" % BUCKET
    r = run([BIN, "ls", "s3:/" + double], env=env)
    check(r.returncode == 1 and "404" in r.stderr and double in s3.proxy.paths,
          "a//b asked as written, signed right: %r %r" % (r.stderr, s3.proxy.paths[-2:]))
    for k in keys:
        url = "s3://%s/%s" % (BUCKET, k)
        r = run([BIN, "ls", url], env=env)
        check(r.returncode == 0 and r.stdout.replace(url, ST) == want_ls,
              "key %r read as written: %d %r" % (k, r.returncode, r.stderr))
        b = run_bytes([BIN, "cat", url, "conv1.weight"], env=env)
        check(b.returncode == 0 and b.stdout == want, "key %r: a tensor's bytes" % k)
    check(not s3.proxy.denied, "every request was signed right: %s" % s3.proxy.denied[:3])
    sent = s3.proxy.passed + len(s3.proxy.denied)
    for url in ("s3://%s/odd/../other/m.safetensors" % BUCKET,
                "s3://%s/odd/a/%%2E%%2E/../../other/m.safetensors" % BUCKET,
                "s3://%s/./other/m.safetensors" % BUCKET,
                "s3://%s/../other-bucket/m.safetensors" % BUCKET):
        r = run([BIN, "ls", url], env=env)
        one_line(r, url, "a dot segment")
        check("'..' segment" in r.stderr, "%s: the dot segment is named: %r" % (url, r.stderr))
    check(s3.proxy.passed + len(s3.proxy.denied) == sent, "nothing was sent for them (%d)"
          % (s3.proxy.passed + len(s3.proxy.denied) - sent))


def session_token_redirect(tmp):
    """An endpoint that redirects to another host (here localhost for
    127.0.0.1, the same nginx, which logs the headers it gets): libcurl drops
    the signature there but would send every other header it was given, the
    session token too. Refused in one line instead, the token sent nowhere
    but to the endpoint."""
    d = os.path.join(tmp, "redirect")
    os.makedirs(d)
    ng = Nginx(d)
    log = os.path.join(d, "headers.log")
    ng.extra = {
        "http": "log_format hdrs '$host $request_uri [$http_x_amz_security_token]';",
        "server": "location /%s/ { access_log %s hdrs; "
                  "return 307 http://localhost:$server_port/plain$request_uri; }\n"
                  "    location /plain/ { access_log %s hdrs; alias %s/; }"
                  % (BUCKET, log, log, ng.root)}
    if not check(os.path.exists(NGINX), "nginx at %s" % NGINX):
        return
    with ng:
        os.makedirs(os.path.join(ng.root, BUCKET))
        shutil.copy(ST, os.path.join(ng.root, BUCKET, "m.safetensors"))
        url = "s3://%s/m.safetensors" % BUCKET
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION=REGION,
                   AWS_SESSION_TOKEN=SESSION, AWS_ENDPOINT_URL="http://127.0.0.1:%d" % ng.port)
        r = run([BIN, "ls", url], env=env)
        one_line(r, url, "a redirect with a session token")
        check("redirect" in r.stderr, "the redirect is named: %r" % r.stderr)
        deadline = time.time() + 10  # (nginx writes its log line after the answer)
        while not (os.path.exists(log) and open(log).read()) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        lines = open(log).read().splitlines() if os.path.exists(log) else []
        check(lines and lines[0].startswith("127.0.0.1 ") and SESSION in lines[0],
              "the endpoint got the token: %r" % lines)
        check(not any(SESSION in l for l in lines if not l.startswith("127.0.0.1 ")),
              "no other host got the session token: %r" % lines)


def main():
    if not os.path.exists(S3RVER):
        print("FAIL: no s3rver at %s (bash .ci/install-deps installs it)" % S3RVER)
        sys.exit(1)

    def with_s3(t):
        def go(tmp):
            with S3(tmp) as s3:
                t(tmp, s3)
        go.__name__ = t.__name__
        return go

    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("deadline")))
    signal.alarm(600)
    run_tests("test_remote_s3", [with_s3(t) for t in (formats, cli_verbs, refusals, keys_as_written)]
              + [session_token_redirect], "remote-s3")


if __name__ == "__main__":
    main()
