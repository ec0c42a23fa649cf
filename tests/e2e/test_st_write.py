"""SafeTensors out, through real mounts (issue 11): byte-exact round trips of
files the reference writer's layout made, rw in place, new .safetensors
mounts, conversions of Burn's Burnpack and SafeTensors fixtures and of every
torch-made case, refusals naming the tensor, and a write-back that failed
(ENOSPC) finished by `burnstore --finish`. Every output is read back by the
strict reader below (written here from the spec, sharing no code with
burnstore) and compared with what was expected."""
import glob
import hashlib
import json
import os
import shutil
import struct
import subprocess

from bsmount import (BIN, FIX, SOURCE_DIR, Mount, check, finish, force_unmount, is_mounted,
                     key_to_relpath, read_bpk, run, small_tmpfs, tensor_files, tmpdir, xattrs)

GEN = os.path.join(SOURCE_DIR, "tests/support/make_torch_cases.py")
MPF = os.path.join(SOURCE_DIR, "tests/support/make-pth-fixtures.py")
ST_FIXTURES = sorted(glob.glob(os.path.join(FIX, "**/*.safetensors"), recursive=True))
BPK_FIXTURES = sorted(glob.glob(os.path.join(FIX, "**/*.bpk"), recursive=True))
ST_OK = {"BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
         "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
         "F64", "I64", "U64"}
# The reference crate's Dtype enum order (increasing alignment).
RANK = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
        "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
        "F64", "I64", "U64"]
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
        "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
        "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64,
        "U64": 64}


def strict_read(path):
    """{key: (dtype, shape, bytes)}, metadata; asserts what the reference
    reader enforces and what its writer does (padding to 8, data order)."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    assert n % 8 == 0, "header length %d is a multiple of 8" % n
    text = data[8:8 + n].decode("utf-8")
    assert text.rstrip(" ") == text.strip(), "padded with spaces only"

    def no_dups(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), "duplicate keys"
        return dict(pairs)
    header = json.loads(text, object_pairs_hook=no_dups)
    meta = header.pop("__metadata__", None) or {}
    assert all(isinstance(v, str) for v in meta.values())
    out, cursor, prev = {}, 0, None
    for k, d in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        assert set(d) == {"dtype", "shape", "data_offsets"}, k
        s, e = d["data_offsets"]
        assert s == cursor, "%s starts at %d, not %d" % (k, s, cursor)
        numel = 1
        for x in d["shape"]:
            numel *= x
        assert numel * BITS[d["dtype"]] == 8 * (e - s), "%s size" % k
        sortkey = (-RANK.index(d["dtype"]), k.encode())
        assert prev is None or prev <= sortkey, "%s out of the reference writer's order" % k
        prev = sortkey
        cursor = e
        out[k] = (d["dtype"], d["shape"], data[8 + n + s:8 + n + e])
    assert 8 + n + cursor == len(data), "the file ends where the last tensor ends"
    return out, meta


def canonical(tensors, meta=None):
    """The file the reference writer makes of {key: (dtype, shape, bytes)}."""
    items = sorted(tensors.items(), key=lambda kv: (-RANK.index(kv[1][0]), kv[0].encode()))
    parts, off = [], 0
    if meta:
        parts.append('"__metadata__":' + json.dumps(dict(sorted(meta.items())), separators=(",", ":"),
                                                    ensure_ascii=False))
    data = b""
    for k, (dt, shape, raw) in items:
        parts.append(json.dumps(k, ensure_ascii=False) + ':{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}' % (
            dt, json.dumps(shape, separators=(",", ":")), off, off + len(raw)))
        off += len(raw)
        data += raw
    h = ("{" + ",".join(parts) + "}").encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def sample():
    import numpy as np
    t = {
        "model.embed.weight": ("F32", [4, 3], np.arange(12, dtype="<f4").tobytes()),
        "model.layers.0.bias": ("F16", [3], np.array([1, -2, 3], dtype="<f2").tobytes()),
        "model.layers.0.mask": ("BOOL", [2, 2], bytes([1, 0, 0, 1])),
        "model.steps": ("I64", [], struct.pack("<q", 123456789)),
        "model.idx": ("U8", [5], bytes([5, 4, 3, 2, 1])),
        "model.z": ("C64", [2], np.array([1 + 2j, 3 - 4j], dtype="<c8").tobytes()),
        "model.empty": ("F64", [0, 3], b""),
        'we"ird\\name.\u00e9': ("I8", [2], bytes([0x80, 0x7f])),
    }
    return t


def test_byte_exact_round_trips(tmp):
    src = os.path.join(tmp, "canon.safetensors")
    tensors = sample()
    for meta in ({"format": "pt"}, None, {"b": "2", "a": "line\nbreak"}):
        raw = canonical(tensors, meta)
        open(src, "wb").write(raw)
        out = os.path.join(tmp, "out.safetensors")
        with Mount(src, os.path.join(tmp, "m1"), opts="output=" + out) as m:
            check(xattrs(m).get("user.burnstore.format") == "safetensors", "source format")
            u = m.unmount()
        check(u.returncode == 0, "conversion to .safetensors: %s" % u.stderr)
        got = open(out, "rb").read() if os.path.exists(out) else b""
        check(got == raw, "meta %r: st -> mount -> st is the same file (%d vs %d bytes)" % (meta, len(got), len(raw)))
        # rw in place, nothing changed: the file is rewritten identical.
        with Mount(src, os.path.join(tmp, "m2"), opts="rw") as m:
            u = m.unmount()
        check(u.returncode == 0, "rw in place: %s" % u.stderr)
        check(open(src, "rb").read() == raw, "meta %r: rw in place keeps the file byte for byte" % meta)
    # Burn's SafeTensors fixtures: tensors and metadata survive; the file is
    # the same when it was written in the reference order.
    for fx in ST_FIXTURES:
        out = os.path.join(tmp, "fx.safetensors")
        with Mount(fx, os.path.join(tmp, "m3"), opts="output=" + out) as m:
            u = m.unmount()
        check(u.returncode == 0, "%s: conversion: %s" % (fx, u.stderr))
        try:
            a, am = strict_read(out)
        except (AssertionError, ValueError, OSError) as e:
            check(False, "%s: output not valid: %s" % (fx, e))
            continue
        data = open(fx, "rb").read()
        n = struct.unpack("<Q", data[:8])[0]
        hdr = json.loads(data[8:8 + n])
        bm = hdr.pop("__metadata__", None) or {}
        b = {k: (d["dtype"], d["shape"], data[8 + n + d["data_offsets"][0]:8 + n + d["data_offsets"][1]])
             for k, d in hdr.items()}
        check(a == b and am == bm, "%s: tensors and metadata round trip" % fx)
        check(open(out, "rb").read() == canonical(b, bm), "%s: output is the canonical file" % fx)


def test_rw_in_place_and_new_files(tmp):
    import numpy as np
    src = os.path.join(tmp, "edit.safetensors")
    tensors = sample()
    open(src, "wb").write(canonical(tensors, {"format": "pt"}))
    with Mount(src, os.path.join(tmp, "m"), opts="rw") as m:
        p = os.path.join(m, key_to_relpath("model.embed.weight"))
        with open(p, "r+b") as f:
            f.write(np.array([9.5], dtype="<f4").tobytes())
        os.mkdir(os.path.join(m, "extra"))
        q = os.path.join(m, "extra", "w")
        with open(q, "wb") as f:
            f.write(np.arange(6, dtype="<i4").tobytes())
        os.setxattr(q, "user.burnstore.dtype", b"I32")
        os.setxattr(q, "user.burnstore.shape", b"[2,3]")
        os.setxattr(m, "user.burnstore.meta.note", b"edited")
        os.remove(os.path.join(m, key_to_relpath("model.idx")))
        u = m.unmount()
    check(u.returncode == 0, "rw write-back: %s" % u.stderr)
    got, meta = strict_read(src)
    want = dict(tensors)
    del want["model.idx"]
    e = bytearray(want["model.embed.weight"][2])
    e[0:4] = np.array([9.5], dtype="<f4").tobytes()
    want["model.embed.weight"] = ("F32", [4, 3], bytes(e))
    want["extra.w"] = ("I32", [2, 3], np.arange(6, dtype="<i4").tobytes())
    check(got == want, "rw: the edited tensors: %s" % sorted(set(got) ^ set(want)))
    check(meta == {"format": "pt", "note": "edited"}, "rw: metadata %r" % meta)
    check(open(src, "rb").read() == canonical(want, meta), "rw: canonical output")
    check(not glob.glob(os.path.join(tmp, ".edit.safetensors.*")), "no staging or temp left")

    # A new .safetensors path: an empty writable mount written as SafeTensors.
    new = os.path.join(tmp, "new.safetensors")
    with Mount(new, os.path.join(tmp, "n")) as m:
        with open(os.path.join(m, "a"), "wb") as f:
            f.write(np.ones(4, dtype="<f8").tobytes())
        os.setxattr(os.path.join(m, "a"), "user.burnstore.dtype", b"F64")
        with open(os.path.join(m, "blob"), "wb") as f:
            f.write(b"xyz")
        u = m.unmount()
    check(u.returncode == 0, "new .safetensors: %s" % u.stderr)
    got, meta = strict_read(new)
    check(got == {"a": ("F64", [4], np.ones(4, dtype="<f8").tobytes()), "blob": ("U8", [3], b"xyz")},
          "new .safetensors: %r" % got)
    check(meta == {}, "a new file carries no default metadata: %r" % meta)
    r = run(["python3", "-c", "import sys"])  # (keeps the harness honest about PATH python)
    check(r.returncode == 0, "python3 runs")


def test_burnpack_to_safetensors(tmp):
    for fx in BPK_FIXTURES:
        want, wmeta = read_bpk(fx)
        out = os.path.join(tmp, os.path.basename(fx) + ".safetensors")
        ok = all(v[0] in ST_OK for v in want.values())
        mnt = os.path.join(tmp, "b")
        if not ok:
            r = run([BIN, fx, mnt, "-o", "output=" + out])
            check(r.returncode != 0 and "safetensors" in r.stderr, "%s: refused: %r" % (fx, r.stderr))
            force_unmount(mnt)
            continue
        with Mount(fx, mnt, opts="output=" + out) as m:
            u = m.unmount()
        check(u.returncode == 0, "%s -> .safetensors: %s" % (fx, u.stderr))
        got, meta = strict_read(out)
        check({k: (v[0], v[1], v[2]) for k, v in want.items()} == got, "%s: tensors equal" % fx)
        exp = dict(wmeta)
        if exp.get("format") == "burnpack":
            exp["format"] = "pt"
        check(meta == exp, "%s: metadata %r, want %r" % (fx, meta, exp))
        # ... and back to Burnpack: the same tensors again.
        back = os.path.join(tmp, "back.bpk")
        with Mount(out, mnt, opts="output=" + back) as m:
            u = m.unmount()
        check(u.returncode == 0, "back to .bpk: %s" % u.stderr)
        b, _ = read_bpk(back)
        check({k: v[:3] for k, v in b.items()} == {k: v[:3] for k, v in want.items()}, "%s: bpk -> st -> bpk" % fx)


def test_torch_cases(tmp):
    out = os.path.join(tmp, "cases")
    os.makedirs(out)
    r = subprocess.run(["/usr/bin/python3", GEN, out, MPF], capture_output=True, text=True, timeout=600)
    if not check(r.returncode == 0, "the torch case generator ran: %s" % r.stderr[-2000:]):
        return
    cases = sorted(f[:-4] for f in os.listdir(out) if f.endswith(".pth"))
    mnt = os.path.join(tmp, "t")
    converted = 0
    for case in cases:
        path = os.path.join(out, case + ".pth")
        expect = {}
        if os.path.exists(os.path.join(out, case + ".expect.json")):
            expect = json.load(open(os.path.join(out, case + ".expect.json")))
        if "error" in expect:
            continue
        man = json.load(open(os.path.join(out, case + ".json")))
        st = os.path.join(tmp, case + ".safetensors")
        bad = sorted(k for k, v in man.items() if v["dtype"] not in ST_OK)
        if bad:
            r = run([BIN, path, mnt, "-o", "output=" + st])
            check(r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
                  and "cannot be written as safetensors" in r.stderr and "'" in r.stderr,
                  "%s: a dtype SafeTensors lacks is refused, naming the tensor: %r" % (case, r.stderr))
            check(not is_mounted(mnt) and not os.path.exists(st), "%s: nothing mounted or written" % case)
            force_unmount(mnt)
            continue
        try:
            with Mount(path, mnt, opts="output=" + st) as m:
                u = m.unmount()
        except RuntimeError as e:
            check(False, "%s: %s" % (case, e))
            continue
        check(u.returncode == 0, "%s: conversion: %s" % (case, u.stderr))
        try:
            got, meta = strict_read(st)
        except (AssertionError, ValueError, OSError) as e:
            check(False, "%s: output not valid SafeTensors: %s" % (case, e))
            continue
        check(set(got) == set(man), "%s: keys %s" % (case, sorted(set(got) ^ set(man))[:6]))
        for k, m in man.items():
            if k not in got:
                continue
            dt, shape, raw = got[k]
            check(dt == m["dtype"] and shape == m["shape"], "%s: %s dtype/shape %s %s" % (case, k, dt, shape))
            check(hashlib.sha256(raw).hexdigest() == m["sha256"], "%s: %s bytes equal torch's" % (case, k))
        converted += 1
    check(converted >= 10, "converted %d torch cases" % converted)
    # torch reads every converted file from its header and bytes, equal to
    # what torch itself wrote for the case (the manifest's .bin files).
    r = subprocess.run(["/usr/bin/python3", "-c", TORCH_READ, tmp, out], capture_output=True, text=True,
                       timeout=600)
    check(r.returncode == 0 and int(r.stdout.split()[-1] or 0) >= 10,
          "torch reads the converted files back equal: %s %s" % (r.stdout[-300:], r.stderr[-1500:]))


TORCH_READ = r"""
import glob, json, os, struct, sys, torch
tmp, cases = sys.argv[1], sys.argv[2]
DT = {'F32': torch.float32, 'F64': torch.float64, 'F16': torch.float16, 'BF16': torch.bfloat16,
      'I64': torch.int64, 'I32': torch.int32, 'I16': torch.int16, 'I8': torch.int8, 'U8': torch.uint8,
      'BOOL': torch.bool, 'C64': torch.complex64}
def tensor(raw, dt, shape):
    b = bytearray(raw)
    t = torch.frombuffer(b, dtype=DT[dt]) if b else torch.empty(0, dtype=DT[dt])
    return t.reshape(shape)
done = 0
for st in sorted(glob.glob(os.path.join(tmp, '*.safetensors'))):
    case = os.path.basename(st)[:-len('.safetensors')]
    man = json.load(open(os.path.join(cases, case + '.json')))
    data = open(st, 'rb').read()
    n = struct.unpack('<Q', data[:8])[0]
    h = json.loads(data[8:8 + n]); h.pop('__metadata__', None)
    for k, d in h.items():
        s, e = d['data_offsets']
        t = tensor(data[8 + n + s:8 + n + e], d['dtype'], d['shape'])
        m = man[k]
        ref = tensor(open(os.path.join(cases, m['bin']), 'rb').read(), m['dtype'], m['shape'])
        assert t.dtype == ref.dtype and t.shape == ref.shape, k
        assert torch.equal(t, ref) or (t.is_floating_point() and torch.equal(t.isnan(), ref.isnan())
                                       and torch.equal(t.nan_to_num(), ref.nan_to_num())), (case, k)
    done += 1
print(done)
"""


def test_refusals_and_finish(tmp):
    # A dtype set after the mount that SafeTensors lacks: the write-back
    # fails naming the tensor, the output is not created, staging is kept.
    new = os.path.join(tmp, "bad.safetensors")
    stg = os.path.join(tmp, "stg")
    os.makedirs(stg)
    with Mount(new, os.path.join(tmp, "r"), opts="staging=" + stg) as m:
        with open(os.path.join(m, "w"), "wb") as f:
            f.write(bytes(8))
        os.setxattr(os.path.join(m, "w"), "user.burnstore.dtype", b"FLEX32")
        u = m.unmount()
    check(u.returncode != 0 and "'w'" in u.stderr and "F32" in u.stderr,
          "write-back refuses FLEX32, naming the tensor: %r" % u.stderr)
    check(not os.path.exists(new), "no output written")
    left = os.listdir(stg)
    check(len(left) == 1, "staging kept: %r" % left)
    for d in left:
        shutil.rmtree(os.path.join(stg, d), ignore_errors=True)

    # ENOSPC: the write-back fails, the INDEX (format safetensors) stays, and
    # --finish completes it once there is room.
    small = os.path.join(tmp, "small")
    with small_tmpfs(small, "64k") as ok:
        if not ok:
            return
        out = os.path.join(small, "big.safetensors")
        with Mount(out, os.path.join(tmp, "f"), opts="staging=" + stg) as m:
            with open(os.path.join(m, "big"), "wb") as f:
                f.write(bytes(range(256)) * 1024)  # 256 KiB > 64 KiB
            os.setxattr(os.path.join(m, "big"), "user.burnstore.dtype", b"U8")
            u = m.unmount()
        check(u.returncode != 0 and "no space" in u.stderr.lower(),
              "write-back fails on ENOSPC: %r" % u.stderr)
        check(not os.path.exists(out), "no partial output")
        left = os.listdir(stg)
        check(len(left) == 1, "staging kept: %r" % left)
        if left:
            idx = open(os.path.join(stg, left[0], "INDEX")).read()
            check("safetensors" in idx, "the INDEX records the format")
            run(["mount", "-o", "remount,size=4m", small])
            r = run([BIN, "--finish", os.path.join(stg, left[0])])
            check(r.returncode == 0, "--finish: %s" % r.stderr)
            got, _ = strict_read(out) if os.path.exists(out) else ({}, {})
            check(got == {"big": ("U8", [262144], bytes(range(256)) * 1024)}, "--finish wrote the SafeTensors file")


def main():
    with tmpdir("stw") as tmp:
        for t in (test_byte_exact_round_trips, test_rw_in_place_and_new_files, test_burnpack_to_safetensors,
                  test_torch_cases, test_refusals_and_finish):
            d = os.path.join(tmp, t.__name__)
            os.makedirs(d)
            try:
                t(d)
            except Exception as e:  # a crash in one test is a failure, not an abort
                check(False, "%s raised %r" % (t.__name__, e))
    finish("test_st_write")


if __name__ == "__main__":
    main()
