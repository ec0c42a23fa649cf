"""The performance behaviours, as request counts (never timings): a
read-only mount lets the kernel cache its directories (no OPENDIR or
RELEASEDIR round trips, a second listing sends no READDIR), `ls -l` gets
attributes through READDIRPLUS and asks the foreign xattr namespaces once
(EOPNOTSUPP), directories report a 4 KiB block size; writable mounts keep
listing what changes. The daemon runs in the foreground with -d and its
request log is counted."""
import errno
import json
import os
import re
import signal
import struct
import subprocess
import time

from bsmount import (BIN, Mount, check, daemon_pid, force_unmount, is_mounted, read_safetensors, run, run_tests,
                     DEADLINE)


def write_st(path, keys, nbytes=4):
    """A SafeTensors file of F32 tensors of nbytes each."""
    hdr, off = {}, 0
    for k in keys:
        hdr[k] = {"dtype": "F32", "shape": [nbytes // 4], "data_offsets": [off, off + nbytes]}
        off += nbytes
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(range(256)) * (off // 256) + bytes(off % 256))


def llm_keys(layers, per):
    keys = ["model.embed.weight", "lm_head.weight"]
    for i in range(layers):
        for j in range(per):
            keys.append("model.layers.%d.block.w%d.weight" % (i, j))
    return keys


class DebugMount:
    """burnstore -d in the foreground: the libfuse request log is counted."""

    def __init__(self, source, mnt, log, opts=None):
        self.source, self.mnt, self.log, self.opts = source, mnt, log, opts

    def __enter__(self):
        os.makedirs(self.mnt, exist_ok=True)
        cmd = [BIN, "-d", self.source, self.mnt] + (["-o", self.opts] if self.opts else [])
        self.logf = open(self.log, "w")
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.logf)
        t = time.time()
        while not is_mounted(self.mnt):
            if self.p.poll() is not None or time.time() - t > DEADLINE:
                self.__exit__()
                raise RuntimeError("debug mount failed: " + open(self.log).read()[-2000:])
            time.sleep(0.05)
        return self

    def ops(self):
        """opcode name -> count, of the log so far."""
        out = {}
        with open(self.log, errors="replace") as f:
            for m in re.finditer(r"opcode: ([A-Z_]+)", f.read()):
                out[m.group(1)] = out.get(m.group(1), 0) + 1
        return out

    def since(self, before):
        now = self.ops()
        return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}

    def __exit__(self, *exc):
        try:
            if is_mounted(self.mnt):
                run([BIN, "-u", self.mnt])
            self.p.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        finally:
            force_unmount(self.mnt)
            self.logf.close()
        return False


def find_files(mnt):
    r = run(["find", mnt, "-type", "f"])
    return r.stdout.split()


def test_readonly_directory_cache(tmp):
    src = os.path.join(tmp, "llm.safetensors")
    keys = llm_keys(20, 10)
    write_st(src, keys)
    with DebugMount(src, os.path.join(tmp, "m"), os.path.join(tmp, "ro.log")) as m:
        st = os.stat(os.path.join(m.mnt, "model/layers"))
        check(st.st_blksize == 4096, "a directory's st_blksize is 4 KiB: %d" % st.st_blksize)
        fst = os.stat(os.path.join(m.mnt, "lm_head/weight"))
        check(fst.st_blksize <= 1 << 20, "a file's st_blksize is sensible: %d" % fst.st_blksize)
        ndirs = 1 + 2 + 1 + 20 + 20 * 10 + 1  # root, model, lm_head, layers, i, i.block.wj, embed
        b = m.ops()
        got = find_files(m.mnt)
        check(len(got) == len(keys), "find lists every tensor: %d of %d" % (len(got), len(keys)))
        first = m.since(b)
        print("first find:", first)
        check(first.get("OPENDIR", 0) <= 1, "at most one OPENDIR (answered ENOSYS): %r" % first)
        check(first.get("RELEASEDIR", 0) == 0, "no RELEASEDIR: %r" % first)
        check(first.get("READDIR", 0) + first.get("READDIRPLUS", 0) >= ndirs // 2,
              "the first find reads the directories: %r" % first)
        b = m.ops()
        got2 = find_files(m.mnt)
        check(sorted(got2) == sorted(got), "the second find lists the same")
        second = m.since(b)
        print("second find:", second)
        for op in ("OPENDIR", "RELEASEDIR", "READDIR", "READDIRPLUS", "LOOKUP"):
            check(second.get(op, 0) == 0, "the second find sends no %s: %r" % (op, second))


def test_ls_l_requests(tmp):
    src = os.path.join(tmp, "wide.safetensors")
    n = 500
    write_st(src, ["w.t%03d" % i for i in range(n)])
    with DebugMount(src, os.path.join(tmp, "m"), os.path.join(tmp, "ls.log")) as m:
        b = m.ops()
        r = run(["ls", "-l", os.path.join(m.mnt, "w")])
        check(r.returncode == 0 and len(r.stdout.splitlines()) == n + 1, "ls -l lists %d files" % n)
        got = m.since(b)
        print("ls -l:", got)
        check(got.get("GETXATTR", 0) <= 10,
              "ls -l of %d files asks a few xattrs, not per file: %r" % (n, got))
        check(got.get("READDIRPLUS", 0) >= 1, "ls -l gets attributes by READDIRPLUS: %r" % got)
        check(got.get("LOOKUP", 0) <= 10, "ls -l needs no LOOKUP per file: %r" % got)
        check(got.get("GETATTR", 0) <= 10, "ls -l needs no GETATTR per file: %r" % got)


def test_foreign_xattrs(tmp):
    src = os.path.join(tmp, "x.safetensors")
    write_st(src, ["a.b", "c"])
    for opts in (None, "rw"):
        with Mount(src, os.path.join(tmp, "m"), opts=opts) as mnt:
            for p in (os.path.join(mnt, "a/b"), os.path.join(mnt, "a"), mnt):
                for name in ("security.selinux", "security.capability", "system.posix_acl_access",
                             "system.posix_acl_default", "trusted.x"):
                    try:
                        os.getxattr(p, name)
                        check(False, "%s %s: no error" % (p, name))
                    except OSError as e:
                        check(e.errno == errno.EOPNOTSUPP,
                              "%s %s (%s): EOPNOTSUPP, got %s" % (p, name, opts, errno.errorcode.get(e.errno)))
                try:
                    os.getxattr(p, "user.nothing")
                    check(False, "user.nothing: no error")
                except OSError as e:
                    check(e.errno == errno.ENODATA, "user.nothing: ENODATA, got %s" % e.errno)
            check(os.getxattr(os.path.join(mnt, "a/b"), "user.burnstore.dtype") == b"F32", "dtype")
            # cp -a out of the mount keeps the user xattrs and does not fail.
            out = os.path.join(tmp, "copy")
            r = run(["cp", "-a", os.path.join(mnt, "a"), out])
            check(r.returncode == 0, "cp -a out of the mount (%s): %s" % (opts, r.stderr))
            check(os.getxattr(os.path.join(out, "b"), "user.burnstore.dtype") == b"F32",
                  "cp -a keeps user.burnstore.dtype")
            run(["rm", "-rf", out])


def test_writable_listing_changes(tmp):
    src = os.path.join(tmp, "w.safetensors")
    write_st(src, ["a.x", "a.y"])
    with DebugMount(src, os.path.join(tmp, "m"), os.path.join(tmp, "rw.log"),
                    opts="rw,output=" + os.path.join(tmp, "out.safetensors")) as m:
        d = os.path.join(m.mnt, "a")
        check(sorted(os.listdir(d)) == ["x", "y"], "listing")
        b = m.ops()
        with open(os.path.join(d, "z"), "wb") as f:
            f.write(b"\0" * 8)
        check(sorted(os.listdir(d)) == ["x", "y", "z"], "a created file is listed")
        os.unlink(os.path.join(d, "x"))
        check(sorted(os.listdir(d)) == ["y", "z"], "a removed file is no longer listed")
        # RELEASEDIR comes after close(2) returned (the kernel sends it on the
        # last reference): give the log a moment (under TSan it lagged).
        t = time.time()
        got = m.since(b)
        while got.get("RELEASEDIR", 0) < 2 and time.time() - t < 10:
            time.sleep(0.1)
            got = m.since(b)
        check(got.get("OPENDIR", 0) >= 2 and got.get("RELEASEDIR", 0) >= 2,
              "a writable mount opens its directories: %r" % got)
        st = os.stat(d)
        check(st.st_blksize == 4096, "st_blksize 4 KiB on rw too: %d" % st.st_blksize)


def test_writeback_cache_requests(tmp):
    out = os.path.join(tmp, "wb.safetensors")
    with DebugMount(out, os.path.join(tmp, "m"), os.path.join(tmp, "wb.log")) as m:
        b = m.ops()
        data = os.urandom(1 << 20)
        fd = os.open(os.path.join(m.mnt, "t"), os.O_WRONLY | os.O_CREAT, 0o644)
        for i in range(0, len(data), 32 << 10):
            os.write(fd, data[i:i + (32 << 10)])
        os.close(fd)
        got = m.since(b)
        print("1 MiB in 32 KiB writes:", got)
        check(0 < got.get("WRITE", 0) <= 16,
              "the write-back cache sends the 32 writes as a few large WRITEs: %r" % got)
        with open(os.path.join(m.mnt, "t"), "rb") as f:
            check(f.read() == data, "read back through the cache")
        # O_APPEND is placed by the kernel with the cache on.
        with open(os.path.join(m.mnt, "t"), "ab") as f:
            f.write(b"tail")
        with open(os.path.join(m.mnt, "t"), "rb") as f:
            check(f.read() == data + b"tail", "O_APPEND appends")
    t = read_safetensors(out)[0]["t"]
    check(t[2] == data + b"tail", "written back")


def test_mmap_and_direct_io(tmp):
    """Tensor files map (np.memmap, mmap) by default; -o direct_io reads the
    same bytes, and a shared map then either works or fails with ENODEV
    (libfuse < 3.16), never with wrong bytes; direct_io is read-only."""
    import mmap
    import numpy as np
    src = os.path.join(tmp, "mm.safetensors")
    truth = (np.arange(300000, dtype=np.float32) * 0.5).astype("<f4")
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [300000], "data_offsets": [0, truth.nbytes]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(src, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + truth.tobytes())
    with Mount(src, os.path.join(tmp, "m")) as mnt:
        p = os.path.join(mnt, "w")
        a = np.memmap(p, dtype="<f4", mode="r")
        check(a.shape == truth.shape and np.array_equal(a, truth), "np.memmap of a tensor file")
        del a
        with open(p, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            check(m[:] == truth.tobytes(), "mmap of a tensor file")
            check(m[4000:4008] == truth.tobytes()[4000:4008], "mapped slice")
            m.close()
    with Mount(src, os.path.join(tmp, "m"), opts="direct_io") as mnt:
        p = os.path.join(mnt, "w")
        with open(p, "rb") as f:
            check(f.read() == truth.tobytes(), "direct_io: read")
            try:
                m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
                check(m[:] == truth.tobytes(), "direct_io: a map that works has the bytes")
                m.close()
            except OSError as e:
                check(e.errno == errno.ENODEV, "direct_io: mmap fails with ENODEV: %r" % e)
    r = run([BIN, src, os.path.join(tmp, "m"), "-o", "rw,direct_io,output=" + os.path.join(tmp, "o.safetensors")])
    check(r.returncode != 0 and "direct_io applies to read-only mounts" in r.stderr,
          "direct_io refused on a writable mount: %r" % r.stderr)
    force_unmount(os.path.join(tmp, "m"))


def test_sigterm_keeps_dirty_pages(tmp):
    """With the write-back cache on, a signal flushes the kernel's dirty
    pages and waits for open files to close before the loop ends: every
    byte is written back."""
    size = 64 << 20
    pattern = os.urandom(1 << 20)
    for how, keep_open in (("SIGTERM", True), ("SIGINT", False), ("SIGTERM", False)):
        out = os.path.join(tmp, "sig-%s-%d.safetensors" % (how, keep_open))
        mnt = os.path.realpath(os.path.join(tmp, "ms"))
        with Mount(out, mnt):
            pid = daemon_pid(mnt)
            check(pid is not None, "daemon found")
            f = open(os.path.join(mnt, "big"), "wb")
            for i in range(size // len(pattern)):
                f.write(pattern)
            f.flush()
            if not keep_open:
                f.close()
            os.kill(pid, getattr(signal, how))
            if keep_open:
                time.sleep(0.5)  # the daemon must still serve this file
                f.close()  # its close sends the last dirty pages
            u = run([BIN, "-u", mnt], timeout=120)
            check(u.returncode == 0 or "not mounted" in u.stderr,
                  "%s: burnstore -u waits and reports: %r" % (how, u.stderr))
            end = time.time() + 60
            while daemon_pid(mnt) and time.time() < end:
                time.sleep(0.1)
        check(os.path.exists(out), "%s (file %s): written back" % (how, "open" if keep_open else "closed"))
        if os.path.exists(out):
            t = read_safetensors(out)[0].get("big")
            got = t[2] if t else b""
            check(len(got) == size, "%s: %d of %d bytes kept" % (how, len(got), size))
            bad = next((i for i in range(0, min(len(got), size), len(pattern))
                        if got[i:i + len(pattern)] != pattern), None)
            check(bad is None, "%s: every byte kept (first bad MiB at %r)" % (how, bad))
            os.unlink(out)


if __name__ == "__main__":
    run_tests("test_perf", [test_readonly_directory_cache, test_ls_l_requests, test_foreign_xattrs,
                            test_writable_listing_changes, test_writeback_cache_requests,
                            test_sigterm_keeps_dirty_pages, test_mmap_and_direct_io], "perf")
