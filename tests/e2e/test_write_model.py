"""The editable model of writable mounts through real mounts: per-file locks
(a read of one tensor is not blocked while another is staged), opening for
writing changes nothing, staged data freed on unlink/replace, no fd per
staged file, rsync -aX / cp -a / mv of plain files, inferred shapes staying
inferred, QFloat kept, links refused, the xattr bound, and filters on rw."""
import errno
import glob
import os
import struct
import subprocess
import sys
import threading
import time

from bsmount import BIN, SOURCE_DIR, Mount, check, force_unmount, read_bpk, run, run_tests

sys.path.insert(0, os.path.join(SOURCE_DIR, "tests/support"))
from cbor_fixture import cbor_encode  # noqa: E402


def sh(cmd, cwd, ok=True):
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=300)
    if ok:
        check(r.returncode == 0, "`%s`: exit %d %s" % (cmd, r.returncode, r.stderr.strip()[:300]))
    return r


def make_bpk(tmp, name, files):
    """A Burnpack written by burnstore: files = {relpath: (bytes, dtype, shape)}."""
    out = os.path.join(tmp, name)
    mnt = os.path.join(tmp, name + "-mk")
    with Mount(out, mnt) as m:
        for rel, (data, dt, shape) in files.items():
            p = os.path.join(mnt, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data)
            os.setxattr(p, "user.burnstore.dtype", dt.encode())
            os.setxattr(p, "user.burnstore.shape", str(list(shape)).encode())
        u = m.unmount()
        check(u.returncode == 0, "make %s: %s" % (name, u.stderr))
    return out


def staging_bytes(tmp, out):
    d = glob.glob(os.path.join(os.path.dirname(out), ".%s.staging-*" % os.path.basename(out)))
    total = 0
    for s in d:
        for f in os.listdir(s):
            total += os.stat(os.path.join(s, f)).st_blocks * 512
    return total, d


def test_read_not_blocked_by_staging(tmp):
    """The first write into a big clean tensor copies it to staging under
    that file's lock only: a read of another tensor returns meanwhile. A
    read counts as not blocked when it returned while the staging copy was
    still incomplete; with a mount-wide lock that can never happen. Three
    tensors give three tries, so a copy that ends just after a read does not
    make the test flaky."""
    big = 384 << 20
    mnt0 = os.path.join(tmp, "lk-mk")
    out = os.path.join(tmp, "lk.bpk")
    with Mount(out, mnt0) as m:
        sh("for i in 0 1 2; do dd if=/dev/zero of=a$i bs=1M count=%d status=none; done && "
           "printf 'bbbbbbbb' > b" % (big >> 20), mnt0)
        check(m.unmount().returncode == 0, "lk.bpk written")
    mnt = os.path.join(tmp, "lk")

    def staged_sizes():
        return [os.path.getsize(f) for s in glob.glob(os.path.join(tmp, ".lk.bpk.staging-*"))
                for f in glob.glob(os.path.join(s, "[0-9]*"))]

    def first_write(path):
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, b"x", 0)
        os.close(fd)

    wins, reads = 0, 0
    with Mount(out, mnt, opts="rw"):
        subprocess.run(["cat", out], stdout=subprocess.DEVNULL, timeout=120)  # a fast copy: the hard case
        for i in range(3):
            t = threading.Thread(target=first_write, args=(os.path.join(mnt, "a%d" % i),))
            t.start()
            deadline = time.time() + 60
            while t.is_alive() and time.time() < deadline:  # the copy of a<i> has started
                if len([x for x in staged_sizes() if x < big]) > 0:
                    break
                time.sleep(0.0002)
            while t.is_alive():
                bfd = os.open(os.path.join(mnt, "b"), os.O_RDONLY)
                data = os.pread(bfd, 8, 0)
                os.close(bfd)
                reads += 1
                check(data == b"bbbbbbbb", "b reads right during the copy")
                if [x for x in staged_sizes() if x < big] and t.is_alive():
                    wins += 1
                    break
            t.join(120)
            if wins:
                break
    check(wins > 0, "a read of b returned while a tensor was being staged (%d reads)" % reads)


def test_open_for_write_is_not_a_change(tmp):
    out = make_bpk(tmp, "ow.bpk", {"w": (b"\1\2\3\4", "U8", [4])})
    ino = os.stat(out).st_ino
    mnt = os.path.join(tmp, "ow")
    with Mount(out, mnt, opts="rw") as m:
        os.close(os.open(os.path.join(mnt, "w"), os.O_WRONLY))
        os.close(os.open(os.path.join(mnt, "w"), os.O_RDWR))
        u = m.unmount()
        check(u.returncode == 0, "unmount: %s" % u.stderr)
    check(os.stat(out).st_ino == ino, "opening for writing did not rewrite the file")


def test_staged_data_freed(tmp):
    out = os.path.join(tmp, "fr.bpk")
    mnt = os.path.join(tmp, "fr")
    size = 64 << 20
    with Mount(out, mnt) as m:
        sh("dd if=/dev/urandom of=big bs=1M count=%d status=none" % (size >> 20), mnt)
        for i in range(5):
            sh("cp big big.tmp && mv big.tmp big", mnt)
        staged, dirs = staging_bytes(tmp, out)
        check(staged <= size + (1 << 20), "after 5 copy-and-rename rounds %d bytes staged (one file: %d)" % (staged, size))
        sh("cp big gone && rm gone", mnt)
        staged, _ = staging_bytes(tmp, out)
        check(staged <= size + (1 << 20), "an unlinked file's staged bytes are freed (%d staged)" % staged)
        # Open, unlink, still readable, freed at close.
        fd = os.open(os.path.join(mnt, "open"), os.O_RDWR | os.O_CREAT)
        os.write(fd, b"z" * (8 << 20))
        os.unlink(os.path.join(mnt, "open"))
        check(os.pread(fd, 4, 0) == b"zzzz", "an unlinked open file stays readable")
        os.close(fd)
        time.sleep(0.2)
        staged, _ = staging_bytes(tmp, out)
        check(staged <= size + (1 << 20), "freed at the last close (%d staged)" % staged)
        data = open(os.path.join(mnt, "big"), "rb").read()
        u = m.unmount()
        check(u.returncode == 0, "write-back: %s" % u.stderr)
    got, _ = read_bpk(out)
    check(set(got) == {"big"} and got["big"][2] == data, "the output holds the last copy")


def test_many_files_low_ulimit(tmp):
    """No fd per staged file: 10,000 files and 1,100 create+unlink cycles with
    the daemon under ulimit -n 1024 (soft and hard), and the write-back."""
    out = os.path.join(tmp, "many.bpk")
    mnt = os.path.join(tmp, "many")
    os.makedirs(mnt, exist_ok=True)
    try:
        r = subprocess.run(["bash", "-c", 'ulimit -n 1024 && exec "$0" "$1" "$2"', BIN, out, mnt],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, "mount under ulimit -n 1024: %s" % r.stderr)
        for i in range(1100):
            p = os.path.join(mnt, "tmp%d" % i)
            with open(p, "wb") as f:
                f.write(b"t")
            os.unlink(p)
        os.makedirs(os.path.join(mnt, "d"))
        for i in range(10000):
            with open(os.path.join(mnt, "d", "f%d" % i), "wb") as f:
                f.write(struct.pack("<I", i))
        check(len(os.listdir(os.path.join(mnt, "d"))) == 10000, "10,000 files listed")
        with open(os.path.join(mnt, "d", "f9999"), "rb") as f:
            check(f.read() == struct.pack("<I", 9999), "read back")
        u = run([BIN, "-u", mnt], timeout=600)
        check(u.returncode == 0, "write-back of 10,000 files under ulimit -n 1024: %s" % u.stderr)
    finally:
        force_unmount(mnt)
    got, _ = read_bpk(out) if os.path.exists(out) else ({}, {})
    check(len(got) == 10000 and got.get("d.f1234", (0, 0, b""))[2] == struct.pack("<I", 1234),
          "10,000 tensors written (%d)" % len(got))
    # A soft limit below the hard one is raised.
    mnt2 = os.path.join(tmp, "many2")
    os.makedirs(mnt2, exist_ok=True)
    try:
        r = subprocess.run(["bash", "-c", 'ulimit -Sn 256 && exec "$0" "$1" "$2"', BIN,
                            os.path.join(tmp, "many2.bpk"), mnt2], capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, "mount under ulimit -Sn 256: %s" % r.stderr)
        os.listdir(mnt2)  # waits for the kernel's INIT, whose handler raises the limit
        pid = run(["pgrep", "-f", "burnstore %s" % os.path.join(tmp, "many2.bpk")]).stdout.split()
        lim = [l.split() for l in open("/proc/%s/limits" % pid[0]) if l.startswith("Max open files")][0]
        check(lim[3] == lim[4], "the daemon raised its soft RLIMIT_NOFILE to the hard one: %r" % lim)
    finally:
        run([BIN, "-u", mnt2])
        force_unmount(mnt2)


def test_copy_tools(tmp):
    """rsync -aX, cp -a and mv of plain files into a writable mount exit 0;
    an inferred shape stays inferred through cp -a and rsync -aX."""
    plain = os.path.join(tmp, "plain")
    os.makedirs(os.path.join(plain, "sub"))
    for rel, data in (("x", b"12345678"), ("sub/y", b"abcd")):
        open(os.path.join(plain, rel), "wb").write(data)
    out = os.path.join(tmp, "ct.bpk")
    mnt = os.path.join(tmp, "ct")
    with Mount(out, mnt) as m:
        sh("rsync -aX %s/ %s/" % (plain, mnt), tmp)
        sh("rsync -aX %s/ %s/" % (plain, mnt), tmp)  # again: over existing files
        sh("cp -a %s/x %s/cpa && cp %s/x %s/mvd-src && mv %s/mvd-src %s/mvd" % (plain, mnt, plain, plain, plain, mnt), tmp)
        check("user.burnstore.shape" not in os.listxattr(os.path.join(mnt, "x")), "an inferred shape is not listed")
        check(os.getxattr(os.path.join(mnt, "x"), "user.burnstore.shape") == b"[8]", "but answered")
        # Copies inside the mount keep it inferred: a later truncate is no contradiction.
        sh("cp -a x x2 && truncate -s 16 x2 && rsync -aX sub/ sub2/ && truncate -s 6 sub2/y", mnt)
        check(os.getxattr(os.path.join(mnt, "x2"), "user.burnstore.shape") == b"[16]", "x2 follows its size")
        # rsync -X back out of the mount and in again.
        sh("rsync -aX %s/sub/ %s/sub3/" % (mnt, mnt), tmp)
        u = m.unmount()
        check(u.returncode == 0, "write-back after the copies: %s" % u.stderr)
    got, _ = read_bpk(out) if os.path.exists(out) else ({}, {})
    check(got.get("x2", (0, 0))[:2] == ("U8", [16]) and got.get("sub2.y", (0, 0))[:2] == ("U8", [6]),
          "inferred shapes written by size: %r" % {k: v[:2] for k, v in got.items()})
    check(got.get("cpa", (0, 0, b""))[2] == b"12345678" and got.get("mvd", (0, 0, b""))[2] == b"12345678"
          and got.get("sub.y", (0, 0, b""))[2] == b"abcd", "copied files written")


def test_qfloat_kept(tmp):
    from bsmount import cbor_decode
    base = make_bpk(tmp, "q0.bpk", {"q": (bytes(range(20)), "U8", [20]), "a": (b"\0" * 4, "F32", [1])})
    data = open(base, "rb").read()
    m = struct.unpack("<I", data[6:10])[0]
    meta, _ = cbor_decode(data, 10)
    old_d = (10 + m + 255) // 256 * 256
    scheme = {"QFloat": {"value": "Q8S", "mode": "Look"}}
    meta["tensors"]["q"]["dtype"] = scheme
    meta["tensors"]["q"]["shape"] = [4, 4]
    mb = cbor_encode(meta)
    d = (10 + len(mb) + 255) // 256 * 256
    q = os.path.join(tmp, "q.bpk")
    with open(q, "wb") as f:
        f.write(data[:6] + struct.pack("<I", len(mb)) + mb + b"\0" * (d - 10 - len(mb)) + data[old_d:])
    before, _ = read_bpk(q)
    check(before["q"][0] == "QFLOAT", "fixture has a QFloat tensor")
    mnt = os.path.join(tmp, "q")
    with Mount(q, mnt, opts="rw") as mm:
        p = os.path.join(mnt, "q")
        check(os.getxattr(p, "user.burnstore.dtype") == b"QFLOAT", "QFloat shown")
        with open(p, "r+b") as f:
            f.write(b"\xff\xfe")
        check(os.getxattr(p, "user.burnstore.dtype") == b"QFLOAT", "still QFloat after a write: %r" % os.getxattr(p, "user.burnstore.dtype"))
        os.setxattr(p, "user.burnstore.dtype", b"U8")
        os.setxattr(p, "user.burnstore.dtype", b"QFLOAT")
        check(os.getxattr(p, "user.burnstore.dtype") == b"QFLOAT", "settable back")
        u = mm.unmount()
        check(u.returncode == 0, "write-back with a written QFloat tensor: %s" % u.stderr)
    after, _ = read_bpk(q)
    check(after["q"][0] == "QFLOAT" and after["q"][2] == b"\xff\xfe" + bytes(range(2, 20)),
          "QFloat written back with its new bytes: %r" % (after["q"][:2],))
    raw = open(q, "rb").read()
    check(b"Q8S" in raw and b"Look" in raw, "the quantization scheme kept")


def test_links_refused(tmp):
    out = os.path.join(tmp, "ln.bpk")
    mnt = os.path.join(tmp, "ln")
    with Mount(out, mnt):
        open(os.path.join(mnt, "f"), "wb").write(b"1")
        for fn in (lambda: os.symlink("f", os.path.join(mnt, "s")),
                   lambda: os.link(os.path.join(mnt, "f"), os.path.join(mnt, "h"))):
            try:
                fn()
                check(False, "a link was created")
            except OSError as e:
                check(e.errno == errno.EPERM, "link: EPERM, not %s" % errno.errorcode.get(e.errno))


def test_xattr_bound(tmp):
    out = os.path.join(tmp, "xb.bpk")
    mnt = os.path.join(tmp, "xb")
    with Mount(out, mnt):
        p = os.path.join(mnt, "f")
        open(p, "wb").write(b"1")
        v = b"v" * 65536
        n, err = 0, None
        for i in range(1200):  # 1200 x 64 KiB = 75 MiB > the 64 MiB bound
            try:
                os.setxattr(p, "user.x%d" % i, v)
                n += 1
            except OSError as e:
                err = e.errno
                break
        check(err == errno.ENOSPC and 900 <= n <= 1024, "ENOSPC past 64 MiB of xattrs (%d set, %r)" % (n, err))
        os.removexattr(p, "user.x0")
        os.setxattr(p, "user.again", v)  # removing gives the room back


def test_filter_on_rw(tmp):
    files = {"fc1/weight": (b"\1" * 16, "F32", [2, 2]), "fc1/bias": (b"\2" * 8, "F32", [2]),
             "fc2/weight": (b"\3" * 16, "F32", [2, 2]), "conv/k": (b"\4" * 4, "U8", [4])}
    src = make_bpk(tmp, "flt.bpk", files)
    before, _ = read_bpk(src)
    mnt = os.path.join(tmp, "flt")
    with Mount(src, mnt, opts="rw,include=^fc1") as m:
        check(sorted(os.listdir(mnt)) == ["fc1"], "the filter restricts the view: %r" % os.listdir(mnt))
        with open(os.path.join(mnt, "fc1/bias"), "r+b") as f:
            f.write(b"\x09")
        u = m.unmount()
        check(u.returncode == 0, "rw,include write-back: %s" % u.stderr)
    after, _ = read_bpk(src)
    check(set(after) == set(before), "nothing the filter hid was deleted: %r" % sorted(after))
    check(after.get("fc1.bias", (0, 0, b""))[2] == b"\x09" + b"\2" * 7, "the edit written")
    for k in ("fc2.weight", "conv.k", "fc1.weight"):
        check(after.get(k, (0, 0, b""))[2] == before[k][2], "%s kept as it was" % k)
    # An extraction to a new output writes only what the mount shows.
    ext = os.path.join(tmp, "ext.bpk")
    with Mount(src, mnt, opts="include=^fc1,output=" + ext) as m:
        u = m.unmount()
        check(u.returncode == 0, "extraction: %s" % u.stderr)
    got, _ = read_bpk(ext) if os.path.exists(ext) else ({}, {})
    check(set(got) == {"fc1.weight", "fc1.bias"}, "extraction holds the view: %r" % sorted(got))


def test_strided_reshaped(tmp):
    """A clean strided tensor (a transposed PyTorch view) whose shape or dtype
    is set on a rw mount is written with the bytes the mount showed, not
    re-read from its storage through strides that no longer fit."""
    pt = os.path.join(tmp, "strided.pt")
    code = ("import collections, sys, torch\n"
            "b = torch.arange(12, dtype=torch.float32)\n"
            "torch.save(collections.OrderedDict([('t', b.view(3, 4).t()), ('u', b.view(3, 4).t())]), "
            "sys.argv[1])\n")
    r = subprocess.run(["/usr/bin/python3", "-c", code, pt], capture_output=True, text=True, timeout=300)
    if not check(r.returncode == 0, "torch wrote the strided checkpoint: %s" % r.stderr[-500:]):
        return
    out = os.path.join(tmp, "strided.bpk")
    mnt = os.path.join(tmp, "strided")
    with Mount(pt, mnt, opts="output=" + out) as m:
        t, u = os.path.join(mnt, "t"), os.path.join(mnt, "u")
        shown = {p: open(p, "rb").read() for p in (t, u)}
        os.setxattr(t, "user.burnstore.shape", b"[12]")
        os.setxattr(u, "user.burnstore.dtype", b"I32")  # the same width; 1-D by size
        check(open(t, "rb").read() == shown[t], "a new shape leaves the bytes as they were")
        res = m.unmount()
        check(res.returncode == 0, "strided write-back: %s" % res.stderr)
    got, _ = read_bpk(out) if os.path.exists(out) else ({}, {})
    check(got.get("t", (0, 0, b""))[:3] == ("F32", [12], shown[t]),
          "t written as shown, reshaped: %r" % (got.get("t"),))
    check(got.get("u", (0, 0, b""))[:3] == ("I32", [12], shown[u]),
          "u written as shown, retyped: %r" % (got.get("u"),))


if __name__ == "__main__":
    run_tests("test_write_model", [
        test_open_for_write_is_not_a_change,
        test_links_refused,
        test_copy_tools,
        test_qfloat_kept,
        test_filter_on_rw,
        test_strided_reshaped,
        test_xattr_bound,
        test_staged_data_freed,
        test_many_files_low_ulimit,
        test_read_not_blocked_by_staging,
    ], "wmodel")
