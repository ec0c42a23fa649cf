"""Decoded views (issue 22): `-o as=F32` shows every floating tensor that is
not F32 as F32. BF16 and F16 tensors made by torch (a strided view among
them) and a GGUF with blocks of every ggml quantized type (random bytes,
scales forced to fp16/f32 extremes: built here from the format description)
are mounted with the option; the bytes equal NumPy's own decode written here
from ggml's description (never our C code; the IQ grids built from ggml's
quantizer tables and checked against decode_grids.c), at odd offsets too (reads that
start and end mid-block), through mmap, and through the .npy views (<f4);
the xattrs name F32 and the stored dtype; every code of the five 8-bit float
types against NumPy's decode of their descriptions; Burnpack QFloat tensors
(block and tensor scales, bytes and packed words) the same way; integers stay; a type without a
decoder (F6: its packing is not defined) is shown as stored with a note, and F4
is decoded with torch's nibble order; `burnstore cat --as F32` (and with --npy) gives
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
                     SANITIZE, run, run_tests, small_tmpfs, vmhwm_kb)

sys.path.insert(0, os.path.join(SOURCE_DIR, "tests/support"))
import gguf_fixture as G  # noqa: E402
from cbor_fixture import cbor_encode  # noqa: E402

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


# ggml's blocks (ggml-common.h: the block_* structs, fields in order, little
# endian) and reference dequantize_row_* (ggml-quants.c), written here with
# NumPy from that description. Every product and sum is a float32 operation
# in the reference's order (NumPy float32 arithmetic rounds each one).
F = np.float32
SIZE = {name: size for name, _, size in G.GGML.values()}
BLCK = {name: blck for name, blck, _ in G.GGML.values()}


def h16(b, off):
    """The fp16 at byte `off` of every block, widened: shape (nb, 1)."""
    return b[:, off:off + 2].copy().view("<f2").astype(F)


def deq_legacy(name, b):
    d = h16(b, 0)
    if name == "Q8_0":
        return b[:, 2:].view(np.int8).astype(F) * d
    m = h16(b, 2) if name.endswith("_1") else None
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
        return q.astype(F) * d
    return q.astype(F) * d + m


def per16(v):
    """(nb, 16) per-group values to (nb, 256): element e takes group e // 16."""
    return np.repeat(v, 16, axis=1)


def deq_q2_k(b):
    # scales[16] | qs[64] | d | dmin; element 128h + 32s + l: bits 2s of qs[32h + l]
    sc, qs, d, dmin = b[:, 0:16], b[:, 16:80], h16(b, 80), h16(b, 82)
    q = np.concatenate([(qs[:, 32 * h:32 * h + 32] >> (2 * s)) & 3 for h in range(2) for s in range(4)], axis=1)
    dl, ml = d * (sc & 15).astype(F), dmin * (sc >> 4).astype(F)
    return per16(dl) * q.astype(F) - per16(ml)


def deq_q3_k(b):
    # hmask[32] | qs[64] | scales[12] | d; 6-bit scales - 32; third bit 4h + s of hmask[l], clear: -4
    hm, qs, s, d = b[:, 0:32].astype(np.int32), b[:, 32:96].astype(np.int32), b[:, 96:108].astype(np.int32), h16(b, 108)
    sc = np.stack([(s[:, i] & 15 if i < 8 else s[:, i - 8] >> 4) | (((s[:, 8 + i % 4] >> (2 * (i // 4))) & 3) << 4)
                   for i in range(16)], axis=1) - 32
    q = np.concatenate([((qs[:, 32 * h:32 * h + 32] >> (2 * t)) & 3) - np.where((hm >> (4 * h + t)) & 1, 0, 4)
                        for h in range(2) for t in range(4)], axis=1)
    return per16(d * sc.astype(F)) * q.astype(F)


def scale_min_k4(s):
    """Q4_K/Q5_K: eight 6-bit scales and mins from 12 bytes, (nb, 8) each."""
    s = s.astype(np.int32)
    sc = [s[:, j] & 63 if j < 4 else (s[:, j + 4] & 15) | ((s[:, j - 4] >> 6) << 4) for j in range(8)]
    mn = [s[:, j + 4] & 63 if j < 4 else (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4) for j in range(8)]
    return np.stack(sc, axis=1).astype(F), np.stack(mn, axis=1).astype(F)


def deq_q45_k(b, five):
    # d | dmin | scales[12] | (Q5_K: qh[32]) | qs[128]; element 64k + 32t + l: nibble t of qs[32k + l]
    d, dmin = h16(b, 0), h16(b, 2)
    sc, mn = scale_min_k4(b[:, 4:16])
    qh = b[:, 16:48].astype(np.int32)
    qs = b[:, 48:176].astype(np.int32) if five else b[:, 16:144].astype(np.int32)
    parts = []
    for k in range(4):
        for t in range(2):
            q = (qs[:, 32 * k:32 * k + 32] >> (4 * t)) & 15
            if five:
                q = q + 16 * ((qh >> (2 * k + t)) & 1)
            parts.append(q)
    q = np.concatenate(parts, axis=1).astype(F)
    return np.repeat(d * sc, 32, axis=1) * q - np.repeat(dmin * mn, 32, axis=1)


def deq_q6_k(b):
    # ql[128] | qh[64] | int8 scales[16] | d; in half h, element 32c + l: nibble c // 2 of
    # ql[64h + l + 32 (c % 2)] | bits 2c of qh[32h + l] << 4, minus 32
    ql, qh = b[:, 0:128].astype(np.int32), b[:, 128:192].astype(np.int32)
    sc, d = b[:, 192:208].view(np.int8).astype(F), h16(b, 208)
    parts = []
    for h in range(2):
        for c in range(4):
            lo = (ql[:, 64 * h + 32 * (c % 2):64 * h + 32 * (c % 2) + 32] >> (4 * (c // 2))) & 15
            parts.append((lo | (((qh[:, 32 * h:32 * h + 32] >> (2 * c)) & 3) << 4)) - 32)
    return per16(d * sc) * np.concatenate(parts, axis=1).astype(F)


def deq_q8_k(b):
    # f32 d | int8 qs[256] | int16 bsums[16] (unused)
    return b[:, 0:4].copy().view("<f4").astype(F) * b[:, 4:260].view(np.int8).astype(F)


def deq_tq1_0(b):
    # qs[48] | qh[4] | d; trit n of byte x: ((x * 3^n mod 256) * 3) >> 8; qs[0:32] for n < 5,
    # qs[32:48] for n < 5, qh for n < 4; y = (trit - 1) * d
    def trits(x, n):
        return (((x.astype(np.int32) * 3 ** n) & 255) * 3) >> 8
    t = [trits(b[:, 0:32], n) for n in range(5)] + [trits(b[:, 32:48], n) for n in range(5)] + \
        [trits(b[:, 48:52], n) for n in range(4)]
    return (np.concatenate(t, axis=1) - 1).astype(F) * h16(b, 52)


def deq_tq2_0(b):
    # qs[64] | d; element 128j + 32l + m: bits 2l of qs[32j + m]; y = (q - 1) * d
    q = [(b[:, 32 * j:32 * j + 32].astype(np.int32) >> (2 * l)) & 3 for j in range(2) for l in range(4)]
    return (np.concatenate(q, axis=1) - 1).astype(F) * h16(b, 64)


# E2M1 (OCP MX 1.0): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; ggml keeps them doubled as
# int8 (so code 8, -0, is 0) and halves the E8M0 scale instead: 2^(e - 127) / 2.
KV_MXFP4 = np.array([int(2 * v) * (1 if c < 8 else -1) for c, v in
                     enumerate([0, 0.5, 1, 1.5, 2, 3, 4, 6] * 2)], np.int8)
# ggml-common.h kvalues_iq4nl, copied here by hand (16 values).
KV_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


def deq_mxfp4(b):
    # e (E8M0) | qs[16]; element j < 16: low nibble of qs[j], j + 16: high nibble
    d = np.ldexp(F(1), b[:, 0:1].astype(np.int32) - 128).astype(F)
    q = np.concatenate([b[:, 1:17] & 15, b[:, 1:17] >> 4], axis=1)
    return KV_MXFP4[q].astype(F) * d


def deq_iq4_nl(b):
    q = np.concatenate([b[:, 2:18] & 15, b[:, 2:18] >> 4], axis=1)
    return h16(b, 0) * KV_IQ4NL[q].astype(F)


def deq_iq4_xs(b):
    # d | u16 scales_h | scales_l[4] | qs[128]; group i: 6-bit scale - 32, nibbles as IQ4_NL
    d, sh, sl = h16(b, 0), b[:, 2:4].copy().view("<u2").astype(np.int32), b[:, 4:8].astype(np.int32)
    out = []
    for i in range(8):
        ls = ((sl[:, i // 2:i // 2 + 1] >> (4 * (i % 2))) & 15) | (((sh >> (2 * i)) & 3) << 4)
        qs = b[:, 8 + 16 * i:24 + 16 * i]
        out.append((d * (ls - 32).astype(F)) * KV_IQ4NL[np.concatenate([qs & 15, qs >> 4], axis=1)].astype(F))
    return np.concatenate(out, axis=1)


def parsed_grids():
    """The IQ grids as src/core/decode_grids.c holds them (each entry's bytes,
    lowest first), parsed from that file."""
    import re
    text = read_all(os.path.join(SOURCE_DIR, "src/core/decode_grids.c")).decode()
    g = {}
    for typ, name, n, body in re.findall(r"const (\w+) bs_(\w+)\[(\d+)\] = \{(.*?)\};", text, re.S):
        vals = [int(v, 0) for v in re.findall(r"-?0x[0-9a-f]+|-?\d+", body)]
        assert len(vals) == int(n), name
        if typ in ("uint64_t", "uint32_t"):
            w = 8 if typ == "uint64_t" else 4
            g[name] = np.array(vals, "<u%d" % w).view(np.uint8).reshape(-1, w)
        else:
            g[name] = np.array(vals, np.int8)
    return g


def built_grids():
    """The same grids built independently: from ggml's quantizer tables
    (tests/support/ggml_kgrid.py), each u16 packing a point's level indexes,
    and the levels ggml's dequantization grids use: IQ2 8, 25, 43; IQ1 -1, 0,
    1; IQ3_XXS 4, 12, ..., 52, 62; IQ3_S 1, 3, ..., 15."""
    sys.path.insert(0, os.path.join(SOURCE_DIR, "tests/support"))
    from ggml_kgrid import kgrid
    def build(table, nvals, bits, levels):
        k = np.array(kgrid(table), np.int64)[:, None]
        return np.array(levels, np.int64)[(k >> (bits * np.arange(nvals))) & ((1 << bits) - 1)].astype(np.uint8)
    two = [8, 25, 43, 0]
    return {"iq2xxs_grid": build("kgrid_2bit_256", 8, 2, two), "iq2xs_grid": build("kgrid_2bit_512", 8, 2, two),
            "iq2s_grid": build("kgrid_2bit_1024", 8, 2, two),
            "iq1s_grid": build("kgrid_1bit_2048", 8, 2, [-1, 0, 1, 0]),
            "iq3xxs_grid": build("kgrid_256", 4, 3, [4, 12, 20, 28, 36, 44, 52, 62]),
            "iq3s_grid": build("kgrid_512", 4, 3, [1, 3, 5, 7, 9, 11, 13, 15])}


GRID = built_grids()
_PARSED = parsed_grids()
for _n, _g in GRID.items():
    check(np.array_equal(_PARSED[_n], _g), "decode_grids.c's %s equals the grid built from ggml's quantizer table" % _n)
# ggml's ksigns_iq2xs: 7 sign bits and an eighth that makes the number of set bits even
KSIGNS = np.array([i | (bin(i).count("1") & 1) << 7 for i in range(128)], np.int32)
check(np.array_equal(_PARSED["kvalues_mxfp4"], KV_MXFP4) and np.array_equal(_PARSED["kvalues_iq4nl"], KV_IQ4NL),
      "decode_grids.c's kvalues tables equal the test's own copies")


def signed(db, vals, signs):
    """db * value, negated where bit j of signs is set (ggml multiplies by -1:
    the same but for a NaN's sign, which burnstore defines as the negation's)."""
    v = db * vals.astype(F)
    return np.where((signs[:, None] >> np.arange(vals.shape[1])) & 1, -v, v)


def u16(b, off):
    return b[:, off:off + 2].copy().view("<u2")[:, 0].astype(np.int64)


def u32(b, off):
    return b[:, off:off + 4].copy().view("<u4")[:, 0].astype(np.int64)


def deq_iq2(b, name):
    d, out = h16(b, 0), []
    for ib in range(8):
        if name == "IQ2_XXS":
            a1 = u32(b, 6 + 8 * ib)
            db = d * (F(0.5) + (a1 >> 28).astype(F)[:, None]) * F(0.25)
            for l in range(4):
                out.append(signed(db, GRID["iq2xxs_grid"][b[:, 2 + 8 * ib + l]], KSIGNS[(a1 >> 7 * l) & 127]))
            continue
        sc = b[:, (66 if name == "IQ2_XS" else 74) + ib].astype(np.int32)[:, None]
        dbs = [d * (F(0.5) + (sc & 15).astype(F)) * F(0.25), d * (F(0.5) + (sc >> 4).astype(F)) * F(0.25)]
        for l in range(4):
            if name == "IQ2_XS":
                q = u16(b, 2 + 2 * (4 * ib + l))
                out.append(signed(dbs[l // 2], GRID["iq2xs_grid"][q & 511], KSIGNS[q >> 9]))
            else:
                idx = b[:, 2 + 4 * ib + l].astype(np.int64) | ((b[:, 66 + ib].astype(np.int64) << (8 - 2 * l)) & 0x300)
                out.append(signed(dbs[l // 2], GRID["iq2s_grid"][idx], b[:, 34 + 4 * ib + l].astype(np.int64)))
    return np.concatenate(out, axis=1)


def deq_iq3(b, name):
    d, out = h16(b, 0), []
    for ib in range(8):
        qs = b[:, 2 + 8 * ib:10 + 8 * ib].astype(np.int64)
        if name == "IQ3_XXS":
            a = u32(b, 66 + 4 * ib)
            db = d * (F(0.5) + (a >> 28).astype(F)[:, None]) * F(0.5)
            for l in range(4):
                v = np.concatenate([GRID["iq3xxs_grid"][qs[:, 2 * l]], GRID["iq3xxs_grid"][qs[:, 2 * l + 1]]], axis=1)
                out.append(signed(db, v, KSIGNS[(a >> 7 * l) & 127]))
        else:
            nib = (b[:, 106 + ib // 2].astype(np.int32) >> (4 * (ib % 2))) & 15
            db = d * (1 + 2 * nib).astype(F)[:, None]
            qh = b[:, 66 + ib].astype(np.int64)
            for l in range(4):
                i1 = qs[:, 2 * l] | ((qh << (8 - 2 * l)) & 256)
                i2 = qs[:, 2 * l + 1] | ((qh << (7 - 2 * l)) & 256)
                v = np.concatenate([GRID["iq3s_grid"][i1], GRID["iq3s_grid"][i2]], axis=1)
                out.append(signed(db, v, b[:, 74 + 4 * ib + l].astype(np.int64)))
    return np.concatenate(out, axis=1)


def deq_iq1(b, name):
    g = GRID["iq1s_grid"].view(np.int8).astype(F)
    out = []
    if name == "IQ1_S":
        d = h16(b, 0)
        for ib in range(8):
            qh = u16(b, 34 + 2 * ib)
            dl = d * (2 * ((qh >> 12) & 7) + 1).astype(F)[:, None]
            delta = np.where(qh & 0x8000, F(-0.125), F(0.125))[:, None]
            for l in range(4):
                idx = b[:, 2 + 4 * ib + l].astype(np.int64) | (((qh >> 3 * l) & 7) << 8)
                out.append(dl * (g[idx] + delta))
        return np.concatenate(out, axis=1)
    sc = [u16(b, 48 + 2 * k) for k in range(4)]
    dh = (sc[0] >> 12) | ((sc[1] >> 8) & 0xf0) | ((sc[2] >> 4) & 0xf00) | (sc[3] & 0xf000)
    d = dh.astype("<u2").view("<f2").astype(F)[:, None]
    for ib in range(8):
        s = sc[ib // 2] >> (6 * (ib % 2))
        dls = [d * (2 * (s & 7) + 1).astype(F)[:, None], d * (2 * ((s >> 3) & 7) + 1).astype(F)[:, None]]
        for l in range(4):
            h = b[:, 32 + 2 * ib + l // 2].astype(np.int64) >> (4 * (l % 2))
            delta = np.where(h & 8, F(-0.125), F(0.125))[:, None]
            out.append(dls[l // 2] * (g[b[:, 4 * ib + l].astype(np.int64) | ((h & 7) << 8)] + delta))
    return np.concatenate(out, axis=1)


DEQ = {
    "TQ1_0": deq_tq1_0, "TQ2_0": deq_tq2_0, "MXFP4": deq_mxfp4, "IQ4_NL": deq_iq4_nl, "IQ4_XS": deq_iq4_xs,
    "IQ2_XXS": lambda b: deq_iq2(b, "IQ2_XXS"), "IQ2_XS": lambda b: deq_iq2(b, "IQ2_XS"),
    "IQ2_S": lambda b: deq_iq2(b, "IQ2_S"), "IQ3_XXS": lambda b: deq_iq3(b, "IQ3_XXS"),
    "IQ3_S": lambda b: deq_iq3(b, "IQ3_S"), "IQ1_S": lambda b: deq_iq1(b, "IQ1_S"),
    "IQ1_M": lambda b: deq_iq1(b, "IQ1_M"),
    "Q2_K": deq_q2_k, "Q3_K": deq_q3_k, "Q4_K": lambda b: deq_q45_k(b, False),
    "Q5_K": lambda b: deq_q45_k(b, True), "Q6_K": deq_q6_k, "Q8_K": deq_q8_k,
}
for _n in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"):
    DEQ[_n] = (lambda n: lambda b: deq_legacy(n, b))(_n)


def deq(name, raw):
    b = np.frombuffer(raw, np.uint8).reshape(-1, SIZE[name])
    return DEQ[name](b).astype(F).reshape(-1)


# Where each type keeps its scales: (byte offset, "f16" | "f32"), forced to the extremes.
SCALES = {"Q8_0": [(0, "f16")], "Q4_0": [(0, "f16")], "Q4_1": [(0, "f16"), (2, "f16")],
          "Q5_0": [(0, "f16")], "Q5_1": [(0, "f16"), (2, "f16")],
          "Q2_K": [(80, "f16"), (82, "f16")], "Q3_K": [(108, "f16")], "Q4_K": [(0, "f16"), (2, "f16")],
          "Q5_K": [(0, "f16"), (2, "f16")], "Q6_K": [(208, "f16")], "Q8_K": [(0, "f32")],
          "TQ1_0": [(52, "f16")], "TQ2_0": [(64, "f16")], "MXFP4": [(0, "e8m0")], "IQ4_NL": [(0, "f16")],
          "IQ4_XS": [(0, "f16")], "IQ2_XXS": [(0, "f16")], "IQ2_XS": [(0, "f16")], "IQ2_S": [(0, "f16")],
          "IQ3_XXS": [(0, "f16")], "IQ3_S": [(0, "f16")], "IQ1_S": [(0, "f16")], "IQ1_M": [(48, "iq1m")]}


def blocks(name, nb, rng):
    """nb blocks of random bytes, their scales forced in turn to fp16 (or f32)
    extremes: largest, smallest subnormal, -0, +0, infinities, NaN, then
    random values."""
    size = SIZE[name]
    raw = bytearray(rng.integers(0, 256, size=nb * size, dtype=np.uint8).tobytes())
    special = [65504.0, -65504.0, 2.0 ** -24, -(2.0 ** -24), 6.1e-5, -0.0, 0.0, 1.0, -0.5,
               float("inf"), float("-inf"), float("nan")]
    for i in range(nb):
        for k, (off, kind) in enumerate(SCALES.get(name, [])):
            j = i + 5 * k  # the min cycles out of step with the scale
            v = special[j] if j < len(special) else float(rng.standard_normal())
            if kind == "f16":
                raw[i * size + off:i * size + off + 2] = f16(v).tobytes()
            elif kind == "e8m0":  # 0 and 1 (the subnormal scales), 2, 127, 254, 255, then random
                raw[i * size + off] = [0, 1, 2, 127, 254, 255][i] if i < 6 else raw[i * size + off]
            elif kind == "iq1m":  # the fp16 d in the top nibbles of four u16
                h = int(f16(v).view("<u2"))
                for n in range(4):
                    p = i * size + off + 2 * n + 1
                    raw[p] = (raw[p] & 0x0F) | (((h >> (4 * n)) & 15) << 4)
            else:
                v = {65504.0: 3.4028235e38, 2.0 ** -24: 1e-45}.get(v, v * 1e-30 if abs(v) == 1.0 else v)
                raw[i * size + off:i * size + off + 4] = np.asarray(v, "<f4").tobytes()
    return bytes(raw)


GGUF_TYPES = (("Q8_0", [3, 64]), ("Q4_0", [5, 32]), ("Q4_1", [4, 64]), ("Q5_0", [7, 32]), ("Q5_1", [2, 96]),
              ("Q2_K", [16, 256]), ("Q3_K", [16, 256]), ("Q4_K", [2, 2048]), ("Q5_K", [16, 256]),
              ("Q6_K", [16, 256]), ("Q8_K", [16, 256]), ("TQ1_0", [16, 256]), ("TQ2_0", [16, 256]),
              ("MXFP4", [16, 64]), ("IQ4_NL", [16, 64]), ("IQ4_XS", [16, 256]), ("IQ2_XXS", [16, 256]),
              ("IQ2_XS", [16, 256]), ("IQ2_S", [16, 256]), ("IQ3_XXS", [16, 256]), ("IQ3_S", [16, 256]),
              ("IQ1_S", [16, 256]), ("IQ1_M", [16, 256]))


@np.errstate(over="ignore", invalid="ignore")
def test_gguf_blocks(tmp):
    rng = np.random.default_rng(22)
    tensors, want = [], {}
    for name, shape in GGUF_TYPES:
        nb = shape[0] * shape[1] // BLCK[name]
        raw = blocks(name, nb, rng)
        key = "blk.%s.weight" % name.lower()
        tensors.append((key, G.TYPE_ID[name], shape, raw))
        want[key] = (name, deq(name, raw).reshape(shape))
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
        check(X + "notes" not in os.listxattr(m), "no note: every type decoded")
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
    r = subprocess.run([BIN, "cat", "--as", "F64", src, "blk.i.weight"], capture_output=True, timeout=DEADLINE)
    check(r.returncode == 2 and b"--as needs F32, F16 or BF16" in r.stderr, "cat --as F64 refused: %r" % r.stderr)


def e2m1_table():
    """The 16 E2M1 codes (OCP MX 1.0, section 5.3.3) as float32, from the
    description: sign bit 3, exponent bits 1-2 (bias 1), mantissa bit 0;
    exponent 0 is subnormal (mantissa x 0.5). No infinity, no NaN; code 8
    is -0."""
    vals = []
    for c in range(16):
        e, m = (c >> 1) & 3, c & 1
        v = m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
        vals.append(-v if c & 8 else v)
    return np.array(vals, dtype=np.float32)


def f4_decode(raw, shape):
    """F4 bytes as torch's float4_e2m1fn_x2 holds them (the storage bytes
    safetensors' torch binding writes): element 2j in the low nibble of
    byte j, element 2j + 1 in the high one."""
    b = np.frombuffer(raw, dtype=np.uint8)
    codes = np.empty(2 * len(b), dtype=np.uint8)
    codes[0::2], codes[1::2] = b & 0x0F, b >> 4
    return e2m1_table()[codes].reshape(shape)


def write_st_tensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes)}, in that order, no padding."""
    import json
    h, off = {}, 0
    for k, (dt, shape, b) in tensors.items():
        h[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    hb = json.dumps(h).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(b for _, _, b in tensors.values()))


F6_WHY = "no file format defines how 4 F6 values are packed in 3 bytes"


def test_f4_and_f6(tmp):
    """F4 (E2M1, two a byte) is decoded: every code in both nibbles, in a
    [6, 10] tensor, equals NumPy's decode of the description with the
    nibble order of torch's float4_e2m1fn_x2, through as=F32 (reads at odd
    offsets, mmap, the .npy view, the xattrs), cat --as F32, convert --as
    F16 (NumPy's astype(float16)) and a .pth written from a writable mount
    and read back decoded. F6 (4 values in 3 bytes, in an order SafeTensors
    does not define) stays as stored with a note saying so; cat --as F32
    refuses it saying the same."""
    rng = np.random.default_rng(4)
    f4 = bytes([c | (15 - c) << 4 for c in range(16)]) + rng.integers(0, 256, 14, dtype=np.uint8).tobytes()
    f6 = rng.integers(0, 256, 12, dtype=np.uint8).tobytes()
    ts = {"w": ("F4", [6, 10], f4), "s": ("F6_E2M3", [2, 8], f6), "t": ("F6_E3M2", [4], f6[:3])}
    src = os.path.join(tmp, "f4.safetensors")
    write_st_tensors(src, ts)
    want = f4_decode(f4, (6, 10))
    check(sorted(set(want.view(np.uint32).ravel().tolist())) == sorted(set(e2m1_table().view(np.uint32).tolist())),
          "the tensor holds every E2M1 code (both zeros)")
    check(want[0, 0] == 0 and want[0, 1] == -6 and want[1, 6] == 0 and np.signbit(want[1, 6]) and want[1, 7] == 6,
          "byte 0 is 0 then -6, byte 8 is -0 then 6 (element 2j in the low nibble)")
    with Mount(src, os.path.join(tmp, "m"), "as=F32,npy") as m:
        w = os.path.join(m, "w")
        check_file(w, want, "F4 as F32")
        check_npy(w + ".npy", want, "F4 .npy")
        check(os.getxattr(w, X + "dtype") == b"F32" and os.getxattr(w, X + "stored_dtype") == b"F4",
              "xattrs: F32, stored F4")
        check(os.getxattr(w, X + "shape") == b"[6,10]", "shape: %r" % os.getxattr(w, X + "shape"))
        for k in ("s", "t"):
            p = os.path.join(m, k)
            check(os.getxattr(p, X + "dtype") == ts[k][0].encode() and read_all(p) == ts[k][2],
                  "%s: %s shown as stored" % (k, ts[k][0]))
            check(X + "stored_dtype" not in os.listxattr(p), "%s: no stored_dtype" % k)
        notes = os.getxattr(m, X + "notes").decode()
        for dt in ("F6_E2M3", "F6_E3M2"):
            check("as=F32: 1 %s tensor shown as stored (%s" % (dt, F6_WHY) in notes
                  and "a guessed order would give wrong numbers" in notes, "the note: %r" % notes)
        check("F4" not in notes, "no note for F4: %r" % notes)
    r = subprocess.run([BIN, "cat", "--as", "F32", src, "w"], capture_output=True, timeout=DEADLINE)
    check(r.returncode == 0 and r.stdout == want.astype("<f4").tobytes(), "cat --as F32 of F4: %r" % r.stderr)
    r = subprocess.run([BIN, "cat", "--as", "F32", src, "s"], capture_output=True, timeout=DEADLINE)
    err = r.stderr.decode()
    check(r.returncode == 1 and r.stdout == b"" and err.count("\n") == 1 and F6_WHY in err,
          "cat --as F32 of an F6 refused in one line saying why: %r" % err)
    # convert --as F16 (F6 left out): NumPy's astype(float16), the header F16
    out = os.path.join(tmp, "f4-f16.safetensors")
    r = run([BIN, "convert", "-q", "--as", "F16", "-o", "exclude=^[st]$", src, out])
    if check(r.returncode == 0, "convert --as F16: %r" % r.stderr):
        r = subprocess.run([BIN, "cat", out, "w"], capture_output=True, timeout=DEADLINE)
        check(r.stdout == want.astype("<f2").tobytes(), "convert --as F16 of F4 = NumPy's astype(float16)")
        r = run([BIN, "ls", out])
        check(r.stdout == "w\tF16\t[6,10]\t120\n", "ls: %r" % r.stdout)
    # unchanged bytes through a copy (the writers keep F4's bytes as they are)
    cp = os.path.join(tmp, "copy.safetensors")
    r = run([BIN, "convert", "-q", src, cp])
    r2 = subprocess.run([BIN, "cat", cp, "w"], capture_output=True, timeout=DEADLINE)
    check(r.returncode == 0 and r2.stdout == f4, "convert (no --as) keeps F4's bytes: %r" % r.stderr)
    # .pth written from a writable mount (torch's float4_e2m1fn_x2), read back decoded
    pth = os.path.join(tmp, "f4.pth")
    with Mount(src, os.path.join(tmp, "mw"), "output=%s,exclude=^[st]$" % pth) as m:
        check(read_all(os.path.join(m, "w")) == f4, "the writable mount shows F4 as stored")
    if check(os.path.exists(pth), "the .pth was written"):
        with Mount(pth, os.path.join(tmp, "mp"), "as=F32") as m:
            w = os.path.join(m, "w")
            check_file(w, want, ".pth F4 as F32")
            check(os.getxattr(w, X + "stored_dtype") == b"F4", ".pth: stored_dtype F4")


def f8_decode(name, b):
    """The 256 codes of an 8-bit float as float32, from the descriptions
    (OCP OFP8 1.0 for E4M3FN and E5M2; PyTorch's FNUZ types: bias 8 and 16,
    0x80 the only NaN; OCP MX 1.0 for E8M0), in float64 then rounded (every
    value is exact in F32)."""
    b = b.astype(np.int64)
    if name == "F8_E8M0":
        return np.where(b == 255, np.nan, np.ldexp(1.0, b - 127)).astype(np.float32)
    eb, mb, bias, fnuz = {"F8_E4M3": (4, 3, 7, False), "F8_E5M2": (5, 2, 15, False),
                          "F8_E4M3FNUZ": (4, 3, 8, True), "F8_E5M2FNUZ": (5, 2, 16, True)}[name]
    sign = np.where(b >> 7, -1.0, 1.0)
    e, m = (b >> mb) & ((1 << eb) - 1), b & ((1 << mb) - 1)
    v = np.where(e == 0, np.ldexp(m.astype(np.float64), 1 - bias - mb),
                 np.ldexp((m | 1 << mb).astype(np.float64), e - bias - mb)) * sign
    if fnuz:
        v = np.where(b == 0x80, np.nan, v)
    elif name == "F8_E4M3":  # no infinities; S.1111.111 is NaN
        v = np.where((e == 15) & (m == 7), np.nan, v)
    else:  # E5M2: exponent 31 is infinity (m = 0) or NaN
        v = np.where(e == 31, np.where(m == 0, sign * np.inf, np.nan), v)
    return v.astype(np.float32)


def test_f8_every_code(tmp):
    """Every code of the five 8-bit float types under as=F32 and with
    cat --as F32: each finite value and infinity bit for bit NumPy's decode
    of the description (subnormals, -0, the largest finite), NaN exactly
    where the description has one (OCP E4M3 and E5M2: with the code's sign);
    a BOOL tensor beside them is shown unchanged."""
    import json
    names = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0")
    codes = np.arange(256, dtype=np.uint8)
    hd = {n.lower(): {"dtype": n, "shape": [16, 16], "data_offsets": [256 * i, 256 * i + 256]}
          for i, n in enumerate(names)}
    hd["mask"] = {"dtype": "BOOL", "shape": [4], "data_offsets": [256 * len(names), 256 * len(names) + 4]}
    h = json.dumps(hd).encode()
    h += b" " * (-len(h) % 8)
    src = os.path.join(tmp, "f8.safetensors")
    with open(src, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + codes.tobytes() * len(names) + b"\1\0\0\1")

    def same(got, name, what):
        want = f8_decode(name, codes)
        g = np.frombuffer(got, "<f4") if len(got) == 1024 else np.zeros(256, np.float32)
        nan = np.isnan(want)
        check(len(got) == 1024 and np.array_equal(np.isnan(g), nan), "%s %s: NaN at the NaN codes" % (what, name))
        check(np.array_equal(g[~nan].view("<u4"), want[~nan].view("<u4")),
              "%s %s: every value bit for bit (first difference at code %s)" % (what, name, next(
                  (i for i in range(256) if not nan[i] and g[i].view("<u4") != want[i].view("<u4")), None)))
        if name in ("F8_E4M3", "F8_E5M2"):
            check(np.array_equal(np.signbit(g[nan]), codes[nan] >= 0x80), "%s %s: NaN sign" % (what, name))
    with Mount(src, os.path.join(tmp, "m8"), "as=F32") as m:
        for n in names:
            p = os.path.join(m, n.lower())
            check(os.getxattr(p, X + "stored_dtype") == n.encode(), "%s: stored_dtype" % n)
            same(read_all(p), n, "as=F32")
        p = os.path.join(m, "mask")
        check(read_all(p) == b"\1\0\0\1" and os.getxattr(p, X + "dtype") == b"BOOL", "BOOL shown unchanged")
        check(X + "stored_dtype" not in os.listxattr(p), "no stored_dtype on BOOL")
    for n in names:
        r = subprocess.run([BIN, "cat", "--as", "F32", src, n.lower()], capture_output=True, timeout=DEADLINE)
        check(r.returncode == 0, "cat --as F32 %s: %r" % (n, r.stderr))
        same(r.stdout, n, "cat --as F32")


def qscheme(value, store, tensor=None, block=None, bdt=None):
    """The current QFloat map (burnpack-format.md 4.2): block is its dims."""
    b = None if block is None else {"size": {"storage": list(block) + [1] * (5 - len(block)), "len": len(block)},
                                    "dtype": bdt}
    return {"QFloat": {"value": value, "store": store, "mode": "Symmetric", "tensor": tensor, "block": b}}


def test_burn_qfloat(tmp):
    """Burnpack QFloat tensors under as=F32 and cat --as F32, against NumPy's
    decode of burn-std's QuantizedBytes layout (the values, then the scales
    row-major over the block grid; y = value x scale in F32): Q8S a byte a
    value in [2, 32] blocks with F32 scales (-0, subnormal, infinite ones);
    Q4S in u32 words along rows of 20 (3 words a row, padded, low bits
    first, sign-extended) with one F16 scale; E4M3 codes (OCP) in blocks of
    4 with UE8M0 scales (2^(code - 127), code 0 a subnormal)."""
    rng = np.random.default_rng(22)
    q8 = rng.integers(-128, 128, (8, 64), dtype=np.int8)
    s8 = np.array([0.5, -0.0, 1e-40, np.inf, 3.0, -2.5, 1e-3, 65504.0], np.float32)  # grid [4, 2]
    w8 = q8.astype(np.float32) * np.repeat(np.repeat(s8.reshape(4, 2), 2, 0), 32, 1)
    q4 = rng.integers(-8, 8, (3, 20))
    words = np.zeros((3, 3), np.uint32)
    for r in range(3):
        for c in range(20):
            words[r, c // 8] |= np.uint32((int(q4[r, c]) & 15) << (4 * (c % 8)))
    s4 = np.float16(0.125)
    w4 = q4.astype(np.float32) * np.float32(s4)
    e4 = np.arange(0, 256, 8, dtype=np.uint8).reshape(4, 8)  # 32 codes, NaN-free: 0x7f, 0xff left out
    ue = np.array([127, 0, 128, 254, 120, 130, 1, 127], np.uint8)  # grid [4, 2]
    we = f8_decode("F8_E4M3", e4) * np.repeat(np.ldexp(1.0, ue.astype(np.int64) - 127).astype(np.float32)
                                              .reshape(4, 2), 4, 1)
    tensors = [("e4", qscheme("E4M3", "Native", block=[4], bdt="UE8M0"), [4, 8], e4.tobytes() + ue.tobytes()),
               ("q4", qscheme("Q4S", {"PackedU32": 0}, tensor="F16"), [3, 20],
                words.astype("<u4").tobytes() + np.array(s4, "<f2").tobytes()),
               ("q8", qscheme("Q8S", "Native", block=[2, 32], bdt="F32"), [8, 64], q8.tobytes() + s8.astype("<f4").tobytes())]
    meta, off, data = {}, 0, b""
    for k, dt, shape, b in tensors:
        meta[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off, data = off + len(b), data + b
    m = cbor_encode({"tensors": meta})
    src = os.path.join(tmp, "qf.bpk")
    with open(src, "wb") as f:
        f.write(b"NRUB" + struct.pack("<HI", 1, len(m)) + m + b"\0" * (-(10 + len(m)) % 256) + data)
    want = {"e4": we, "q4": w4, "q8": w8}
    with Mount(src, os.path.join(tmp, "mq"), "as=F32,npy") as mq:
        check(X + "notes" not in os.listxattr(mq), "every QFloat decoded (no note)")
        for k, w in want.items():
            p = os.path.join(mq, k)
            check_file(p, w, "QFloat " + k)
            check_npy(p + ".npy", w, "QFloat %s.npy" % k)
            check(os.getxattr(p, X + "stored_dtype") == b"QFLOAT", "%s: stored_dtype QFLOAT" % k)
    for k, w in want.items():
        r = subprocess.run([BIN, "cat", "--as", "F32", src, k], capture_output=True, timeout=DEADLINE)
        check(r.returncode == 0 and r.stdout == w.astype("<f4").tobytes(), "cat --as F32 QFloat %s: %r" % (k, r.stderr))


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
    r = run([BIN, src, os.path.join(tmp, "mr"), "-o", "as=F8_E4M3"])
    force_unmount(os.path.join(tmp, "mr"))
    check(r.returncode != 0 and "as= takes F32, F16 or BF16" in r.stderr, "as=F8_E4M3 refused: %r" % r.stderr)
    r = run([BIN, src, os.path.join(tmp, "mr"), "-o", "as=F16,rw"])
    force_unmount(os.path.join(tmp, "mr"))
    check(r.returncode != 0 and "as=F16 are read-only views" in r.stderr, "as=F16,rw refused: %r" % r.stderr)


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



def test_decoded_size_past_off_t(tmp):
    """An F4 tensor of 2^61 elements (2^60 bytes, a sparse file on a tmpfs)
    is 2^63 bytes as F32, past what a file can be (off_t): stat and open of
    it failed with a bare EIO, nothing logged. It is shown as stored, with a
    note naming it and why (the rule for what cannot be decoded); as F16
    (2^62 bytes) it is decoded. cat --as F32 and convert --as F32 refuse it
    in one line saying why."""
    with small_tmpfs(os.path.join(tmp, "shm"), "1m") as ok:
        if not ok:
            return
        src = os.path.join(tmp, "shm", "huge.safetensors")
        write_st(src, "huge", "F4", [1 << 61], 1 << 60)
        why = "its decoded size does not fit a file size (2^63 - 1 bytes): 'huge' is 2305843009213693952 elements of 4 bytes"
        with Mount(src, os.path.join(tmp, "m"), "as=F32") as m:
            p = os.path.join(m, "huge")
            try:
                st = os.stat(p)
                check(st.st_size == 1 << 60, "as stored: %d bytes" % st.st_size)
                with open(p, "rb") as f:
                    f.seek((1 << 60) - 8)
                    check(f.read(16) == bytes(8), "its last stored bytes read")
            except OSError as e:
                check(False, "stat/open/read of the tensor: %s" % e)
            check(os.getxattr(p, X + "dtype") == b"F4", "dtype F4: %r" % os.getxattr(p, X + "dtype"))
            notes = os.getxattr(m, X + "notes").decode()
            check("as=F32: 1 F4 tensor shown as stored (%s)" % why in notes, "the note says why: %r" % notes)
        with Mount(src, os.path.join(tmp, "m16"), "as=F16") as m:
            p = os.path.join(m, "huge")
            check(os.stat(p).st_size == 1 << 62 and os.getxattr(p, X + "dtype") == b"F16", "as F16: decoded")
            with open(p, "rb") as f:
                check(f.read(8) == bytes(8), "its first decoded bytes: +0")
        r = subprocess.run([BIN, "cat", "--as", "F32", src, "huge"], capture_output=True, timeout=DEADLINE)
        err = r.stderr.decode()
        check(r.returncode == 1 and r.stdout == b"" and err.count("\n") == 1 and why in err,
              "cat --as F32 refused in one line saying why: %r" % err)
        out = os.path.join(tmp, "out.safetensors")
        r = run([BIN, "convert", "-q", "--as", "F32", src, out])
        check(r.returncode == 1 and r.stderr.count("\n") == 1 and why in r.stderr and not os.path.exists(out),
              "convert --as F32 refused in one line saying why: %r" % r.stderr)

if __name__ == "__main__":
    run_tests("test_decoded", [test_torch_bf16_f16, test_gguf_blocks, test_f8_every_code, test_burn_qfloat, test_f4_and_f6, test_refusals, test_memory_independent_of_size,
                                test_decoded_size_past_off_t],
              "decoded")
