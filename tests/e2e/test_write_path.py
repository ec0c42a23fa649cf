"""The write path's speed-ups keep every byte (issue 34): odd writes through a
mount (sizes and offsets off the page, overlapping, past the end, truncation
then writes, O_APPEND, shared mmap) land as a plain file would have them, in
the mount and in the written file; a write(2) costs no GETXATTR round trip
(FUSE_HANDLE_KILLPRIV_V2, src/fuse/fs_io.c) and set-id bits still go on
write, truncation and chown; the write-back and convert move stored tensor
bytes with copy_file_range (src/core/sink.c), and fall back to copying where
the kernel cannot (another file system)."""
import glob
import mmap
import os
import random
import re
import stat
import struct
import subprocess
import time

from bsmount import (BIN, DEADLINE, FIX, Mount, check, force_unmount, foreground_mount, is_mounted, read_safetensors,
                     run, run_tests, small_tmpfs)

ST = os.path.join(FIX, "burn-store/safetensors-tests/tests/multi_layer/multi_layer.safetensors")


def same(mnt_path, shadow, what):
    with open(mnt_path, "rb") as f:
        got = f.read()
    with open(shadow, "rb") as f:
        want = f.read()
    return check(got == want, "%s: the mount's bytes (%d) are the plain file's (%d)%s" % (
        what, len(got), len(want), "" if len(got) != len(want) else
        ", first difference at %d" % next((i for i in range(len(got)) if got[i] != want[i]), -1)))


def odd_writes(path, shadow, rng):
    """The same writes to path (in the mount) and shadow (a plain file)."""
    fds = [os.open(p, os.O_RDWR | os.O_CREAT, 0o644) for p in (path, shadow)]
    try:
        def both(fn):
            for fd in fds:
                fn(fd)
        # Odd sizes at odd offsets, overlapping each other and the page edges.
        for _ in range(300):
            off = rng.randrange(0, 3 << 20)
            data = rng.randbytes(rng.choice((1, 7, 4095, 4097, 65537, rng.randrange(1, 300000))))
            both(lambda fd: os.pwrite(fd, data, off))
        # Past the end: a hole, then bytes.
        end = os.fstat(fds[1]).st_size
        both(lambda fd: os.pwrite(fd, b"tail" * 1000, end + 123457))
        # Truncation down to an odd size, a write across the new end, up again.
        both(lambda fd: os.ftruncate(fd, 1000003))
        both(lambda fd: os.pwrite(fd, b"\xab" * 9000, 1000003 - 4000))
        both(lambda fd: os.ftruncate(fd, 1500001))
        both(lambda fd: os.pwrite(fd, b"\xcd" * 3, 1500001 + 77))
    finally:
        for fd in fds:
            os.close(fd)
    # O_APPEND.
    for p in (path, shadow):
        with open(p, "ab") as f:
            f.write(b"appended" * 1111)
    # Shared mmap: stores into pages, written back by msync.
    for p in (path, shadow):
        with open(p, "r+b") as f:
            m = mmap.mmap(f.fileno(), 0)
            m[5:9] = b"MMAP"
            m[len(m) - 4097:len(m) - 4093] = b"mmap"
            m.flush()
            m.close()


def tensor_bytes(path, key):
    tensors, _ = read_safetensors(path)
    return tensors[key][2]


def test_odd_writes(tmp):
    """A new file and an existing tensor, each written oddly: the mount reads
    back what a plain file would hold, before and after close, and the
    written checkpoint holds the same bytes."""
    rng = random.Random(34)
    out = os.path.join(tmp, "odd.safetensors")
    mnt = os.path.join(tmp, "odd")
    shadow = os.path.join(tmp, "shadow")
    with Mount(out, mnt) as m:
        odd_writes(os.path.join(mnt, "t"), shadow, rng)
        same(os.path.join(mnt, "t"), shadow, "a new file")
        u = m.unmount()
        check(u.returncode == 0, "write-back: %s" % u.stderr)
    check(tensor_bytes(out, "t") == open(shadow, "rb").read(), "the written file holds the plain file's bytes")
    # An existing checkpoint's tensor: its clean bytes staged first, then changed.
    work = os.path.join(tmp, "rw.safetensors")
    subprocess.run(["cp", ST, work], check=True)
    tensors, _ = read_safetensors(work)
    key = max(tensors, key=lambda k: len(tensors[k][2]))
    shadow2 = os.path.join(tmp, "shadow2")
    with open(shadow2, "wb") as f:
        f.write(tensors[key][2])
    mnt2 = os.path.join(tmp, "rw")
    with Mount(work, mnt2, opts="rw") as m:
        rel = key.replace(".", "/")
        p = os.path.join(mnt2, rel)
        check(os.path.exists(p), "the tensor %s is at %s" % (key, rel))
        odd_writes(p, shadow2, rng)
        same(p, shadow2, "an existing tensor")
        # Its size changed: as bytes, so that the written file can hold it.
        os.setxattr(p, "user.burnstore.dtype", b"U8")
        os.setxattr(p, "user.burnstore.shape", b"[%d]" % os.path.getsize(shadow2))
        u = m.unmount()
        check(u.returncode == 0, "write-back in place: %s" % u.stderr)
    after, _ = read_safetensors(work)
    check(after[key][2] == open(shadow2, "rb").read(), "the changed tensor is written")
    check(all(after[k][2] == tensors[k][2] for k in tensors if k != key), "the other tensors are unchanged")


def test_no_getxattr_per_write(tmp):
    """400 write(2)s of 4 KiB into a mount: the kernel asked for
    security.capability before each one (a GETXATTR round trip each); with
    FUSE_HANDLE_KILLPRIV_V2 it asks at most once a file."""
    out = os.path.join(tmp, "x.safetensors")
    mnt = os.path.join(tmp, "x")
    logp = os.path.join(tmp, "x.log")
    with open(logp, "wb") as log, foreground_mount(out, mnt, flag="-d", stderr=log):
        with open(logp, "rb") as f:
            before = f.read().count(b"GETXATTR")
        fd = os.open(os.path.join(mnt, "t"), os.O_WRONLY | os.O_CREAT, 0o644)
        for i in range(400):
            os.write(fd, b"%c" % (i & 0xff) * 4096)
        os.close(fd)
        time.sleep(0.2)
        with open(logp, "rb") as f:
            n = f.read().count(b"GETXATTR") - before
        check(n <= 4, "GETXATTR requests for 400 writes: %d (at most one a file)" % n)
    check(tensor_bytes(out, "t") == b"".join(b"%c" % (i & 0xff) * 4096 for i in range(400)), "the bytes are written")


def test_set_id_bits_go(tmp):
    """What the kernel left to the daemon with FUSE_HANDLE_KILLPRIV_V2: a
    write, a truncation, an O_TRUNC open and a chown drop set-id bits."""
    out = os.path.join(tmp, "s.safetensors")
    mnt = os.path.join(tmp, "s")
    with Mount(out, mnt) as m:
        p = os.path.join(mnt, "t")
        with open(p, "wb") as f:
            f.write(b"x" * 8192)

        def after(what, act):
            os.chmod(p, 0o6755)
            check(stat.S_IMODE(os.stat(p).st_mode) == 0o6755, "%s: the bits are set" % what)
            act()
            mode = stat.S_IMODE(os.stat(p).st_mode)
            check(mode & 0o6000 == 0, "%s drops set-id bits: %o" % (what, mode))

        def write():
            with open(p, "r+b") as f:
                f.write(b"y")

        def trunc_open():
            with open(p, "wb") as f:
                f.write(b"z" * 100)
        after("a write", write)
        after("a truncation", lambda: os.truncate(p, 4000))
        after("an O_TRUNC open", trunc_open)
        after("a chown", lambda: os.chown(p, 1234, 1234))
        u = m.unmount()
        check(u.returncode == 0, "write-back: %s" % u.stderr)


def traced(cmd, log, calls):
    """cmd under strace tracing calls, a log file a thread (LOG.TID: no call
    split into unfinished/resumed)."""
    return ["strace", "-ff", "-qq", "-o", log, "-e", "trace=" + calls] + cmd


# LeakSanitizer cannot run under ptrace (the ASan build).
TRACED_ENV = dict(os.environ, ASAN_OPTIONS=(os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":"))


def traced_text(log):
    return "".join(open(f).read() for f in glob.glob(log + ".*"))


def returned(log, pattern):
    """The sum of what the calls matching pattern (up to their arguments'
    end) returned, from an strace log."""
    return sum(int(x) for x in re.findall(pattern + r" = (\d+)", traced_text(log)))


def copied(log):
    """Bytes copy_file_range moved."""
    return returned(log, r"copy_file_range\(.*\)")


def write_under_strace(tmp, name, blob, calls):
    """A new NAME.safetensors mounted under strace (calls traced into
    tmp/NAME.strace.*), blob written to its file t, unmounted (the
    write-back done): the log's prefix."""
    out = os.path.join(tmp, name + ".safetensors")
    mnt = os.path.join(tmp, name)
    log = os.path.join(tmp, name + ".strace")
    os.makedirs(mnt, exist_ok=True)
    p = subprocess.Popen(traced([BIN, out, mnt, "-f"], log, calls), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=TRACED_ENV)
    try:
        end = time.time() + DEADLINE
        while not is_mounted(mnt) and time.time() < end and p.poll() is None:
            time.sleep(0.05)
        check(is_mounted(mnt), "mounted under strace")
        with open(os.path.join(mnt, "t"), "wb") as f:
            f.write(blob)
        subprocess.run(["fusermount3", "-u", mnt], capture_output=True, timeout=DEADLINE)
        p.communicate(timeout=DEADLINE)
    finally:
        force_unmount(mnt)
        if p.poll() is None:
            p.kill()
            p.communicate()
    check(tensor_bytes(out, "t") == blob, "%s: the written bytes are in the output" % name)
    return log


def test_writes_are_spliced(tmp):
    """WRITEs of 1 MiB less 4 KiB fit libfuse's pipe of 1 MiB (the default
    pipe-max-size, for any user): spliced from /dev/fuse and on into the
    staging file (a splice with an output offset), not read(2) into memory
    and pwrite(2)n; the bytes are the same."""
    blob = random.Random(9).randbytes(8 << 20)
    log = write_under_strace(tmp, "sp", blob, "splice,pwrite64")
    into_file = returned(log, r"splice\(\d+, NULL, \d+, \[\d+\], \d+, \w+\)")
    pwritten = returned(log, r"pwrite64\(.*\)")
    check(into_file >= len(blob), "%d bytes spliced into the staging file (>= %d); %d pwrite(2)n" % (
        into_file, len(blob), pwritten))


def test_writeback_in_kernel(tmp):
    """The write-back of a staged tensor and of clean ones, and convert, move
    the bytes with copy_file_range; to another file system (a tmpfs, where it
    fails with EXDEV) they are copied, the output the same."""
    blob = random.Random(7).randbytes(3 << 20)
    log = write_under_strace(tmp, "k", blob, "copy_file_range")
    check(copied(log) >= len(blob), "the write-back moved %d bytes with copy_file_range (>= %d)" % (
        copied(log), len(blob)))
    # convert: clean tensors of a file.
    src = os.path.join(tmp, "src.safetensors")
    subprocess.run(["cp", ST, src], check=True)
    want, _ = read_safetensors(src)
    total = sum(len(v[2]) for v in want.values())
    dst = os.path.join(tmp, "dst.safetensors")
    log2 = os.path.join(tmp, "c.strace")
    r = subprocess.run(traced([BIN, "convert", "-q", src, dst], log2, "copy_file_range"), capture_output=True,
                       text=True, timeout=DEADLINE, env=TRACED_ENV)
    check(r.returncode == 0, "convert: %s" % r.stderr)
    got, _ = read_safetensors(dst)
    check({k: v[2] for k, v in got.items()} == {k: v[2] for k, v in want.items()}, "convert: the same tensors")
    check(copied(log2) == total, "convert moved %d of %d bytes with copy_file_range" % (copied(log2), total))
    # Another file system: EXDEV, and a copy through memory.
    shm = os.path.join(tmp, "shm")
    with small_tmpfs(shm, "16m") as ok:
        if ok:
            dst2 = os.path.join(shm, "dst.safetensors")
            r = run([BIN, "convert", "-q", src, dst2])
            check(r.returncode == 0, "convert to a tmpfs: %s" % r.stderr)
            got, _ = read_safetensors(dst2)
            check({k: v[2] for k, v in got.items()} == {k: v[2] for k, v in want.items()},
                  "convert to a tmpfs: the same tensors")


if __name__ == "__main__":
    run_tests("test_write_path", [
        test_odd_writes,
        test_no_getxattr_per_write,
        test_set_id_bits_go,
        test_writes_are_spliced,
        test_writeback_in_kernel,
    ], "wpath")
