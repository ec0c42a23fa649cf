"""Reads stay honest when the checkpoint changes under a mount: truncating
it, rewriting it in place (cp over it, same or other size) or editing it
(even with the mtime restored) makes reads of what was not read yet fail
with EIO and one log line naming the file, never return wrong or short
bytes; deleting it or renaming another file over it keeps serving the old
bytes. A writable mount whose source changed refuses its write-back."""
import errno
import os
import subprocess
import time

from bsmount import (BIN, DEADLINE, Mount, check, finish, force_unmount, is_mounted, read_bpk, run,
                     tmpdir, run_tests, write_safetensors)

MIB = 1 << 20
NAMES = ("a", "b", "c", "d")


def tensors(fill):
    """Four 1 MiB U8 tensors; byte values depend on fill."""
    return {k: bytes([(fill + i * 7 + j) & 0xFF for j in range(256)]) * (MIB // 256)
            for i, k in enumerate(NAMES)}


def read_errno(path):
    """The errno of reading path whole, or None and the bytes."""
    try:
        with open(path, "rb") as f:
            return None, f.read()
    except OSError as e:
        return e.errno, None


class ForegroundMount:
    """burnstore -f SOURCE MNT, its stderr kept; always unmounted."""

    def __init__(self, source, mnt):
        self.source, self.mnt, self.stderr = source, mnt, ""

    def __enter__(self):
        os.makedirs(self.mnt, exist_ok=True)
        self.proc = subprocess.Popen([BIN, "-f", self.source, self.mnt], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        end = time.monotonic() + DEADLINE
        while not is_mounted(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.__exit__()
                raise RuntimeError("foreground mount failed: %s" % self.stderr)
            time.sleep(0.02)
        return self.mnt

    def __exit__(self, *exc):
        force_unmount(self.mnt)
        try:
            _, self.stderr = self.proc.communicate(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, self.stderr = self.proc.communicate()
            check(False, "the foreground daemon did not exit after the unmount")
        return False


def fresh(tmp, name):
    src = os.path.join(tmp, name + ".safetensors")
    write_safetensors(src, tensors(1))
    return src, os.path.join(tmp, "m-" + name)


def expect_eio(mnt, what, read_first=None):
    for k in NAMES:
        if k == read_first:
            continue
        e, _ = read_errno(os.path.join(mnt, k))
        check(e == errno.EIO, "%s: reading %s gives %s, want EIO" % (what, k, errno.errorcode.get(e, e)))
    r = subprocess.run(["cat", os.path.join(mnt, NAMES[-1])], capture_output=True, timeout=DEADLINE)
    check(r.returncode != 0 and r.stdout == b"", "%s: cat fails and prints nothing" % what)
    check(sorted(os.listdir(mnt)) == list(NAMES), "%s: the listing still works" % what)


def test_changes_give_eio(tmp):
    ref = tensors(1)
    other = os.path.join(tmp, "other.safetensors")
    write_safetensors(other, tensors(2))  # same size, other bytes
    bigger = os.path.join(tmp, "bigger.safetensors")
    write_safetensors(bigger, tensors(3), pad=4096)

    def truncate(src):
        os.truncate(src, 0)

    def cp_same_size(src):
        ino = os.stat(src).st_ino
        check(run(["cp", other, src]).returncode == 0, "cp over")
        check(os.stat(src).st_ino == ino and os.path.getsize(src) == os.path.getsize(other),
              "cp rewrote the same inode at the same size")

    def cp_other_size(src):
        ino = os.stat(src).st_ino
        check(run(["cp", bigger, src]).returncode == 0, "cp over")
        check(os.stat(src).st_ino == ino, "cp rewrote the same inode")

    def edit_touch_r(src):
        st = os.stat(src)
        ref_file = src + ".ref"
        open(ref_file, "w").close()
        os.utime(ref_file, ns=(st.st_atime_ns, st.st_mtime_ns))
        time.sleep(0.02)  # let the file clock tick so that the edit gets a new ctime
        with open(src, "r+b") as f:  # one byte inside tensor d, in place
            f.seek(st.st_size - 100)
            f.write(b"\xAA")
        check(run(["touch", "-r", ref_file, src]).returncode == 0, "touch -r")
        st2 = os.stat(src)
        check(st2.st_mtime_ns == st.st_mtime_ns and st2.st_size == st.st_size and st2.st_ctime_ns != st.st_ctime_ns,
              "edit: same size and mtime, new ctime")

    for name, change in (("truncate", truncate), ("cp-same-size", cp_same_size),
                         ("cp-other-size", cp_other_size), ("edit-touch-r", edit_touch_r)):
        src, mnt = fresh(tmp, name)
        with Mount(src, mnt):
            # Read one tensor before the change: it may stay cached (its bytes
            # are the mounted file's, so that is honest) and must be right.
            e, got = read_errno(os.path.join(mnt, "a"))
            check(e is None and got == ref["a"], "%s: read before the change" % name)
            time.sleep(0.02)  # a new timestamp for the change
            change(src)
            expect_eio(mnt, name, read_first="a")
            check(os.stat(os.path.join(mnt, "b")).st_size == MIB, "%s: stat still works" % name)


def test_delete_and_rename_over_keep_the_old_bytes(tmp):
    ref = tensors(1)
    for name in ("delete", "rename-over"):
        src, mnt = fresh(tmp, name)
        with Mount(src, mnt):
            if name == "delete":
                os.unlink(src)
            else:
                new = os.path.join(tmp, "new.safetensors")
                write_safetensors(new, tensors(5))
                os.rename(new, src)
            for k in NAMES:  # none read before: every read reaches the daemon
                e, got = read_errno(os.path.join(mnt, k))
                check(e is None and got == ref[k], "%s: %s gives the old bytes (%s)" % (name, k, e))


def test_log_line(tmp):
    src, mnt = fresh(tmp, "log")
    fm = ForegroundMount(src, mnt)
    with fm:
        time.sleep(0.02)
        os.truncate(src, 100)
        for k in NAMES:
            read_errno(os.path.join(mnt, k))
    lines = [l for l in fm.stderr.splitlines() if "changed since it was mounted" in l]
    check(len(lines) == 1, "one log line per source, got %d: %r" % (len(lines), fm.stderr[-500:]))
    check(lines and src in lines[0] and "size changed" in lines[0], "the line names the file: %r" % lines)


def test_writable_refuses_writeback(tmp):
    """rw: the target changed under the mount, so the write-back would copy
    changed bytes and overwrite another writer's file: refused, named."""
    base = os.path.join(tmp, "rwbase.safetensors")
    write_safetensors(base, tensors(1))
    bpk = os.path.join(tmp, "rw.bpk")
    with Mount(base, os.path.join(tmp, "m-conv"), opts="output=" + bpk) as m:
        check(m.unmount().returncode == 0, "conversion")
    mnt = os.path.join(tmp, "m-rw")
    with Mount(bpk, mnt, opts="rw") as m:
        with open(os.path.join(mnt, "a"), "r+b") as f:
            f.write(b"\x00" * 16)
        time.sleep(0.02)
        with open(bpk, "r+b") as f:  # someone else edits the file in place
            f.seek(-1, 2)
            f.write(b"\x55")
        edited = open(bpk, "rb").read()
        u = m.unmount()
        check(u.returncode != 0 and "changed since it was opened" in u.stderr and bpk in u.stderr,
              "burnstore -u reports the refused write-back: %r" % (u.stderr,))
    check(open(bpk, "rb").read() == edited, "the other writer's file is left as it was")
    # output= to another file: not written either.
    out = os.path.join(tmp, "out.bpk")
    src, mnt = fresh(tmp, "conv2")
    with Mount(src, mnt, opts="output=" + out) as m:
        time.sleep(0.02)
        os.truncate(src, 0)
        u = m.unmount()
        check(u.returncode != 0 and "changed since it was opened" in u.stderr,
              "output=: write-back refused: %r" % (u.stderr,))
    check(not os.path.exists(out), "output= not written from a changed source")


if __name__ == "__main__":
    run_tests("test_honest", [
        test_changes_give_eio,
        test_delete_and_rename_over_keep_the_old_bytes,
        test_log_line,
        test_writable_refuses_writeback,
    ], "honest")
