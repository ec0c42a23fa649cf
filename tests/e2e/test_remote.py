"""Remote checkpoints over HTTP (issue 20): a real nginx (Debian's
nginx-light) started here on a free port of 127.0.0.1 with a config written
into the test's temp dir, serving a fixture of each format; every tensor
read through a mount of its URL equals the same tensor read through a local
mount; the CLI verbs on URLs; -o rw of a URL refused; a 302 redirect followed; a location that needs
a bearer token; a file replaced on the server mid-mount fails reads with EIO
(the ETag pin), never old and new bytes mixed; a 500 then 200 and a 429
with Retry-After retried; a redirect target that expires (403) read again
from the URL; -o readahead= applied (also on a mountpoint reached through a
symlink, or with a space in its path), defaulted, refused when invalid.
nginx cannot fail only the first request, so that case uses a small Python
HTTP server with Range support defined in this file (FlakyServer). Everything runs under deadlines; nginx and the Python server
are stopped in teardown also on failure."""
import errno
import fcntl
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
from bsmount import (BIN, FIX, SANITIZE, Mount, check, daemon_pid, force_unmount,  # noqa: E402
                     foreground_mount, run, run_tests, tensor_files, write_safetensors)
from httpfault import NGINX, start_server, stop_server  # noqa: E402

TOKEN = "s3cr3t-t0ken"

ST = os.path.join(FIX, "burn-store/safetensors-tests/tests/multi_layer/multi_layer.safetensors")
BPK = os.path.join(FIX, "examples/mnist-inference-web/model.bpk")
PT_ZIP = os.path.join(FIX, "burn-store/src/pytorch/tests/reader/test_data/checkpoint.pt")
PT_LEGACY = os.path.join(FIX, "burn-store/src/pytorch/tests/reader/test_data/simple_legacy.pt")


class Env:
    """os.environ (which the mounts inherit) set to env for a block."""

    def __init__(self, env):
        self.env, self.old = env, None

    def __enter__(self):
        self.old = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)

    def __exit__(self, *exc):
        os.environ.clear()
        os.environ.update(self.old)
        return False


class Nginx:
    """nginx on 127.0.0.1:PORT serving ROOT: / (ranges on by default),
    /redir/X answers 302 to /X, /auth/X needs "Authorization: Bearer TOKEN";
    `http` and `server`: more of the configuration, in those blocks."""

    def __init__(self, tmp, http="", server=""):
        self.extra = {"http": http, "server": server}
        self.dir = os.path.join(tmp, "nginx")
        self.root = os.path.join(self.dir, "www")
        os.makedirs(os.path.join(self.dir, "tmp"), exist_ok=True)
        os.makedirs(self.root, exist_ok=True)
        self.port = None  # chosen when it starts
        self.proc = None

    def __enter__(self):
        self.proc, (self.port,) = start_server(self._start, 1, "nginx")
        return self

    def _start(self, ports):
        d = self.dir
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write("""daemon off;
master_process off;
worker_processes 1;
pid %(d)s/nginx.pid;
error_log %(d)s/error.log;
events { worker_connections 256; }
http {
  access_log %(d)s/access.log;
  client_body_temp_path %(d)s/tmp; proxy_temp_path %(d)s/tmp; fastcgi_temp_path %(d)s/tmp;
  uwsgi_temp_path %(d)s/tmp; scgi_temp_path %(d)s/tmp;
  %(http)s
  server {
    listen 127.0.0.1:%(port)d;
    root %(root)s;
    location /redir/ { rewrite ^/redir/(.*)$ /$1 redirect; }
    location /auth/ {
      if ($http_authorization != "Bearer %(token)s") { return 401; }
      alias %(root)s/;
    }
    %(server)s
  }
}
""" % dict(self.extra, d=d, port=ports[0], root=self.root, token=TOKEN))
        return subprocess.Popen([NGINX, "-c", conf, "-p", d], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)

    def url(self, name, prefix=""):
        return "http://127.0.0.1:%d/%s%s" % (self.port, prefix, name)

    def put(self, src, name=None):
        shutil.copy(src, os.path.join(self.root, name or os.path.basename(src)))
        return name or os.path.basename(src)

    def __exit__(self, *exc):
        stop_server(self.proc)
        return False


class FlakyHandler(http.server.BaseHTTPRequestHandler):
    """GET with Range; the first request of each path answers 500 (a path
    under /busy/: 429 with Retry-After: 1)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send_small(self, code, headers=()):
        body = b"no"
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        srv = self.server
        # /hop/X redirects to /signed/GEN/X (a CDN's signed URL); a stale
        # generation answers 403, as an expired signature does.
        if self.path.startswith("/hop/"):
            with srv.lock:
                srv.hops += 1
            return self.send_small(302, [("Location", "/signed/%d/%s" % (srv.gen, self.path[5:]))])
        if self.path.startswith("/signed/"):
            gen, name = self.path[len("/signed/"):].split("/", 1)
            if int(gen) != srv.gen:
                return self.send_small(403)
            self.path = "/ok/" + name
        if self.path.startswith("/ok/"):
            srv.seen.add(self.path)
        busy = self.path.startswith("/busy/")
        path = os.path.join(srv.root, self.path.split("/", 2)[2] if busy or
                            self.path.startswith("/ok/") else self.path[1:])
        with srv.lock:
            first = self.path not in srv.seen
            srv.seen.add(self.path)
            srv.requests += 1
        if first:
            body = b"try again"
            self.send_response(429 if busy else 500)
            if busy:
                self.send_header("Retry-After", "1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        data = open(path, "rb").read()
        rng = self.headers.get("Range", "")
        a, b = rng[len("bytes="):].split("-")
        a, b = int(a), min(int(b), len(data) - 1)
        self.send_response(206)
        self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))
        self.send_header("Content-Length", str(b - a + 1))
        self.send_header("ETag", '"fixed"')
        self.end_headers()
        self.wfile.write(data[a:b + 1])


class FlakyServer:
    def __init__(self, root):
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FlakyHandler)
        self.srv.root, self.srv.seen, self.srv.requests = root, set(), 0
        self.srv.gen, self.srv.hops = 1, 0
        self.srv.lock = threading.Lock()
        self.srv.daemon_threads = True
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def url(self, name):
        return "http://127.0.0.1:%d/%s" % (self.srv.server_address[1], name)

    def __exit__(self, *exc):
        self.srv.shutdown()
        self.srv.server_close()
        self.thread.join(timeout=10)
        return False


def run_bytes(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, timeout=60, **kw)


def read_all(root):
    return {rel: open(p, "rb").read() for rel, p in tensor_files(root).items()}


def same_as_local(tmp, url, local, what, opts=None):
    """The mount of url shows the same files with the same bytes as a local mount of local."""
    lm, rm = os.path.join(tmp, "local-" + what), os.path.join(tmp, "remote-" + what)
    with Mount(local, lm, opts) as a, Mount(url, rm, opts) as b:
        want, got = read_all(a), read_all(b)
        check(len(want) > 0, "%s: the local mount shows tensors" % what)
        check(sorted(got) == sorted(want), "%s: same files remote and local: %s vs %s"
              % (what, sorted(got)[:5], sorted(want)[:5]))
        for rel in want:
            check(got.get(rel) == want[rel], "%s: %s has the local bytes" % (what, rel))


def formats(tmp, ng):
    gguf = os.path.join(tmp, "model.gguf")
    idx = os.path.join(tmp, "sharded", "model.safetensors.index.json")
    os.makedirs(os.path.dirname(idx), exist_ok=True)
    r = run([BIN, "convert", "-q", ST, gguf])
    check(r.returncode == 0, "convert to GGUF: %s" % r.stderr)
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=8KB", ST, idx])
    check(r.returncode == 0, "convert to shards: %s" % r.stderr)
    shards = [f for f in os.listdir(os.path.dirname(idx)) if f.endswith(".safetensors")]
    check(len(shards) >= 2, "the sharded fixture has shards: %s" % shards)
    os.makedirs(os.path.join(ng.root, "sharded"), exist_ok=True)
    for f in os.listdir(os.path.dirname(idx)):
        shutil.copy(os.path.join(os.path.dirname(idx), f), os.path.join(ng.root, "sharded", f))
    for local in (ST, BPK, PT_ZIP, PT_LEGACY, gguf):
        name = ng.put(local)
        same_as_local(tmp, ng.url(name), local, name)
    same_as_local(tmp, ng.url("sharded/model.safetensors.index.json"), idx, "sharded")
    # A redirect (the Hub answers a file URL with one) is followed.
    same_as_local(tmp, ng.url(os.path.basename(ST), "redir/"), ST, "redirected")


def cli_verbs(tmp, ng):
    name = ng.put(ST)
    url = ng.url(name)
    for verb in (["ls"], ["info"], ["cat", "conv1.weight"], ["ls", "--json"]):
        a = run_bytes([BIN] + verb[:1] + [ST] + verb[1:])
        b = run_bytes([BIN] + verb[:1] + [url] + verb[1:])
        check(a.returncode == 0 and b.returncode == 0, "%s on a URL: %s" % (verb, b.stderr))
        check(a.stdout == b.stdout.replace(url.encode(), ST.encode()),
              "%s on a URL prints what it prints locally" % verb)
    r = run([BIN, "diff", ST, url])
    check(r.returncode == 0, "diff of a file and its URL: same (%d) %s" % (r.returncode, r.stderr))
    out = os.path.join(tmp, "from-url.safetensors")
    r = run([BIN, "convert", "-q", url, out])
    check(r.returncode == 0, "convert URL -> local: %s" % r.stderr)
    r = run([BIN, "diff", ST, out])
    check(r.returncode == 0, "the converted copy equals the source: %s" % r.stdout[:200])
    # Behind a redirect: the opening request follows it, the reads go where it led.
    log = os.path.join(ng.dir, "access.log")
    before = open(log).read().count("/redir/")
    r = run_bytes([BIN, "cat", ng.url(name, "redir/"), "conv1.weight"])
    check(r.returncode == 0 and r.stdout == run_bytes([BIN, "cat", ST, "conv1.weight"]).stdout,
          "cat through a redirect: the right bytes")
    redirected = open(log).read().count("/redir/") - before
    check(redirected == 1, "one redirect for the open and none for the reads (%d)" % redirected)
    # A password in the URL: not in the daemon's command line (ps) nor the mount table.
    mnt = os.path.join(tmp, "mnt-pass")
    with Mount("http://user:hunter2@127.0.0.1:%d/%s?sig=s3cr3t" % (ng.port, name), mnt) as m:
        pid = daemon_pid(m)
        cmdline = open("/proc/%d/cmdline" % pid, "rb").read() if pid else b""
        check(pid and b"127.0.0.1" in cmdline, "the daemon is found: %r" % cmdline)
        check(b"hunter2" not in cmdline and b"s3cr3t" not in cmdline,
              "no password or query in the daemon's command line: %r" % cmdline)
        check("hunter2" not in open("/proc/self/mounts").read(), "nor in the mount table")
        check(len(read_all(m)) > 0, "the mount reads")
    # Errors: one line, non-zero, the URL without its credentials.
    r = run([BIN, "ls", "http://user:hunter2@127.0.0.1:%d/missing.safetensors" % ng.port])
    check(r.returncode != 0 and "404" in r.stderr and "hunter2" not in r.stderr
          and len(r.stderr.strip().splitlines()) == 1, "a 404: one line, no password: %r" % r.stderr)


def bearer(tmp, ng):
    name = ng.put(ST)
    url = ng.url(name, "auth/")
    r = run([BIN, "ls", url])
    check(r.returncode != 0 and "401" in r.stderr, "no token: refused with 401: %r" % r.stderr)
    env = dict(os.environ, BURNSTORE_HTTP_TOKEN=TOKEN)
    r = run([BIN, "ls", url], env=env)
    check(r.returncode == 0 and "conv1.weight" in r.stdout, "with the token: listed: %r" % r.stderr)
    check(TOKEN not in r.stderr, "the token is not printed")
    mnt = os.path.join(tmp, "mnt-auth")
    os.environ["BURNSTORE_HTTP_TOKEN"] = TOKEN
    try:
        with Mount(url, mnt) as m:
            want = run_bytes([BIN, "cat", ST, "conv1.weight"]).stdout
            got = open(os.path.join(m, "conv1", "weight"), "rb").read()
            check(len(got) > 0 and got == want, "a tensor read through a token-protected mount")
            mounts = open("/proc/self/mounts").read()
            check(TOKEN not in mounts, "the token is not in the mount table")
    finally:
        del os.environ["BURNSTORE_HTTP_TOKEN"]


def refusals(tmp, ng):
    name = ng.put(ST)
    mnt = os.path.join(tmp, "mnt-refused")
    os.makedirs(mnt, exist_ok=True)
    # (a writable mount into a local output=: test_remote_write.py)
    r = run([BIN, ng.url(name), mnt, "-o", "rw"])
    check(r.returncode != 0 and "in place" in r.stderr
          and len(r.stderr.strip().splitlines()) == 1,
          "a URL written in place (-o rw) refused in one line: %r" % r.stderr)
    check(not os.path.ismount(mnt), "nothing mounted after a refusal")
    # the cache and timeout options: a bad value is refused in one line
    # (mount: exit 2, usage); so is one that cannot apply (a local SOURCE)
    for opt, what in (("http_cache=lots", "not a cache size"), ("http_cache=512K", "not a cache size"),
                      ("http_cache=17G", "not a cache size"), ("http_timeout=0", "not whole seconds"),
                      ("http_timeout=3601", "not whole seconds"), ("http_timeout=5s", "not whole seconds")):
        r = run([BIN, ng.url(name), mnt, "-o", opt])
        check(r.returncode == 2 and what in r.stderr and len(r.stderr.strip().splitlines()) == 1,
              "-o %s refused in one line: %d %r" % (opt, r.returncode, r.stderr))
    r = run([BIN, ST, mnt, "-o", "http_timeout=5"])
    check(r.returncode == 1 and "apply to a URL" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
          "-o http_timeout= of a local SOURCE refused in one line: %r" % r.stderr)
    check(not os.path.ismount(mnt), "nothing mounted after these refusals")
    # the CLI opens through the same path, with the same options (one size
    # grammar: 64M and 64MiB binary, as http_cache= always read them)
    r = run([BIN, "ls", "-o", "http_cache=64M,http_timeout=30", ng.url(name)])
    check(r.returncode == 0 and r.stdout.strip(), "ls -o http_cache=,http_timeout= URL: %r"
          % r.stderr)
    r = run([BIN, "ls", "-o", "http_cache=17G", ng.url(name)])
    check(r.returncode == 2 and "not a cache size" in r.stderr
          and len(r.stderr.strip().splitlines()) == 1, "ls -o http_cache=17G: %r" % r.stderr)
    r = run([BIN, "ls", "-o", "unvalidated", ST])
    check(r.returncode == 1 and "apply to a URL" in r.stderr
          and len(r.stderr.strip().splitlines()) == 1, "ls -o unvalidated FILE: %r" % r.stderr)
    # the variables: set to something that is not a value, an error naming
    # the variable (it was taken as the default, silently)
    for var, val in (("BURNSTORE_HTTP_CACHE", "lots"), ("BURNSTORE_HTTP_CACHE", "0"),
                     ("BURNSTORE_HTTP_TIMEOUT", "-1"), ("BURNSTORE_HTTP_TIMEOUT", "1m")):
        r = run([BIN, "ls", ng.url(name)], env=dict(os.environ, **{var: val}))
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1 and var in lines[0] and ng.url(name) in lines[0],
              "%s=%s: one line naming the URL and the variable: %d %r" % (var, val, r.returncode, lines))
        r = run([BIN, ng.url(name), mnt], env=dict(os.environ, **{var: val}))
        check(r.returncode != 0 and var in r.stderr and not os.path.ismount(mnt),
              "%s=%s: the mount refused: %r" % (var, val, r.stderr))
    r = run([BIN, "ls", ng.url(name)], env=dict(os.environ, BURNSTORE_HTTP_CACHE="2MiB",
                                                BURNSTORE_HTTP_TIMEOUT="3600"))
    check(r.returncode == 0, "good values are taken: %r" % r.stderr)


def shard_escape(tmp, ng):
    """An index's shard names may not leave the index's directory on the
    server: "%2E%2E/..." (which nginx decodes, then climbs) used to open
    /secret/s.safetensors beside the model's directory; refused in one line
    naming the index and the shard, nothing mounted."""
    os.makedirs(os.path.join(ng.root, "secret"), exist_ok=True)
    os.makedirs(os.path.join(ng.root, "model"), exist_ok=True)
    write_safetensors(os.path.join(ng.root, "secret", "s.safetensors"), {"w": b"secret"})
    # ("%00/%2E%2E/...": a %00 ended the decoded ".." check; a server that
    # decodes, then normalizes the path (Python's http.server) climbs; nginx
    # answers 400, which is no refusal of ours either)
    for i, rel in enumerate(("%2E%2E/secret/s.safetensors", "..%5Csecret%5Cs.safetensors",
                             "http://127.0.0.1:%d/secret/s.safetensors" % ng.port,
                             "%00/%2E%2E/%2E%2E/secret/s.safetensors")):
        name = "model/i%d.safetensors.index.json" % i
        with open(os.path.join(ng.root, name), "w") as f:
            json.dump({"metadata": {}, "weight_map": {"w": rel}}, f)
        r = run([BIN, "ls", ng.url(name)])
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1 and "i%d.safetensors.index.json" % i in lines[0]
              and rel in lines[0]
              and any(w in lines[0] for w in ("climbs out", "URL", "control character")),
              "shard %s refused in one line naming the index and the shard: %d %r"
              % (rel, r.returncode, lines))
        check("w" not in r.stdout.split(), "shard %s: nothing listed: %r" % (rel, r.stdout))


def bdi_ra(mnt):
    d = os.stat(mnt).st_dev
    with open("/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(d), os.minor(d))) as f:
        return int(f.read())


def readahead(tmp, ng):
    """-o readahead=KIB: the mount's read-ahead (the size of the kernel's
    READs), applied at the first open (root only); 1024 by default for a
    URL, the kernel's for a local file; refused in one line when it is no
    KiB count in range; the bytes are the local mount's."""
    name = ng.put(ST)
    mnt = os.path.join(tmp, "mnt-ra")
    root = os.geteuid() == 0
    for src, opts, want in ((ng.url(name), None, 1024), (ng.url(name), "readahead=256", 256),
                            (ng.url(name), "readahead=0", None), (ST, None, None),
                            (ST, "readahead=512", 512)):
        with Mount(src, mnt, opts) as m:
            before = bdi_ra(m)
            files = tensor_files(m)
            got = {rel: open(p, "rb").read() for rel, p in files.items()}
            after = bdi_ra(m)
            what = "%s -o %s" % ("URL" if src != ST else "local", opts)
            if root:
                check(after == (before if want is None else want),
                      "%s: read_ahead_kb %d after an open (want %s, %d before)"
                      % (what, after, want, before))
            check(len(got) > 0 and all(v for v in got.values()), "%s: tensors read" % what)
    # The mount found in /proc/self/mountinfo also on a path it escapes (a
    # space, a backslash) and through a symlink to the mountpoint (the mount
    # is on its target: the link's path is in no line, and the read-ahead
    # stayed the kernel's 128 KiB), and on a path whose mountinfo line is
    # longer than 8 KiB (14 names of 200 spaces, each escaped to 800 bytes).
    real = os.path.join(tmp, "mnt ra\\real")
    link = os.path.join(tmp, "mnt-ra-link")
    deep = os.path.join(tmp, *([" " * 200] * 14))
    for d in (real, deep):
        os.makedirs(d, exist_ok=True)
    if not os.path.islink(link):
        os.symlink(real, link)
    # (the deep path only as root: fusermount3 -u of a user reads the
    # mount table with getmntent, whose lines stop at 4 KiB)
    for mp in (real, link) + ((deep,) if root else ()):
        with Mount(ng.url(name), mp) as m:
            m.mount.unmount_timeout = 30  # (the old code's -u waited for ever)
            got = [open(p, "rb").read() for p in tensor_files(m).values()]
            check(len(got) > 0 and all(got), "%r: tensors read" % mp)
            if root:
                check(bdi_ra(m) == 1024, "%r: read_ahead_kb %d after an open (want 1024)"
                      % (mp, bdi_ra(m)))
    same_as_local(tmp, ng.url(name), ST, "ra4096", "readahead=4096")
    # A local file's READs larger than the splice pipe can grow to (past
    # pipe-max-size only with CAP_SYS_RESOURCE) are copied, half as fast:
    # said at mount, in one line, exactly when a pipe cannot hold them.
    pg = os.sysconf("SC_PAGESIZE")
    pmax = int(open("/proc/sys/fs/pipe-max-size").read())
    fit = (pmax - 3 * pg - 16) // pg * pg // 1024

    def pipe_holds(kib):
        r, w = os.pipe()
        try:
            fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, kib * 1024 + 3 * pg + 16)
            return True
        except OSError:
            return False
        finally:
            os.close(r)
            os.close(w)
    for kib in (fit, fit + 4) if fit + 4 <= 65536 else ():
        warned = not pipe_holds(kib)
        check(kib == fit + 4 or not warned, "a pipe holds a reply of readahead=%d" % fit)
        try:
            r = run([BIN, ST, mnt, "-o", "readahead=%d" % kib])
            lines = r.stderr.strip().splitlines()
            check(r.returncode == 0 and len(lines) == int(warned)
                  and (not warned or "cannot be spliced" in lines[0] and "readahead=%d " % fit in lines[0]),
                  "local readahead=%d: warned %s: %d %r" % (kib, warned, r.returncode, lines))
        finally:
            run([BIN, "-u", mnt])
            force_unmount(mnt)
    for bad in ("readahead=2", "readahead=65537", "readahead=1M", "readahead=-1", "readahead="):
        r = run([BIN, ng.url(name), mnt, "-o", bad])
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 2 and len(lines) == 1 and "readahead=" in lines[0],
              "%s refused in one line: %d %r" % (bad, r.returncode, lines))
        check(not os.path.ismount(mnt), "%s: nothing mounted" % bad)
    r = run([BIN, "--help"])
    check("readahead=KIB" in r.stdout, "--help names readahead=")
    man = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "burnstore.1")
    check("readahead" in open(man).read(), "the man page names readahead=")


def minflt(pid):
    """A process's minor page faults so far (all its threads)."""
    return int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[7])


def recv_buffers(tmp, ng):
    """A sequential read of a URL costs the daemon page faults for the
    cache's blocks (its first fill: the cache, its spare buffers and what
    is in flight), not for every request: libcurl's 512 KiB receive buffer,
    allocated and freed by each transfer, was mapped afresh each time (128
    faults, and 512 KiB zeroed, a 4 MiB request). The blocks are in huge
    pages where the system has them (a fault a 2 MiB, and a reply from a
    block pins one page, not 256). The bytes are the file's."""
    size, cache = 192 << 20, 4 << 20
    path = os.path.join(ng.root, "big.safetensors")
    head = b'{"big":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (size, size)
    head += b" " * (-len(head) % 8)
    chunk = bytes(range(256)) * 4096  # 1 MiB
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        for _ in range(size // len(chunk)):
            f.write(chunk)
    mnt = os.path.join(tmp, "mnt-recv")
    try:
        with foreground_mount(ng.url("big.safetensors"), mnt, "http_cache=%dM" % (cache >> 20)) as p:
            f0 = minflt(p.pid)
            ok = True
            with open(os.path.join(mnt, "big"), "rb") as f:
                while True:
                    b = f.read(1 << 20)
                    if not b:
                        break
                    ok = ok and b == chunk
            faults = minflt(p.pid) - f0
            check(ok, "the URL's bytes read are the file's")
            # the blocks' first fill: the cache, as many spare buffers, and
            # half the cache in flight, in 4 KiB pages; 1,024 more for the
            # rest (thread stacks, FUSE buffers)
            bound = (2 * cache + cache // 2) // 4096 + 1024
            if SANITIZE == "OFF":  # (a sanitizer's allocator and shadow fault on their own)
                check(faults <= bound, "%d page faults for a read of %d MiB (at most %d: the "
                      "cache's first fill)" % (faults, size >> 20, bound))
            print("  %d page faults for %d MiB (bound %d)" % (faults, size >> 20, bound))
            # the cache's blocks in huge pages, where the system gives them
            # to a range advised for them (THP "always" or "madvise")
            thp = "/sys/kernel/mm/transparent_hugepage/enabled"
            if os.path.exists(thp) and "[never]" not in open(thp).read():
                huge = sum(int(line.split()[1]) for line in open("/proc/%d/smaps" % p.pid)
                           if line.startswith("AnonHugePages:"))
                check(huge >= 2048, "the cache's blocks in huge pages: %d kB (at least 2048)" % huge)
    finally:
        os.unlink(path)


def etag_pin(tmp, ng):
    """The object replaced mid-mount: a read of bytes not yet fetched fails
    with EIO (If-Match answered 412), never the new bytes beside the old."""
    a, b = os.urandom(3 << 20), os.urandom(3 << 20)
    path = os.path.join(ng.root, "replaced.safetensors")
    write_safetensors(path, {"a": a, "b": b})
    mnt = os.path.join(tmp, "mnt-etag")
    os.environ["BURNSTORE_HTTP_CACHE"] = "1M"
    try:
        with Mount(ng.url("replaced.safetensors"), mnt) as m:
            check(open(os.path.join(m, "a"), "rb").read() == a, "a read before the change")
            tmp_path = path + ".new"
            write_safetensors(tmp_path, {"a": os.urandom(3 << 20), "b": os.urandom(3 << 20)})
            os.utime(tmp_path, (time.time() + 10, time.time() + 10))
            os.rename(tmp_path, path)
            try:
                open(os.path.join(m, "b"), "rb").read()
                check(False, "a read after the object changed fails")
            except OSError as e:
                check(e.errno == errno.EIO, "the read fails with EIO: %r" % e)
    finally:
        del os.environ["BURNSTORE_HTTP_CACHE"]


def retry_500(tmp, ng):
    root = os.path.join(tmp, "flaky")
    os.makedirs(root, exist_ok=True)
    shutil.copy(ST, root)
    with FlakyServer(root) as fs:
        url = fs.url(os.path.basename(ST))
        r = run_bytes([BIN, "cat", url, "conv1.weight"])
        want = run_bytes([BIN, "cat", ST, "conv1.weight"])
        check(r.returncode == 0 and r.stdout == want.stdout,
              "a 500 then 200: retried, the right bytes: %r" % r.stderr)
        # (the opening request's 64 KiB hold this small file whole: a 500, then its retry)
        check(fs.srv.requests >= 2, "the 500 was answered and retried (%d requests)"
              % fs.srv.requests)
        # The redirect's target expires mid-mount: the read starts from the URL again.
        # (b is past the first 1 MiB block, which the open fetched)
        a, b = os.urandom(3 << 19), os.urandom(3 << 19)
        write_safetensors(os.path.join(root, "hop.safetensors"), {"a": a, "b": b})
        mnt = os.path.join(tmp, "mnt-hop")
        with Mount(fs.url("hop/hop.safetensors"), mnt) as m:
            fs.srv.gen = 2
            got = open(os.path.join(m, "b"), "rb").read()
            check(got == b, "an expired redirect target: the URL again, right bytes")
            check(fs.srv.hops == 2, "one redirect at open, one after the 403 (%d)" % fs.srv.hops)
        t0 = time.time()
        r = run_bytes([BIN, "cat", fs.url("busy/" + os.path.basename(ST)), "conv1.weight"])
        check(r.returncode == 0 and r.stdout == want.stdout, "a 429 then 200: the right bytes")
        check(time.time() - t0 >= 1.0, "Retry-After: 1 was honoured (%.2f s)" % (time.time() - t0))


def main():
    if not os.path.exists(NGINX):
        print("SKIP: no nginx (Debian's nginx-light; .ci/install-deps installs it)")
        sys.exit(77)

    def with_nginx(t):
        def go(tmp):
            with Nginx(tmp) as ng:
                t(tmp, ng)
        go.__name__ = t.__name__
        return go

    # A deadline on everything: the whole run is killed (its finally blocks
    # unmount and stop nginx) if it hangs.
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("deadline")))
    signal.alarm(600)
    run_tests("test_remote", [with_nginx(t) for t in
                              (formats, cli_verbs, bearer, refusals, shard_escape, readahead,
                               recv_buffers, etag_pin, retry_500)], "remote")


if __name__ == "__main__":
    main()
