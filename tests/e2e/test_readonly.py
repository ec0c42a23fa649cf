"""Read-only mounts of Burnpack and SafeTensors files, through real mounts:
every tensor file's bytes and xattrs against an independent reading, the
usual tools (ls, cat, cp, getfattr), mount(8) through the helper, EROFS,
and bad input refused before mounting."""
import errno
import json
import os
import shutil
import struct
import subprocess

from bsmount import (BIN, FIX, SOURCE_DIR, Mount, check, compare_tree, finish, is_mounted,
                     read_bpk, read_safetensors, run, tmpdir, force_unmount, xattrs, run_tests)

BPK = os.path.join(FIX, "examples/mnist-inference-web/model.bpk")
ST1 = os.path.join(FIX, "burn-store/safetensors-tests/tests/multi_layer/multi_layer.safetensors")
ST2 = os.path.join(FIX, "examples/import-model-weights/weights/mnist.safetensors")


def test_fixtures(tmp):
    for path, reader, fmt in ((BPK, read_bpk, "burnpack"), (ST1, read_safetensors, "safetensors"),
                              (ST2, read_safetensors, "safetensors")):
        expected, meta = reader(path)
        mnt = os.path.join(tmp, "m-" + os.path.basename(path))
        with Mount(path, mnt):
            compare_tree(mnt, expected, meta, fmt, os.path.basename(path))
            st = os.stat(os.path.join(mnt, os.listdir(mnt)[0]))
            check(st.st_mtime == os.stat(path).st_mtime, "timestamps are the source's mtime")
            check(os.stat(mnt).st_mode & 0o777 == 0o555, "root dir mode 0555")


def test_tools(tmp):
    mnt = os.path.join(tmp, "tools")
    expected, _ = read_bpk(BPK)
    with Mount(BPK, mnt):
        r = run(["ls", mnt])
        check(r.stdout.split() == ["conv1", "conv2", "fc1", "fc2", "fc3"], "ls: %r" % r.stdout)
        r = run(["ls", "-l", os.path.join(mnt, "fc3")])
        check("bias" in r.stdout and "weight" in r.stdout and "-r--r--r--" in r.stdout, "ls -l: %r" % r.stdout)
        r = subprocess.run(["cat", os.path.join(mnt, "fc1/weight")], capture_output=True, timeout=60)
        check(r.stdout == expected["fc1.weight"][2], "cat gives the tensor bytes")
        dst = os.path.join(tmp, "copied")
        r = run(["cp", "-r", mnt, dst])
        check(r.returncode == 0, "cp -r: %s" % r.stderr)
        check(open(os.path.join(dst, "conv2/conv/weight"), "rb").read() == expected["conv2.conv.weight"][2],
              "cp copies the bytes")
        r = run(["getfattr", "-d", os.path.join(mnt, "fc1/weight")])
        check('user.burnstore.dtype="F32"' in r.stdout and 'user.burnstore.shape="[1600,128]"' in r.stdout
              and 'user.burnstore.key="fc1.weight"' in r.stdout, "getfattr -d: %r" % r.stdout)
        r = run(["getfattr", "-d", mnt])
        check('user.burnstore.format="burnpack"' in r.stdout, "getfattr -d root: %r" % r.stdout)
        # Reads at odd offsets and sizes, and past the end.
        with open(os.path.join(mnt, "fc1/weight"), "rb") as f:
            raw = expected["fc1.weight"][2]
            for off, n in ((0, 1), (1, 4095), (4093, 10000), (len(raw) - 3, 100), (len(raw), 10)):
                f.seek(off)
                check(f.read(n) == raw[off:off + n], "read at %d+%d" % (off, n))
        # Read-only: every kind of write fails with EROFS.
        for what, fn in (
                ("open for write", lambda: open(os.path.join(mnt, "fc1/weight"), "r+b")),
                ("create", lambda: open(os.path.join(mnt, "new"), "wb")),
                ("mkdir", lambda: os.mkdir(os.path.join(mnt, "d"))),
                ("unlink", lambda: os.unlink(os.path.join(mnt, "fc1/bias"))),
                ("rename", lambda: os.rename(os.path.join(mnt, "fc1"), os.path.join(mnt, "x"))),
                ("truncate", lambda: os.truncate(os.path.join(mnt, "fc1/bias"), 0)),
                ("setxattr", lambda: os.setxattr(os.path.join(mnt, "fc1/bias"), "user.x", b"1"))):
            try:
                fn()
                check(False, "%s on a read-only mount succeeded" % what)
            except OSError as e:
                check(e.errno == errno.EROFS, "%s: errno %s, want EROFS" % (what, errno.errorcode.get(e.errno)))
        try:
            os.getxattr(os.path.join(mnt, "fc1/bias"), "user.burnstore.nope")
            check(False, "unknown xattr exists")
        except OSError as e:
            check(e.errno == errno.ENODATA, "unknown xattr: ENODATA")
    check(not is_mounted(mnt), "unmounted after burnstore -u")


def test_flat(tmp):
    mnt = os.path.join(tmp, "flat")
    expected, _ = read_safetensors(ST1)
    with Mount(ST1, mnt, opts="flat"):
        names = sorted(os.listdir(mnt))
        check(names == sorted(expected), "flat names are the keys: %r" % names[:4])
        for k in expected:
            check(open(os.path.join(mnt, k), "rb").read() == expected[k][2], "flat bytes of %s" % k)


def test_mount_helper(tmp):
    """mount -t burnstore through the installed /sbin/mount.burnstore, and
    an fstab-style line through mount -T FILE."""
    helper = "/sbin/mount.burnstore"
    if not check(os.access(helper, os.X_OK), "%s is installed (run cmake --install build)" % helper):
        return
    mnt = os.path.join(tmp, "helper")
    os.makedirs(mnt)
    expected, _ = read_bpk(BPK)
    try:
        r = run(["mount", "-t", "burnstore", BPK, mnt])
        check(r.returncode == 0, "mount -t burnstore: %s" % r.stderr)
        check(is_mounted(mnt), "mounted through the helper")
        if is_mounted(mnt):
            check(open(os.path.join(mnt, "fc3/bias"), "rb").read() == expected["fc3.bias"][2], "helper mount bytes")
            check(os.stat(os.path.join(mnt, "fc3/bias")).st_mode & 0o777 == 0o444, "mount(8)'s implicit rw stays read-only")
            r = run(["umount", mnt])
            check(r.returncode == 0 and not is_mounted(mnt), "umount: %s" % r.stderr)
        fstab = os.path.join(tmp, "fstab")
        with open(fstab, "w") as f:
            f.write("%s %s burnstore ro,flat,nofail 0 0\n" % (ST1, mnt))
        r = run(["mount", "-T", fstab, mnt])
        check(r.returncode == 0 and is_mounted(mnt), "mount -T fstab: %s" % r.stderr)
        if is_mounted(mnt):
            check("conv1.weight" in os.listdir(mnt), "fstab options reach burnstore (flat)")
        r = run([BIN, "-u", mnt])
        check(r.returncode == 0, "burnstore -u: %s" % r.stderr)
    finally:
        force_unmount(mnt)


def bad_inputs(tmp):
    """(name, bytes, substring of the error) for each kind of bad input."""
    good = open(BPK, "rb").read()
    m = struct.unpack("<I", good[6:10])[0]
    cases = [("truncated.bpk", good[:len(good) // 2], "trunc"),
             ("magic.bpk", b"XXXX" + good[4:], "unknown format"),
             ("badcbor.bpk", good[:10] + b"\xff" * m + good[10 + m:], "offset"),
             ("meta-huge.bpk", good[:6] + struct.pack("<I", 0xFFFFFFF0) + good[10:], "metadata")]
    st = open(ST1, "rb").read()
    n = struct.unpack("<Q", st[:8])[0]
    header = json.loads(st[8:8 + n])
    data = st[8 + n:]

    def st_file(h, d=data):
        hb = json.dumps(h).encode()
        return struct.pack("<Q", len(hb)) + hb + d

    def mutate(fn):
        h = json.loads(json.dumps(header))
        fn(h)
        return h
    first = next(k for k in header if k != "__metadata__")
    cases += [
        ("hugeheader.safetensors", struct.pack("<Q", 1 << 62) + st[8:], "header"),
        ("oob.safetensors", st_file(mutate(lambda h: h[first].__setitem__("data_offsets", [0, 10 ** 12]))), first),
        ("overlap.safetensors", st_file(mutate(lambda h: [h[k].__setitem__("data_offsets", [0, h[k]["data_offsets"][1] - h[k]["data_offsets"][0]]) for k in list(h)[:2]])), "offset"),
        ("size.safetensors", st_file(mutate(lambda h: h[first].__setitem__("shape", [3, 1000]))), first),
        ("dtype.safetensors", st_file(mutate(lambda h: h[first].__setitem__("dtype", "Q9"))), "Q9"),
        ("trailing.safetensors", st + b"xx", "bytes"),
        ("dup.safetensors", struct.pack("<Q", 0), "header"),
        ("empty.bin", b"", "bytes"),
        ("text.txt", b"hello world, not a checkpoint\n", "unknown format"),
    ]
    hb = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    cases.append(("dupkeys.safetensors", struct.pack("<Q", len(hb)) + hb + b"\0" * 8, "duplicate"))
    return cases


def test_bad_input(tmp):
    mnt = os.path.join(tmp, "bad")
    os.makedirs(mnt)
    for name, blob, needle in bad_inputs(tmp):
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(blob)
        try:
            r = run([BIN, path, mnt], timeout=30)
        except subprocess.TimeoutExpired:
            check(False, "%s: burnstore hung" % name)
            force_unmount(mnt)
            continue
        lines = r.stderr.strip().splitlines()
        check(r.returncode != 0, "%s: exit status %d" % (name, r.returncode))
        check(len(lines) == 1, "%s: one line of error, got %r" % (name, r.stderr))
        check(r.returncode < 128, "%s: crashed (status %d)" % (name, r.returncode))
        if lines:
            check(name in lines[0], "%s: the error names the file: %r" % (name, lines[0]))
            check(needle.lower() in lines[0].lower(), "%s: error mentions %r: %r" % (name, needle, lines[0]))
        check(not is_mounted(mnt), "%s: nothing mounted" % name)
        force_unmount(mnt)


def test_huge_sparse(tmp):
    """A 6 GiB tensor (a sparse file): 64-bit sizes and offsets end to end,
    and mounting reads only the header."""
    path = os.path.join(tmp, "huge.safetensors")
    n = 6 << 30
    hb = json.dumps({"small": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                     "huge": {"dtype": "F32", "shape": [n // 4], "data_offsets": [8, 8 + n]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"ABCDEFGH")
        f.truncate(8 + len(hb) + 8 + n)
        f.seek(8 + len(hb) + 8 + n - 4)
        f.write(b"WXYZ")
    mnt = os.path.join(tmp, "huge")
    with Mount(path, mnt):
        p = os.path.join(mnt, "huge")
        check(os.path.getsize(p) == n, "6 GiB st_size")
        with open(p, "rb") as f:
            f.seek(n - 8)
            check(f.read(100) == b"\0\0\0\0WXYZ", "the last bytes of a 6 GiB tensor")
            f.seek((5 << 30) + 3)
            check(f.read(4) == b"\0" * 4, "bytes past 4 GiB")
        check(open(os.path.join(mnt, "small"), "rb").read() == b"ABCDEFGH", "the small tensor")
    os.unlink(path)


def test_cli(tmp):
    r = run([BIN, "--version"])
    check(r.returncode == 0 and r.stdout.startswith("burnstore "), "--version")
    r = run([BIN, "--help"])
    check(r.returncode == 0 and "MOUNTPOINT" in r.stdout, "--help")
    r = run([BIN, BPK, os.path.join(tmp, "m"), "-o", "bogus"])
    check(r.returncode != 0 and "unknown option 'bogus'" in r.stderr, "unknown option refused: %r" % r.stderr)
    r = run([BIN, BPK])
    check(r.returncode != 0 and "MOUNTPOINT" in r.stderr, "missing mountpoint refused")


def test_unmount_odd_paths(tmp):
    """-u finds a mount whose path /proc/mounts escapes (space, tab), and says
    plainly when a directory is not mounted at all."""
    for name in ("sp ace", "t\tab", "back\\slash"):
        mnt = os.path.join(tmp, name)
        with Mount(BPK, mnt):
            try:
                r = run([BIN, "-u", mnt], timeout=20)
                check(r.returncode == 0 and not is_mounted(mnt), "-u of %r: %r" % (name, r.stderr))
            except subprocess.TimeoutExpired:
                check(False, "-u of %r hangs" % name)
    plain = os.path.join(tmp, "plain")
    os.makedirs(plain, exist_ok=True)
    r = run([BIN, "-u", plain])
    check(r.returncode == 1 and r.stderr.count("\n") == 1 and "not mounted" in r.stderr,
          "-u of an unmounted directory: one line saying so: %r" % r.stderr)
    f = os.path.join(tmp, "afile")
    open(f, "w").close()
    r = run([BIN, BPK, f])
    check(r.returncode == 1 and "Not a directory" in r.stderr, "a file as mountpoint: %r" % r.stderr)


if __name__ == "__main__":
    run_tests("test_readonly", [
        test_unmount_odd_paths,
        test_cli,
        test_fixtures,
        test_tools,
        test_flat,
        test_huge_sparse,
        test_mount_helper,
        test_bad_input,
    ], "ro")
