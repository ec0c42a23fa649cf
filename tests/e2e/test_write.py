"""Writable mounts through real mounts: the rsync round trip between mounts
(docs/user-guide.md, section 3) for every format, every POSIX operation that common tools use, -o rw on
an existing checkpoint, and the failures (nothing lost, old file intact,
burnstore -u reports)."""
import errno
import glob
import json
import os
import signal
import struct
import subprocess
import time

import numpy as np

from bsmount import (BIN, FIX, Mount, check, finish, force_unmount, is_mounted, mem_limit_kb,
                     read_bpk, run, tensor_files, tmpdir, xattrs, run_tests)

BPK = os.path.join(FIX, "examples/mnist-inference-web/model.bpk")
ST = os.path.join(FIX, "burn-store/safetensors-tests/tests/multi_layer/multi_layer.safetensors")
PT = os.path.join(FIX, "burn-store/pytorch-tests/tests/complex_nested/complex_nested.pt")
PT_LEGACY = os.path.join(FIX, "burn-store/src/pytorch/tests/reader/test_data/legacy_with_offsets.pt")


def snapshot(root):
    """relative path -> (bytes, dtype, shape) of every file of a mount."""
    out = {}
    for rel, p in tensor_files(root).items():
        x = xattrs(p)
        out[rel] = (open(p, "rb").read(), x.get("user.burnstore.dtype"), x.get("user.burnstore.shape"))
    return out


def roundtrip(tmp, src, name, sub=""):
    """mount src at A, new Y.bpk at B, rsync -aX A/sub B/sub, -u B, mount Y at C; compare."""
    a, b, c = (os.path.join(tmp, name + s) for s in ("-A", "-B", "-C"))
    y = os.path.join(tmp, name + "-Y.bpk")
    with Mount(src, a):
        with Mount(y, b) as mb:
            if sub:
                os.makedirs(os.path.join(b, sub), exist_ok=True)
            r = run(["rsync", "-aX", os.path.join(a, sub) + "/", os.path.join(b, sub) + "/"], timeout=300)
            check(r.returncode == 0, "%s: rsync -aX: %s" % (name, r.stderr))
            u = mb.unmount()
            check(u.returncode == 0, "%s: burnstore -u: %s" % (name, u.stderr))
        check(os.path.exists(y), "%s: %s written" % (name, y))
        if not os.path.exists(y):
            return
        with Mount(y, c):
            want = {k: v for k, v in snapshot(a).items() if k.startswith(sub)}
            got = snapshot(c)
            check(set(got) == set(want), "%s: same files: extra %s missing %s" % (
                name, sorted(set(got) - set(want))[:4], sorted(set(want) - set(got))[:4]))
            for k in want:
                if k in got:
                    check(got[k] == want[k], "%s: %s differs (bytes/dtype/shape)" % (name, k))
            r = run(["diff", "-r", os.path.join(a, sub), os.path.join(c, sub)])
            check(r.returncode == 0, "%s: diff -r: %s" % (name, r.stdout[:300]))
            check(xattrs(c).get("user.burnstore.meta.producer") == "burnstore", "%s: producer meta" % name)


def test_roundtrips(tmp):
    roundtrip(tmp, BPK, "bpk")
    roundtrip(tmp, BPK, "bpk-partial", sub="conv1")
    roundtrip(tmp, ST, "st")
    roundtrip(tmp, PT, "pt")
    roundtrip(tmp, PT, "pt-partial", sub="conv_blocks/1")
    roundtrip(tmp, PT_LEGACY, "pt-legacy")
    # Keys that need escaping survive an rsync: a tensor that is also a
    # directory (%%), empty segments (%), '/' and '%' in names.
    weird = os.path.join(tmp, "weird.safetensors")
    keys = ["a.b", "a.b.c", "x..y", ".lead", "p/q.r", "50%.v", "u.%2E", "t."]
    header, off = {}, 0
    for i, k in enumerate(keys):
        header[k] = {"dtype": "U8", "shape": [i + 1], "data_offsets": [off, off + i + 1]}
        off += i + 1
    hb = json.dumps(header).encode()
    with open(weird, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + bytes(range(off)))
    roundtrip(tmp, weird, "weird")
    y = os.path.join(tmp, "weird-Y.bpk")
    if os.path.exists(y):
        check(sorted(read_bpk(y)[0]) == sorted(keys), "escaped keys round trip: %s" % sorted(read_bpk(y)[0]))
    # param_ids survive an rsync copy of a Burnpack file.
    y = os.path.join(tmp, "bpk-Y.bpk")
    if os.path.exists(y):
        want, _ = read_bpk(BPK)
        got, meta = read_bpk(y)
        check(all(got[k][3] == want[k][3] for k in want if k in got), "param_ids kept by rsync -aX")


def sh(cmd, cwd):
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, "`%s`: %s" % (cmd, r.stderr.strip()))
    return r


def test_posix_ops(tmp):
    out = os.path.join(tmp, "posix.bpk")
    mnt = os.path.join(tmp, "posix")
    src = os.path.join(tmp, "posix-src")
    os.makedirs(src)
    np.arange(12, dtype=np.float32).tofile(os.path.join(src, "w"))
    with Mount(out, mnt) as m:
        sh("mkdir -p enc/layer0 dec tmpdir/deep/er", mnt)
        sh("cp -a %s/w enc/layer0/weight" % src, mnt)
        sh("setfattr -n user.burnstore.dtype -v F32 enc/layer0/weight", mnt)
        sh("setfattr -n user.burnstore.shape -v '[3,4]' enc/layer0/weight", mnt)
        sh("echo -n abcd > dec/bytes", mnt)                         # shell redirection, no dtype: U8
        sh("printf 'xxxxxxxx' > dec/over && printf 'YY' | dd of=dec/over bs=1 seek=3 conv=notrunc status=none", mnt)
        sh("truncate -s 16 dec/grown && truncate -s 8 dec/grown", mnt)
        with open(os.path.join(mnt, "dec/py"), "wb") as f:          # Python open(..., 'wb')
            f.write(np.arange(4, dtype=np.int64).tobytes())
        os.setxattr(os.path.join(mnt, "dec/py"), "user.burnstore.dtype", b"I64")
        np.arange(6, dtype=np.float64).reshape(2, 3).tofile(os.path.join(mnt, "dec/np"))  # numpy.tofile
        os.setxattr(os.path.join(mnt, "dec/np"), "user.burnstore.shape", b"[2,3]")
        os.setxattr(os.path.join(mnt, "dec/np"), "user.burnstore.dtype", b"F64")  # after the shape
        with open(os.path.join(mnt, "dec/sparse"), "wb") as f:       # sparse write
            f.seek(12)
            f.write(b"\x01\x02\x03\x04")
        sh("echo gone > dec/gone && rm dec/gone", mnt)
        sh("mv dec/bytes dec/renamed && mv tmpdir/deep moved && rm -r tmpdir", mnt)
        sh("cp -a enc/layer0/weight enc/copy && touch -d '2001-01-01' enc/copy && chmod 600 enc/copy", mnt)
        st = os.stat(os.path.join(mnt, "enc/copy"))
        check(int(st.st_mtime) == int(time.mktime(time.strptime("2001-01-01", "%Y-%m-%d"))), "utimens kept")
        check(st.st_mode & 0o777 == 0o600, "chmod kept")
        sh("setfattr -n user.rsync.junk -v 1 enc/copy && getfattr -n user.rsync.junk enc/copy", mnt)
        sh("setfattr -n user.burnstore.param_id -v 42 enc/copy", mnt)
        sh("setfattr -n user.burnstore.meta.author -v me .", mnt)
        for bad in (("user.burnstore.dtype", b"F99"), ("user.burnstore.shape", b"[1,"),
                    ("user.burnstore.shape", b"[-1]"), ("user.burnstore.param_id", b"x")):
            try:
                os.setxattr(os.path.join(mnt, "enc/copy"), bad[0], bad[1])
                check(False, "setxattr %s=%r accepted" % bad)
            except OSError as e:
                check(e.errno == errno.EINVAL, "setxattr %s=%r: EINVAL" % bad)
        check(open(os.path.join(mnt, "dec/over"), "rb").read() == b"xxxYYxxx", "dd conv=notrunc")
        check(os.path.getsize(os.path.join(mnt, "dec/grown")) == 8, "truncate")
        check(sorted(os.listdir(os.path.join(mnt, "dec"))) == ["grown", "np", "over", "py", "renamed", "sparse"],
              "listing after rm/mv: %r" % sorted(os.listdir(os.path.join(mnt, "dec"))))
        check(os.listdir(mnt).count("moved") == 1 and "tmpdir" not in os.listdir(mnt), "mv and rm -r of dirs")
        u = m.unmount()
        check(u.returncode == 0, "burnstore -u: %s" % u.stderr)
    got, meta = read_bpk(out)
    check(meta.get("author") == "me" and meta.get("format") == "burnpack", "metadata: %r" % meta)
    expect = {
        "enc.layer0.weight": ("F32", [3, 4], np.arange(12, dtype=np.float32).tobytes()),
        "enc.copy": ("F32", [3, 4], np.arange(12, dtype=np.float32).tobytes()),
        "dec.renamed": ("U8", [4], b"abcd"),
        "dec.over": ("U8", [8], b"xxxYYxxx"),
        "dec.grown": ("U8", [8], b"\0" * 8),
        "dec.py": ("I64", [4], np.arange(4, dtype=np.int64).tobytes()),
        "dec.np": ("F64", [2, 3], np.arange(6, dtype=np.float64).tobytes()),
        "dec.sparse": ("U8", [16], b"\0" * 12 + b"\x01\x02\x03\x04"),
    }
    check(set(got) == set(expect), "written keys %r" % sorted(got))
    for k, (dt, shape, raw) in expect.items():
        if k in got:
            check(got[k][:3] == (dt, shape, raw), "%s written as %r" % (k, got[k][:2]))
    check(got.get("enc.copy", (0, 0, 0, None))[3] == 42, "param_id written")
    data = open(out, "rb").read()
    check(len(data) % 1 == 0 and data[:4] == b"NRUB", "Burnpack magic")
    check(not glob.glob(os.path.join(tmp, ".posix.bpk.staging-*")), "staging removed after success")


def test_rw_existing(tmp):
    work = os.path.join(tmp, "rw.bpk")
    subprocess.run(["cp", BPK, work], check=True)
    os.chmod(work, 0o640)
    before, _ = read_bpk(work)
    mnt = os.path.join(tmp, "rw")
    with Mount(work, mnt, opts="rw") as m:
        sh("rm -r fc3 && mv fc1 dense && printf '\\0\\0\\x80\\x3f' | dd of=conv1/conv/bias bs=1 conv=notrunc status=none", mnt)
        sh("echo -n zz > extra", mnt)
        check(open(os.path.join(mnt, "fc2/bias"), "rb").read() == before["fc2.bias"][2], "clean tensors read from the source")
        u = m.unmount()
        check(u.returncode == 0, "rw: burnstore -u: %s" % u.stderr)
    after, _ = read_bpk(work)
    check(os.stat(work).st_mode & 0o777 == 0o640, "the replaced file keeps its mode")
    check("fc3.weight" not in after and "fc3.bias" not in after, "rm -r removed fc3")
    check(after.get("dense.weight", (0, 0, 0))[2] == before["fc1.weight"][2], "mv renamed fc1 -> dense")
    check(after.get("dense.weight", (0, 0, 0, 0))[3] == before["fc1.weight"][3], "param_id follows the rename")
    cb = after.get("conv1.conv.bias")
    check(cb is not None and cb[2][:4] == b"\0\0\x80\x3f" and cb[2][4:] == before["conv1.conv.bias"][2][4:],
          "overwrite in place")
    check(after.get("extra", (0, 0, 0))[2] == b"zz", "new file")
    check(after["fc2.weight"][2] == before["fc2.weight"][2], "unchanged tensors copied")
    # rw in place on a .pt (issue 21; tests/e2e/test_pth_write.py has the
    # edits): a mount that changes nothing leaves the file as it was.
    pt = os.path.join(tmp, "copy.pt")
    with open(PT, "rb") as f:
        orig = f.read()
    with open(pt, "wb") as f:
        f.write(orig)
    with Mount(pt, mnt, opts="rw") as m:
        u = m.unmount()
    check(u.returncode == 0, "rw on a .pt: %s" % u.stderr)
    with open(pt, "rb") as f:
        check(f.read() == orig, "an unchanged rw mount of a .pt leaves its bytes")
    # output= converts: nothing changed, still written
    conv = os.path.join(tmp, "converted.bpk")
    with Mount(ST, mnt, opts="output=" + conv) as m:
        u = m.unmount()
        check(u.returncode == 0, "convert: %s" % u.stderr)
    got, _ = read_bpk(conv) if os.path.exists(conv) else ({}, {})
    check(len(got) == 9, "converted safetensors has 9 tensors")


def kill_during_write_back(work, mnt, old, tmp):
    """kill -9 of the daemon while it writes back: the old file stays."""
    with Mount(work, mnt, opts="rw") as m:
        with open(os.path.join(mnt, "huge"), "wb") as f:
            chunk = b"\7" * (1 << 20)
            for _ in range(256):
                f.write(chunk)
        pids = [int(p) for p in run(["pgrep", "-f", "burnstore %s" % work]).stdout.split()]
        check(len(pids) == 1, "one daemon for %s" % work)
        um = subprocess.Popen(["fusermount3", "-u", mnt])
        caught = False
        deadline = time.time() + 30
        while time.time() < deadline and not caught:
            caught = any(f.startswith(".kill.bpk.burnstore-tmp-") for f in os.listdir(tmp))
        for p in pids:
            os.kill(p, signal.SIGKILL)
        um.wait(timeout=60)
        check(caught, "caught the write-back in progress (temp file seen)")
        u = run([BIN, "-u", mnt])
        check(u.returncode == 1 and "without finishing" in u.stderr, "-u after kill -9 says the daemon died: %r" % u.stderr)
    check(open(work, "rb").read() == old, "kill -9 during write-back leaves the old file intact")


def test_failures(tmp):
    # 1. A size that contradicts the shape: nothing written, staged data kept, -u says so.
    out = os.path.join(tmp, "bad.bpk")
    mnt = os.path.join(tmp, "fail")
    with Mount(out, mnt) as m:
        sh("printf 'abcdef' > t && setfattr -n user.burnstore.dtype -v F32 t && setfattr -n user.burnstore.shape -v '[2]' t", mnt)
        u = m.unmount()
        check(u.returncode != 0, "-u fails when a tensor is inconsistent")
        check("'t'" in u.stderr and "6 bytes" in u.stderr and "staging" in u.stderr, "-u explains: %r" % u.stderr)
    check(not os.path.exists(out), "no output file after a failed write-back")
    staged = glob.glob(os.path.join(tmp, ".bad.bpk.staging-*"))
    check(len(staged) == 1 and os.path.exists(os.path.join(staged[0], "INDEX")), "staged data and its INDEX kept")
    # 1b. The INDEX names every staged file, also those after the one that failed.
    out = os.path.join(tmp, "bad2.bpk")
    with Mount(out, mnt) as m:
        sh("printf abcde > a && setfattr -n user.burnstore.dtype -v F32 a && mkdir z && "
           "printf 12345678 > z/b && printf 1234 > z/c", mnt)
        u = m.unmount()
        check(u.returncode != 0 and "'a'" in u.stderr, "-u names the bad tensor: %r" % u.stderr)
    staged = glob.glob(os.path.join(tmp, ".bad2.bpk.staging-*"))
    if check(len(staged) == 1, "staging of bad2 kept"):
        # The INDEX of a write-back that could not describe its output:
        # "file STAGED KEY DTYPE SHAPE" records (docs/robustness.md).
        rows = [l.split("\t") for l in open(os.path.join(staged[0], "INDEX")).read().splitlines()
                if not l.startswith("#")]
        byname = {r[2]: r[1:] for r in rows if len(r) == 5 and r[0] == "file"}
        check(sorted(byname) == ["a", "z.b", "z.c"], "INDEX names every staged file: %r" % rows)
        for key, data in (("a", b"abcde"), ("z.b", b"12345678"), ("z.c", b"1234")):
            if key in byname:
                check(open(os.path.join(staged[0], byname[key][0]), "rb").read() == data,
                      "INDEX row of %s points at its data" % key)
        check(byname.get("a", [0, 0, 0])[2] == "F32", "INDEX keeps the dtype set: %r" % byname.get("a"))
    # 2. A full disk: a small tmpfs as the target directory; the old file stays.
    small = os.path.join(tmp, "small")
    os.makedirs(small)
    r = run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", small])
    if check(r.returncode == 0, "mount tmpfs: %s" % r.stderr):
        try:
            target = os.path.join(small, "full.bpk")
            with open(target, "wb") as f:
                f.write(b"old")
            # Staging on the big disk, output on the full one.
            with Mount(os.path.join(small, "new.bpk"), mnt, extra=["-o", "staging=" + tmp]) as m:
                with open(os.path.join(mnt, "big"), "wb") as f:
                    f.write(b"\1" * (2 << 20))
                u = m.unmount()
                check(u.returncode != 0, "-u fails on a full disk")
                check("No space" in u.stderr or "ENOSPC" in u.stderr or "space" in u.stderr, "-u says the disk is full: %r" % u.stderr)
            check(not os.path.exists(os.path.join(small, "new.bpk")), "no partial output on a full disk")
            check(not [f for f in os.listdir(small) if ".burnstore-tmp-" in f], "temp file removed")
            check(open(target, "rb").read() == b"old", "other files untouched")
        finally:
            run(["umount", small])
    # 3. kill -9 of the daemon during write-back leaves the old file intact.
    #    A run directory of its own: any other daemon starting meanwhile
    #    (another test run on the machine) sweeps the killed one's status
    #    file, and -u then finds nothing to report.
    work = os.path.join(tmp, "kill.bpk")
    subprocess.run(["cp", BPK, work], check=True)
    old = open(work, "rb").read()
    run_dir = os.path.join(tmp, "run-kill")
    os.mkdir(run_dir, 0o700)
    saved_run_dir = os.environ.get("BURNSTORE_RUN_DIR")
    os.environ["BURNSTORE_RUN_DIR"] = run_dir
    try:
        kill_during_write_back(work, mnt, old, tmp)
    finally:
        if saved_run_dir is None:
            del os.environ["BURNSTORE_RUN_DIR"]
        else:
            os.environ["BURNSTORE_RUN_DIR"] = saved_run_dir
    # 4. Every way a mount ends writes back: umount, fusermount3 -u, SIGTERM, SIGINT.
    #    After umount, `burnstore -u` still waits for a daemon that is writing
    #    back and reports; one that has already finished left nothing (its
    #    runtime files go with it), so -u then says the directory is not mounted.
    for how in ("umount", "fusermount3", "SIGTERM", "SIGINT"):
        out = os.path.join(tmp, "end-%s.bpk" % how)
        with Mount(out, mnt):
            sh("echo -n 1234 > x", mnt)
            if how in ("umount", "fusermount3"):
                r = run(["umount", mnt] if how == "umount" else ["fusermount3", "-u", mnt])
                check(r.returncode == 0, "%s: %s" % (how, r.stderr))
            else:
                pids = [int(p) for p in run(["pgrep", "-f", "burnstore %s" % out]).stdout.split()]
                check(len(pids) == 1, "one daemon")
                for p in pids:
                    os.kill(p, getattr(signal, how))
            u = run([BIN, "-u", mnt], timeout=120)
            check(u.returncode == 0 or (u.returncode == 1 and "is not mounted" in u.stderr),
                  "%s: burnstore -u afterwards waits and reports success, or finds the daemon gone: %r"
                  % (how, u.stderr))
        check(os.path.exists(out) and read_bpk(out)[0].get("x", (0, 0, 0))[2] == b"1234",
              "%s writes back" % how)


def test_staging_inside_mount(tmp):
    """Staging inside the mountpoint would make the daemon call into its own
    mount (a hang no signal ends): refused before mounting, in one line."""
    mnt = os.path.join(tmp, "self")
    os.makedirs(mnt, exist_ok=True)
    for out, opts in ((os.path.join(tmp, "s1.bpk"), ["-o", "staging=" + os.path.join(mnt, "st")]),
                      (os.path.join(tmp, "s2.bpk"), ["-o", "staging=" + mnt]),
                      (os.path.join(mnt, "s3.bpk"), [])):
        try:
            r = run([BIN, out, mnt] + opts, timeout=20)
            if is_mounted(mnt):
                # It mounted: show the hang with a deadline, then clean up.
                try:
                    subprocess.run(["sh", "-c", "echo hi > '%s/f'" % mnt], timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            check(r.returncode == 1 and r.stderr.count("\n") == 1 and "inside the mountpoint" in r.stderr,
                  "staging inside the mountpoint refused (%s): %r" % (opts, r.stderr))
        finally:
            force_unmount(mnt)
        check(not is_mounted(mnt), "nothing mounted")


def test_parallel(tmp):
    """Many writers and readers at once (the daemon is multithreaded)."""
    out = os.path.join(tmp, "par.bpk")
    mnt = os.path.join(tmp, "par")
    blobs = {"d%d/t%d" % (i % 4, i): bytes([i]) * (300000 + 4097 * i) for i in range(16)}
    with Mount(out, mnt) as m:
        for i in range(4):
            os.makedirs(os.path.join(mnt, "d%d" % i))
        procs = []
        for rel, data in blobs.items():
            src = os.path.join(tmp, rel.replace("/", "_"))
            open(src, "wb").write(data)
            procs.append(subprocess.Popen(["dd", "if=" + src, "of=" + os.path.join(mnt, rel), "bs=4096",
                                           "status=none"]))
        for p in procs:
            check(p.wait(timeout=120) == 0, "parallel dd")
        procs = [subprocess.Popen(["cmp", os.path.join(tmp, rel.replace("/", "_")), os.path.join(mnt, rel)])
                 for rel in blobs for _ in range(2)]
        for p in procs:
            check(p.wait(timeout=120) == 0, "parallel reads give what was written")
        u = m.unmount()
        check(u.returncode == 0, "write-back: %s" % u.stderr)
    got, _ = read_bpk(out)
    for rel, data in blobs.items():
        check(got.get(rel.replace("/", "."), (0, 0, b""))[2] == data, "%s written back" % rel)


def test_memory(tmp):
    """Written data is staged on disk: writing 512 MiB leaves the daemon small,
    and the write-back streams it."""
    out = os.path.join(tmp, "mem.bpk")
    mnt = os.path.join(tmp, "mem")
    with Mount(out, mnt) as m:
        pids = [int(p) for p in run(["pgrep", "-f", "burnstore %s" % out]).stdout.split()]
        r = run(["dd", "if=/dev/zero", "of=" + os.path.join(mnt, "big"), "bs=1M", "count=512"], timeout=300)
        check(r.returncode == 0, "dd 512 MiB into the mount: %s" % r.stderr)
        hwm = [int(l.split()[1]) for l in open("/proc/%d/status" % pids[0]) if l.startswith("VmHWM")][0]
        check(hwm < mem_limit_kb(64 * 1024),
              "daemon peak memory %d KiB after writing 512 MiB (< %d KiB)" % (hwm, mem_limit_kb(64 * 1024)))
        u = m.unmount()
        check(u.returncode == 0, "write-back of 512 MiB: %s" % u.stderr)
    check(os.path.getsize(out) == 256 + (512 << 20), "the 512 MiB tensor is in the file")
    os.unlink(out)


if __name__ == "__main__":
    run_tests("test_write", [
        test_staging_inside_mount,
        test_posix_ops,
        test_rw_existing,
        test_roundtrips,
        test_failures,
        test_parallel,
        test_memory,
    ], "write")
