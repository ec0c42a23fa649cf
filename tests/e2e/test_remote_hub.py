"""hf:// against a Hub of our own (issue 20): a real nginx (Debian's
nginx-light) on two free ports of 127.0.0.1, started and stopped here. The
"Hub" port answers /{org}/{repo}/resolve/{revision}/{path} with a 302 to the
"CDN" port and an X-Repo-Commit header (a map from the revision to a commit,
in a file the test rewrites and nginx reloads); the repository "gated/..."
answers 401 without "Authorization: Bearer TOKEN"; the CDN answers 400 to
any Authorization header (the token goes to the Hub only) and 403 to a
redirect of an older generation (an expired signed URL). burnstore reaches
it through HF_ENDPOINT. Checked: every tensor of a SafeTensors, a GGUF and a
sharded index read over hf:// equals a local mount's; the CLI verbs; the
token from HF_TOKEN and from $HF_HOME/token, one line without it, never in
an error, the mount table or ps; mount.burnstore (mount -t, fstab) with an hf:// SOURCE; the revision pinned at open, so main moving
to another commit mid-mount (with the CDN's URLs expiring) gives the first
commit's bytes, never a mix; '.' and '..' segments in a typed hf:// URL
refused in one line, nothing asked (issue 31: they left the repository with
its token)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from bsmount import (BIN, SOURCE_DIR, Mount, check, daemon_pid, force_unmount, run,  # noqa: E402
                     run_tests, write_safetensors)
from test_remote import (BPK, NGINX, ST, Env, run_bytes, start_server, stop_server,  # noqa: E402
                         same_as_local)

TOKEN = "hf_t0kenAbCdEf"
COMMIT_A = "a" * 8 + "0123456789abcdef0123456789abcdef"
COMMIT_B = "b" * 8 + "0123456789abcdef0123456789abcdef"


class Hub:
    """nginx: the Hub on self.port, its CDN on self.cdn; files under
    self.www/{repo}/{commit}/{path}. A master process (SIGHUP reloads the
    map of revisions)."""

    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "hub")
        self.www = os.path.join(self.dir, "www")
        os.makedirs(os.path.join(self.dir, "tmp"), exist_ok=True)
        os.makedirs(self.www, exist_ok=True)
        self.port = self.cdn = None  # chosen when it starts
        self.proc = None
        self.main, self.gen = COMMIT_A, 1

    def write_map(self):
        with open(os.path.join(self.dir, "refs.conf"), "w") as f:
            f.write("map $hf_rev $hf_commit { default $hf_rev; main %s; }\n"
                    "map $host $cdn_gen { default g%d; }\n" % (self.main, self.gen))

    def __enter__(self):
        self.write_map()
        self.proc, (self.port, self.cdn) = start_server(self._start, 2, "nginx")
        return self

    def _start(self, ports):
        d = self.dir
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write("""daemon off;
master_process on;
%(user)s
worker_processes 1;
pid %(d)s/nginx.pid;
error_log %(d)s/error.log;
events { worker_connections 256; }
http {
  access_log %(d)s/access.log;
  client_body_temp_path %(d)s/tmp; proxy_temp_path %(d)s/tmp; fastcgi_temp_path %(d)s/tmp;
  uwsgi_temp_path %(d)s/tmp; scgi_temp_path %(d)s/tmp;
  include %(d)s/refs.conf;
  server {
    listen 127.0.0.1:%(port)d;
    location ~ ^/(?<hf_repo>[^/]+/[^/]+)/resolve/(?<hf_rev>[^/]+)/(?<hf_path>.+)$ {
      set $need "";
      if ($hf_repo ~ ^gated/) { set $need "Bearer %(token)s"; }
      if ($http_authorization != $need) { return 401; }
      add_header X-Repo-Commit $hf_commit always;
      return 302 http://127.0.0.1:%(cdn)d/$cdn_gen/$hf_repo/$hf_commit/$hf_path;
    }
    location / { return 404; }
  }
  server {
    listen 127.0.0.1:%(cdn)d;
    location ~ ^/(?<gen>g[0-9]+)/(?<rest>.*)$ {
      if ($http_authorization) { return 400; }
      if ($gen != $cdn_gen) { return 403; }
      alias %(www)s/$rest;
    }
  }
}
""" % {"user": "user root;" if os.geteuid() == 0 else "",  # (as root its worker
       # would be nobody, who cannot read the test's temp dir)
       "d": d, "port": ports[0], "cdn": ports[1], "www": self.www, "token": TOKEN})
        return subprocess.Popen([NGINX, "-c", conf, "-p", d], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)

    def endpoint(self):
        return "http://127.0.0.1:%d" % self.port

    def put(self, repo, commit, src, name=None):
        dst = os.path.join(self.www, repo, commit, name or os.path.basename(src))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy(src, dst)
        return name or os.path.basename(src)

    def resolve_head(self, repo, rev, path):
        """The Hub's answer (not followed): its status and X-Repo-Commit."""
        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *a):
                return None
        url = "%s/%s/resolve/%s/%s" % (self.endpoint(), repo, rev, path)
        try:
            r = urllib.request.build_opener(NoRedirect).open(url, timeout=10)
            return r.status, r.headers.get("X-Repo-Commit")
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("X-Repo-Commit")

    def move_main(self, commit, gen):
        """main now names commit; the CDN's URLs of older generations answer 403."""
        self.main, self.gen = commit, gen
        self.write_map()
        old = self.workers()
        self.proc.send_signal(signal.SIGHUP)
        # the new config answers, and the old workers (which would still
        # answer with the old one) are gone
        deadline = time.time() + 20
        while time.time() < deadline:
            if (self.resolve_head("org/pinned", "main", "x")[1] == commit
                    and not old & self.workers()):
                return
            time.sleep(0.05)
        raise RuntimeError("nginx did not reload within 20 s")

    def workers(self):
        """The pids of nginx's worker processes (the master's children)."""
        out = set()
        for d in os.listdir("/proc"):
            try:
                if d.isdigit() and ("PPid:\t%d\n" % self.proc.pid) in open(
                        "/proc/%s/status" % d).read():
                    out.add(int(d))
            except OSError:
                pass
        return out

    def requests(self, part):
        return [ln for ln in open(os.path.join(self.dir, "access.log")) if part in ln]

    def __exit__(self, *exc):
        stop_server(self.proc)
        return False


def hf_env(hub, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HOME")}
    env["HF_ENDPOINT"] = hub.endpoint()
    env["HF_HOME"] = os.path.join(hub.dir, "no-hf-home")
    env.update(kw)
    return env


def formats(tmp, hub):
    """SafeTensors, GGUF, Burnpack and a sharded index over hf://: the local bytes."""
    gguf = os.path.join(tmp, "model.gguf")
    r = run([BIN, "convert", "-q", ST, gguf])
    check(r.returncode == 0, "convert to GGUF: %s" % r.stderr)
    shard_dir = os.path.join(tmp, "sharded")
    os.makedirs(shard_dir)
    idx = os.path.join(shard_dir, "model.safetensors.index.json")
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=8KB", ST, idx])
    check(r.returncode == 0, "convert to shards: %s" % r.stderr)
    check(len(os.listdir(shard_dir)) >= 3, "an index and shards: %s" % os.listdir(shard_dir))
    for f in os.listdir(shard_dir):
        hub.put("org/model", COMMIT_A, os.path.join(shard_dir, f), "sub/" + f)
    for local in (ST, gguf, BPK):
        hub.put("org/model", COMMIT_A, local)
    with Env(hf_env(hub)):
        for local in (ST, gguf, BPK):
            name = os.path.basename(local)
            same_as_local(tmp, "hf://org/model/" + name, local, "hf-" + name)
        same_as_local(tmp, "hf://org/model/sub/model.safetensors.index.json", idx, "hf-sharded")
        same_as_local(tmp, "hf://org/model@%s/%s" % (COMMIT_A, os.path.basename(ST)), ST,
                      "hf-at-commit")
    # the shards were asked at the pinned commit, not at main
    shard_asks = [ln for ln in hub.requests("/resolve/") if "/sub/" in ln
                  and "index.json" not in ln]
    check(shard_asks and all("/resolve/%s/" % COMMIT_A in ln for ln in shard_asks),
          "the shards are resolved at the index's commit: %s" % shard_asks[:3])


def cli_verbs(tmp, hub):
    hub.put("org/cli", COMMIT_A, ST)
    url = "hf://org/cli/" + os.path.basename(ST)
    env = hf_env(hub)
    for verb in (["ls"], ["info"], ["cat", "conv1.weight"], ["ls", "--json"]):
        a = run_bytes([BIN] + verb[:1] + [ST] + verb[1:])
        b = run_bytes([BIN] + verb[:1] + [url] + verb[1:], env=env)
        check(a.returncode == 0 and b.returncode == 0, "%s on hf://: %s" % (verb, b.stderr))
        check(a.stdout == b.stdout.replace(url.encode(), ST.encode()),
              "%s on hf:// prints what it prints locally" % verb)
    r = run([BIN, "diff", ST, url], env=env)
    check(r.returncode == 0, "diff of a file and its hf:// copy: same: %s" % r.stderr)
    out = os.path.join(tmp, "from-hub.safetensors")
    r = run([BIN, "convert", "-q", url, out], env=env)
    check(r.returncode == 0 and run([BIN, "diff", ST, out]).returncode == 0,
          "convert hf:// -> local: the same tensors: %s" % r.stderr)
    r = run([BIN, "ls", "hf://org/cli/missing.safetensors"], env=env)
    check(r.returncode != 0 and "404" in r.stderr and "hf://org/cli/missing.safetensors"
          in r.stderr and len(r.stderr.strip().splitlines()) == 1,
          "a missing file: one line naming the hf:// URL: %r" % r.stderr)
    r = run([BIN, "ls", "hf://org"], env=env)
    check(r.returncode != 0 and "hf://" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
          "a malformed hf:// URL: one line: %r" % r.stderr)


def tokens(tmp, hub):
    hub.put("gated/model", COMMIT_A, ST)
    url = "hf://gated/model/" + os.path.basename(ST)
    want = run_bytes([BIN, "cat", ST, "conv1.weight"]).stdout
    r = run([BIN, "ls", url], env=hf_env(hub))
    check(r.returncode != 0 and "401" in r.stderr and "HF_TOKEN" in r.stderr
          and url in r.stderr and len(r.stderr.strip().splitlines()) == 1,
          "a gated repository without a token: one line, 401, names HF_TOKEN: %r" % r.stderr)
    r = run_bytes([BIN, "cat", url, "conv1.weight"], env=hf_env(hub, HF_TOKEN=TOKEN))
    check(r.returncode == 0 and r.stdout == want,
          "HF_TOKEN: the tensor's bytes (the CDN got no token): %r" % r.stderr)
    check(TOKEN.encode() not in r.stderr, "the token is not printed")
    home = os.path.join(tmp, "hf-home")
    os.makedirs(home)
    with open(os.path.join(home, "token"), "w") as f:
        f.write(TOKEN + "\n")
    r = run_bytes([BIN, "cat", url, "conv1.weight"], env=hf_env(hub, HF_HOME=home))
    check(r.returncode == 0 and r.stdout == want, "$HF_HOME/token: the bytes: %r" % r.stderr)
    r = run([BIN, "ls", url], env=hf_env(hub, HF_TOKEN="hf_wrong"))
    check(r.returncode != 0 and "401" in r.stderr and "hf_wrong" not in r.stderr,
          "a wrong token: refused, not printed: %r" % r.stderr)
    # The token goes to the Hub only: a CDN that got it answers 400 (checked
    # above by the bytes); here the Hub's log shows it asked, the CDN's none.
    mnt = os.path.join(tmp, "mnt-gated")
    with Env(hf_env(hub, HF_TOKEN=TOKEN)):
        with Mount(url, mnt) as m:
            got = open(os.path.join(m, "conv1", "weight"), "rb").read()
            check(got == want, "a gated tensor through the mount")
            pid = daemon_pid(m)
            cmdline = open("/proc/%d/cmdline" % pid, "rb").read() if pid else b""
            environ_ok = pid is not None
            check(environ_ok and b"hf://gated/model" in cmdline
                  and TOKEN.encode() not in cmdline, "the daemon's argv: %r" % cmdline)
            mounts = open("/proc/self/mounts").read()
            check(TOKEN not in mounts and "hf://gated/model" in mounts,
                  "the mount table shows the hf:// URL, not the token")
            for n in os.listxattr(m):
                check(TOKEN.encode() not in os.getxattr(m, n), "no token in xattr %s" % n)


def helper(tmp, hub):
    """mount.burnstore (what mount -t burnstore and fstab run) takes an hf:// SOURCE."""
    hub.put("org/helper", COMMIT_A, ST)
    mnt = os.path.join(tmp, "mnt-helper")
    os.makedirs(mnt)
    env = hf_env(hub, BURNSTORE_BIN=BIN)
    r = run(["sh", os.path.join(SOURCE_DIR, "mount-helpers", "mount.burnstore"),
             "hf://org/helper/" + os.path.basename(ST), mnt, "-o", "rw,ro,_netdev"], env=env)
    try:
        check(r.returncode == 0 and os.path.ismount(mnt), "mount.burnstore of hf://: %r" % r.stderr)
        if os.path.ismount(mnt):
            got = open(os.path.join(mnt, "conv1", "weight"), "rb").read()
            check(got == run_bytes([BIN, "cat", ST, "conv1.weight"]).stdout, "a tensor read")
    finally:
        if os.path.ismount(mnt):
            u = run([BIN, "-u", mnt])
            check(u.returncode == 0, "unmounted: %r" % u.stderr)
        force_unmount(mnt)


def pinned(tmp, hub):
    """main moves to another commit mid-mount while the CDN's URLs expire: the
    reads go back to the Hub at the pinned commit and get its bytes."""
    a = {"t%d" % i: os.urandom(3 << 19) for i in range(4)}
    b = {k: os.urandom(len(v)) for k, v in a.items()}
    for commit, ts in ((COMMIT_A, a), (COMMIT_B, b)):
        d = os.path.join(tmp, commit)
        os.makedirs(d)
        names = sorted(ts)
        write_safetensors(os.path.join(d, "s1.safetensors"), {k: ts[k] for k in names[:2]})
        write_safetensors(os.path.join(d, "s2.safetensors"), {k: ts[k] for k in names[2:]})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": {k: "s1.safetensors" if k in names[:2]
                                                      else "s2.safetensors" for k in names}}, f)
        for f in os.listdir(d):
            hub.put("org/pinned", commit, os.path.join(d, f))
    mnt = os.path.join(tmp, "mnt-pinned")
    with Env(hf_env(hub, BURNSTORE_HTTP_CACHE="1M")):
        with Mount("hf://org/pinned/model.safetensors.index.json", mnt) as m:
            hub.move_main(COMMIT_B, 2)
            # every tensor at once: the shards' expired CDN URLs are resolved
            # again by several threads while others read where they lead
            # (the ThreadSanitizer pass checks it is race-free)
            got = {}

            def one(k):
                got[k] = open(os.path.join(m, k), "rb").read()
            ts = [threading.Thread(target=one, args=(k,)) for k in sorted(a) for _ in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(timeout=60)
    for k in sorted(a):
        check(got.get(k) == a[k], "%s: the pinned commit's bytes (main moved mid-mount)" % k)
    again = [ln for ln in hub.requests("/org/pinned/resolve/%s/" % COMMIT_A)]
    check(len(again) >= 1, "expired CDN URLs resolved again at the commit: %d" % len(again))
    check(not hub.requests("/org/pinned/resolve/%s/" % COMMIT_B) and
          not hub.requests("/org/pinned/%s/" % COMMIT_B), "nothing asked at the new commit")


def shard_escape(tmp, hub):
    """A sharded index on the Hub naming a shard in another repository
    (".." written %2E%2E, which the Hub would decode; a URL): refused in one
    line naming the index and the shard, with the token never sent for it."""
    d = os.path.join(tmp, "esc")
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "s.safetensors"), {"w": b"other repo"})
    hub.put("org/other", COMMIT_A, os.path.join(d, "s.safetensors"))
    for i, rel in enumerate(("%2E%2E/%2E%2E/%2E%2E/org/other/resolve/" + COMMIT_A + "/s.safetensors",
                             "hf://org/other/s.safetensors")):
        idx = os.path.join(d, "i%d.safetensors.index.json" % i)
        with open(idx, "w") as f:
            json.dump({"metadata": {}, "weight_map": {"w": rel}}, f)
        hub.put("org/esc", COMMIT_A, idx)
        r = run([BIN, "ls", "hf://org/esc/i%d.safetensors.index.json" % i], env=hf_env(hub))
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1 and "hf://org/esc/i%d" % i in lines[0]
              and rel in lines[0] and ("its repository and revision" in lines[0]),
              "hf shard %s refused in one line: %d %r" % (rel, r.returncode, lines))


def dot_segments(tmp, hub):
    """Issue 31: '..' in a typed hf:// URL left the repository with its
    token (libcurl removed the dot segments: the URL below was asked as
    /org/other/resolve/main/s.safetensors with gated/model's token).
    Refused in one line by ls and a mount, nothing asked of the Hub."""
    d = os.path.join(tmp, "dots")
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "s.safetensors"), {"w": b"other repo"})
    hub.put("org/other", COMMIT_A, os.path.join(d, "s.safetensors"))
    env = hf_env(hub, HF_TOKEN=TOKEN)
    before = len(hub.requests("/org/other/"))
    mnt = os.path.join(tmp, "mnt-dots")
    os.makedirs(mnt, exist_ok=True)
    for url in ("hf://gated/model/../../../../org/other/resolve/main/s.safetensors",
                "hf://gated/model/sub/%2E%2E/%2e%2E/../../../org/other/resolve/main/s.safetensors",
                "hf://gated/model@../../../../org/other/resolve/main/s.safetensors",
                "hf://gated/model/./s.safetensors"):
        for what, cmd in (("ls", [BIN, "ls", url]), ("mount", [BIN, url, mnt])):
            r = run(cmd, env=env)
            lines = r.stderr.strip().splitlines()
            check(r.returncode == 1 and len(lines) == 1 and "'..' segment" in lines[0]
                  and TOKEN not in r.stderr,
                  "%s %s: refused in one line: %d %r" % (what, url, r.returncode, lines))
            force_unmount(mnt)
    check(len(hub.requests("/org/other/")) == before, "nothing was asked of org/other")


def main():
    if not os.path.exists(NGINX):
        print("SKIP: no nginx (Debian's nginx-light; .ci/install-deps installs it)")
        sys.exit(77)

    def with_hub(t):
        def go(tmp):
            with Hub(tmp) as hub:
                t(tmp, hub)
        go.__name__ = t.__name__
        return go

    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("deadline")))
    signal.alarm(600)
    run_tests("test_remote_hub", [with_hub(t) for t in (formats, cli_verbs, tokens, helper, pinned,
                                                             shard_escape, dot_segments)],
              "remote-hub")


if __name__ == "__main__":
    main()
