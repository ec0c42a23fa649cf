"""Remote reads through a fault-injecting proxy (tests/support/httpfault.py)
in front of a real nginx on 127.0.0.1 (issue 20): added latency, connections
dropped mid-body, 500/503/429 (with Retry-After) answers, short bodies
(Content-Length promised, fewer bytes sent), 200 with the whole body to a
Range request, and the object replaced mid-mount. In every case each read
gives the same bytes as the same tensor read through a local mount of the
same file, or EIO with one log line; never other bytes, never a hang (the
whole run is under a deadline); the daemon (-f, its VmHWM) stays within the
cache (BURNSTORE_HTTP_CACHE=8M) plus a fixed amount while it reads a 96 MiB
tensor; with a cache of 1 or 2 blocks, concurrent readers at unaligned
offsets get the right bytes (replies are sent from pinned cache blocks).
"""
import errno
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
from bsmount import (SANITIZE, Mount, check, force_unmount, foreground_mount,  # noqa: E402
                     run_tests, vmhwm_kb, write_safetensors)
from httpfault import NGINX, FaultProxy, Nginx  # noqa: E402

CACHE_MIB = 8
FIXED_MIB = 40  # read-ahead in flight (4 x 4 MiB), spare blocks, readers' blocks, the daemon


def model():
    """Tensors of several sizes; the big one's 1 MiB blocks each start with
    their index (a block from the wrong place cannot pass for the right one)."""
    pool = [os.urandom(1 << 20) for _ in range(3)]
    big = b"".join(struct.pack("<Q", i) + pool[i % 3][8:] for i in range(96))
    return {"a": os.urandom(3 << 20), "b": os.urandom((5 << 20) + 17), "c": os.urandom(100),
            "d": big, "e": os.urandom(1 << 20), "f": os.urandom(4096)}


def read_all(m, names):
    """{name: bytes or the errno of the read}."""
    out = {}
    for k in names:
        try:
            with open(os.path.join(m, k), "rb") as f:
                out[k] = f.read()
        except OSError as e:
            out[k] = e.errno
    return out


class Case:
    def __init__(self, tmp, ng, want):
        self.tmp, self.ng, self.want = tmp, ng, want

    def run(self, name, fault=None, every=1, latency=0.0, expect_all=True, during=None):
        """Mount through a proxy, arm the fault, read every tensor; check
        each is right or EIO (all right when expect_all), one log line per
        EIO, the daemon's peak memory. Returns (results, stderr)."""
        mnt = os.path.join(self.tmp, "mnt-" + name)
        # the option, over a variable that would allow 8 times the memory
        env = dict(os.environ, BURNSTORE_HTTP_CACHE="%dM" % (8 * CACHE_MIB))
        with FaultProxy(self.ng.port, latency=latency) as px:
            with foreground_mount(px.url("m.safetensors"), mnt, "ro,http_cache=%dM" % CACHE_MIB,
                                  env=env) as p:
                if fault:
                    px.arm(fault, every)
                got = read_all(mnt, sorted(self.want)) if not during else during(mnt, px)
                hwm = vmhwm_kb(p.pid)
            err = p.stderr.read().decode(errors="replace")
            if fault:
                check(px.faults > 0, "%s: the proxy gave the fault (%d times)" % (name, px.faults))
        for k, v in got.items():
            if isinstance(v, int):
                check(v == errno.EIO and not expect_all,
                      "%s: %s failed with %s" % (name, k, errno.errorcode.get(v, v)))
            else:
                check(v == self.want[k], "%s: %s has the right bytes (%d of %d)"
                      % (name, k, len(v), len(self.want[k])))
        fails = sum(1 for v in got.values() if isinstance(v, int))
        lines = [x for x in err.splitlines() if x.strip()]
        if expect_all:
            check(not lines, "%s: retried, no failure logged: %r" % (name, lines[:4]))
        else:  # (the kernel's read-ahead reads fail too: a line each, unseen by the reader)
            check(len(lines) >= fails and all(" failed: " in x or "changed" in x for x in lines),
                  "%s: a line for each failed read: %r" % (name, lines[:4]))
        print("  %s: daemon peak %d kB, %d log line(s)" % (name, hwm, len(lines)))
        limit = (CACHE_MIB + FIXED_MIB) << 10
        if SANITIZE == "OFF":
            check(hwm <= limit, "%s: daemon peak %d kB within the cache + %d MiB (%d kB)"
                  % (name, hwm, FIXED_MIB, limit))
        return got, err


def setup(tmp, ng):
    want_raw = model()
    path = ng.path("m.safetensors")
    write_safetensors(path, want_raw)
    # the reference: the same file through a local mount
    with Mount(path, os.path.join(tmp, "mnt-local")) as m:
        want = {k: open(os.path.join(m, k), "rb").read() for k in want_raw}
    check(want == want_raw, "the local mount reads the fixture")
    return Case(tmp, ng, want)


def faults(tmp):
    with Nginx(tmp) as ng:
        c = setup(tmp, ng)
        c.run("plain")
        c.run("latency", latency=0.02)
        c.run("drop", "drop", every=2)
        c.run("short", "short", every=2)
        c.run("s500", "500", every=2)
        c.run("s503", "503", every=3)
        t = time.time()
        c.run("s429", "429", every=6)
        check(time.time() - t >= 1.0, "429: Retry-After: 1 was waited for")
        # 200 with the whole body: read from it up to 64 MiB in; past that
        # refused (EIO, one line), never the body's first bytes as the range
        c.run("full200", "full200", every=2, expect_all=False)

        # every tensor at once (6 readers, the big one twice), drops every 3rd request
        def together(mnt, px):
            out, lock = {}, threading.Lock()

            def one(k, tag):
                r = read_all(mnt, [k])[k]
                with lock:
                    out[k + tag] = r
            ts = [threading.Thread(target=one, args=(k, "")) for k in sorted(c.want)]
            ts.append(threading.Thread(target=one, args=("d", "2")))
            for t in ts:
                t.start()
            for t in ts:
                t.join(timeout=120)
            check(not any(t.is_alive() for t in ts), "together: every reader ended")
            d2 = out.pop("d2", None)
            check(d2 == c.want["d"], "together: the second reader of d has its bytes")
            return out
        c.run("together", "drop", every=3, during=together)


def always_down(tmp):
    """Every range request dropped: the retries give up, EIO, one line a read."""
    with Nginx(tmp) as ng:
        c = setup(tmp, ng)

        def during(mnt, px):
            return read_all(mnt, ["c", "f"])
        t = time.time()
        got, err = c.run("down", "drop", every=1, expect_all=False, during=during)
        check(got == {"c": errno.EIO, "f": errno.EIO}, "down: both reads fail with EIO: %r" % got)
        lines = [x for x in err.splitlines() if x.strip()]
        check(len(lines) == 2 and all("failed" in x for x in lines),
              "down: one line each: %r" % lines)
        check(time.time() - t < 50, "down: the retries end (%.1f s)" % (time.time() - t))


def replaced(tmp):
    """The object replaced mid-read: the bytes read are the old object's,
    then EIO (and one line); never the new object's bytes."""
    with Nginx(tmp) as ng:
        c = setup(tmp, ng)
        path = ng.path("m.safetensors")
        new = model()

        def during(mnt, px):
            out = {"d": None}
            old_d = c.want["d"]
            bad = 0
            with open(os.path.join(mnt, "d"), "rb") as f:
                pos = 0
                try:
                    while True:
                        if pos == 16 << 20:  # replaced: a new mtime, a new ETag
                            write_safetensors(path + ".new", new)
                            os.utime(path + ".new", (time.time() + 10, time.time() + 10))
                            os.rename(path + ".new", path)
                        b = f.read(1 << 20)
                        if not b:
                            break
                        if b != old_d[pos:pos + len(b)]:
                            bad += 1
                        pos += len(b)
                    out["d"] = b"" if bad else old_d[:pos]
                except OSError as e:
                    out["d"] = e.errno
            check(bad == 0, "replaced: no chunk other than the old object's bytes (%d)" % bad)
            return out
        got, err = c.run("replaced", expect_all=False, during=during)
        check(got["d"] == errno.EIO, "replaced: the read ends in EIO: %r" %
              (got["d"] if isinstance(got["d"], int) else len(got["d"])))
        check("changed" in err, "replaced: the log says the object changed: %r" % err)


def stalled(tmp):
    """A server that stalls mid-body (headers and half the body, then
    silence, the connection open): an unmount while read-ahead is stalled
    returns within a few seconds (the release cancels its requests), and a
    read of a stalled range fails with EIO and one line within
    BURNSTORE_HTTP_TIMEOUT (+ the second in which libcurl looks), never a
    hang (a stall used to be waited for 30 s a try, 6 tries)."""
    with Nginx(tmp) as ng:
        c = setup(tmp, ng)
        # 1. read-ahead stalled (requests that start past the block after
        # the first MiB of d: the reader's own stay before), then unmount
        # with the default timeout (60 s)
        with open(ng.path("m.safetensors"), "rb") as f:
            hl = 8 + struct.unpack("<Q", f.read(8))[0]
            d0 = hl + json.loads(f.read(hl - 8))["d"]["data_offsets"][0]
        past = (d0 + (2 << 20) - 1) >> 20 << 20
        mnt = os.path.join(tmp, "mnt-stall-ra")
        with FaultProxy(ng.port) as px:
            with foreground_mount(px.url("m.safetensors"), mnt, "ro") as p:
                px.arm("stall", min_start=past)
                fd = os.open(os.path.join(mnt, "d"), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # (no kernel read-ahead)
                    got = b"".join(os.pread(fd, 128 << 10, i << 17) for i in range(8))
                finally:
                    os.close(fd)
                check(got == c.want["d"][:1 << 20], "stall: the first MiB read before the stall")
                end = time.time() + 5
                while px.faults == 0 and time.time() < end:
                    time.sleep(0.05)
                check(px.faults > 0, "stall: read-ahead requests stalled (%d)" % px.faults)
                t = time.time()
                force_unmount(mnt)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
                took = time.time() - t
            check(took < 5, "stall: the unmount (and the daemon's exit) took %.1f s (< 5)" % took)
        # 2. every range stalled, BURNSTORE_HTTP_TIMEOUT=3: EIO within it
        stalled_read(tmp, ng, "mnt-stall-read", "ro", dict(os.environ, BURNSTORE_HTTP_TIMEOUT="3"), 3)
        # 3. the same bound as a mount option (fstab cannot set a variable),
        # which overrides the variable
        stalled_read(tmp, ng, "mnt-stall-opt", "ro,http_timeout=2",
                     dict(os.environ, BURNSTORE_HTTP_TIMEOUT="60"), 2)


def stalled_read(tmp, ng, name, opts, env, bound):
    """Every range stalled: a read fails with EIO within bound seconds (+ 2),
    the unmount is quick, and the log has one line naming the bound."""
    mnt = os.path.join(tmp, name)
    with FaultProxy(ng.port) as px:
        with foreground_mount(px.url("m.safetensors"), mnt, opts, env=env) as p:
            px.arm("stall")
            t = time.time()
            fd = os.open(os.path.join(mnt, "c"), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                os.pread(fd, 100, 0)
                r = "bytes"
            except OSError as e:
                r = e.errno
            finally:
                os.close(fd)
            took = time.time() - t
            check(r == errno.EIO, "%s (-o %s): EIO (%r)" % (name, opts, r))
            check(took < bound + 2, "%s: failed after %.1f s (%d s bound, + 2)" % (name, took, bound))
            t = time.time()
        check(time.time() - t < 5, "%s: unmount in %.1f s" % (name, time.time() - t))
        err = p.stderr.read().decode(errors="replace")
    lines = [x for x in err.splitlines() if x.strip()]
    check(len(lines) == 1 and "no answer within %d s" % bound in lines[0],
          "%s: one line naming the bound: %r" % (name, lines))


def requests_and_parallel(tmp):
    """What goes over the wire (nginx's access log, the proxy's count of
    requests under way at once): a header of over 64 KiB mounts in 2
    requests with no byte past it; the 4 shards of an index are asked for
    at once; a tensor read on gets read-ahead as parallel requests of whole
    blocks (4 MiB on loopback)."""
    with Nginx(tmp) as ng:
        many = {"t%05d" % i: b"\0\0\0\0" for i in range(4000)}
        path = ng.path("many.safetensors")
        write_safetensors(path, many)
        with open(path, "rb") as f:
            header = 8 + struct.unpack("<Q", f.read(8))[0]
        check(header > 64 << 10, "the header is over 64 KiB (%d)" % header)
        ng.requests()
        with Mount(ng.url("many.safetensors"), os.path.join(tmp, "mnt-many")) as m:
            check(len(os.listdir(m)) == 4000, "4000 tensors listed")
        reqs = ng.requests()
        sent = sum(r[2] for r in reqs)
        check(len(reqs) <= 3 and sent <= header + (64 << 10),
              "mount: %d requests (<= 3), %d bytes for a %d-byte header (<= +64 KiB): %r"
              % (len(reqs), sent, header, reqs[:4]))
        # an index of 4 shards, through a proxy adding 0.3 s a request
        wmap = {}
        for i in range(4):
            name = "model-%05d-of-00004.safetensors" % (i + 1)
            write_safetensors(ng.path(name), {"s%d.t%d" % (i, j): os.urandom(16) for j in range(50)})
            wmap.update({"s%d.t%d" % (i, j): name for j in range(50)})
        with open(ng.path("model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": wmap}, f)
        with FaultProxy(ng.port, latency=0.3) as px:
            with Mount(px.url("model.safetensors.index.json"), os.path.join(tmp, "mnt-idx")) as m:
                check(sorted(os.listdir(m)) == ["s0", "s1", "s2", "s3"], "the 4 shards mounted")
            check(px.max_inflight >= 4, "the shards' requests went out at once (%d at most)"
                  % px.max_inflight)
        # read-ahead: a 96 MiB tensor read on, through 50 ms a request
        c = Case(tmp, ng, model())
        write_safetensors(ng.path("m.safetensors"), c.want)
        with FaultProxy(ng.port, latency=0.05) as px:
            with Mount(px.url("m.safetensors"), os.path.join(tmp, "mnt-ra")) as m:
                ng.requests()
                got = open(os.path.join(m, "d"), "rb").read()
                check(got == c.want["d"], "read-ahead: the right bytes")
                reqs = ng.requests()
        check(px.max_inflight >= 3, "read-ahead: requests in parallel (%d at most)" % px.max_inflight)
        # (of whole blocks: 4 MiB while one connection is fast, 1 MiB when
        # it is slow, as under a loaded machine: then more go out at once)
        whole = sum(r[2] for r in reqs if r[2] in (1 << 20, 2 << 20, 3 << 20, 4 << 20))
        check(whole >= (96 << 20) * 3 // 4, "read-ahead: in requests of whole blocks (%d MiB of %d)"
              % (whole >> 20, len(reqs)))


def tiny_cache(tmp):
    """Replies go out from the cache blocks themselves (pinned while they
    are sent): with a cache of 1 or 2 blocks, 6 readers at once at
    unaligned offsets and sizes (1 MiB kernel reads span two blocks, which
    such a cache cannot keep pinned together: those are copied instead)
    each get exactly the local mount's bytes, nothing failed or logged."""
    import random
    with Nginx(tmp) as ng:
        c = setup(tmp, ng)
        for cache in ("1M", "2M"):
            mnt = os.path.join(tmp, "mnt-tiny" + cache)
            env = dict(os.environ, BURNSTORE_HTTP_CACHE=cache)
            bad = []
            with foreground_mount(ng.url("m.safetensors"), mnt, "ro", env=env) as p:
                def reader(seed, k):
                    rnd, want = random.Random(seed), c.want[k]
                    fd = os.open(os.path.join(mnt, k), os.O_RDONLY)
                    try:
                        for _ in range(40):
                            off = rnd.randrange(len(want))
                            n = rnd.choice((1, 4095, 4097, 1 << 17, (1 << 20) + 3, 3 << 20))
                            got = os.pread(fd, n, off)
                            if got != want[off:off + n]:
                                bad.append((k, off, n))
                            # (drop the kernel's copy: the next reads go to the daemon again)
                            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    except OSError as e:
                        bad.append((k, "errno", e.errno))
                    finally:
                        os.close(fd)
                ts = [threading.Thread(target=reader, args=(i, k))
                      for i, k in enumerate(("d", "d", "b", "a", "e", "d"))]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join(timeout=240)
                check(not any(t.is_alive() for t in ts), "tiny cache %s: every reader ended" % cache)
                whole = open(os.path.join(mnt, "d"), "rb").read()
                check(whole == c.want["d"], "tiny cache %s: d read whole is right" % cache)
            err = p.stderr.read().decode(errors="replace")
            check(not bad, "tiny cache %s: every read has the local bytes: %r" % (cache, bad[:4]))
            check(not err.strip(), "tiny cache %s: nothing logged: %r" % (cache, err[:300]))


def main():
    if not os.path.exists(NGINX):
        print("SKIP: no nginx (Debian's nginx-light; .ci/install-deps installs it)")
        sys.exit(77)
    # A deadline on everything: the whole run is killed (its finally blocks
    # unmount and stop nginx and the proxy) if it hangs.
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("deadline")))
    signal.alarm(600)
    run_tests("test_remote_faults", [stalled, requests_and_parallel, faults, always_down,
                                         replaced, tiny_cache], "rfault")


if __name__ == "__main__":
    main()
