"""convert --as F32|F16|BF16 (issue 22): a torch-made .pth of BF16, F16,
F32 and F64 tensors (rounding ties, the values next to F16's and BF16's
overflow thresholds, subnormals, -0, infinities, NaN, random values, a
strided view) and integer and bool tensors is converted to each dtype,
into .pth (read back with torch.load) and .safetensors (read with the
tests' own reader); every float tensor equals torch's own `.to(dtype)`
bit for bit (a NaN only has to stay a NaN: torch's scalar and vector
paths give NaNs different payloads), integers and bools are unchanged,
and the header says the new dtype. `cat --as F16` gives the same bytes.
A type without a decoder (F6: its packing is not defined) is refused
before anything is written, saying why. A 256 MiB BF16 tensor converted --as F16 costs no more peak
memory than a small one."""
import json
import os
import struct
import subprocess

import numpy as np
import torch

from bsmount import BIN, SANITIZE, Mount, check, force_unmount, mem_limit_kb, read_safetensors, run, run_tests

NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def bits(t):
    """The tensor's bytes, and where it holds NaNs."""
    t = t.contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b"", torch.isnan(t.float()).numpy()


def same_floats(got, want, what):
    """got, want: tensors of one float dtype; bit for bit, except NaN for NaN."""
    if not check(got.dtype == want.dtype and list(got.shape) == list(want.shape),
                 "%s: %s %s, want %s %s" % (what, got.dtype, list(got.shape), want.dtype, list(want.shape))):
        return
    gn, wn = torch.isnan(got.float()), torch.isnan(want.float())
    check(torch.equal(gn, wn), "%s: NaN where torch has NaN" % what)
    g = got.contiguous().flatten()[~wn.flatten()]
    w = want.contiguous().flatten()[~wn.flatten()]
    iv = torch.int16 if got.element_size() == 2 else torch.int32 if got.element_size() == 4 else torch.int64
    diff = (g.view(iv) != w.view(iv)).nonzero()
    check(len(diff) == 0, "%s: %d values differ from torch's .to(); first at %s: %r vs %r" %
          (what, len(diff), diff[:1].tolist(), g[diff[:1]].tolist(), w[diff[:1]].tolist()))


def fixture():
    torch.manual_seed(2201)
    f16_ties = torch.tensor([1 + 2 ** -11, 1 + 3 * 2 ** -11, 2 ** -25, 3 * 2 ** -25, 65504.0, 65519.0, 65520.0,
                             -65520.0, 2 ** -24, 2 ** -14 - 2 ** -26, 1e-10, 7e4])
    bf16_ties = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.3895e38, 3.4e38, -3.4e38, 1e-39, 9.2e-41])
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"), 1.0, 0.1])
    f32 = torch.cat([f16_ties, bf16_ties, special, torch.randn(1000) * 10 ** torch.randint(-8, 8, (1000,))])
    sd = {
        "f32": f32,
        "bf16": torch.cat([special, torch.randn(200) * 1e5, torch.randn(100) * 1e-6]).bfloat16().reshape(-1, 4),
        "f16": torch.cat([special, torch.randn(300) * 1e3]).half(),
        "f64": torch.cat([f32.double(), torch.tensor([1 / 3, 1e300, -1e-300, 65519.999999], dtype=torch.float64)]),
        "bt": (torch.randn(6, 9) * 100).bfloat16().t(),  # strided: the transpose of a 6x9 storage
        "i64": torch.arange(-5, 5),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 3),
    }
    return sd


def test_pth_and_safetensors(tmp):
    sd = fixture()
    src = os.path.join(tmp, "src.pth")
    torch.save(sd, src)
    for dt, name in NAMES.items():
        for ext in (".pth", ".safetensors"):
            out = os.path.join(tmp, "out-%s%s" % (name, ext))
            r = run([BIN, "convert", "-q", "--as", name, src, out])
            if not check(r.returncode == 0, "convert --as %s to %s: %r" % (name, ext, r.stderr)):
                continue
            if ext == ".pth":
                got = torch.load(out)
            else:
                ts, _ = read_safetensors(out)
                got = {}
                for k, (sdt, shape, raw, _) in ts.items():
                    tdt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
                           "I8": torch.int8, "BOOL": torch.bool}.get(sdt)
                    if not check(tdt is not None, "%s: %s: dtype %s" % (out, k, sdt)):
                        continue
                    got[k] = (torch.frombuffer(bytearray(raw), dtype=tdt) if raw else torch.zeros(0, dtype=tdt)) \
                        .reshape(shape)
            check(sorted(got) == sorted(sd), "%s: keys %s" % (out, sorted(got)))
            for k, v in sd.items():
                if k not in got:
                    continue
                what = "%s: %s" % (os.path.basename(out), k)
                if v.is_floating_point():
                    same_floats(got[k], v.to(dt), what)
                else:
                    check(got[k].dtype == v.dtype and torch.equal(got[k], v), "%s: unchanged" % what)
    # cat --as gives the same bytes as the converted file's tensor
    for name, dt in (("F16", torch.float16), ("BF16", torch.bfloat16)):
        r = subprocess.run([BIN, "cat", "--as", name, src, "bf16"], capture_output=True, timeout=60)
        want = sd["bf16"].to(dt)
        check(r.returncode == 0 and len(r.stdout) == want.numel() * 2, "cat --as %s: %r" % (name, r.stderr))
        if r.returncode == 0 and len(r.stdout) == want.numel() * 2:
            same_floats(torch.frombuffer(bytearray(r.stdout), dtype=dt).reshape(want.shape), want,
                        "cat --as %s bf16" % name)


def test_refusals(tmp):
    # F6 (no file format defines how 4 values pack in 3 bytes) has no decoder
    g = os.path.join(tmp, "k.safetensors")
    h = json.dumps({"k": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]},
                    "f": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]}}).encode()
    with open(g, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(11))
    out = os.path.join(tmp, "k-out.safetensors")
    r = run([BIN, "convert", "-q", "--as", "F16", g, out])
    check(r.returncode != 0 and "'k'" in r.stderr and "4 F6 values are packed in 3 bytes" in r.stderr
          and r.stderr.count("\n") == 1 and not os.path.exists(out),
          "an F6 tensor is refused in one line saying why, nothing written: %r" % r.stderr)
    r = run([BIN, "convert", "-q", "--as", "F16", "-o", "exclude=^k$", g, out])
    check(r.returncode == 0 and read_safetensors(out)[0]["f"][0] == "F16", "excluded, the rest converts: %r" % r.stderr)
    for bad in ("F64", "I32", "f16", ""):
        r = run([BIN, "convert", "--as", bad, g, out])
        check(r.returncode == 2 and "--as needs F32, F16 or BF16" in r.stderr, "--as %r refused: %r" % (bad, r.stderr))


def test_mount_output_as(tmp):
    """-o output=OUT,output_as=DT: the write-back converts what the mount
    shows, unchanged tensors and a new F32 tensor written into it alike."""
    sd = fixture()
    src = os.path.join(tmp, "msrc.pth")
    torch.save(sd, src)
    new = (torch.randn(3, 5) * 1e4).float()
    for dt, name in ((torch.float16, "F16"), (torch.bfloat16, "BF16")):
        for ext in (".pth", ".safetensors"):
            out = os.path.join(tmp, "mout-%s%s" % (name, ext))
            mnt = os.path.join(tmp, "mnt-%s%s" % (name, ext[1:]))
            with Mount(src, mnt, "output=%s,output_as=%s" % (out, name)) as m:
                w = os.path.join(m, "new")
                with open(w, "wb") as f:
                    f.write(new.numpy().tobytes())
                os.setxattr(w, "user.burnstore.dtype", b"F32")
                os.setxattr(w, "user.burnstore.shape", b"[3,5]")
                # the mount shows the tensors as stored; the output is converted
                check(os.getxattr(os.path.join(m, "bf16"), "user.burnstore.dtype") == b"BF16",
                      "the mount shows the stored dtype")
                r = m.unmount()
                check(r is not None and r.returncode == 0, "-u: %r" % (r and r.stderr))
            if ext == ".pth":
                got = torch.load(out)
            else:
                ts, _ = read_safetensors(out)
                got = {k: torch.frombuffer(bytearray(raw), dtype={"F16": torch.float16, "BF16": torch.bfloat16,
                                                                 "I64": torch.int64, "I8": torch.int8,
                                                                 "BOOL": torch.bool}[d]).reshape(shp)
                       if raw else torch.zeros(shp, dtype=dt) for k, (d, shp, raw, _) in ts.items()}
            want = dict(sd, new=new)
            check(sorted(got) == sorted(want), "%s: keys %s" % (out, sorted(got)))
            for k, v in want.items():
                if k in got:
                    if v.is_floating_point():
                        same_floats(got[k], v.to(dt), "%s: %s" % (os.path.basename(out), k))
                    else:
                        check(torch.equal(got[k], v), "%s: %s unchanged" % (out, k))
    # refusals: a read-only mount, a bad dtype, a source float without a decoder
    mnt = os.path.join(tmp, "mnt-bad")
    for opts, why in (("output_as=F16", "applies to a writable mount"),
                      ("output=%s,output_as=F64" % os.path.join(tmp, "x.pth"), "takes F32, F16 or BF16")):
        os.makedirs(mnt, exist_ok=True)
        r = run([BIN, src, mnt, "-o", opts])
        force_unmount(mnt)
        check(r.returncode != 0 and why in r.stderr, "-o %s refused: %r" % (opts, r.stderr))
    g = os.path.join(tmp, "f6.safetensors")
    h = json.dumps({"k": {"dtype": "F6_E3M2", "shape": [4], "data_offsets": [0, 3]}}).encode()
    with open(g, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(3))
    r = run([BIN, g, mnt, "-o", "output=%s,output_as=F16" % os.path.join(tmp, "f6-out.safetensors")])
    force_unmount(mnt)
    check(r.returncode != 0 and "'k'" in r.stderr and "4 F6 values are packed in 3 bytes" in r.stderr,
          "F6 source refused saying why: %r" % r.stderr)


def test_mount_as_narrowed(tmp):
    """-o as=F16 and as=BF16 on a read-only mount: every floating tensor not
    stored in that dtype (F32, F64, the other 16-bit one, a strided view, a
    qint8 tensor dequantized) is shown narrowed, equal to torch's own
    `.to(dtype)` bit for bit (NaN for NaN); a tensor already in it and the
    integers are unchanged; the xattrs say the dtype shown and the stored
    one; the .npy view says <f2 for F16 (np.load gives the same values) and
    <u2 for BF16 (NumPy has no bfloat16: the bits, as for a stored BF16)."""
    sd = fixture()
    sd["q"] = torch.quantize_per_tensor(torch.randn(7) * 3, 0.05, 2, torch.qint8)
    src = os.path.join(tmp, "src.pth")
    torch.save(sd, src)
    X = "user.burnstore."
    for name, dt in (("F16", torch.float16), ("BF16", torch.bfloat16)):
        with Mount(src, os.path.join(tmp, "m" + name), "as=%s,npy" % name) as m:
            for k, v in sd.items():
                p = os.path.join(m, k)
                raw = open(p, "rb").read()
                if v.is_quantized:
                    v = v.dequantize()
                stored = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                          torch.float64: "F64", torch.qint8: "QI8"}.get(sd[k].dtype)
                what = "as=%s: %s" % (name, k)
                if v.is_floating_point():
                    got = (torch.frombuffer(bytearray(raw), dtype=dt) if raw else torch.zeros(0, dtype=dt))
                    same_floats(got.reshape(v.shape), v.to(dt), what)
                    check(os.getxattr(p, X + "dtype") == name.encode(), "%s: dtype %s" % (what, name))
                    has = X + "stored_dtype" in os.listxattr(p)
                    if stored == name:
                        check(not has, "%s: already %s: no stored_dtype" % (what, name))
                    else:
                        check(has and os.getxattr(p, X + "stored_dtype") == stored.encode(),
                              "%s: stored_dtype %s" % (what, stored))
                    if v.numel():
                        hdr = open(p + ".npy", "rb").read(128)
                        descr = b"'<f2'" if name == "F16" else b"'<u2'"
                        check(descr in hdr, "%s.npy: descr %s: %r" % (what, descr, hdr[:80]))
                        a = np.load(p + ".npy")
                        if name == "F16":
                            same_floats(torch.from_numpy(a.copy()).reshape(v.shape), v.to(dt), what + ".npy")
                        else:
                            check(a.tobytes() == raw, "%s.npy: the same bits as the file" % what)
                else:
                    check(raw == v.contiguous().numpy().tobytes(), "%s: unchanged" % what)
                    check(os.getxattr(p, X + "dtype") != name.encode(), "%s: its own dtype" % what)


def convert_peak_kb(src, out):
    """Peak RSS of one `convert --as F16` (a child of a fresh Python, so the
    children's maximum is this one's)."""
    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:], capture_output=True)\n"
            "sys.stderr.write(r.stderr.decode())\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r.returncode == 0 else -1)\n")
    r = run(["/usr/bin/python3", "-c", code, BIN, "convert", "-q", "--as", "F16", src, out], timeout=600)
    return int(r.stdout.strip() or -1)


def test_memory_independent_of_size(tmp):
    def write_st(path, n):
        h = json.dumps({"w": {"dtype": "BF16", "shape": [n], "data_offsets": [0, 2 * n]}}).encode()
        h += b" " * (-len(h) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            f.truncate(8 + len(h) + 2 * n)

    small, big = os.path.join(tmp, "ms.safetensors"), os.path.join(tmp, "mb.safetensors")
    write_st(small, 1024)
    write_st(big, 128 << 20)  # 256 MiB of BF16
    hs = convert_peak_kb(small, os.path.join(tmp, "ms-out.safetensors"))
    hb = convert_peak_kb(big, os.path.join(tmp, "mb-out.safetensors"))
    out = os.path.join(tmp, "mb-out.safetensors")
    check(hs > 0 and hb > 0 and os.path.getsize(out) > 256 << 20, "both converted (%d, %d kB)" % (hs, hb))
    print("peak convert --as F16 memory: %d kB for 2 KiB, %d kB for 256 MiB of BF16" % (hs, hb))
    limit = mem_limit_kb((48 if SANITIZE in ("ON", "thread") else 16) * 1024)
    check(hb - hs < limit, "peak grew by %d kB for a 256 MiB tensor (< %d)" % (hb - hs, limit))
    os.unlink(out)


if __name__ == "__main__":
    run_tests("test_convert_as", [test_pth_and_safetensors, test_refusals, test_mount_output_as,
                                  test_mount_as_narrowed, test_memory_independent_of_size],
              "convert_as")
