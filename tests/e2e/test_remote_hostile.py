"""URL sources against servers of our own on 127.0.0.1 that lie, swap the
object, stall and send what was not asked for (tests/support/httpfault.py
Hostile; issue 31). Each case failed on the code before it:

  huge_size        a Content-Range total near 2^64 (the block arithmetic
                   wrapped: `cat` printed bytes the server never sent):
                   refused at open, over 2^62
  mixed_versions   the object swapped after the first read by a server that
                   ignores If-*: with only Last-Modified, a weak ETag, a weak
                   ETag and Last-Modified, a strong ETag missing from later
                   answers, an ETag too long to keep, no validator (the reads
                   mixed two versions with exit 0): refused at open naming
                   -o unvalidated / BURNSTORE_HTTP_UNVALIDATED, or the read
                   fails; with the option the size and Last-Modified of
                   every answer are compared, and `status` says unvalidated
  shards_bounded   an index whose shards stall, answer 404 or 503 with
                   Retry-After: 10: the open fails within about one
                   http_timeout naming a shard; shards cost at most 2
                   requests each (the opening block was evicted before its
                   header was read: 3)
  stuck_reads      one tensor's ranges stalled, 24 readers stuck on it:
                   stat, listing and another tensor's read are not delayed
                   (libfuse's 10 workers were all blocked), the stuck
                   readers fail within one http_timeout
  unmount_quick    `burnstore -u` with a reader of a stalled range killed:
                   returns in about a second (it waited out the request)
  answers          an object whose size changes mid-read, a 0-byte object
                   (416 to the opening range), a 404 with an endless body,
                   a 206 with Content-Encoding: gzip: each its own one-line
                   error; a Content-Range longer than 127 characters is read
"""
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../support"))
from bsmount import (BIN, Mount, check, force_unmount, foreground_mount, is_mounted,  # noqa: E402
                     run, run_tests, write_safetensors)
from httpfault import Hostile, Stall, range_answer  # noqa: E402

LM1 = "Mon, 01 Jan 2024 00:00:00 GMT"
LM2 = "Tue, 02 Jan 2024 00:00:00 GMT"


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


# ---- item 1 -----------------------------------------------------------------

def gguf_far(top):
    """A GGUF of two F32 tensors: `top` at the data section's start, `end`
    1 MiB below 2^64 (what a file of 18446744073709551614 bytes may hold)."""
    def s(x):
        return struct.pack("<Q", len(x)) + x
    infos = b""
    start_guess = 4 + 4 + 8 + 8
    for name, n in ((b"top", len(top) // 4), (b"end", 256)):
        infos += s(name) + struct.pack("<I", 1) + struct.pack("<Q", n) + struct.pack("<I", 0)
        infos += b"OFFS"  # patched below
    head = b"GGUF" + struct.pack("<I", 3) + struct.pack("<Q", 2) + struct.pack("<Q", 0) + infos
    pad = (-len(head)) % 32
    data_start = len(head) + pad
    end_off = ((1 << 64) - (1 << 20) - data_start) // 32 * 32
    parts = head.split(b"OFFS")
    head = parts[0] + struct.pack("<Q", 0) + parts[1] + struct.pack("<Q", end_off) + parts[2]
    del start_guess
    return head + b"\0" * pad + top


def huge_size(tmp):
    top = os.urandom(1024)
    data = gguf_far(top)
    total = 18446744073709551614

    def answer(method, path, hs, n):
        return range_answer(data, hs, total=total, etag='"v1"')
    with Hostile(answer) as srv:
        url = srv.url("far.gguf")
        rc, out, err, _ = cli(["cat", url, "top"], env={"BURNSTORE_HTTP_TIMEOUT": "5"})
        check(rc != 0 and out == b"", "huge size: cat refused (rc %d, %d bytes out)" % (rc, len(out)))
        line = one_line(err, "huge size")
        check("18446744073709551614" in line and "2^62" in line,
              "huge size: the line names the size and the bound: %r" % line)
        rc, out, err, _ = cli(["convert", url, os.path.join(tmp, "far.safetensors")],
                              env={"BURNSTORE_HTTP_CACHE": "1M", "BURNSTORE_HTTP_TIMEOUT": "5"})
        check(rc != 0 and not os.path.exists(os.path.join(tmp, "far.safetensors")),
              "huge size: convert refused, nothing written (rc %d)" % rc)
        mnt = os.path.join(tmp, "mnt-far")
        os.makedirs(mnt, exist_ok=True)
        r = run([BIN, url, mnt])
        force_unmount(mnt)
        check(r.returncode != 0 and "2^62" in r.stderr, "huge size: the mount refused: %r" % r.stderr)


# ---- item 2 -----------------------------------------------------------------

def swapping(v1, v2, hdr1, hdr2):
    """A server answering with v1 (and its validators hdr1) until its first
    ranged read past the opening one, then with v2 (hdr2); If-* ignored."""
    state = {"reads": 0}

    def answer(method, path, hs, n):
        rng = hs.get("range", "")
        first = rng.startswith("bytes=0-")
        if not first:
            state["reads"] += 1
        new = state["reads"] > 1
        data, h = (v2, hdr2) if new else (v1, hdr1)
        st, hh, body = range_answer(data, hs)
        return st, hh + h, body
    return answer


def mixed_versions(tmp):
    size = 3 << 20
    v1 = st_bytes(tmp, {"t": os.urandom(size)})
    v2 = st_bytes(tmp, {"t": os.urandom(size)})
    check(len(v1) == len(v2), "two versions of one size")
    long_tag = '"' + "a" * 300 + '"'
    refused = {  # validators given: refused at open without the option
        "only Last-Modified": ([("Last-Modified", LM1)], [("Last-Modified", LM2)]),
        "a weak ETag": ([("ETag", 'W/"1"')], [("ETag", 'W/"2"')]),
        "a weak ETag and Last-Modified": ([("ETag", 'W/"1"'), ("Last-Modified", LM1)],
                                          [("ETag", 'W/"2"'), ("Last-Modified", LM2)]),
        "an ETag too long to keep": ([("ETag", long_tag)], [("ETag", long_tag[:-2] + 'b"')]),
        "no validator": ([], []),
    }
    for what, (h1, h2) in refused.items():
        with Hostile(swapping(v1, v2, h1, h2)) as srv:
            rc, out, err, _ = cli(["cat", srv.url("m.safetensors"), "t"])
            check(rc != 0 and out == b"", "%s: refused (rc %d, %d bytes)" % (what, rc, len(out)))
            line = one_line(err, what)
            check("unvalidated" in line and "BURNSTORE_HTTP_UNVALIDATED" in line,
                  "%s: the line names -o unvalidated and the variable: %r" % (what, line))
    # a strong ETag, then answers without it: the read fails, nothing mixed
    with Hostile(swapping(v1, v2, [("ETag", '"1"')], [])) as srv:
        rc, out, err, _ = cli(["cat", srv.url("m.safetensors"), "t"])
        check(rc != 0, "strong ETag missing later: the read fails (rc %d)" % rc)
        check(v2[header_len(v2):][:1 << 16] not in out, "strong ETag missing later: no byte of v2")
        check("ETag" in err and "changed" in err, "strong ETag missing later: said why: %r" % err)
    # accepted with BURNSTORE_HTTP_UNVALIDATED=1: the size and Last-Modified compared
    for what, h1, h2, w2 in (("Last-Modified changes", [("Last-Modified", LM1)],
                              [("Last-Modified", LM2)], v2),
                             ("the size changes", [], [], v2 + b"\0" * 4096),
                             ("weak ETag changes", [("ETag", 'W/"1"')], [("ETag", 'W/"2"')], v2)):
        with Hostile(swapping(v1, w2, h1, h2)) as srv:
            rc, out, err, _ = cli(["cat", srv.url("m.safetensors"), "t"],
                                  env={"BURNSTORE_HTTP_UNVALIDATED": "1"})
            check(rc != 0, "unvalidated, %s: the read fails (rc %d)" % (what, rc))
            check(v2[header_len(v2):][:1 << 16] not in out, "unvalidated, %s: no byte of v2" % what)
            check("changed" in err, "unvalidated, %s: said so: %r" % (what, err))
    # ... and the same object read whole when nothing changes
    def same(method, path, hs, n):
        st, hh, body = range_answer(v1, hs)
        return st, hh + [("Last-Modified", LM1)], body
    with Hostile(same) as srv:
        rc, out, err, _ = cli(["cat", srv.url("m.safetensors"), "t"],
                              env={"BURNSTORE_HTTP_UNVALIDATED": "1"})
        check(rc == 0 and out == v1[header_len(v1):], "unvalidated, unchanged: read whole (%d)" % rc)
        mnt = os.path.join(tmp, "mnt-unval")
        os.makedirs(mnt, exist_ok=True)
        r = run([BIN, srv.url("m.safetensors"), mnt])
        check(r.returncode != 0 and "unvalidated" in r.stderr, "mount without -o unvalidated refused")
        with Mount(srv.url("m.safetensors"), mnt, "unvalidated") as m:
            check(open(os.path.join(m, "t"), "rb").read() == v1[header_len(v1):],
                  "-o unvalidated: the tensor read")
            st = run([BIN, "status", m])
            check(st.returncode == 0 and "unvalidated" in st.stdout,
                  "status says the mount is unvalidated: %r" % st.stdout)


# ---- item 3 -----------------------------------------------------------------

def index_of(tmp, n):
    """An index of n one-tensor shards, and the shards' bytes."""
    shards, wmap = {}, {}
    for i in range(n):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, n)
        shards[name] = st_bytes(tmp, {"s%d" % i: struct.pack("<f", i)})
        wmap["s%d" % i] = name
    index = json.dumps({"metadata": {}, "weight_map": wmap}).encode()
    return index, shards


def shards_bounded(tmp):
    n = 64
    index, shards = index_of(tmp, n)

    def serve(bad):
        def answer(method, path, hs, k):
            name = path.rsplit("/", 1)[1]
            if name == "model.safetensors.index.json":
                return range_answer(index, hs, etag='"idx"')
            return bad(name, hs)
        return answer
    cases = [
        ("stall", lambda name, hs: (206, [("Content-Range", "bytes 0-65535/70000")], Stall(b"x")),
         {"BURNSTORE_HTTP_TIMEOUT": "2"}, 2, "no answer"),
        ("404", lambda name, hs: (404, [], b"no\n"), {"BURNSTORE_HTTP_TIMEOUT": "20"}, 0, "404"),
        ("503", lambda name, hs: (503, [("Retry-After", "10")], b"busy\n"),
         {"BURNSTORE_HTTP_TIMEOUT": "3"}, 3, "503"),
    ]
    for what, bad, env, bound, word in cases:
        with Hostile(serve(bad)) as srv:
            rc, out, err, took = cli(["ls", srv.url("model.safetensors.index.json")], env=env)
            check(rc != 0, "%s shards: refused (rc %d)" % (what, rc))
            check(took < bound + 2.5, "%s shards: within one timeout (%d s): %.1f s" % (what, bound, took))
            line = one_line(err, "%s shards" % what)
            check(word in line and "model-0" in line, "%s shards: the line names a shard: %r" % (what, line))
    # requests: an index of 300 shards (more than the 64 blocks of the cache)
    n = 300
    index, shards = index_of(tmp, n)

    def honest(method, path, hs, k):
        name = path.rsplit("/", 1)[1]
        data = index if name == "model.safetensors.index.json" else shards[name]
        return range_answer(data, hs, etag='"%s"' % name)
    with Hostile(honest) as srv:
        rc, out, err, took = cli(["ls", srv.url("model.safetensors.index.json")])
        check(rc == 0 and out.decode().split().count("s0") == 1, "300 shards listed (rc %d): %s" % (rc, err))
        per = sum(1 for r in srv.requests if "model-" in r[1])
        check(per <= 2 * n, "300 shards: %d requests (<= 2 a shard)" % per)


# ---- item 4 and 6 -----------------------------------------------------------

def stuck_server(tmp):
    """A model whose tensor `stuck` (4 MiB) is never served past its first
    block boundary (ranges there stall), and `ok` (1 MiB, before it) is.
    Returns (answer, the first offset in `stuck` that stalls)."""
    data = st_bytes(tmp, {"ok": os.urandom(1 << 20), "stuck": os.urandom(4 << 20)})
    hl = header_len(data)
    meta = json.loads(data[8:hl])
    a, b = meta["stuck"]["data_offsets"]
    a, b = a + hl, b + hl
    stall_from = (a + (1 << 20) - 1) >> 20 << 20

    def answer(method, path, hs, n):
        rng = hs.get("range", "")
        if rng.startswith("bytes=") and not rng.startswith("bytes=0-"):
            x, y = (int(v) for v in rng[6:].split("-"))
            if x < b and y >= stall_from:
                return 206, [("ETag", '"s"'), ("Content-Range", "bytes %d-%d/%d" % (x, y, len(data)))], Stall()
        return range_answer(data, hs, etag='"s"')
    return answer, stall_from - a


def stuck_reads(tmp):
    answer, skip = stuck_server(tmp)
    timeout = 4
    with Hostile(answer) as srv:
        mnt = os.path.join(tmp, "mnt-stuck")
        with foreground_mount(srv.url("m.safetensors"), mnt, "ro,http_timeout=%d" % timeout) as p:
            res = {}

            def reader(i):
                t = time.time()
                fd = os.open(os.path.join(mnt, "stuck"), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                    os.pread(fd, 4096, skip + ((i * 120) << 10))
                    r = "bytes"
                except OSError as e:
                    r = e.errno
                finally:
                    os.close(fd)
                res[i] = (r, time.time() - t)
            ts = [threading.Thread(target=reader, args=(i,)) for i in range(24)]
            t0 = time.time()
            for t in ts:
                t.start()
            time.sleep(0.5)
            t = time.time()
            os.stat(mnt)
            os.listdir(mnt)
            took_stat = time.time() - t
            t = time.time()
            with open(os.path.join(mnt, "ok"), "rb") as f:
                ok = f.read()
            took_ok = time.time() - t
            for t in ts:
                t.join(timeout=120)
            all_end = time.time() - t0
        check(took_stat < 1.5, "stuck: stat and listing took %.1f s (< 1.5)" % took_stat)
        # (`ok` shares its last block with `stuck`'s first: its read may wait
        # for a request that stalls, one http_timeout at most)
        check(took_ok < timeout + 0.5 and len(ok) == 1 << 20,
              "stuck: a healthy tensor read in %.1f s (< %d s)" % (took_ok, timeout))
        check(len(res) == 24 and all(r[0] == 5 for r in res.values()),
              "stuck: every stuck reader got EIO: %r" % sorted(set(r[0] for r in res.values())))
        slow = max(r[1] for r in res.values()) if res else 999
        check(slow < timeout + 2.5, "stuck: the slowest stuck reader took %.1f s (timeout %d)" % (slow, timeout))
        print("  stuck: stat %.2f s, healthy read %.2f s, stuck readers <= %.1f s, all %.1f s"
              % (took_stat, took_ok, slow, all_end))


def unmount_quick(tmp):
    answer, skip = stuck_server(tmp)
    with Hostile(answer) as srv:
        mnt = os.path.join(tmp, "mnt-umount")
        with Mount(srv.url("m.safetensors"), mnt, "ro,http_timeout=30") as m:
            code = ("import os,sys\nfd=os.open(sys.argv[1],os.O_RDONLY)\n"
                    "os.posix_fadvise(fd,0,0,os.POSIX_FADV_RANDOM)\nos.pread(fd,4096,int(sys.argv[2]))\n")
            rd = subprocess.Popen([sys.executable, "-c", code, os.path.join(m, "stuck"), str(skip)])
            time.sleep(1.0)
            check(rd.poll() is None, "unmount: the reader is stuck")
            rd.kill()
            rd.wait(timeout=30)
            t = time.time()
            r = m.unmount()
            took = time.time() - t
            check(r is not None and r.returncode == 0, "unmount: burnstore -u succeeded")
            check(took < 3.0, "unmount: burnstore -u returned in %.1f s (< 3)" % took)
            check(not is_mounted(mnt), "unmount: unmounted")


# ---- item 10, 11 ------------------------------------------------------------

def answers(tmp):
    size = 3 << 20
    v1 = st_bytes(tmp, {"t": os.urandom(size)})
    # the size changes mid-read (the same strong ETag: a lying server)
    def grows(method, path, hs, n):
        rng = hs.get("range", "")
        total = len(v1) if rng.startswith("bytes=0-") else len(v1) + 4096
        return range_answer(v1, hs, total=total, etag='"1"')
    with Hostile(grows) as srv:
        rc, out, err, _ = cli(["cat", srv.url("m.safetensors"), "t"])
        check(rc != 0, "size changes: the read fails (rc %d)" % rc)
        check("size" in err and str(len(v1) + 4096) in err and str(len(v1)) in err,
              "size changes: the error gives both sizes: %r" % err)
    # a 0-byte object: 416 to the opening range
    with Hostile(lambda m, p, hs, n: (416, [("Content-Range", "bytes */0"), ("ETag", '"e"')], b"")) as srv:
        rc, out, err, _ = cli(["ls", srv.url("empty.safetensors")])
        line = one_line(err, "empty")
        check(rc != 0 and "empty" in line and "changed" not in line, "0 bytes: said so: %r" % line)
    # a 404 with an endless body: not drained
    def endless(method, path, hs, n):
        return 404, [], iter(lambda: b"x" * 65536, None)
    with Hostile(endless) as srv:
        rc, out, err, took = cli(["ls", srv.url("m.safetensors")], env={"BURNSTORE_HTTP_TIMEOUT": "10"})
        line = one_line(err, "endless 404")
        check(rc != 0 and "404" in line, "endless 404: refused: %r" % line)
        check(took < 3 and srv.sent < (64 << 20), "endless 404: %.1f s, %d bytes drained" % (took, srv.sent))
    # a 206 with Content-Encoding: gzip (later answers; and the opening one)
    for later in (True, False):
        def gz(method, path, hs, n, later=later):
            st, hh, body = range_answer(v1, hs, etag='"1"')
            if not later or not hs.get("range", "").startswith("bytes=0-"):
                hh = hh + [("Content-Encoding", "gzip")]
            return st, hh, body
        with Hostile(gz) as srv:
            rc, out, err, _ = cli(["cat", srv.url("m.safetensors"), "t"])
            check(rc != 0 and v1[header_len(v1):][:4096] not in out,
                  "gzip (%s): refused (rc %d)" % ("later" if later else "open", rc))
            check("Content-Encoding" in err, "gzip: said so: %r" % err)
    # a Content-Range of 150 characters (leading zeros): read as any other
    def zeros(method, path, hs, n):
        st, hh, body = range_answer(v1, hs, etag='"1"')
        hh = [(k, v.replace("bytes ", "bytes " + "0" * 130) if k == "Content-Range" else v) for k, v in hh]
        return st, hh, body
    with Hostile(zeros) as srv:
        rc, out, err, _ = cli(["cat", srv.url("m.safetensors"), "t"])
        check(rc == 0 and out == v1[header_len(v1):], "long Content-Range: read (rc %d): %r" % (rc, err))


def main():
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("deadline")))
    signal.alarm(900)
    run_tests("test_remote_hostile", [huge_size, mixed_versions, shards_bounded, stuck_reads,
                                      unmount_quick, answers], "rhostile")


if __name__ == "__main__":
    main()
