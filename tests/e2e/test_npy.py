"""The .npy views (issue 13): `-o npy` puts NAME.npy beside every tensor file,
`-o npy=only` instead of it; numpy.load and numpy.load(mmap_mode='r') give
exactly the tensor for every dtype NumPy has (a SafeTensors file made here
with numpy, and torch-made PyTorch files with strided views), stat sizes are
exact, reads at any offset agree, BF16/F8 come as <u2/|u1 with the true dtype
in the xattr, and writable mounts refuse the option. `.npy` written INTO a
writable mount (header stripped, dtype/shape from it) is tested here too."""
import io
import json
import os
import struct

import numpy as np
import torch

from bsmount import BIN, Mount, check, force_unmount, is_mounted, read_bpk, run, run_tests

ST_DT = {np.float64: "F64", np.float32: "F32", np.float16: "F16", np.int64: "I64", np.int32: "I32",
         np.int16: "I16", np.int8: "I8", np.uint64: "U64", np.uint32: "U32", np.uint16: "U16",
         np.uint8: "U8", np.bool_: "BOOL", np.complex64: "C64"}


def write_st(path, tensors):
    header, blobs, off = {}, [], 0
    for k, (dt, shape, b) in tensors.items():
        header[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def numpy_cases():
    rng = np.random.default_rng(13)
    arrs = {}
    for t in ST_DT:
        if t == np.bool_:
            a = rng.integers(0, 2, size=(3, 5)).astype(np.bool_)
        elif t == np.complex64:
            a = (rng.standard_normal((4, 2)) + 1j * rng.standard_normal((4, 2))).astype(t)
        elif np.issubdtype(t, np.floating):
            a = rng.standard_normal((2, 3, 4)).astype(t)
        else:
            info = np.iinfo(t)
            a = rng.integers(info.min, info.max, size=(7,), dtype=t, endpoint=True)
        arrs["n." + ST_DT[t].lower()] = a
    arrs["n.scalar"] = np.array(3.5, dtype=np.float32)
    arrs["n.empty"] = np.zeros((0, 3), dtype=np.float32)
    arrs["n.big"] = rng.standard_normal((300, 257)).astype(np.float32)  # > 128 KiB: several reads
    return arrs


def check_npy(path, want, what, raw_dtype=None):
    try:
        a = np.load(path)
        m = np.load(path, mmap_mode="r")
    except Exception as e:
        check(False, "%s: np.load fails: %r" % (what, e))
        return
    if raw_dtype is not None:
        ok = a.dtype == raw_dtype and a.shape == want.shape and a.tobytes() == want.tobytes()
        okm = m.dtype == raw_dtype and bytes(m.tobytes()) == want.tobytes()
    else:
        ok = a.dtype == want.dtype and a.shape == want.shape and np.array_equal(a, want)
        okm = m.dtype == want.dtype and m.shape == want.shape and np.array_equal(np.asarray(m), want)
    check(ok, "%s: np.load gives the tensor (%s %s)" % (what, a.dtype, a.shape))
    check(okm, "%s: np.load(mmap_mode='r') gives the tensor" % what)
    del m
    size = os.stat(path).st_size
    data = open(path, "rb").read()
    check(size == len(data) and data.endswith(want.tobytes()), "%s: st_size %d is exact (%d read)" % (what, size, len(data)))
    hl = len(data) - len(want.tobytes())
    check(hl % 64 == 0 and data[:6] == b"\x93NUMPY" and data[6] == 1, "%s: a 1.0 header padded to 64 (%d)" % (what, hl))
    # reads at odd offsets across the header/data boundary
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in (0, 1, hl - 3, hl, hl + 5, max(0, len(data) - 7)):
            for n in (1, 10, 4096, 200000):
                got = os.pread(fd, n, off)
                if got != data[off:off + n]:
                    check(False, "%s: pread(%d, %d) agrees" % (what, n, off))
    finally:
        os.close(fd)


def test_numpy_dtypes(tmp):
    arrs = numpy_cases()
    st = os.path.join(tmp, "n.safetensors")
    tensors = {k: (ST_DT[a.dtype.type], a.shape, a.tobytes()) for k, a in arrs.items()}
    bf = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    bf_bits = (bf.view(np.uint32) >> 16).astype(np.uint16)
    tensors["n.bf16"] = ("BF16", [3, 4], bf_bits.tobytes())
    f8 = np.arange(0, 16, dtype=np.uint8)
    tensors["n.f8"] = ("F8_E4M3", [16], f8.tobytes())
    tensors["n.f4"] = ("F4", [4], b"\x12\x34")  # no .npy form
    write_st(st, tensors)
    with Mount(st, os.path.join(tmp, "m1"), "npy") as mnt:
        for k, a in arrs.items():
            rel = k.replace(".", "/")
            check(open(os.path.join(mnt, rel), "rb").read() == a.tobytes(), "%s: the plain file stays" % k)
            check_npy(os.path.join(mnt, rel + ".npy"), a, k)
        p = os.path.join(mnt, "n/bf16.npy")
        check_npy(p, bf_bits, "bf16", raw_dtype=np.uint16)
        check(os.getxattr(p, "user.burnstore.dtype") == b"BF16", "bf16.npy's xattr says BF16")
        check_npy(os.path.join(mnt, "n/f8.npy"), f8, "f8", raw_dtype=np.uint8)
        check(os.getxattr(os.path.join(mnt, "n/f8.npy"), "user.burnstore.dtype") == b"F8_E4M3", "f8.npy's xattr")
        check(not os.path.exists(os.path.join(mnt, "n/f4.npy")) and os.path.exists(os.path.join(mnt, "n/f4")),
              "F4 has no .npy view, its plain file stays")
        names = sorted(os.listdir(os.path.join(mnt, "n")))
        check("f32" in names and "f32.npy" in names, "readdir lists both: %r" % names[:6])
    with Mount(st, os.path.join(tmp, "m2"), "npy=only,flat") as mnt:
        names = set(os.listdir(mnt))
        check("n.f32.npy" in names and "n.f32" not in names and "n.f4" in names,
              "npy=only: NAME.npy instead of NAME (flat): %r" % sorted(names)[:5])
        check_npy(os.path.join(mnt, "n.i64.npy"), arrs["n.i64"], "npy=only i64")


def test_torch_views(tmp):
    g = torch.Generator().manual_seed(1)
    base = torch.randn(5, 7, generator=g)
    sd = {"t": base.t(), "s": base[1:4, ::2], "c128": torch.randn(3, dtype=torch.complex128, generator=g),
          "d": torch.randn(2, 3, 4, generator=g).permute(2, 0, 1), "i": torch.arange(12).reshape(3, 4)[:, 1]}
    pth = os.path.join(tmp, "v.pth")
    torch.save(sd, pth)
    with Mount(pth, os.path.join(tmp, "m3"), "npy") as mnt:
        for k, t in sd.items():
            check_npy(os.path.join(mnt, k + ".npy"), t.contiguous().numpy(), "torch %s" % k)


def test_refusals(tmp):
    st = os.path.join(tmp, "r.safetensors")
    write_st(st, {"w": ("F32", [2], struct.pack("<2f", 1, 2))})
    for opts in ("npy,rw", "npy=only,output=%s" % os.path.join(tmp, "o.bpk")):
        mnt = os.path.join(tmp, "m4")
        os.makedirs(mnt, exist_ok=True)
        try:
            r = run([BIN, st, mnt, "-o", opts])
            check(r.returncode != 0 and not is_mounted(mnt) and len(r.stderr.strip().splitlines()) == 1
                  and "read-only" in r.stderr, "-o %s refused in one line: %r" % (opts, r.stderr))
        finally:
            force_unmount(mnt)


def test_npy_in(tmp):
    """np.save into a writable mount: the tensor, header stripped."""
    out = os.path.join(tmp, "in.bpk")
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    b = np.array([1, -2, 3], dtype=np.int64)
    c = np.arange(6, dtype=np.float64).reshape(2, 3)
    with Mount(out, os.path.join(tmp, "m5")) as mnt:
        os.makedirs(os.path.join(mnt, "enc"))
        np.save(os.path.join(mnt, "enc/w.npy"), a)
        np.save(os.path.join(mnt, "b.npy"), b)
        np.save(os.path.join(mnt, "c.npy"), np.asfortranarray(c))  # fortran_order: True
        for n in ("enc/w", "b", "c"):
            check(os.path.exists(os.path.join(mnt, n)) or os.path.exists(os.path.join(mnt, n + ".npy")),
                  "%s is there after np.save" % n)
        # user.burnstore.key names the tensor it will be (not "enc.w.npy");
        # a .npy file numpy did not write keeps its name
        key = os.getxattr(os.path.join(mnt, "enc/w.npy"), "user.burnstore.key")
        check(key == b"enc.w", "the key of enc/w.npy is the tensor's: %r" % key)
        with open(os.path.join(mnt, "raw.npy"), "wb") as f:
            f.write(b"0123456789ab")
        os.setxattr(os.path.join(mnt, "raw.npy"), "user.burnstore.dtype", b"U8")
        key = os.getxattr(os.path.join(mnt, "raw.npy"), "user.burnstore.key")
        check(key == b"raw.npy", "a .npy file numpy did not write keeps its name: %r" % key)
        r = mnt.unmount()
        check(r is not None and r.returncode == 0, "the write-back succeeds: %r" % (r.stderr if r else None))
    got, _ = read_bpk(out)
    check(got.get("enc.w", (0, 0, b""))[:3] == ("F32", [2, 3, 4], a.tobytes()), "enc.w: F32 [2,3,4], header stripped: %r" % (got.get("enc.w", ("?",))[:2],))
    check(got.get("b", (0, 0, b""))[:3] == ("I64", [3], b.tobytes()), "b: I64 [3]")
    check(got.get("c", (0, 0, b""))[:3] == ("F64", [2, 3], c.tobytes()), "c (fortran order): transposed back to row-major")
    check(not any(k.endswith("npy") for k in got if k != "raw.npy"), "no key ends in .npy: %r" % sorted(got))
    check("raw.npy" in got, "raw.npy written under its name")
    # a bad header: the write-back fails with one line naming the file
    out2 = os.path.join(tmp, "bad.bpk")
    with Mount(out2, os.path.join(tmp, "m6")) as mnt:
        with open(os.path.join(mnt, "x.npy"), "wb") as f:
            f.write(b"\x93NUMPY\x01\x00\x20\x00{'descr': '<f4', 'shape': (9999,), }" + b" " * 4 + b"\n" + b"\0" * 8)
        r = mnt.unmount()
        check(r is not None and r.returncode != 0 and "x" in r.stderr and "npy" in r.stderr,
              "a bad .npy header fails the write-back, named: %r" % (r.stderr if r else None))
    # a good header over too few bytes: the message gives dtype and shape
    out3 = os.path.join(tmp, "short.bpk")
    buf = io.BytesIO()
    np.save(buf, np.zeros(9999, "<f4"))
    short = buf.getvalue()[:-(9999 * 4) + 8]
    with Mount(out3, os.path.join(tmp, "m7")) as mnt:
        with open(os.path.join(mnt, "y.npy"), "wb") as f:
            f.write(short)
        r = mnt.unmount()
        check(r is not None and r.returncode != 0 and "F32 [9999]" in r.stderr and "holds 8" in r.stderr,
              "a .npy shorter than its header says is refused with dtype and shape: %r" % (r.stderr if r else None))
    # NumPy's magic and too few bytes for any header (6 to 9): refused too,
    # never stored as a U8 blob; the target is not written.
    for n in (6, 8, 9):
        out4 = os.path.join(tmp, "tiny%d.bpk" % n)
        with Mount(out4, os.path.join(tmp, "m8")) as mnt:
            with open(os.path.join(mnt, "z.npy"), "wb") as f:
                f.write(b"\x93NUMPY\x01\x00\x76\x00"[:n])
            r = mnt.unmount()
            check(r is not None and r.returncode != 0 and "'z.npy'" in r.stderr and "truncated" in r.stderr,
                  "a %d-byte .npy is refused, named: %r" % (n, r.stderr if r else None))
        check(not os.path.exists(out4), "no %s written" % out4)


def test_rsync_from_views(tmp):
    """rsync -aX from an npy=only mount into a new .bpk: every NAME.npy is
    tensor NAME again, BF16 included (its xattr wins over the <u2 stand-in)."""
    st = os.path.join(tmp, "rs.safetensors")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    bf = (np.arange(6, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    write_st(st, {"enc.a": ("F32", [3, 4], a.tobytes()), "enc.bf": ("BF16", [2, 3], bf.tobytes())})
    out = os.path.join(tmp, "rs.bpk")
    with Mount(st, os.path.join(tmp, "ma"), "npy=only") as src:
        with Mount(out, os.path.join(tmp, "mb")) as dst:
            r = run(["rsync", "-aX", src + "/", dst + "/"])
            check(r.returncode == 0, "rsync -aX: %r" % r.stderr)
            r = dst.unmount()
            check(r is not None and r.returncode == 0, "write-back: %r" % (r.stderr if r else None))
    got, _ = read_bpk(out)
    check(got.get("enc.a", (0, 0, b""))[:3] == ("F32", [3, 4], a.tobytes()), "enc.a back: %r" % sorted(got))
    check(got.get("enc.bf", (0, 0, b""))[:3] == ("BF16", [2, 3], bf.tobytes()), "enc.bf back as BF16")


def main():
    run_tests("test_npy", [test_numpy_dtypes, test_torch_views, test_refusals, test_npy_in, test_rsync_from_views],
              "npy")

if __name__ == "__main__":
    main()
