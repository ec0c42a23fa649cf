"""URL sources against more servers of our own on 127.0.0.1 that lie
(tests/support/httpfault.py Hostile, Raw: answers written byte for byte),
found by the review of issue 31. Each case failed on the code before it:

  redirect_body    a 302 (or 301, 307) whose body never ends: libcurl
                   drains the body of a redirect it follows for the whole
                   http_timeout (GBs read) before the next hop; now cut at
                   64 KiB, one line naming the status, at once
  twice            an answer with two Content-Range, ETag, Last-Modified or
                   Content-Length headers that differ (the last one was
                   taken: `ETag: "2"` then `ETag: "1"` read as "1", exit
                   0): refused in one line naming the header, at open and
                   on later ranges; the same header twice with one value
                   is read
  no_size          under BURNSTORE_HTTP_UNVALIDATED=1 (the size being what
                   is compared) an answer without the size (`bytes A-B/*`,
                   a 200 in chunks) swapping the object: the read mixed
                   the two, exit 0; now the read fails, `without its size`
  open_range       the opening request (bytes 0-65535) answered with bytes
                   0-131071 or 5-65540: refused as "short body: 65536 of
                   65536 bytes"; now "another range than asked", naming
                   both; a 412 to it (which sets no precondition) said
                   "the object changed on the server"
  huge_header      a header line of 1 MiB (libcurl's bound is 100 KiB):
                   the read failed with "Out of memory", now with a line
                   saying a header line is over 100 KiB
  slow_dns         a name whose resolution hangs (tests/preload/slowdns.c
                   LD_PRELOADed: getaddrinfo sleeps 20 s), http_timeout=2:
                   the request ended at 2 s but libcurl joined the resolver
                   thread, so `ls` took 20 s (and the client's one thread,
                   every other request, waited with it); now 2 s, one line
"""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../support"))
from bsmount import check, run_tests  # noqa: E402
from httpfault import Hostile, range_answer  # noqa: E402
from test_remote_hostile import LM1, LM2, cli, header_len, one_line, st_bytes  # noqa: E402


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


# ---- headers given twice --------------------------------------------------

def twice(tmp):
    data = st_bytes(tmp, {"t": os.urandom(3 << 20)})
    tensor = data[header_len(data):]

    def cr(hh):
        return [v for k, v in hh if k == "Content-Range"][0]

    def length(hh, body):
        return str(len(body))
    cases = {  # what the lying answer adds: (header, another value)
        "Content-Range": lambda hh, body: ("Content-Range", "bytes 0-9/%d" % len(data)),
        "ETag": lambda hh, body: ("ETag", '"2"'),
        "Last-Modified": lambda hh, body: ("Last-Modified", LM2),
        "Content-Length": lambda hh, body: ("Content-Length", str(len(body) + 7)),
    }
    for name, other in cases.items():
        for when in ("open", "later"):
            def answer(method, path, hs, n, other=other, when=when):
                st, hh, body = range_answer(data, hs, etag='"1"', lastmod=LM1)
                if when == "later" and opening(hs):
                    return st, hh, body
                k, v = other(hh, body)
                # the other value first, the right one last (which was taken);
                # (Hostile adds the right Content-Length after these)
                if k != "Content-Length":
                    hh = [(a, b) for a, b in hh if a != k] + [(k, v)] + [(a, b) for a, b in hh if a == k]
                else:
                    hh = hh + [(k, v)]
                return st, hh, body
            with Hostile(answer) as srv:
                rc, out, err, _ = cli(["cat", srv.url("m.safetensors"), "t"])
                what = "two %s headers (%s)" % (name, when)
                line = one_line(err, what)
                check(rc != 0 and out == b"", "%s: refused (rc %d, %d bytes)" % (what, rc, len(out)))
                check(name in line and "two" in line, "%s: the line names the header: %r" % (what, line))
    # the same value twice: read
    def same_twice(method, path, hs, n):
        st, hh, body = range_answer(data, hs, etag='"1"', lastmod=LM1)
        return st, hh + [(k, v) for k, v in hh if k in ("ETag", "Content-Range", "Last-Modified")], body
    with Hostile(same_twice) as srv:
        rc, out, err, _ = cli(["cat", srv.url("m.safetensors"), "t"])
        check(rc == 0 and out == tensor, "the same headers twice: read (rc %d): %r" % (rc, err))


# ---- an answer without the size, under unvalidated ------------------------

def no_size(tmp):
    size = 3 << 20
    v1 = st_bytes(tmp, {"t": os.urandom(size)})
    v2 = st_bytes(tmp, {"t": os.urandom(size)}) + b"\0" * 4096
    env = {"BURNSTORE_HTTP_UNVALIDATED": "1"}

    def star(method, path, hs, n, reads={"n": 0}):
        if opening(hs):
            return range_answer(v1, hs)
        reads["n"] += 1
        data = v1 if reads["n"] < 2 else v2
        st, hh, body = range_answer(data, hs)
        return st, [(k, v[:v.rindex("/")] + "/*" if k == "Content-Range" else v) for k, v in hh], body

    def chunked200(method, path, hs, n, reads={"n": 0}):
        if opening(hs):
            return range_answer(v1, hs)
        reads["n"] += 1
        data = v1 if reads["n"] < 2 else v2
        return 200, [], iter([data[i:i + 65536] for i in range(0, len(data), 65536)])
    for what, answer in (("bytes A-B/*", star), ("a 200 in chunks", chunked200)):
        with Hostile(answer) as srv:
            rc, out, err, _ = cli(["cat", srv.url("m.safetensors"), "t"], env=env)
            check(rc != 0, "%s, the object swapped: the read fails (rc %d)" % (what, rc))
            t2 = v2[header_len(v2):]
            check(all(out[i:i + 4096] != t2[i:i + 4096] for i in range(0, len(out), 4096)),
                  "%s: no block of the new object" % what)
            check("size" in err, "%s: said why: %r" % (what, err))


# ---- the opening range ------------------------------------------------------

def open_range(tmp):
    data = st_bytes(tmp, {"t": os.urandom(1 << 20)})
    cases = {
        "more than asked": (0, 131071, "bytes 0-131071"),
        "shifted": (5, 65540, "bytes 5-65540"),
    }
    for what, (a, b, said) in cases.items():
        def answer(method, path, hs, n, a=a, b=b):
            if opening(hs):
                return 206, [("ETag", '"1"'), ("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))], data[a:b + 1]
            return range_answer(data, hs, etag='"1"')
        with Hostile(answer) as srv:
            rc, out, err, _ = cli(["ls", srv.url("m.safetensors")])
            line = one_line(err, "open: %s" % what)
            check(rc != 0 and "another range than asked" in line and said in line,
                  "open: %s: said so (rc %d): %r" % (what, rc, line))
    with Hostile(lambda m, p, hs, n: (412, [], b"")) as srv:
        rc, out, err, _ = cli(["ls", srv.url("m.safetensors")])
        line = one_line(err, "open: 412")
        check(rc != 0 and "412" in line and "changed" not in line, "open: 412: said so: %r" % line)


# ---- a header line over libcurl's bound -------------------------------------

def huge_header(tmp):
    data = st_bytes(tmp, {"t": os.urandom(3 << 20)})
    for when in ("open", "later"):
        def answer(method, path, hs, n, when=when):
            st, hh, body = range_answer(data, hs, etag='"1"')
            if when == "open" or not opening(hs):
                hh = hh + [("X-Big", "a" * (1 << 20))]
            return st, hh, body
        with Hostile(answer) as srv:
            rc, out, err, took = cli(["cat", srv.url("m.safetensors"), "t"])
            line = one_line(err, "huge header (%s)" % when)
            check(rc != 0 and "header line" in line and "100 KiB" in line,
                  "huge header (%s): said so (rc %d): %r" % (when, rc, line))


# ---- a resolver that hangs --------------------------------------------------

def slow_dns(tmp):
    data = st_bytes(tmp, {"t": os.urandom(1 << 20)})
    shim = os.environ.get("BS_SLOWDNS", "")
    if not check(os.path.exists(shim), "slow_dns: BS_SLOWDNS names the preload shim: %r" % shim):
        return
    # (the shim comes before a sanitizer's runtime in the library list)
    asan = os.environ.get("ASAN_OPTIONS", "")
    env = {"LD_PRELOAD": shim, "BS_SLOWDNS_S": "20", "BURNSTORE_HTTP_TIMEOUT": "2",
           "ASAN_OPTIONS": (asan + ":" if asan else "") + "verify_asan_link_order=0"}
    with Hostile(lambda m, p, hs, n: range_answer(data, hs, etag='"1"')) as srv:
        url = "http://slowdns.test:%d/m.safetensors" % srv.port
        rc, out, err, took = cli(["ls", url], env=env)
        line = one_line(err, "slow dns")
        check(rc != 0 and ("Resolving" in line or "no answer" in line),
              "slow dns: refused in one line (rc %d): %r" % (rc, line))
        check(took < 2 + 2.5, "slow dns: within http_timeout=2: %.1f s" % took)


def main():
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("deadline")))
    signal.alarm(900)
    run_tests("test_remote_lies", [redirect_body, twice, no_size, open_range, huge_header, slow_dns], "rlies")


if __name__ == "__main__":
    main()
