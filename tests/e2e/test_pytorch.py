"""PyTorch checkpoints through real mounts, against real torch: every case
that tests/support/make_torch_cases.py writes with torch (the shared
make-pth-fixtures.py cases, then ours: protocols 4/5, views of every kind,
legacy, optimizer state, re-zipped, malicious, whole module) is mounted and
every file compared with the manifest torch wrote (sha256 of the contiguous
bytes, dtype, shape); then Burn's own .pt/.tar fixtures against the values
their tests assert."""
import hashlib
import json
import os
import struct
import subprocess
import sys

from bsmount import (read_bpk, BIN, FIX, SOURCE_DIR, Mount, check, finish, force_unmount, is_mounted,
                     key_to_relpath, run, tensor_files, tmpdir, xattrs)

GEN = os.path.join(SOURCE_DIR, "tests/support/make_torch_cases.py")
MPF = os.path.join(SOURCE_DIR, "tests/support/make-pth-fixtures.py")
RD = os.path.join(FIX, "burn-store/src/pytorch/tests/reader/test_data")
BPK_OK = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"}


def test_torch_cases(tmp):
    out = os.path.join(tmp, "cases")
    os.makedirs(out)
    r = subprocess.run(["/usr/bin/python3", GEN, out, MPF], capture_output=True, text=True, timeout=600)
    if not check(r.returncode == 0, "the torch case generator ran (needs python3-torch): %s" % r.stderr[-2000:]):
        return
    cases = sorted(f[:-4] for f in os.listdir(out) if f.endswith(".pth"))
    check(len(cases) >= 15, "generated %d cases" % len(cases))
    mnt = os.path.join(tmp, "m")
    for case in cases:
        path = os.path.join(out, case + ".pth")
        expect = {}
        if os.path.exists(os.path.join(out, case + ".expect.json")):
            expect = json.load(open(os.path.join(out, case + ".expect.json")))
        if "error" in expect:
            r = run([BIN, path, mnt])
            check(r.returncode != 0 and expect["error"].lower() in r.stderr.lower()
                  and len(r.stderr.strip().splitlines()) == 1,
                  "%s: refused with %r: %r" % (case, expect["error"], r.stderr))
            check(not is_mounted(mnt), "%s: nothing mounted" % case)
            force_unmount(mnt)
            continue
        man = json.load(open(os.path.join(out, case + ".json")))
        try:
            with Mount(path, mnt):
                files = tensor_files(mnt)
                want = {key_to_relpath(k): k for k in man}
                check(set(files) == set(want), "%s: files %s != keys %s" % (case, sorted(files)[:6], sorted(want)[:6]))
                for rel, key in want.items():
                    if rel not in files:
                        continue
                    m = man[key]
                    data = open(files[rel], "rb").read()
                    check(hashlib.sha256(data).hexdigest() == m["sha256"], "%s: %s bytes differ from torch's" % (case, key))
                    x = xattrs(files[rel])
                    check(x.get("user.burnstore.dtype") == m["dtype"], "%s: %s dtype %r != %r" % (case, key, x.get("user.burnstore.dtype"), m["dtype"]))
                    check(json.loads(x.get("user.burnstore.shape", "null")) == m["shape"], "%s: %s shape" % (case, key))
                    check(os.path.getsize(files[rel]) == len(data), "%s: %s st_size" % (case, key))
                root = xattrs(mnt)
                check(root.get("user.burnstore.format") == "pytorch", "%s: format xattr" % case)
                if "values" in expect:
                    vals = json.loads(root.get("user.burnstore.values", "{}"))
                    for k, v in expect["values"].items():
                        check(vals.get(k) == v, "%s: value %s = %r, want %r" % (case, k, vals.get(k), v))
                if "note" in expect:
                    check(expect["note"] in root.get("user.burnstore.notes", ""), "%s: notes mention %r: %r" % (
                        case, expect["note"], root.get("user.burnstore.notes")))
        except RuntimeError as e:
            check(False, "%s: %s" % (case, e))
        # Converted to Burnpack (output=), strided views included: the same bytes.
        bpk = os.path.join(tmp, case + ".bpk")
        try:
            if all(v["dtype"] in BPK_OK for v in man.values()):
                with Mount(path, mnt, opts="output=" + bpk) as m:
                    u = m.unmount()
                check(u.returncode == 0, "%s: conversion to Burnpack: %s" % (case, u.stderr))
                got = read_bpk(bpk)[0] if os.path.exists(bpk) else {}
                for key, m in man.items():
                    g = got.get(key)
                    check(g is not None and g[0] == m["dtype"] and g[1] == m["shape"]
                          and hashlib.sha256(g[2]).hexdigest() == m["sha256"],
                          "%s: %s converted to Burnpack differs" % (case, key))
            else:
                try:
                    r = run([BIN, path, mnt, "-o", "output=" + bpk], timeout=30)
                finally:
                    force_unmount(mnt)
                check(r.returncode == 1 and "Burnpack has no dtype" in r.stderr and not os.path.exists(bpk),
                      "%s: a dtype Burnpack lacks is refused at mount time: %r" % (case, r.stderr))
        except RuntimeError as e:
            check(False, "%s: conversion: %s" % (case, e))
        if "absent" in expect:
            check(not os.path.exists(expect["absent"]), "%s: %s must not exist (pickle code ran?)" % (case, expect["absent"]))


def f32(b):
    return list(struct.unpack("<%df" % (len(b) // 4), b))


def test_burn_fixtures(tmp):
    """Burn's reader fixtures, against the values its tests assert (MANIFEST.md)."""
    mnt = os.path.join(tmp, "bf")
    cases = {
        "float32.pt": {"tensor": ("F32", [4], lambda b: f32(b) == [1.0, 2.5, struct.unpack("<f", struct.pack("<f", -3.7))[0], 0.0])},
        "uint8.pt": {"tensor": ("U8", [4], lambda b: list(b) == [0, 128, 255, 42])},
        "int8.pt": {"tensor": ("I8", [4], lambda b: list(struct.unpack("<4b", b)) == [127, -128, 0, 50])},
        "bool.pt": {"tensor": ("BOOL", [5], lambda b: list(b) == [1, 0, 1, 1, 0])},
        "bfloat16.pt": {"tensor": ("BF16", [3], lambda b: [struct.unpack("<f", b"\0\0" + b[i:i + 2])[0] for i in (0, 2, 4)] == [1.5, -2.5, 3.5])},
        "scalar.pt": {"tensor": ("F32", [], lambda b: f32(b) == [42.0])},
        "empty.pt": {"tensor": ("F32", [0], lambda b: b == b"")},
        "tensor_2d.pt": {"tensor": ("F32", [3, 2], lambda b: f32(b) == [1, 2, 3, 4, 5, 6])},
        "legacy_with_offsets.pt": {"tensor2": ("F32", [5], lambda b: [round(v, 5) for v in f32(b)] == [2.0, 2.1, 2.2, 2.3, 2.4])},
        "legacy_uncloned_views.pt": {"tensor1": ("F32", [10], lambda b: f32(b) == list(range(10, 20))),
                                     "tensor2": ("F32", [10], lambda b: f32(b) == list(range(50, 60)))},
        "tar_2d_tensor.tar": {"matrix": ("F32", [3, 4], lambda b: f32(b) == list(range(1, 13)))},
        "tar_int64.tar": {"tensor": ("I64", [4], lambda b: list(struct.unpack("<4q", b)) == [100, -200, 300, 0])},
        "parameter.pt": {"param": ("F32", [3, 3], lambda b: len(b) == 36)},
        "checkpoint.pt": {"model_state_dict.fc1.weight": ("F32", [10, 5], lambda b: len(b) == 200),
                          "optimizer_state_dict.state.0.momentum_buffer": ("F32", [10, 5], lambda b: len(b) == 200)},
    }
    for name, tensors in cases.items():
        path = os.path.join(RD, name)
        try:
            with Mount(path, mnt):
                for key, (dt, shape, ok) in tensors.items():
                    p = os.path.join(mnt, key_to_relpath(key))
                    if not check(os.path.exists(p), "%s: %s exists" % (name, key)):
                        continue
                    x = xattrs(p)
                    check(x.get("user.burnstore.dtype") == dt, "%s: %s dtype %r" % (name, key, x.get("user.burnstore.dtype")))
                    check(json.loads(x["user.burnstore.shape"]) == shape, "%s: %s shape %r" % (name, key, x["user.burnstore.shape"]))
                    check(ok(open(p, "rb").read()), "%s: %s values" % (name, key))
                if name == "checkpoint.pt":
                    vals = json.loads(xattrs(mnt).get("user.burnstore.values", "{}"))
                    check(vals.get("epoch") == 42 and abs(vals.get("loss", 0) - 0.123) < 1e-9, "checkpoint values %r" % vals)
        except RuntimeError as e:
            check(False, "%s: %s" % (name, e))
    # Every .pt/.tar fixture mounts (or, broken.pt, is refused cleanly).
    for d, _, files in os.walk(FIX):
        for f in files:
            if not f.endswith((".pt", ".tar")):
                continue
            path = os.path.join(d, f)
            if f == "broken.pt":
                r = run([BIN, path, mnt])
                check(r.returncode == 1 and "broken.pt" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
                      "broken.pt refused with one line: %r" % r.stderr)
                force_unmount(mnt)
                continue
            try:
                with Mount(path, mnt):
                    check(len(tensor_files(mnt)) > 0, "%s has tensor files" % f)
            except RuntimeError as e:
                check(False, "%s: %s" % (f, e))


if __name__ == "__main__":
    with tmpdir("pth") as tmp:
        for t in (test_burn_fixtures, test_torch_cases):
            print("--", t.__name__, flush=True)
            try:
                t(tmp)
            except Exception as e:
                check(False, "%s raised %r" % (t.__name__, e))
    finish("test_pytorch")
