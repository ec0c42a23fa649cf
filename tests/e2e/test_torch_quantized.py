"""PyTorch quantized tensors under -o as=F32 (issue 22): a torch 1.13 .pth of
quantize_per_tensor (qint8, quint8, qint32, the qint32 extremes whose
q - zero_point wraps in torch's int32 arithmetic) and quantize_per_channel
tensors (axis 0, 1 and 2 of a 3-D tensor, a scalar per channel) and strided
views of per-tensor ones (t(), a slice with a step) is mounted
with as=F32: every file equals torch's own `t.dequantize()` bit for bit, its
xattrs say F32 and the stored dtype, `cat --as F32` gives the same bytes,
and without the option the stored integers are shown as before.
per_channel_affine_float_qparams tensors (float zero points: quint8 and
qint8, axis 0 and 1, double scales torch narrows, an nn.Embedding quantized
by torch.ao.quantization) are dequantized the same way (issue 21); a
quint4x2 one (packed, no dtype here) is not shown as numbers.
convert --as F16 writes dequantize().half().
Hostile quantizers (patched pickles): an axis past the rank is refused in one
line; scales that do not match the channels leave the tensor as stored. One
per-channel tensor shared by a thousand keys (each keeps a copy of its
quantizer: 200 MB from a 220 KB file) is refused in one line; the same
tensor under two keys opens. torch's quint4x2/quint2x4 tensors are not read:
refused in one line."""
import errno
import os
import subprocess

import numpy as np
import torch

from bsmount import BIN, Mount, check, mem_limit_kb, run, run_tests

X = "user.burnstore."


def fbytes(t):
    return t.contiguous().numpy().astype("<f4").tobytes()


KEEP = []


def emb_weight():
    """An nn.Embedding's weight as torch.ao.quantization's weight-only
    float_qparams config quantizes it (quint8, per row). The module is kept
    alive: in torch 1.13 the weight's zero points are freed with it (its
    dequantize() then reads freed memory)."""
    import torch.ao.quantization as Q
    torch.manual_seed(7)
    m = torch.nn.Sequential(torch.nn.Embedding(50, 16))
    m.qconfig = Q.float_qparams_weight_only_qconfig
    Q.prepare(m, inplace=True)
    Q.convert(m, inplace=True)
    w = m.state_dict()["0._packed_params._packed_weight"]
    check(w.qscheme() == torch.per_channel_affine_float_qparams and w.dtype == torch.quint8,
          "the embedding's weight is a quint8 float_qparams tensor")
    KEEP.append(m)
    return w


def fixture(tmp):
    torch.manual_seed(2203)
    x = torch.randn(4, 5, 6) * 20
    ext = torch.tensor([2 ** 31 - 1, -2 ** 31, 33554433, -134217733, 0, 7], dtype=torch.int32)
    sd = {
        "t_i8": torch.quantize_per_tensor(x, 0.1, 3, torch.qint8),
        "t_u8": torch.quantize_per_tensor(x, 1 / 3, 128, torch.quint8),
        "t_i32": torch.quantize_per_tensor(x, 1e-3, -5, torch.qint32),
        "t_i32_ext": torch._make_per_tensor_quantized_tensor(ext, 0.7, 5),
        "t_tiny": torch.quantize_per_tensor(x[0, 0], 3e-39, 0, torch.qint8),  # subnormal results
        "c0": torch.quantize_per_channel(x, torch.tensor([0.1, 1 / 3, 2e-2, 7.0], dtype=torch.double),
                                         torch.tensor([0, 3, -5, 10]), 0, torch.qint8),
        "c1": torch.quantize_per_channel(x, torch.rand(5, dtype=torch.double) + 0.01, torch.randint(0, 20, (5,)), 1,
                                         torch.quint8),
        "c2": torch.quantize_per_channel(x, torch.rand(6, dtype=torch.double) * 1e-3 + 1e-6,
                                         torch.randint(-9, 9, (6,)), 2, torch.qint32),
        "c_one": torch.quantize_per_channel(torch.randn(3) * 5, torch.tensor([0.5, 0.25, 1 / 7], dtype=torch.double),
                                            torch.tensor([1, 2, 3]), 0, torch.qint8),
        "fq": torch.quantize_per_channel(torch.randn(3, 4), torch.tensor([0.1, 0.2, 0.3], dtype=torch.double),
                                         torch.tensor([0.5, 1.0, 2.0]), 0, torch.quint8),
        "fq_i8": torch.quantize_per_channel(x, torch.tensor([0.1, 1 / 3, 2e-2, 7.0]),
                                            torch.tensor([0.25, -3.5, 1 / 3, 100.0]), 0, torch.qint8),
        "fq_ax1": torch.quantize_per_channel(x, torch.rand(5) * 0.5 + 1e-3, torch.randn(5) * 40, 1, torch.quint8),
        "emb": emb_weight(),
        # strided views (torch makes them of per-tensor tensors only): said
        # "no decoder for QU8 yet", their quantizer not kept
        "s_tr": torch.quantize_per_tensor(x[0], 0.25, 100, torch.quint8).t(),
        "s_step": torch.quantize_per_tensor(x.reshape(4, 30), 0.05, -7, torch.qint8)[1:, ::4],
        "f": torch.randn(3),
        "i": torch.arange(4),
    }
    check(sd["fq"].qscheme() == torch.per_channel_affine_float_qparams, "fq is a float_qparams tensor")
    check(not sd["s_tr"].is_contiguous() and not sd["s_step"].is_contiguous(), "s_tr and s_step are strided views")
    pth = os.path.join(tmp, "q.pth")
    torch.save(sd, pth)
    return sd, pth


def test_dequantized_views(tmp):
    sd, pth = fixture(tmp)
    dequant = {k: v for k, v in sd.items() if v.is_quantized}
    with Mount(pth, os.path.join(tmp, "m"), "as=F32") as m:
        for k, v in dequant.items():
            p = os.path.join(m, k)
            want = fbytes(v.dequantize())
            got = open(p, "rb").read()
            check(got == want, "%s: bytes equal torch's dequantize() (%d vs %d bytes; first difference at %s)"
                  % (k, len(got), len(want), next((i for i in range(min(len(got), len(want))) if got[i] != want[i]),
                                                  "end")))
            fd = os.open(p, os.O_RDONLY)
            try:
                for off in (4, 12, len(want) - 8):
                    if off >= 0:
                        check(os.pread(fd, 8, off) == want[off:off + 8], "%s: pread at %d" % (k, off))
            finally:
                os.close(fd)
            check(os.getxattr(p, X + "dtype") == b"F32", "%s: dtype F32" % k)
            stored = {torch.qint8: b"QI8", torch.quint8: b"QU8", torch.qint32: b"QI32"}[v.dtype]
            check(os.getxattr(p, X + "stored_dtype") == stored, "%s: stored_dtype %s" % (k, stored))
        check(open(os.path.join(m, "i"), "rb").read() == sd["i"].numpy().tobytes(), "integers unchanged")
    for k in ("t_i32_ext", "c1", "c2", "fq", "fq_ax1", "emb", "s_tr", "s_step"):
        r = subprocess.run([BIN, "cat", "--as", "F32", pth, k], capture_output=True, timeout=60)
        check(r.returncode == 0 and r.stdout == fbytes(sd[k].dequantize()), "cat --as F32 %s" % k)
    # without the option: the stored integers, as before
    with Mount(pth, os.path.join(tmp, "m3")) as m:
        for k in ("t_i8", "c2"):
            check(open(os.path.join(m, k), "rb").read() == sd[k].int_repr().numpy().tobytes(),
                  "%s: stored integers without as=F32" % k)


def test_convert_as_f16(tmp):
    sd, pth = fixture(tmp)
    for ext in (".pth", ".safetensors"):
        r = run([BIN, "convert", "-q", pth, os.path.join(tmp, "plain" + ext)])
        check(r.returncode != 0 and "convert --as F32 dequantizes them" in r.stderr,
              "without --as, %s refuses a quantized tensor with the hint: %r" % (ext, r.stderr))
    out = os.path.join(tmp, "q16.pth")
    r = run([BIN, "convert", "-q", "--as", "F16", pth, out])
    if not check(r.returncode == 0, "convert --as F16: %r" % r.stderr):
        return
    got = torch.load(out)
    for k, v in sd.items():
        want = v.dequantize().half() if v.is_quantized else v.half() if v.is_floating_point() else v
        check(got[k].dtype == want.dtype and np.array_equal(got[k].numpy().view(np.uint8) if want.is_floating_point()
                                                            else got[k].numpy(),
                                                            want.numpy().view(np.uint8) if want.is_floating_point()
                                                            else want.numpy()),
              "%s: convert --as F16 equals dequantize().half()" % k)


def test_mount_output_as(tmp):
    """A quantized .pth mounted with output=X.safetensors,output_as=F32 is
    written dequantized (SafeTensors has no quantized dtype: accepted at
    mount because the output will hold F32)."""
    sd, pth = fixture(tmp)
    out = os.path.join(tmp, "deq.safetensors")
    with Mount(pth, os.path.join(tmp, "mo"), "output=%s,output_as=F32" % out) as m:
        r = m.unmount()
        check(r is not None and r.returncode == 0, "-u: %r" % (r and r.stderr))
    from bsmount import read_safetensors
    ts, _ = read_safetensors(out)
    for k, v in sd.items():
        if not check(k in ts, "%s written" % k):
            continue
        if v.is_quantized:
            check(ts[k][0] == "F32" and ts[k][2] == fbytes(v.dequantize()), "%s: dequantized in the output" % k)


def test_reshaped_in_the_mount(tmp):
    """A per-channel tensor reshaped in a writable mount (its shape xattr;
    the bytes stay) keeps its quantizer: output_as=F32 writes
    dequantize().reshape(), its channels following the flat order."""
    x = torch.randn(4, 6) * 10
    c = torch.quantize_per_channel(x, torch.rand(4, dtype=torch.double) + 0.1, torch.randint(-3, 3, (4,)), 0,
                                   torch.qint8)
    src = os.path.join(tmp, "rs.pth")
    torch.save({"c": c}, src)
    out = os.path.join(tmp, "rs.safetensors")
    with Mount(src, os.path.join(tmp, "mr"), "output=%s,output_as=F32" % out) as m:
        os.setxattr(os.path.join(m, "c"), X + "shape", b"[2,12]")
        r = m.unmount()
        check(r is not None and r.returncode == 0, "-u: %r" % (r and r.stderr))
    from bsmount import read_safetensors
    ts, _ = read_safetensors(out)
    check("c" in ts and ts["c"][0] == "F32" and list(ts["c"][1]) == [2, 12] and
          ts["c"][2] == fbytes(c.dequantize().reshape(2, 12)), "reshaped, dequantized: %r" % (ts.get("c", "")[:2],))


def patched(src, dst, old, new):
    """A copy of .pth src whose data.pkl has `old` replaced by `new` (once)."""
    import zipfile
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            b = zin.read(info)
            if info.filename.endswith("/data.pkl"):
                check(b.count(old) == 1, "the pickle holds %r once" % old)
                b = b.replace(old, new)
            zout.writestr(info.filename, b)


def test_hostile_quantizers(tmp):
    """A per-channel quantizer whose axis is past the rank is refused in one
    line naming the tensor; one whose scales do not match the channels is
    not kept (the stored integers are shown, as/--as F32 refuse them)."""
    x = torch.randn(2, 3)
    q = torch.quantize_per_channel(x, torch.tensor([0.1, 0.2], dtype=torch.double), torch.tensor([0, 1]), 0,
                                   torch.qint8)
    src = os.path.join(tmp, "pc.pth")
    torch.save({"q": q}, src)
    # the axis: BININT1 0 closing the quantizer tuple, before requires_grad (NEWFALSE)
    bad = os.path.join(tmp, "pc-axis.pth")
    patched(src, bad, b"K\x00tq\x1d\x89", b"K\x05tq\x1d\x89")
    r = run([BIN, "ls", bad])
    check(r.returncode != 0 and r.stderr.count("\n") == 1 and "'q'" in r.stderr and "axis 5" in r.stderr,
          "an axis past the rank is refused in one line: %r" % r.stderr)
    # the scales' shape (2,) -> (1,): not this tensor's channels
    odd = os.path.join(tmp, "pc-scales.pth")
    patched(src, odd, b"K\x02\x85q\x0f", b"K\x01\x85q\x0f")
    r = run([BIN, "ls", odd])
    check(r.returncode == 0 and "QI8" in r.stdout, "scales of another length: opened, QI8: %r" % (r.stdout + r.stderr))
    r = subprocess.run([BIN, "cat", "--as", "F32", odd, "q"], capture_output=True, timeout=60)
    check(r.returncode == 1 and b"its per-channel scales do not match the tensor's channels" in r.stderr,
          "and not dequantized, saying why: %r" % r.stderr)
    r = subprocess.run([BIN, "cat", odd, "q"], capture_output=True, timeout=60)
    check(r.returncode == 0 and r.stdout == q.int_repr().numpy().tobytes(), "its stored integers shown")


def test_shared_quantizer_budget(tmp):
    """Shared references multiply a quantizer: 1000 keys of one tensor with
    12,500 channels would keep 1000 copies of 200 KB. Refused in one line,
    fast and small; two keys of it open and dequantize."""
    n = 12500
    q = torch.quantize_per_channel(torch.randn(n, 1), torch.rand(n, dtype=torch.double) + 0.1,
                                   torch.zeros(n, dtype=torch.long), 0, torch.qint8)
    many = os.path.join(tmp, "many.pth")
    torch.save({"k%d" % i: q for i in range(1000)}, many)
    r = subprocess.run(["/usr/bin/time", "-f", "maxrss %M", BIN, "ls", many], capture_output=True, text=True,
                       timeout=60)
    err = [l for l in r.stderr.splitlines() if not l.startswith(("maxrss ", "Command exited"))]
    rss = int(r.stderr.rsplit("maxrss ", 1)[1].split()[0])
    check(r.returncode == 1 and len(err) == 1 and "per-channel quantizers" in err[0] and "many.pth" in err[0],
          "1000 keys of one quantizer refused in one line: %r" % r.stderr)
    check(rss < mem_limit_kb(64 * 1024), "and it costs no more than 64 MiB (%d KiB)" % rss)
    two = os.path.join(tmp, "two.pth")
    torch.save({"a": q, "b": q}, two)
    r = subprocess.run([BIN, "cat", "--as", "F32", two, "b"], capture_output=True, timeout=60)
    check(r.returncode == 0 and r.stdout == fbytes(q.dequantize()), "two keys of it: dequantized: %r" % r.stderr)


def test_sub_byte_not_read(tmp):
    """torch 1.13's quint4x2 and quint2x4 tensors (float_qparams, two or four
    values a byte) are not read: ls lists them unsupported, cat and cat --as
    F32 exit 1 with one line naming the storage class (they printed nothing
    and exited 0), reading their files in a mount with as=F32 fails (no bytes) and
    the rest is served."""
    x = torch.randn(3, 5)
    sd = {"q4": torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 1.0, 2.0]), 0,
                                           torch.quint4x2),
          "q2": torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 1.0, 2.0]), 0,
                                           torch.quint2x4),
          "f": torch.randn(4)}
    pth = os.path.join(tmp, "sub.pth")
    torch.save(sd, pth)
    r = run([BIN, "ls", pth])
    check(r.returncode == 0 and "QUInt4x2Storage is not supported" in r.stdout
          and "QUInt2x4Storage is not supported" in r.stdout, "ls lists them unsupported: %r" % r.stdout)
    for k, cls in (("q4", "QUInt4x2Storage"), ("q2", "QUInt2x4Storage")):
        for extra in ([], ["--as", "F32"]):
            r = subprocess.run([BIN, "cat"] + extra + [pth, k], capture_output=True, timeout=60)
            check(r.returncode == 1 and r.stdout == b"" and r.stderr.count(b"\n") == 1
                  and cls.encode() in r.stderr and b"'%s'" % k.encode() in r.stderr,
                  "cat %s %s: refused in one line: %r" % (" ".join(extra), k, r.stderr))
    with Mount(pth, os.path.join(tmp, "ms"), "as=F32") as m:
        check(open(os.path.join(m, "f"), "rb").read() == fbytes(sd["f"]), "the mount serves the rest")
        for k in ("q4", "q2"):
            try:
                open(os.path.join(m, k), "rb").read()
                check(False, "%s: reading it fails, never gives bytes" % k)
            except OSError as e:
                check(e.errno in (errno.EIO, errno.ENOTSUP, errno.EOPNOTSUPP), "%s: %s" % (k, e))


if __name__ == "__main__":
    run_tests("test_torch_quantized", [test_dequantized_views, test_convert_as_f16, test_mount_output_as,
                                       test_hostile_quantizers, test_shared_quantizer_budget,
                                       test_reshaped_in_the_mount, test_sub_byte_not_read], "tq")
