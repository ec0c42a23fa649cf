"""Reads, writes, xattrs and namespace changes at the same time in one
writable mount (the daemon is multithreaded). Mostly here for the
ThreadSanitizer pass of tests/run.sh, which runs it against a TSan daemon:
readers of untouched tensors, writers whose first write stages a whole
tensor, getxattr/setxattr, readdir, and create/rename/unlink of new files all
overlap. Afterwards the written-back file must hold exactly what was written,
and every other tensor unchanged."""
import os
import shutil
import threading

from bsmount import FIX, Mount, check, finish, force_unmount, key_to_relpath, read_bpk, tmpdir

BPK = os.path.join(FIX, "examples/mnist-inference-web/model.bpk")
ROUNDS = 50


def pattern(i, n):
    return bytes((i * 37 + k) & 0xFF for k in range(n))


def test_mixed(tmp):
    src = os.path.join(tmp, "model.bpk")
    shutil.copy(BPK, src)
    orig, _ = read_bpk(src)
    keys = sorted(orig)
    written = keys[:4]  # one writer each
    read_only = keys[4:]
    mnt = os.path.join(tmp, "m")
    errors = []
    start = threading.Barrier(4 + 3 + 2)  # writers, readers, namespace, walker

    def guard(fn):
        def run(*a):
            try:
                start.wait(timeout=60)
                fn(*a)
            except Exception as e:  # reported after the join
                errors.append("%s%r: %r" % (fn.__name__, a, e))
        return run

    @guard
    def writer(i):
        key = written[i]
        p = os.path.join(mnt, key_to_relpath(key))
        n = len(orig[key][2])
        want = pattern(i, n)
        fd = os.open(p, os.O_WRONLY)
        try:
            step = max(1, n // ROUNDS)
            for off in range(0, n, step):  # the first pwrite stages the tensor
                os.pwrite(fd, want[off:off + step], off)
            os.fsync(fd)
        finally:
            os.close(fd)
        with open(p, "rb") as f:
            if f.read() != want:
                errors.append("%s: does not read back what was written" % key)

    @guard
    def reader(i):
        for r in range(ROUNDS):
            key = read_only[(i + r) % len(read_only)]
            p = os.path.join(mnt, key_to_relpath(key))
            with open(p, "rb") as f:
                if f.read() != orig[key][2]:
                    errors.append("%s: wrong bytes while others write" % key)
            if os.getxattr(p, "user.burnstore.dtype").decode() != orig[key][0]:
                errors.append("%s: wrong dtype xattr" % key)
            os.listdir(mnt)

    @guard
    def namespace():
        d = os.path.join(mnt, "scratch")
        os.makedirs(d, exist_ok=True)
        for r in range(ROUNDS):
            a, b = os.path.join(d, "a%d" % r), os.path.join(d, "b%d" % r)
            with open(a, "wb") as f:
                f.write(pattern(r, 4096))
            os.setxattr(a, "user.burnstore.shape", b"[1024]")
            os.setxattr(a, "user.burnstore.dtype", b"F32")
            os.rename(a, b)
            if r % 2:
                os.unlink(b)

    @guard
    def walker():
        for _ in range(ROUNDS):
            for d, _dirs, files in os.walk(mnt):
                for f in files:
                    try:
                        os.listxattr(os.path.join(d, f))
                    except FileNotFoundError:
                        pass  # scratch files come and go

    with Mount(src, mnt, "rw") as m:
        threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
        threads += [threading.Thread(target=reader, args=(i,)) for i in range(3)]
        threads += [threading.Thread(target=namespace)]
        threads += [threading.Thread(target=walker)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
            check(not t.is_alive(), "a worker thread finished within 300 s")
        for e in errors:
            check(False, e)
        u = m.unmount()
        check(u is not None and u.returncode == 0, "write-back: %s" % (u and u.stderr))
    got, _ = read_bpk(src)
    for i, key in enumerate(written):
        check(got.get(key, (0, 0, b""))[2] == pattern(i, len(orig[key][2])), "%s written back" % key)
    for key in read_only:
        check(got.get(key) == orig[key], "%s unchanged" % key)
    scratch = sorted(k for k in got if k.startswith("scratch."))
    want = sorted("scratch.b%d" % r for r in range(0, ROUNDS, 2))
    check(scratch == want, "scratch files written back: %s" % scratch)
    for k in scratch:
        check(got[k][0] == "F32" and got[k][1] == [1024], "%s dtype/shape %r" % (k, got[k][:2]))


if __name__ == "__main__":
    with tmpdir("conc") as tmp:
        try:
            test_mixed(tmp)
        except Exception as e:
            check(False, "test_mixed raised %r" % e)
        finally:
            force_unmount(os.path.join(tmp, "m"))
    finish("test_concurrent_io")
