"""Decoded views (issue 22): `-o as=F32` shows every floating tensor that is
not F32 as F32. BF16 and F16 tensors made by torch (a strided view among
them) and a GGUF with ggml Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 blocks (built here from
the format description) are mounted with the option; the bytes equal NumPy's
own decode written here from the descriptions (never our C code), at odd
offsets too, through mmap, and through the .npy views (<f4); the xattrs name
F32 and the stored dtype; integers stay; a type without a decoder (Q4_K) is
shown as stored with a note; `burnstore cat --as F32` (and with --npy) gives
the same bytes; writable mounts refuse the option; a 256 MiB
BF16 tensor read whole costs the daemon no more peak memory than a small one."""
import io
import mmap
import os
import struct
import subprocess
import sys
import time

import numpy as np
import torch

from bsmount import (BIN, DEADLINE, SOURCE_DIR, Mount, check, force_unmount, foreground_mount, mem_limit_kb,
                     SANITIZE, run, run_tests, vmhwm_kb)

sys.path.insert(0, os.path.join(SOURCE_DIR, "tests/support"))
import gguf_fixture as G  # noqa: E402

X = "user.burnstore."


def bf16_to_f32(u16):
    """BF16 is the upper half of an F32."""
    return (u16.astype(np.uint32) << 16).view(np.float32)


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


def check_file(path, want, what):
    """want: the float32 array the file must hold, row-major."""
    wb = np.ascontiguousarray(want, dtype="<f4").tobytes()
    check(os.path.getsize(path) == len(wb), "%s: size %d, want %d" % (what, os.path.getsize(path), len(wb)))
    got = read_all(path)
    check(got == wb, "%s: bytes differ from NumPy's decode (first at %s)" %
          (what, next((i for i in range(min(len(got), len(wb))) if got[i] != wb[i]), "end")))
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in (1, 3, 7, 33, 129, len(wb) - 5, len(wb) - 1):
            for n in (1, 5, 13, 131):
                if 0 <= off < len(wb):
                    check(os.pread(fd, n, off) == wb[off:off + n], "%s: pread(%d, %d)" % (what, n, off))
        if wb:
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mm:
                check(mm[:] == wb, "%s: mmap gives the same bytes" % what)
    finally:
        os.close(fd)


def check_npy(path, want, what):
    a = np.load(path)
    check(a.dtype == np.dtype("<f4"), "%s: .npy dtype %s" % (what, a.dtype))
    check(a.shape == want.shape and a.tobytes() == np.ascontiguousarray(want, "<f4").tobytes(),
          "%s: np.load gives the decoded values" % what)


@np.errstate(over="ignore")
def test_torch_bf16_f16(tmp):
    torch.manual_seed(22)
    special = torch.tensor([1.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -3.0e38, 0.1])
    bf = torch.cat([special, torch.randn(40)]).bfloat16().reshape(6, 8)
    f16 = torch.cat([torch.tensor([65504.0, 6e-8, -0.0, float("nan"), float("inf")]), torch.randn(19)])
    f16 = f16.half().reshape(2, 3, 4)
    base = torch.randn(5, 7).bfloat16()
    sd = {"bf": bf, "f16": f16, "bt": base.t(),  # a strided view (the transpose)
          "f32": torch.randn(3), "i64": torch.arange(5), "f64": torch.tensor([1 / 3, 1e300, -0.0], dtype=torch.float64)}
    pth = os.path.join(tmp, "t.pth")
    torch.save(sd, pth)
    # NumPy's decode from the descriptions: BF16 bits << 16; float16 -> float32; float64 -> float32
    want = {
        "bf": bf16_to_f32(bf.view(torch.int16).numpy().view(np.uint16)),
        "f16": f16.numpy().astype(np.float32),
        "bt": bf16_to_f32(base.view(torch.int16).numpy().view(np.uint16)).T,
        "f64": sd["f64"].numpy().astype(np.float32),
    }
    with Mount(pth, os.path.join(tmp, "m"), "as=F32,npy") as m:
        for k, w in want.items():
            p = os.path.join(m, k)
            check_file(p, w, k)
            check_npy(p + ".npy", w, k + ".npy")
            check(os.getxattr(p, X + "dtype") == b"F32", "%s: dtype F32" % k)
            stored = {"bf": b"BF16", "bt": b"BF16", "f16": b"F16", "f64": b"F64"}[k]
            check(os.getxattr(p, X + "stored_dtype") == stored, "%s: stored_dtype %s" % (k, stored))
            check(X + "stored_dtype" in os.listxattr(p), "%s: stored_dtype listed" % k)
        check(read_all(os.path.join(m, "f32")) == sd["f32"].numpy().tobytes(), "F32 unchanged")
        check(read_all(os.path.join(m, "i64")) == sd["i64"].numpy().astype("<i8").tobytes(), "I64 unchanged")
        check(os.getxattr(os.path.join(m, "i64"), X + "dtype") == b"I64", "I64 dtype unchanged")
        check(X + "stored_dtype" not in os.listxattr(os.path.join(m, "i64")), "no stored_dtype on I64")
    # without the option: the bytes as stored
    with Mount(pth, os.path.join(tmp, "m2")) as m:
        check(os.path.getsize(os.path.join(m, "bf")) == 96, "without as=F32: BF16 as stored")


def f16(a):
    return np.asarray(a, dtype="<f2")


# ggml's blocks (ggml-common.h) and reference dequantize_row_* (ggml-quants.c),
# written here with NumPy: y = q * d (float32), plus m for the _1 types.
def deq(name, raw):
    size = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24}[name]
    b = np.frombuffer(raw, np.uint8).reshape(-1, size)
    d = b[:, 0:2].copy().view("<f2").astype(np.float32)  # (nb, 1)
    if name == "Q8_0":
        return (b[:, 2:].view(np.int8).astype(np.float32) * d).reshape(-1)
    m = b[:, 2:4].copy().view("<f2").astype(np.float32) if name.endswith("_1") else None
    hi = name.startswith("Q5")
    qoff = 2 + (2 if m is not None else 0) + (4 if hi else 0)
    qs = b[:, qoff:qoff + 16]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)
    if hi:
        qh = b[:, qoff - 4:qoff].copy().view("<u4")  # (nb, 1)
        bits = (qh >> np.arange(32, dtype=np.uint32)) & 1
        q |= (bits << 4).astype(np.int32)
    if m is None:
        q -= 16 if hi else 8
        return (q.astype(np.float32) * d).reshape(-1)
    return (q.astype(np.float32) * d + m).reshape(-1)


def blocks(name, nb, rng):
    """nb blocks: random quants; scales from fp16 extremes and random values."""
    size = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24}[name]
    raw = bytearray(rng.integers(0, 256, size=nb * size, dtype=np.uint8).tobytes())
    scales = [65504.0, -65504.0, 2.0 ** -24, -0.0, 0.0, 1.0, -0.5] + list(rng.standard_normal(nb))
    for i in range(nb):
        raw[i * size:i * size + 2] = f16(scales[i]).tobytes()
        if name.endswith("_1"):
            raw[i * size + 2:i * size + 4] = f16(scales[(i + 3) % nb] * 4).tobytes()
    return bytes(raw)


@np.errstate(over="ignore")
def test_gguf_blocks(tmp):
    rng = np.random.default_rng(22)
    tensors, want = [], {}
    for name, shape in (("Q8_0", [3, 64]), ("Q4_0", [5, 32]), ("Q4_1", [4, 64]), ("Q5_0", [7, 32]),
                        ("Q5_1", [2, 96])):
        nb = shape[0] * shape[1] // 32
        raw = blocks(name, nb, rng)
        key = "blk.%s.weight" % name.lower()
        tensors.append((key, G.TYPE_ID[name], shape, raw))
        want[key] = (name, deq(name, raw).reshape(shape))
    tensors.append(("blk.k.weight", G.TYPE_ID["Q4_K"], [256], bytes(range(144))))
    tensors.append(("blk.i.weight", G.TYPE_ID["I32"], [2], struct.pack("<2i", -1, 7)))
    src = os.path.join(tmp, "q.gguf")
    G.write(src, G.every_type_kvs(), tensors)
    with Mount(src, os.path.join(tmp, "mg"), "as=F32,npy") as m:
        for key, (name, w) in want.items():
            p = os.path.join(m, key.replace(".", "/"))
            check_file(p, w, key)
            check_npy(p + ".npy", w, key + ".npy")
            check(os.getxattr(p, X + "stored_dtype") == name.encode(), "%s: stored_dtype %s" % (key, name))
            check(os.getxattr(p, X + "shape") == ("[%d,%d]" % w.shape).encode(), "%s: shape kept" % key)
        k = os.path.join(m, "blk/k/weight")
        check(os.getxattr(k, X + "dtype") == b"Q4_K" and os.path.getsize(k) == 144,
              "Q4_K (no decoder yet) shown as stored")
        notes = os.getxattr(m, X + "notes").decode()
        check("as=F32: 1 Q4_K tensor shown as stored (no decoder for Q4_K)" in notes, "the note: %r" % notes)
        check(read_all(os.path.join(m, "blk/i/weight")) == struct.pack("<2i", -1, 7), "I32 unchanged")
    # the CLI: the same decode, raw and as .npy
    for key, (name, w) in want.items():
        r = subprocess.run([BIN, "cat", "--as", "F32", src, key], capture_output=True, timeout=DEADLINE)
        check(r.returncode == 0 and r.stdout == w.astype("<f4").tobytes(), "cat --as F32 %s" % key)
        r = subprocess.run([BIN, "cat", "--npy", "--as", "F32", src, key], capture_output=True, timeout=DEADLINE)
        a = np.load(io.BytesIO(r.stdout)) if r.returncode == 0 else None
        check(a is not None and a.dtype == np.dtype("<f4") and a.shape == w.shape and a.tobytes() == w.tobytes(),
              "cat --npy --as F32 %s" % key)
    r = subprocess.run([BIN, "cat", "--as", "F32", src, "blk.i.weight"], capture_output=True, timeout=DEADLINE)
    check(r.returncode == 0 and r.stdout == struct.pack("<2i", -1, 7), "cat --as F32 of an I32: unchanged")
    r = subprocess.run([BIN, "cat", "--as", "F32", src, "blk.k.weight"], capture_output=True, timeout=DEADLINE)
    err = r.stderr.decode()
    check(r.returncode == 1 and r.stdout == b"" and err.count("\n") == 1 and "no decoder for Q4_K" in err,
          "cat --as F32 of a Q4_K refused in one line: %r" % err)
    r = subprocess.run([BIN, "cat", "--as", "F64", src, "blk.i.weight"], capture_output=True, timeout=DEADLINE)
    check(r.returncode == 2 and b"--as needs F32, F16 or BF16" in r.stderr, "cat --as F64 refused: %r" % r.stderr)


def test_refusals(tmp):
    src = os.path.join(tmp, "r.gguf")
    G.write_tiny(src)
    for opts in ("as=F32,rw", "as=F32,output=%s" % os.path.join(tmp, "o.bpk")):
        mnt = os.path.join(tmp, "mr")
        os.makedirs(mnt, exist_ok=True)
        r = run([BIN, src, mnt, "-o", opts])
        force_unmount(mnt)
        check(r.returncode != 0 and "as=F32 are read-only views" in r.stderr and r.stderr.count("\n") == 1,
              "-o %s refused in one line: %r" % (opts, r.stderr))
    r = run([BIN, src, os.path.join(tmp, "mr"), "-o", "as=F16"])
    force_unmount(os.path.join(tmp, "mr"))
    check(r.returncode != 0 and "only as=F32" in r.stderr, "as=F16 refused: %r" % r.stderr)


def daemon_read_peak(src, mnt, name):
    """Mount src in -f with as=F32, read `name` whole; the daemon's VmHWM."""
    # AddressSanitizer keeps up to 256 MiB of freed blocks in quarantine (a
    # reply buffer per read): bounded here so the peak measures the daemon.
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "quarantine_size_mb=4"]))
    with foreground_mount(src, mnt, "as=F32", env=env) as p:
        t0 = time.time()
        n = 0
        with open(os.path.join(mnt, name), "rb") as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                n += len(b)
        dt = time.time() - t0
        return vmhwm_kb(p.pid), n, dt


def write_st(path, name, dtype, shape, nbytes):
    import json
    h = json.dumps({name: {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + nbytes)  # zeros, sparse: BF16 +0


def test_memory_independent_of_size(tmp):
    small, big = os.path.join(tmp, "s.safetensors"), os.path.join(tmp, "b.safetensors")
    write_st(small, "w", "BF16", [1024], 2048)
    write_st(big, "w", "BF16", [128 << 10, 1024], 256 << 20)  # 256 MiB stored, 512 MiB as F32
    hs, ns, _ = daemon_read_peak(small, os.path.join(tmp, "ms"), "w")
    hb, nb, dt = daemon_read_peak(big, os.path.join(tmp, "mb"), "w")
    check(ns == 4096 and nb == 512 << 20, "read %d and %d bytes" % (ns, nb))
    print("peak daemon memory: %d kB reading 4 KiB, %d kB reading 512 MiB of decoded BF16 (%.0f MB/s)"
          % (hs, hb, nb / dt / 1e6 if dt else 0))
    # A whole-tensor buffer would add 512 MiB; the sanitizers' allocators
    # (ASan's bounded quarantine, TSan's shadow of each reply buffer: 17 MB
    # seen) add some MiB of their own.
    limit = mem_limit_kb((32 if SANITIZE in ("ON", "thread") else 8) * 1024)
    check(hb - hs < limit, "peak grew by %d kB for a 256 MiB tensor (< %d)" % (hb - hs, limit))


if __name__ == "__main__":
    run_tests("test_decoded", [test_torch_bf16_f16, test_gguf_blocks, test_refusals, test_memory_independent_of_size],
              "decoded")
