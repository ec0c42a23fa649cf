"""URL sources against more servers of our own on 127.0.0.1 that lie
(tests/support/httpfault.py Hostile, Raw: answers written byte for byte),
found by the review of issue 31. Each case failed on the code before it:

  redirect_body    a 302 (or 301, 307) whose body never ends: libcurl
                   drains the body of a redirect it follows for the whole
                   http_timeout (GBs read) before the next hop; now cut at
                   64 KiB, one line naming the status, at once
"""
import os
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../support"))
from bsmount import BIN, check, run_tests, write_safetensors  # noqa: E402
from httpfault import Hostile, range_answer  # noqa: E402


def st_bytes(tmp, tensors):
    path = os.path.join(tmp, "x.safetensors")
    write_safetensors(path, tensors)
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return data


def header_len(data):
    return 8 + struct.unpack("<Q", data[:8])[0]


def cli(args, env=None, timeout=120):
    t = time.time()
    r = subprocess.run([BIN] + args, capture_output=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return r.returncode, r.stdout, r.stderr.decode(errors="replace"), time.time() - t


def one_line(err, what):
    lines = [x for x in err.splitlines() if x.strip()]
    check(len(lines) == 1, "%s: one line: %r" % (what, lines))
    return lines[0] if lines else ""


def opening(hs):
    return hs.get("range", "").startswith("bytes=0-")


def endless(chunk=b"y" * 65536):
    return iter(lambda: chunk, None)


# ---- a redirect's endless body ----------------------------------------------

def redirect_body(tmp):
    data = st_bytes(tmp, {"t": os.urandom(3 << 20)})
    tensor = data[header_len(data):]
    env = {"BURNSTORE_HTTP_TIMEOUT": "10"}
    for status in (301, 302, 307):
        for when in ("open", "later"):
            def answer(method, path, hs, n, status=status, when=when):
                if path.endswith("/real") or (when == "later" and opening(hs)):
                    return range_answer(data, hs, etag='"1"')
                return status, [("Location", "/real")], endless()
            with Hostile(answer) as srv:
                rc, out, err, took = cli(["cat", srv.url("m.safetensors"), "t"], env=env)
                what = "%d with an endless body (%s)" % (status, when)
                line = one_line(err, what)
                check(rc != 0 and out == b"" and str(status) in line,
                      "%s: refused, naming the status (rc %d): %r" % (what, rc, line))
                check(took < 3 and srv.sent < (64 << 20),
                      "%s: not drained: %.1f s, %d bytes sent" % (what, took, srv.sent))
    # a redirect with a body of its own (under 64 KiB) is still followed
    def small(method, path, hs, n):
        if path.endswith("/real"):
            return range_answer(data, hs, etag='"1"')
        return 302, [("Location", "/real")], b"moved\n" * 5000
    with Hostile(small) as srv:
        rc, out, err, _ = cli(["cat", srv.url("m.safetensors"), "t"], env=env)
        check(rc == 0 and out == tensor, "a redirect's 30 KB body: followed (rc %d): %r" % (rc, err))


def main():
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("deadline")))
    signal.alarm(900)
    run_tests("test_remote_lies", [redirect_body], "rlies")


if __name__ == "__main__":
    main()
