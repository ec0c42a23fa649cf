"""One lock per target for every writer (docs/robustness.md): a second
writable mount of the same target (a single file; a shard set named by its
index, by a shard or by NAME.safetensors), `burnstore convert` onto a mounted
target and `burnstore --finish` of a staging directory whose target is
mounted are all refused with one line naming the holder (its mountpoint and
pid), and the first mount's write-back is intact."""
import fcntl
import glob
import os

from bsmount import (BIN, Mount, check, daemon_pid, force_unmount, immutable, read_bpk, read_safetensors, run,
                     run_path, run_tests, write_safetensors)


def refused(r, mnt, what):
    """Non-zero, one line, naming the holding mount and its daemon's pid."""
    lines = r.stderr.strip().splitlines()
    pid = daemon_pid(mnt)
    return check(r.returncode != 0 and len(lines) == 1 and os.path.realpath(mnt) in lines[0]
                 and ("pid %d" % pid) in lines[0],
                 "%s: refused in one line naming %s (pid %s): %r" % (what, mnt, pid, r.stderr))


def test_single_file(tmp):
    out = os.path.join(tmp, "one.bpk")
    other = os.path.join(tmp, "other.safetensors")
    write_safetensors(other, {"o": b"oooo"})
    a, b = os.path.join(tmp, "one-a"), os.path.join(tmp, "one-b")
    os.makedirs(b)
    with Mount(out, a) as ma:
        with open(os.path.join(a, "x"), "wb") as f:
            f.write(b"1111")
        try:
            refused(run([BIN, out, b]), a, "a second mount of the same new file")
            refused(run([BIN, "-o", "output=" + out, other, b]), a, "output= of the same file")
            # Through another name of the same file: a relative path, a symlink's directory.
            os.symlink(tmp, os.path.join(tmp, "link"))
            refused(run([BIN, "-o", "output=link/one.bpk", other, b], cwd=tmp), a,
                    "output= through a symlinked directory")
            # convert onto the mounted target.
            r = run([BIN, "convert", other, out])
            refused(r, a, "convert onto a mounted target")
            check(not os.path.exists(out), "convert wrote nothing")
        finally:
            force_unmount(b)
        u = ma.unmount()
        check(u.returncode == 0, "-u: %s" % u.stderr)
    got, _ = read_bpk(out)
    check(set(got) == {"x"} and got["x"][2] == b"1111", "the first mount's write-back is intact: %r" % got)
    # Once the mount is gone, convert may write it.
    r = run([BIN, "convert", other, out])
    check(r.returncode == 0, "convert after the mount ended: %s" % r.stderr)


def test_shard_set(tmp):
    d = os.path.join(tmp, "set")
    os.makedirs(d)
    one = os.path.join(tmp, "flat.safetensors")
    ts = {"a": b"a" * 40, "b": b"b" * 40, "c": b"c" * 40}
    write_safetensors(one, ts)
    r = run([BIN, "convert", "-o", "max_shard_size=50", one, os.path.join(d, "model.safetensors")])
    if not check(r.returncode == 0, "convert into a set: %s" % r.stderr):
        return
    index = os.path.join(d, "model.safetensors.index.json")
    shards = sorted(glob.glob(os.path.join(d, "model-*-of-*.safetensors")))
    check(os.path.exists(index) and len(shards) == 3, "a set of 3 shards: %r" % shards)
    other = os.path.join(tmp, "other2.safetensors")
    write_safetensors(other, {"o": b"oooo"})
    a, b = os.path.join(tmp, "set-a"), os.path.join(tmp, "set-b")
    os.makedirs(b)
    # The set mounted rw in place through its index ...
    with Mount(index, a, "rw") as ma:
        with open(os.path.join(a, "b"), "r+b") as f:
            f.write(b"B")
        try:
            # ... is the same target as output= naming the set by its index,
            # by NAME.safetensors (with shards) and by one of its shards.
            for opts in ("output=%s" % index,
                         "output=%s,max_shard_size=50" % os.path.join(d, "model.safetensors"),
                         "output=%s" % shards[0]):
                refused(run([BIN, "-o", opts, other, b]), a, "-o " + opts)
            refused(run([BIN, d, b, "-o", "rw"]), a, "the set's directory mounted rw")
            refused(run([BIN, "convert", other, os.path.join(d, "model.safetensors")]), a,
                    "convert onto the set")
        finally:
            force_unmount(b)
        u = ma.unmount()
        check(u.returncode == 0, "-u: %s" % u.stderr)
    got = {}
    for s in glob.glob(os.path.join(d, "model-*-of-*.safetensors")):
        got.update(read_safetensors(s)[0])
    want = dict(ts, b=b"B" + b"b" * 39)
    check({k: v[2] for k, v in got.items()} == want, "the set holds the mount's write-back: %r" % sorted(got))


def test_mount_while_convert_writes(tmp):
    """A writer that is not a mount (convert, --finish) holds the lock: a
    writable mount of its target is refused naming it. The lock is held here
    as convert holds it, with convert's record; a real convert is too quick
    to be caught."""
    out = os.path.join(tmp, "conv.safetensors")
    mnt = os.path.join(tmp, "conv-m")
    os.makedirs(mnt)
    # Every name of the set is the one key DIR/NAME.safetensors.
    fd = os.open(run_path(os.path.join(os.path.realpath(tmp), "conv.safetensors"), ".target"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"pid 4242\nholder convert\ntarget %s\n" % out.encode())
        for target in (out, os.path.join(tmp, "conv.safetensors.index.json")):
            r = run([BIN, target, mnt])
            check(r.returncode != 0 and r.stderr.count("\n") == 1 and "burnstore convert (pid 4242)" in r.stderr,
                  "a mount of %s while convert writes it: %r" % (target, r.stderr))
        check(not os.path.exists(out), "nothing written")
    finally:
        force_unmount(mnt)
        os.close(fd)
    with Mount(out, mnt) as m:
        with open(os.path.join(mnt, "x"), "wb") as f:
            f.write(b"12")
        check(m.unmount().returncode == 0, "mounted once convert let go")
    check(os.path.exists(out), "the mount wrote its target")


def test_finish_while_mounted(tmp):
    """A staging directory left for target T (its write-back failed) cannot be
    finished while a new mount of T lives: it would replace that mount's
    result, or be replaced by it."""
    out = os.path.join(tmp, "fin.bpk")
    stg = os.path.join(tmp, "fin-stg")
    os.makedirs(stg)
    a = os.path.join(tmp, "fin-a")
    with Mount(out, a) as m:
        with open(os.path.join(a, "x"), "wb") as f:
            f.write(b"1234")
        check(m.unmount().returncode == 0, "fin.bpk written")
    with immutable(out) as ok:
        if not ok:
            return
        with Mount(out, a, "rw,staging=" + stg) as m:
            with open(os.path.join(a, "x"), "r+b") as f:
                f.write(b"9")
            check(m.unmount().returncode != 0, "the write-back over an immutable target fails")
    left = glob.glob(os.path.join(stg, "burnstore-*"))
    if not check(len(left) == 1 and os.path.exists(os.path.join(left[0], "INDEX")), "staging kept: %r" % left):
        return
    with Mount(out, a, "rw") as m:
        with open(os.path.join(a, "x"), "r+b") as f:
            f.write(b"7")
        refused(run([BIN, "--finish", left[0]]), a, "--finish while the target is mounted")
        check(os.path.isdir(left[0]), "the staging directory is kept")
        check(m.unmount().returncode == 0, "the mount writes back")
    got, _ = read_bpk(out)
    check(got.get("x", (0, 0, b""))[2] == b"7234", "the mount's write-back is intact: %r" % got)


if __name__ == "__main__":
    run_tests("test_target_lock", [test_single_file, test_shard_set, test_mount_while_convert_writes,
                                   test_finish_while_mounted], "lock")
