"""A writable mount of a remote checkpoint into a local output= (issue 20):
the model is read by ranges from a real nginx (and over hf:// from the Hub
of test_remote_hub) on 127.0.0.1, and what the user keeps, changes or adds
is written to a local .safetensors at unmount. Checked: tensors removed,
replaced by rsync and added are in the output, the clean ones with the
server's bytes; the staging INDEX/JOURNAL records the URL (hf:// at its
pinned commit) and each file's ETag, so `--finish` after kill -9 writes the
same output, and refuses in one line naming the URL when the object changed
on the server meanwhile (nothing written, the staging kept); `-o rw` without
output= (in place) and a URL holding a password are refused in one line,
the password never printed nor written to the staging directory."""
import glob
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bsmount import (BIN, Mount, check, daemon_pid, force_unmount, read_safetensors, run,  # noqa: E402
                     run_tests, wait_gone, write_safetensors)
from test_remote import NGINX, ST, Env, Nginx  # noqa: E402
from test_remote_hub import COMMIT_A, COMMIT_B, Hub, hf_env  # noqa: E402

WINDOW = 1.0  # BS_JOURNAL_SYNC_MS: the journal is on disk after it


def sh(cmd, cwd):
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, "`%s`: %s" % (cmd, r.stderr.strip()))
    return r


def model(path, seed):
    """A SafeTensors of U8 tensors over several 1 MiB blocks: {key: bytes}."""
    ts = {"keep.a": os.urandom(3 << 19), "keep.b": os.urandom(1 << 20) + bytes([seed]),
          "drop.c": os.urandom(1 << 19), "swap.d": os.urandom(4096)}
    write_safetensors(path, ts)
    return ts


def tensors(path):
    """{key: bytes} of a SafeTensors file."""
    return {k: v[2] for k, v in read_safetensors(path)[0].items()}


def edit(d, mnt):
    """rm one tensor, rsync a replacement over another, rsync a new one in:
    what the output must then hold, given the source's tensors."""
    inc = os.path.join(d, "incoming")
    os.makedirs(inc, exist_ok=True)
    new_d, added = os.urandom(4096), os.urandom(777)
    with open(os.path.join(inc, "d"), "wb") as f:
        f.write(new_d)
    with open(os.path.join(inc, "added"), "wb") as f:
        f.write(added)
    sh("rm %s/drop/c" % mnt, d)
    sh("rsync -a -I incoming/d %s/swap/d" % mnt, d)  # (-I: same size, maybe same second)
    sh("rsync -a incoming/added %s/added" % mnt, d)
    return lambda src: {"keep.a": src["keep.a"], "keep.b": src["keep.b"], "swap.d": new_d,
                        "added": added}


def kill_daemon(mnt):
    pid = daemon_pid(os.path.realpath(mnt))
    check(pid is not None, "daemon of %s found" % mnt)
    if pid:
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
    force_unmount(mnt)


def http_output(tmp, ng):
    d = os.path.join(tmp, "http")
    os.makedirs(d)
    src = model(os.path.join(ng.root, "w.safetensors"), 1)
    out = os.path.join(d, "out.safetensors")
    mnt = os.path.join(d, "mnt")
    with Env(dict(os.environ, BURNSTORE_HTTP_CACHE="1M")):
        with Mount(ng.url("w.safetensors"), mnt, "rw,output=" + out) as m:
            want = edit(d, m)(src)
            check(open(os.path.join(m, "keep", "a"), "rb").read() == src["keep.a"],
                  "a clean tensor reads the server's bytes in the writable mount")
            r = m.unmount()
            check(r is not None and r.returncode == 0, "unmount wrote the output: %r"
                  % (r.stderr if r else None))
    got = tensors(out) if os.path.exists(out) else {}
    check(got == want, "the output holds the kept tensors (the server's bytes), the replaced and "
          "the added: %s" % {k: (len(got.get(k, b"")), len(v), got.get(k) == v)
                             for k, v in want.items()})
    check(not glob.glob(os.path.join(d, ".out.safetensors.staging-*")), "no staging left")


def sharded_output(tmp, ng):
    """A sharded index over HTTP into one local file: every shard recorded."""
    d = os.path.join(tmp, "sharded")
    os.makedirs(os.path.join(ng.root, "sh"))
    idx = os.path.join(ng.root, "sh", "model.safetensors.index.json")
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=8KB", ST, idx])
    check(r.returncode == 0 and len(os.listdir(os.path.dirname(idx))) >= 3, "shards: %s" % r.stderr)
    out = os.path.join(d, "out.safetensors")
    with Mount(ng.url("sh/model.safetensors.index.json"), os.path.join(d, "mnt"),
               "output=" + out) as m:
        time.sleep(WINDOW + 0.5)
        stg = glob.glob(os.path.join(d, ".out.safetensors.staging-*"))
        journal = open(os.path.join(stg[0], "JOURNAL"), "rb").read() if stg else b""
        check(journal.count(b"\tremote\tIf-Match:") >= 3, "each shard's ETag is recorded")
        r = m.unmount()
        check(r is not None and r.returncode == 0, "unmount: %r" % (r.stderr if r else None))
    r = run([BIN, "diff", ST, out])
    check(r.returncode == 0, "the output holds every tensor of the shards: %s" % r.stdout[:300])


def shard_without_validator(tmp, _ng):
    """A shard served without ETag and Last-Modified (proxied with both
    hidden): --finish could not tell it changed, so output= is refused in
    one line, as for a single file without them; nothing staged."""
    d = os.path.join(tmp, "novalidator")
    os.makedirs(d)
    ng = Nginx(d)
    ng.extra["server"] = (
        "location ~ ^/nv/(.*-00002-of-.*)$ { proxy_pass http://127.0.0.1:$server_port/sh/$1; "
        "proxy_hide_header ETag; proxy_hide_header Last-Modified; }\n"
        "    location /nv/ { alias %s/sh/; }" % ng.root)
    with ng:
        os.makedirs(os.path.join(ng.root, "sh"))
        idx = os.path.join(ng.root, "sh", "model.safetensors.index.json")
        r = run([BIN, "convert", "-q", "-o", "max_shard_size=8KB", ST, idx])
        names = os.listdir(os.path.dirname(idx))
        check(r.returncode == 0 and any("-00002-of-" in f for f in names), "shards: %s" % r.stderr)
        url = ng.url("nv/model.safetensors.index.json")
        out = os.path.join(d, "out.safetensors")
        mnt = os.path.join(d, "mnt")
        os.makedirs(mnt)
        # (no strong ETag: refused at open, read-only too, unless -o unvalidated)
        r = run([BIN, url, mnt, "-o", "output=" + out])
        if r.returncode == 0:
            force_unmount(mnt)
        check(r.returncode != 0 and "no strong ETag" in r.stderr and "unvalidated" in r.stderr
              and "00002" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
              "a shard without validators: refused in one line naming it: %r" % r.stderr)
        r = run([BIN, url, mnt, "-o", "unvalidated,output=" + out])
        if r.returncode == 0:
            force_unmount(mnt)
        check(r.returncode != 0 and "neither an ETag nor a Last-Modified" in r.stderr
              and "00002" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
              "a shard without validators: output= refused in one line naming it: %r" % r.stderr)
        check(not os.path.ismount(mnt) and not glob.glob(os.path.join(d, ".out*")),
              "nothing mounted, no staging")
        r = run([BIN, "ls", url], env=dict(os.environ, BURNSTORE_HTTP_UNVALIDATED="1"))
        check(r.returncode == 0, "read-only, unvalidated, the same URL lists: %r" % r.stderr)


def killed_then_finish(tmp, ng):
    d = os.path.join(tmp, "killed")
    os.makedirs(d)
    src = model(os.path.join(ng.root, "k.safetensors"), 2)
    out = os.path.join(d, "out.safetensors")
    mnt = os.path.join(d, "mnt")
    with Mount(ng.url("k.safetensors"), mnt, "rw,output=" + out) as m:
        want = edit(d, m)(src)
        time.sleep(WINDOW + 0.5)
        kill_daemon(m)
    check(not os.path.exists(out), "killed while mounted: no output yet")
    stg = glob.glob(os.path.join(d, ".out.safetensors.staging-*"))
    if not check(len(stg) == 1, "one staging directory left: %r" % stg):
        return
    r = run([BIN, "--finish", stg[0]])
    check(r.returncode == 0, "--finish of a remote source's staging: %r" % r.stderr)
    check(os.path.exists(out) and tensors(out) == want, "--finish wrote the same output")
    check(not os.path.exists(stg[0]), "--finish removed the staging directory")


def unvalidated_finish(tmp, _ng):
    """A server that gives no ETag, only Last-Modified, mounted with -o
    unvalidated: --finish after kill -9 reads it the same way (the INDEX's
    validator says how), not refused for want of a strong ETag."""
    d = os.path.join(tmp, "unvalidated")
    os.makedirs(d)
    ng = Nginx(d)
    ng.extra["server"] = "location /ne/ { alias %s/; etag off; }" % ng.root
    with ng:
        src = model(os.path.join(ng.root, "u.safetensors"), 4)
        url = ng.url("ne/u.safetensors")
        out = os.path.join(d, "out.safetensors")
        mnt = os.path.join(d, "mnt")
        with Mount(url, mnt, "rw,unvalidated,output=" + out) as m:
            want = edit(d, m)(src)
            time.sleep(WINDOW + 0.5)
            kill_daemon(m)
        stg = glob.glob(os.path.join(d, ".out.safetensors.staging-*"))
        if not check(len(stg) == 1, "one staging directory left: %r" % stg):
            return
        env = {k: v for k, v in os.environ.items() if k != "BURNSTORE_HTTP_UNVALIDATED"}
        r = run([BIN, "--finish", stg[0]], env=env)
        check(r.returncode == 0, "--finish of an unvalidated mount's staging: %r" % r.stderr)
        check(os.path.exists(out) and tensors(out) == want, "--finish wrote the same output")
        check(not os.path.exists(stg[0]), "--finish removed the staging directory")


def changed_then_finish(tmp, ng):
    d = os.path.join(tmp, "changed")
    os.makedirs(d)
    path = os.path.join(ng.root, "c.safetensors")
    model(path, 3)
    url = ng.url("c.safetensors")
    out = os.path.join(d, "out.safetensors")
    mnt = os.path.join(d, "mnt")
    with Mount(url, mnt, "rw,output=" + out) as m:
        edit(d, m)
        time.sleep(WINDOW + 0.5)
        kill_daemon(m)
    # replaced on the server, same size: only its ETag (mtime) tells
    model(path + ".new", 3)
    os.utime(path + ".new", (time.time() + 10, time.time() + 10))
    os.rename(path + ".new", path)
    stg = glob.glob(os.path.join(d, ".out.safetensors.staging-*"))
    if not check(len(stg) == 1, "one staging directory left: %r" % stg):
        return
    r = run([BIN, "--finish", stg[0]])
    check(r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and url in r.stderr
          and "changed" in r.stderr,
          "the object changed: --finish refuses in one line naming the URL: %r" % r.stderr)
    check(not os.path.exists(out), "nothing written")
    check(os.path.exists(os.path.join(stg[0], "JOURNAL")), "the staging is kept")
    shutil.rmtree(stg[0])


def refusals(tmp, ng):
    d = os.path.join(tmp, "refused")
    os.makedirs(d)
    model(os.path.join(ng.root, "r.safetensors"), 4)
    mnt = os.path.join(d, "mnt")
    os.makedirs(mnt)
    r = run([BIN, ng.url("r.safetensors"), mnt, "-o", "rw"])
    check(r.returncode != 0 and "in place" in r.stderr and "output=" in r.stderr
          and len(r.stderr.strip().splitlines()) == 1, "-o rw of a URL: one line: %r" % r.stderr)
    out = os.path.join(d, "out.safetensors")
    secret = "http://user:hunter2@127.0.0.1:%d/r.safetensors" % ng.port
    r = run([BIN, secret, mnt, "-o", "output=" + out])
    check(r.returncode != 0 and "credentials" in r.stderr and "hunter2" not in r.stderr
          and len(r.stderr.strip().splitlines()) == 1,
          "a URL with a password and output=: refused in one line: %r" % r.stderr)
    check(not os.path.ismount(mnt) and not glob.glob(os.path.join(d, ".out*")),
          "nothing mounted, no staging")


def hub_output(tmp, ng):
    """hf:// written to a local file; the staging records the pinned commit,
    so --finish reads that commit after main moved."""
    d = os.path.join(tmp, "hub")
    os.makedirs(d)
    with Hub(d) as hub:
        a = model(os.path.join(d, "a.safetensors"), 5)
        model(os.path.join(d, "b.safetensors"), 6)
        hub.put("org/w", COMMIT_A, os.path.join(d, "a.safetensors"), "m.safetensors")
        hub.put("org/w", COMMIT_B, os.path.join(d, "b.safetensors"), "m.safetensors")
        out = os.path.join(d, "out.safetensors")
        mnt = os.path.join(d, "mnt")
        with Env(hf_env(hub)):
            with Mount("hf://org/w/m.safetensors", mnt, "rw,output=" + out) as m:
                want = edit(d, m)(a)
                time.sleep(WINDOW + 0.5)
                stg = glob.glob(os.path.join(d, ".out.safetensors.staging-*"))
                journal = open(os.path.join(stg[0], "JOURNAL"), "rb").read() if stg else b""
                check(("hf://org/w@%s/m.safetensors" % COMMIT_A).encode() in journal,
                      "the journal records the URL at its pinned commit")
                kill_daemon(m)
            hub.move_main(COMMIT_B, 2)
            r = run([BIN, "--finish", stg[0]] if stg else [BIN, "--finish", "/nonexistent"])
        check(r.returncode == 0, "--finish of an hf:// source: %r" % r.stderr)
        check(os.path.exists(out) and tensors(out) == want,
              "--finish wrote the pinned commit's bytes (main moved meanwhile)")


def main():
    if not os.path.exists(NGINX):
        print("SKIP: no nginx (Debian's nginx-light; .ci/install-deps installs it)")
        sys.exit(77)

    def with_nginx(t):
        def go(tmp):
            with Nginx(tmp) if t is not hub_output else _Nothing() as ng:
                t(tmp, ng)
        go.__name__ = t.__name__
        return go

    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("deadline")))
    signal.alarm(600)
    run_tests("test_remote_write", [with_nginx(t) for t in (
        http_output, sharded_output, shard_without_validator, killed_then_finish,
        unvalidated_finish, changed_then_finish, refusals, hub_output)],
        "remote-write")


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
