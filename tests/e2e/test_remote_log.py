"""Where a URL source's read failures are told (issue 31, items 5, 7 and 10),
through the fault-injecting proxy (tests/support/httpfault.py) in front of
a real nginx on 127.0.0.1:

- a daemon-mode mount (not -f: its stderr is /dev/null once detached)
  whose server then answers 503: the read gets EIO, and `burnstore status`
  shows the line saying which URL, offset and why (it said "(nothing
  logged)");
- a writable mount into a local output= whose write-back cannot read a
  kept tensor from the server: `burnstore -u -v` and the log kept in the
  staging directory name the tensor, the URL and the HTTP status (they
  said only "Input/output error");
- a hostile server whose ETag holds terminal escapes and other control
  bytes, then changes: the log file, `status`, the foreground daemon's
  stderr and the CLI's error show '?' for each, never the raw bytes;
- the CLI (cat, diff, convert, ls, info) prints exactly one line for a
  read failure (it printed the source's line, then its own).
Everything under deadlines; mounts always unmounted, servers stopped."""
import errno
import glob
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../support"))
from bsmount import (BIN, Mount, check, foreground_mount, run, run_tests,  # noqa: E402
                     write_safetensors)
from httpfault import FaultProxy, Nginx  # noqa: E402

# An ETag a hostile server sends: ESC [31m (red), BEL, BS, TAB, DEL and C1's
# CSI written as UTF-8 (U+009B, which some terminals obey as ESC [).
HOSTILE = b'"v1\x1b[31mred\x07\x08\t\x7f\xc2\x9bX"'
SHOWN = '"v1?[31mred??????X"'  # (BEL BS TAB DEL, and the C1 character's two bytes)
RAW = ("\x1b", "\x07", "\x08", "\x7f", "\x9b", "\u009b")


def model(ng, name, pad=0):
    ts = {"a": os.urandom(3 << 20), "b": os.urandom(4096), "c": os.urandom(1 << 20)}
    write_safetensors(ng.path(name), ts, pad)
    return ts


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        return e.errno


def status(mnt):
    r = run([BIN, "status", mnt])
    check(r.returncode == 0, "status %s: %s" % (mnt, r.stderr))
    return r.stdout


def log_path(st):
    """The mount's log file, as `status` names it."""
    for line in st.splitlines():
        if line.startswith("log ") and line.endswith(":"):
            return line[4:-1]
    return None


def clean(what, text):
    bad = [c for c in RAW if c in text]
    return check(not bad, "%s: no raw control character %r in %r" % (what, bad, text[-600:]))


def daemon_read_failure(tmp):
    """Item 5: a daemon-mode mount's read failure reaches its log."""
    with Nginx(tmp) as ng, FaultProxy(ng.port) as px:
        model(ng, "m.safetensors")
        mnt = os.path.join(tmp, "mnt-daemon")
        with Mount(px.url("m.safetensors"), mnt, "ro,http_timeout=2") as m:
            px.arm("503")
            got = read(os.path.join(m, "a"))
            check(got == errno.EIO, "the read of a tensor whose server answers 503 gets EIO: %r"
                  % (got if isinstance(got, int) else len(got)))
            st = status(m)
        lines = [x for x in st.splitlines() if "read of" in x]
        check(lines and "(nothing logged)" not in st, "status shows the failed read: %r" % st)
        check(any(px.url("m.safetensors") in x and "HTTP 503" in x and "2 s" in x for x in lines),
              "the line names the URL, the timeout and the HTTP status: %r" % lines)


def writeback_reason(tmp):
    """Item 5: a failed write-back says which tensor, URL and why."""
    with Nginx(tmp) as ng, FaultProxy(ng.port) as px:
        model(ng, "w.safetensors")
        d = os.path.join(tmp, "wb")
        os.makedirs(d)
        out = os.path.join(d, "out.safetensors")
        mnt = os.path.join(d, "mnt")
        with Mount(px.url("w.safetensors"), mnt, "rw,output=%s,http_timeout=2" % out) as m:
            os.unlink(os.path.join(m, "b"))  # (something to write)
            px.arm("503")
            r = run([BIN, "-u", "-v", m], timeout=120)
            m.mount.unmount_result = r
        err = r.stderr + r.stdout
        print("   -u:", r.stderr.strip()[:700])
        check(r.returncode != 0, "the write-back failed (exit %d)" % r.returncode)
        check("tensor 'a'" in r.stderr and px.url("w.safetensors") in r.stderr
              and "HTTP 503" in r.stderr,
              "-u names the tensor, the URL and the HTTP status: %r" % r.stderr)
        check("Input/output error" not in err, "not a bare 'Input/output error': %r" % err)
        check(not os.path.exists(out), "the output was not written")
        logs = glob.glob(os.path.join(d, ".out.safetensors.staging-*", "log"))
        text = open(logs[0]).read() if logs else ""
        check("tensor 'a'" in text and "HTTP 503" in text,
              "the staging directory's log says why: %r" % text)


def hostile_etag(tmp):
    """Item 7: an ETag's control characters are replaced wherever it is shown."""
    with Nginx(tmp) as ng, FaultProxy(ng.port) as px:
        model(ng, "e.safetensors")
        url = px.url("e.safetensors")
        # at open: no strong ETag (a control character is no part of one),
        # refused in one line that does not repeat it
        px.set_etags(HOSTILE, b'"v2"')
        r = subprocess.run([BIN, "ls", url], capture_output=True, timeout=60)
        e = r.stderr.decode("latin-1")
        check(r.returncode != 0 and len(e.splitlines()) == 1 and "no strong ETag" in e,
              "an opening ETag with control characters: refused in one line: %r" % e)
        clean("the refusal", e)
        # later: the answers' ETag changed to it, shown escaped
        px.set_etags(b'"v1"', HOSTILE)
        # the daemon: its log file and status
        mnt = os.path.join(tmp, "mnt-etag")
        with Mount(url, mnt, "ro") as m:
            check(read(os.path.join(m, "a")) == errno.EIO, "a changed ETag fails the read")
            st = status(m)
            lp = log_path(st)
            raw = open(lp, "rb").read().decode("latin-1") if lp and os.path.exists(lp) else ""
        check("ETag changed" in st and SHOWN in st, "status shows the ETag, escaped: %r" % st)
        clean("status", st)
        check(SHOWN in raw, "the log file has the line: %r" % raw)
        clean("the log file", raw)
        # the foreground daemon's stderr
        with foreground_mount(url, os.path.join(tmp, "mnt-etag-f"), "ro") as p:
            check(read(os.path.join(tmp, "mnt-etag-f", "a")) == errno.EIO, "-f: EIO")
        ferr = p.stderr.read().decode("latin-1")
        check(SHOWN in ferr, "-f: the line on stderr: %r" % ferr)
        clean("-f stderr", ferr)
        # the CLI: one line, escaped
        r = subprocess.run([BIN, "cat", url, "a"], capture_output=True, timeout=60)
        e = r.stderr.decode("latin-1")
        check(r.returncode != 0 and len(e.splitlines()) == 1 and SHOWN in e,
              "cat: one line naming the ETag, escaped: %r" % e)
        clean("cat's stderr", e)


def cli_one_line(tmp):
    """Item 10: a CLI read failure is one line: the command's, with the
    source's reason in it."""
    with Nginx(tmp) as ng, FaultProxy(ng.port) as px:
        model(ng, "c.safetensors")
        model(ng, "big.safetensors", pad=200000)  # (a header past the opening 64 KiB)
        local = os.path.join(tmp, "local.safetensors")
        write_safetensors(local, {"a": b"x" * (3 << 20), "b": b"y" * 4096, "c": b"z" * (1 << 20)})
        env = dict(os.environ, BURNSTORE_HTTP_TIMEOUT="2")
        px.arm("503")
        url, big = px.url("c.safetensors"), px.url("big.safetensors")
        out = os.path.join(tmp, "out.safetensors")
        for what, cmd in (("cat", ["cat", url, "a"]), ("diff", ["diff", url, local]),
                          ("convert", ["convert", "-q", url, out]), ("ls", ["ls", big]),
                          ("info", ["info", big])):
            r = run([BIN] + cmd, env=env, timeout=60)
            lines = r.stderr.splitlines()
            print("   %s:" % what, r.stderr.strip())
            check(r.returncode != 0 and len(lines) == 1 and "HTTP 503" in r.stderr
                  and "read" in r.stderr,
                  "%s: exactly one line, with the reason: %r" % (what, r.stderr))
        check(not os.path.exists(out), "convert wrote nothing")


if __name__ == "__main__":
    run_tests("test_remote_log", [daemon_read_failure, writeback_reason, hostile_etag,
                                  cli_one_line], "remote-log")
