"""PyTorch out (issue 21): every fixture converted to .pth and loaded by real
torch with torch.load(weights_only=True): same keys in the same order, dtypes,
shapes and bytes as burnstore reads the source (and as torch reads it, for
flat torch-made sources); every member's data 64-byte aligned as torch's own
writer aligns it; the .pth outputs of mounts (output=, a new model.pth path);
dtypes torch cannot store refused naming the tensor; a .pth never rewritten
in place. (torch 1.13 here: its torch.load has no mmap=, so the alignment is
checked on the bytes.)"""
import collections
import glob
import json
import os
import pickle
import pickletools
import signal
import struct
import subprocess
import time
import zipfile

from bsmount import (BIN, FIX, Mount, check, daemon_pid, force_unmount, is_mounted, run, run_tests, wait_gone,
                     small_tmpfs)

import torch

FIXTURES = os.path.dirname(FIX)
DT = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
      "BOOL": torch.bool, "C64": torch.complex64, "C128": torch.complex128}
# The dtypes torch 2.x saves as an UntypedStorage rebuilt by _rebuild_tensor_v3
# with the torch dtype as 7th argument (pytorch torch/storage.py _new_dtypes,
# torch/_tensor.py _reduce_ex_internal, torch/serialization.py _save's
# persistent_id): burnstore's name -> torch's. torch 1.13 has none of them.
NEW_DT = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
          "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu", "U16": "uint16", "U32": "uint32",
          "U64": "uint64", "F4": "float4_e2m1fn_x2"}
# torch/storage.py _dtype_to_storage_type_map, for the dtypes 1.13 has
STORAGE = {"F64": "DoubleStorage", "F32": "FloatStorage", "F16": "HalfStorage", "BF16": "BFloat16Storage",
           "I64": "LongStorage", "I32": "IntStorage", "I16": "ShortStorage", "I8": "CharStorage",
           "U8": "ByteStorage", "BOOL": "BoolStorage", "C64": "ComplexFloatStorage",
           "C128": "ComplexDoubleStorage"}
# The opcodes torch's weights_only unpickler (torch/_weights_only_unpickler.py
# Unpickler.load) handles; any other one is refused there.
WEIGHTS_ONLY_OPS = {"PROTO", "STOP", "GLOBAL", "NEWOBJ", "REDUCE", "BUILD", "APPEND", "APPENDS", "SETITEM",
                    "SETITEMS", "MARK", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWFALSE", "NEWTRUE",
                    "EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "BINPERSID", "BININT", "BININT1",
                    "BININT2", "BINFLOAT", "BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT", "BINUNICODE",
                    "SHORT_BINSTRING", "LONG1", "BINBYTES", "SHORT_BINBYTES"}


class Glob(collections.namedtuple("Glob", "module name")):
    """A GLOBAL the pickle names, not imported."""


class Rebuilt(collections.namedtuple("Rebuilt", "func args")):
    """A call of a torch._utils rebuild function, not made."""


class TorchNames(pickle.Unpickler):
    """data.pkl read without torch: the globals torch's weights_only
    unpickler allows (those a state dict needs) come back as names, a
    rebuild call as its function and arguments, a persistent id as itself;
    any other global is an error."""
    def find_class(self, module, name):
        ok = ((module, name) in (("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"),
                                 ("torch._utils", "_rebuild_tensor_v3"), ("torch.storage", "UntypedStorage"))
              or (module == "torch" and (name in STORAGE.values() or name in NEW_DT.values())))
        if not ok:
            raise pickle.UnpicklingError("global %s.%s" % (module, name))
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch._utils":
            return lambda *a: Rebuilt(name, a)
        return Glob(module, name)

    def persistent_load(self, pid):
        return ("pid",) + tuple(pid)


def pickled(path):
    """(the value of data.pkl read by TorchNames, the set of its opcodes)."""
    with zipfile.ZipFile(path) as z:
        pkl = z.read([n for n in z.namelist() if n.endswith("/data.pkl")][0])
    import io
    return TorchNames(io.BytesIO(pkl)).load(), {o.name for o, _, _ in pickletools.genops(pkl)}


def rebuild_as_torch(name, r, dtype, shape, index):
    """Is r, the pickled tensor `name` (index-th storage), exactly the call
    torch.save writes for a contiguous tensor of this dtype and shape?"""
    stride, s = [], 1
    for d in reversed(shape):
        stride.insert(0, s)
        s *= max(d, 1)
    n = 1
    for d in shape:
        n *= d
    nbytes = n * {"U16": 2, "U32": 4, "U64": 8}.get(dtype, 1)
    want_tail = (0, tuple(shape), tuple(stride), False, collections.OrderedDict())
    if dtype in NEW_DT:
        want = Rebuilt("_rebuild_tensor_v3", (("pid", "storage", Glob("torch.storage", "UntypedStorage"), str(index),
                                               "cpu", nbytes),) + want_tail + (Glob("torch", NEW_DT[dtype]),))
    else:
        want = Rebuilt("_rebuild_tensor_v2", (("pid", "storage", Glob("torch", STORAGE[dtype]), str(index), "cpu", n),)
                       + want_tail)
    return check(r == want, "%s: pickled as torch.save pickles a %s tensor: %r, want %r" % (name, dtype, r, want))


def write_st(path, ts, meta=None):
    """A SafeTensors file of {key: (dtype, shape, bytes)}."""
    header, off, blob = ({"__metadata__": meta} if meta else {}), 0, []
    for k, (dt, shape, b) in ts.items():
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blob.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blob))


def raw(t):
    """A tensor's row-major little-endian bytes."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def aligned(path):
    """Every member's data offset (from its local header) is a multiple of 64."""
    bad = []
    with open(path, "rb") as f, zipfile.ZipFile(path) as z:
        for i in z.infolist():
            f.seek(i.header_offset)
            h = f.read(30)
            nlen, xlen = struct.unpack("<HH", h[26:30])
            if (i.header_offset + 30 + nlen + xlen) % 64:
                bad.append(i.filename)
        check(z.testzip() is None, "%s: every CRC right" % path)
    return bad


def ls(path):
    r = run([BIN, "ls", "--json", path])
    return json.loads(r.stdout) if r.returncode == 0 else None


def cat_bytes(path, key):
    r = subprocess.run([BIN, "cat", path, key], capture_output=True, timeout=60)
    return r.stdout if r.returncode == 0 else None


def compare(name, out, want, src=None):
    """torch loads `out` with weights_only=True and finds exactly `want`
    (list of ls entries); bytes equal burnstore's reading of src."""
    try:
        sd = torch.load(out, weights_only=True)
    except Exception as e:
        check(False, "%s: torch.load(weights_only=True) fails: %r" % (name, e))
        return False
    check(type(sd).__name__ == "OrderedDict", "%s: a state dict" % name)
    check(list(sd.keys()) == [w["key"] for w in want], "%s: keys in the source's order" % name)
    for w in want:
        t = sd.get(w["key"])
        if t is None:
            continue
        check(t.dtype == DT[w["dtype"]] and list(t.shape) == w["shape"],
              "%s: %s is %s %s, torch has %s %s" % (name, w["key"], w["dtype"], w["shape"], t.dtype,
                                                   list(t.shape)))
        if src is not None:
            check(raw(t) == cat_bytes(src, w["key"]), "%s: %s bytes equal the source's" % (name, w["key"]))
    bad = aligned(out)
    check(not bad, "%s: member data 64-byte aligned: %s" % (name, bad))
    return True


def test_every_fixture(tmp):
    srcs = sorted(p for p in glob.glob(os.path.join(FIXTURES, "**/*"), recursive=True)
                  if os.path.isfile(p) and p.rsplit(".", 1)[-1] in ("pt", "pth", "bin", "safetensors",
                                                                     "bpk", "tar", "gguf"))
    converted = refused = 0
    for i, src in enumerate(srcs):
        want = ls(src)
        if want is None:  # a fixture burnstore refuses to read (hostile cases)
            continue
        name = os.path.relpath(src, FIXTURES)
        out = os.path.join(tmp, "f%d.pth" % i)
        r = run([BIN, "convert", "-q", src, out])
        lacking = [w["key"] for w in want if w["dtype"] not in DT and w["dtype"] not in NEW_DT]
        if lacking:
            check(r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
                  and "cannot be written as pytorch" in r.stderr
                  and any("'%s'" % k in r.stderr for k in lacking) and not os.path.exists(out),
                  "%s: a dtype torch cannot store is refused naming the tensor: %r" % (name, r.stderr))
            refused += 1
            continue
        if not check(r.returncode == 0, "%s: convert: %r" % (name, r.stderr)):
            continue
        if any(w["dtype"] in NEW_DT for w in want):  # torch 1.13 cannot load it; its pickle is torch 2's
            sd, _ = pickled(out)
            for i, w in enumerate(want):
                rebuild_as_torch(w["key"], sd.get(w["key"]), w["dtype"], w["shape"], i)
            converted += 1
        elif compare(name, out, want, src):
            converted += 1
        # A flat state dict torch wrote: torch reads both files to equal tensors.
        if src.endswith((".pt", ".pth")):
            try:
                orig = torch.load(src, weights_only=True)
            except Exception:
                orig = None
            if isinstance(orig, dict) and orig and all(torch.is_tensor(v) for v in orig.values()):
                back = torch.load(out, weights_only=True)
                check(list(back) == list(orig) and all(back[k].dtype == orig[k].dtype and raw(back[k]) == raw(orig[k])
                                                       for k in orig),
                      "%s: torch sees the same tensors in both files" % name)
        # The written file reads back through burnstore as the same checkpoint.
        r = run([BIN, "diff", src, out])
        check(r.returncode == 0, "%s: burnstore diff with its .pth: %r" % (name, r.stdout[-300:]))
    check(converted >= 40, "converted %d fixtures (refused %d)" % (converted, refused))


def test_torch_dtypes_and_views(tmp):
    """Every dtype torch 1.13 saves, views, shared storages, a 0-d and an
    empty tensor: torch's own file through burnstore and back."""
    src = os.path.join(tmp, "dtypes.pt")
    sd = {}
    for n, dt in DT.items():
        x = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4)
        sd["t." + n] = (x % 2 == 1) if dt == torch.bool else (x * 1.5 - 7).to(dt)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    sd["view.t"] = base.t()
    sd["view.slice"] = base[:, ::2]
    sd["view.expand"] = torch.arange(3.0).reshape(3, 1).expand(3, 4)
    sd["shared.a"] = base
    sd["shared.b"] = base[1]
    sd["scalar"] = torch.tensor(5, dtype=torch.int64)
    sd["empty"] = torch.zeros(0, 3)
    torch.save(sd, src)
    out = os.path.join(tmp, "dtypes-out.pth")
    r = run([BIN, "convert", "-q", src, out])
    if not check(r.returncode == 0, "convert: %r" % r.stderr):
        return
    back = torch.load(out, weights_only=True)
    check(list(back) == list(sd), "keys in order")
    for k, v in sd.items():
        check(back[k].dtype == v.dtype and torch.equal(back[k], v), "%s: torch sees the same tensor" % k)
        check(back[k].is_contiguous(), "%s: written contiguous" % k)
    check(not aligned(out), "aligned")
    # the prefix torch.save would use for this path
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
    check(names[0] == "dtypes-out/data.pkl" and "dtypes-out/byteorder" in names
          and names[-1] == "dtypes-out/version", "records as torch.save writes them: %s" % names[:3])


def test_mount_outputs(tmp):
    """output=x.pth of a writable mount, and a new model.pth path."""
    st = os.path.join(tmp, "in.safetensors")
    write_st(st, {"a.w": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
                           "a.b": ("I64", [2], struct.pack("<2q", -1, 7))})
    out = os.path.join(tmp, "out.pth")
    mnt = os.path.join(tmp, "m")
    with Mount(st, mnt, opts="output=" + out) as m:
        with open(os.path.join(mnt, "a", "w"), "r+b") as f:
            f.write(struct.pack("<f", 9))
        with open(os.path.join(mnt, "extra"), "wb") as f:
            f.write(struct.pack("<3h", 1, 2, 3))
        os.setxattr(os.path.join(mnt, "extra"), "user.burnstore.dtype", b"I16")
        u = m.unmount()
    check(u.returncode == 0, "output=out.pth: %s" % u.stderr)
    if os.path.exists(out):
        sd = torch.load(out, weights_only=True)
        check(list(sd) == ["a.w", "a.b", "extra"], "keys: %s" % list(sd))
        check(torch.equal(sd["a.w"], torch.tensor([[9.0, 2], [3, 4]])), "the edit is in the file")
        check(torch.equal(sd["a.b"], torch.tensor([-1, 7])), "unchanged tensor kept")
        check(torch.equal(sd["extra"], torch.tensor([1, 2, 3], dtype=torch.int16)), "new tensor")
        check(not aligned(out), "aligned")
    new = os.path.join(tmp, "model.pth")
    with Mount(new, os.path.join(tmp, "n"), opts="rw") as m:
        os.makedirs(os.path.join(m, "enc"))
        p = os.path.join(m, "enc", "w")
        with open(p, "wb") as f:
            f.write(struct.pack("<6e", 1, 2, 3, 4, 5, 6))
        os.setxattr(p, "user.burnstore.dtype", b"F16")
        os.setxattr(p, "user.burnstore.shape", b"[2,3]")
        u = m.unmount()
    check(u.returncode == 0, "new model.pth: %s" % u.stderr)
    if os.path.exists(new):
        sd = torch.load(new, weights_only=True)
        check(list(sd) == ["enc.w"] and torch.equal(sd["enc.w"], torch.arange(1, 7, dtype=torch.float16).reshape(2, 3)),
              "a new .pth mount is a state dict torch loads: %s" % sd)


def test_refusals(tmp):
    st = os.path.join(tmp, "f6.safetensors")
    write_st(st, {"ok": ("F32", [1], b"\0" * 4), "q.f6": ("F6_E2M3", [4], b"\1" * 3)})
    out = os.path.join(tmp, "f6.pth")
    mnt = os.path.join(tmp, "m")
    os.makedirs(mnt)
    r = run([BIN, st, mnt, "-o", "output=" + out])
    mounted = is_mounted(mnt)
    force_unmount(mnt)
    check(r.returncode == 1 and not mounted and len(r.stderr.strip().splitlines()) == 1
          and "'q.f6'" in r.stderr and "F6_E2M3" in r.stderr and "exclude=" in r.stderr,
          "a 6-bit float tensor is refused at mount time, naming it: %r" % r.stderr)
    check(not os.path.exists(out), "nothing written")
    r = run([BIN, "convert", "-q", "-o", r"exclude=\.f6$", st, out])
    check(r.returncode == 0 and list(torch.load(out, weights_only=True)) == ["ok"],
          "leaving it out converts the rest: %r" % r.stderr)
    # File metadata has no place in a torch file: convert says it drops it.
    st2 = os.path.join(tmp, "meta.safetensors")
    write_st(st2, {"w": ("F32", [1], b"\0" * 4)}, meta={"format": "pt", "note": "x"})
    out2 = os.path.join(tmp, "meta.pth")
    r = run([BIN, "convert", "-q", st2, out2])
    check(r.returncode == 0 and "2 metadata entries not written" in r.stderr
          and len(r.stderr.splitlines()) == 1, "convert notes the dropped metadata: %r" % r.stderr)


def test_training_checkpoint_values_noted(tmp):
    """Issue 34: a training checkpoint converted to .pth, .safetensors or
    .gguf: one line on stderr names the non-tensor values the output leaves
    out (epoch, the optimizer's hyperparameters, the scheduler's fields),
    as it does for metadata; the tensors are all written."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(2, 4)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    src = os.path.join(tmp, "ckpt.pth")
    torch.save({"epoch": 3, "model": net.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict()}, src)
    want = set(net.state_dict())
    for ext in ("pth", "safetensors", "gguf"):
        out = os.path.join(tmp, "out." + ext)
        r = run([BIN, "convert", "-q", src, out])
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 0 and len(lines) == 1 and "non-tensor values of the source not written" in lines[0]
              and ": epoch, optimizer.* (" in lines[0] and "scheduler.* (" in lines[0],
              "%s: one line names the values left out: %r" % (ext, r.stderr))
        ls = run([BIN, "ls", out])
        keys = {line.split("\t")[0] for line in ls.stdout.splitlines()}
        check({"model." + k for k in want} <= keys, "%s: the model's tensors written: %r" % (ext, sorted(keys)))
    # A plain state_dict has no such values: nothing to say.
    sd = os.path.join(tmp, "sd.pth")
    torch.save(net.state_dict(), sd)
    r = run([BIN, "convert", "-q", sd, os.path.join(tmp, "sd.safetensors")])
    check(r.returncode == 0 and r.stderr == "", "a state_dict converts silently: %r" % r.stderr)


def test_torch2_dtypes(tmp):
    """The dtypes only torch 2.x has (F8, U16-U64) are written as torch 2's
    torch.save writes them: data.pkl names exactly the globals, persistent
    ids and rebuild arguments torch's source gives (read here without
    torch, which 1.13 cannot do), with opcodes its weights_only loader
    takes; burnstore reads each back to the same dtype, shape and bytes,
    also after a rewrite in place; torch 1.13 refuses the file (it has no
    _rebuild_tensor_v3), and loads it once those tensors are left out."""
    st = os.path.join(tmp, "t2.safetensors")
    ts, i = {"f32": ("F32", [2], struct.pack("<2f", 1.5, -2))}, 0
    for dt, size in (("F8_E4M3", 1), ("F8_E5M2", 1), ("F8_E4M3FNUZ", 1), ("F8_E5M2FNUZ", 1), ("F8_E8M0", 1),
                     ("U16", 2), ("U32", 4), ("U64", 8)):
        ts["t." + dt.lower()] = (dt, [2, 3], bytes((i * 37 + j * 11) & 0xFF for j in range(6 * size)))
        i += 1
    ts["u64.big"] = ("U64", [2], struct.pack("<2Q", (1 << 64) - 1, 1 << 63))
    ts["f8.empty"] = ("F8_E4M3", [0, 4], b"")
    write_st(st, ts)
    out = os.path.join(tmp, "t2.pth")
    r = run([BIN, "convert", "-q", st, out])
    if not check(r.returncode == 0, "convert torch 2 dtypes: %r" % r.stderr):
        return
    sd, ops = pickled(out)
    check(type(sd) is collections.OrderedDict and list(sd) == list(ts), "a state dict, keys in order: %s" % list(sd))
    for i, (k, (dt, shape, _)) in enumerate(ts.items()):
        rebuild_as_torch(k, sd.get(k), dt, shape, i)
    check(ops <= WEIGHTS_ONLY_OPS, "opcodes torch's weights_only loader takes: %s" % (ops - WEIGHTS_ONLY_OPS))
    check(not aligned(out), "aligned")
    got = {w["key"]: w for w in ls(out) or []}
    for k, (dt, shape, b) in ts.items():
        w = got.get(k, {})
        check(w.get("dtype") == dt and w.get("shape") == shape, "%s: burnstore reads %s %s: %s" % (k, dt, shape, w))
        check(cat_bytes(out, k) == b, "%s: burnstore reads the same bytes" % k)
    r = run([BIN, "diff", st, out])
    check(r.returncode == 0, "burnstore diff of the source and its .pth: %r" % r.stdout[-300:])
    # torch 1.13 has neither these dtypes nor _rebuild_tensor_v3: it refuses the file.
    r = run(["/usr/bin/python3", "-c", "import sys, torch; torch.load(sys.argv[1], weights_only=True)", out])
    check(r.returncode != 0 and "_rebuild_tensor_v3" in r.stderr,
          "torch 1.13 cannot load it (a dtype it lacks): %r" % r.stderr[-300:])
    # Left out, the rest is a file torch 1.13 loads.
    out13 = os.path.join(tmp, "t13.pth")
    r = run([BIN, "convert", "-q", "-o", r"exclude=^(t|u64|f8)\.", st, out13])
    if check(r.returncode == 0, "convert without them: %r" % r.stderr):
        check(torch.equal(torch.load(out13, weights_only=True)["f32"], torch.tensor([1.5, -2])), "torch 1.13 loads it")
    # A rewrite in place of that file: edit one F8 tensor, add a U32 one.
    with Mount(out, os.path.join(tmp, "m"), opts="rw") as m:
        with open(os.path.join(m, "t", "f8_e5m2"), "r+b") as f:
            f.write(b"\x7b\x7c")
        with open(os.path.join(m, "t", "new"), "wb") as f:
            f.write(struct.pack("<3I", 1, 2, 1 << 31))
        os.setxattr(os.path.join(m, "t", "new"), "user.burnstore.dtype", b"U32")
        u = m.unmount()
    if check(u.returncode == 0, "rw in place: %s" % u.stderr):
        sd, _ = pickled(out)
        check(list(sd) == list(ts) + ["t.new"], "the keys in order, the new one last: %s" % list(sd))
        rebuild_as_torch("t.new", sd.get("t.new"), "U32", [3], len(ts))
        check(cat_bytes(out, "t.f8_e5m2") == b"\x7b\x7c" + ts["t.f8_e5m2"][2][2:], "the edit")
        check(cat_bytes(out, "t.new") == struct.pack("<3I", 1, 2, 1 << 31), "the new U32 tensor")
        check(cat_bytes(out, "t.u64") == ts["t.u64"][2], "an unchanged tensor")
        check(not aligned(out), "aligned after the rewrite")


def test_f4(tmp):
    """F4 goes to torch as float4_e2m1fn_x2 (torch 2.8's two-E2M1-a-byte
    dtype; c10/util/Float4_e2m1fn_x2.h: element 2j in the low nibble): the
    same bytes in an UntypedStorage of that many bytes, the last dimension
    halved, rebuilt by _rebuild_tensor_v3 with torch.float4_e2m1fn_x2;
    burnstore reads the file back as F4 of the source's shape and bytes
    (also through a mount); an odd last dimension is refused naming the
    tensor; torch 1.13 (no such dtype) refuses the file."""
    st = os.path.join(tmp, "f4.safetensors")
    ts = {"a": ("F4", [2, 6], bytes([0x21, 0x43, 0x65, 0x87, 0xa9, 0xcb])),
          "b": ("F4", [4], bytes([0x0f, 0xf0])),
          "c": ("F4", [3, 0, 2], b""),
          "f": ("F32", [1], struct.pack("<f", 0.5))}
    write_st(st, ts)
    out = os.path.join(tmp, "f4.pth")
    r = run([BIN, "convert", "-q", st, out])
    if not check(r.returncode == 0, "convert F4: %r" % r.stderr):
        return
    sd, ops = pickled(out)
    check(list(sd) == list(ts), "keys in order: %s" % list(sd))
    for i, (k, (dt, shape, _)) in enumerate(ts.items()):
        torch_shape = shape[:-1] + [shape[-1] // 2] if dt == "F4" else shape
        rebuild_as_torch(k, sd.get(k), dt, torch_shape, i)
    check(ops <= WEIGHTS_ONLY_OPS, "opcodes: %s" % (ops - WEIGHTS_ONLY_OPS))
    check(not aligned(out), "aligned")
    with zipfile.ZipFile(out) as z:
        names = [n for n in z.namelist() if "/data/" in n]
        check(z.read([n for n in names if n.endswith("/data/0")][0]) == ts["a"][2], "a's bytes as they are")
    got = {w["key"]: w for w in ls(out) or []}
    for k, (dt, shape, b) in ts.items():
        w = got.get(k, {})
        check(w.get("dtype") == dt and w.get("shape") == shape, "%s: read back as %s %s: %s" % (k, dt, shape, w))
        check(cat_bytes(out, k) == b, "%s: the same bytes read back" % k)
    with Mount(out, os.path.join(tmp, "m")) as m:
        check(open(os.path.join(m, "a"), "rb").read() == ts["a"][2]
              and os.getxattr(os.path.join(m, "a"), "user.burnstore.dtype") == b"F4", "a mount shows it as F4")
    r = run(["/usr/bin/python3", "-c", "import sys, torch; torch.load(sys.argv[1], weights_only=True)", out])
    check(r.returncode != 0, "torch 1.13 cannot load it: %r" % r.stderr[-200:])
    # a float4_e2m1fn_x2 view that is not row-major (strides (3, 1) -> (1, 2)): listed unsupported
    view = os.path.join(tmp, "view.pth")
    with zipfile.ZipFile(out) as zin, zipfile.ZipFile(view, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            b = zin.read(info)
            if info.filename.endswith("/data.pkl"):
                check(b.count(b"K\x03K\x01\x86") == 1, "a's strides in the pickle once")
                b = b.replace(b"K\x03K\x01\x86", b"K\x01K\x02\x86")
            zout.writestr(info.filename, b)
    got = {w["key"]: w for w in ls(view) or []}
    check("not row-major" in str(got.get("a", {})) and got.get("b", {}).get("dtype") == "F4",
          "a non-row-major float4 view is unsupported, the others read: %s" % got)
    odd = os.path.join(tmp, "odd.safetensors")
    write_st(odd, {"o": ("F4", [2, 3], bytes(3))})
    r = run([BIN, "convert", "-q", odd, os.path.join(tmp, "odd.pth")])
    check(r.returncode != 0 and "'o'" in r.stderr and "even" in r.stderr and len(r.stderr.splitlines()) == 1,
          "an odd last dimension is refused in one line: %r" % r.stderr)


def make_sources(tmp):
    """torch-made files: a module's state dict (OrderedDict with _metadata),
    a plain dict with shared storages and views, a nested checkpoint, a
    legacy-format file."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    torch.save(m.state_dict(), os.path.join(tmp, "module.pth"))
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    views = {"base": base, "row": base[1], "t": base.t(), "slice": base[:, ::2],
             "expand": torch.arange(3.0).reshape(3, 1).expand(3, 4), "half": torch.ones(2, dtype=torch.float16)}
    torch.save(views, os.path.join(tmp, "views.pt"))
    opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
    m(torch.randn(2, 3)).sum().backward()
    opt.step()
    torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 7, "best": 0.25,
                "note": "run 3", "shape": (3, 4), "flags": [True, None], 5: "int key"},
               os.path.join(tmp, "nested.pth"))
    import argparse
    torch.save({"model": m.state_dict(), "args": argparse.Namespace(lr=0.5)}, os.path.join(tmp, "args.pth"))
    bomb = [1]
    for _ in range(60):  # 2**60 paths through 60 shared lists
        bomb = [bomb, bomb]
    torch.save({"w": torch.ones(1), "bomb": bomb}, os.path.join(tmp, "bomb.pth"))
    cyc = {"v": 1}
    cyc["self"] = cyc
    torch.save({"w": torch.ones(1), "cyc": cyc}, os.path.join(tmp, "cyc.pth"))
    torch.save(m.state_dict(), os.path.join(tmp, "legacy.pth"), _use_new_zipfile_serialization=False)
    return m.state_dict(), views


def test_rw_in_place(tmp):
    sd, views = make_sources(tmp)
    # A module's state dict: replace, add, delete, rename; _metadata kept.
    path = os.path.join(tmp, "module.pth")
    orig = torch.load(path, weights_only=True)
    with Mount(path, os.path.join(tmp, "m1"), opts="rw") as m:
        with open(os.path.join(m, "0", "bias"), "r+b") as f:
            f.write(struct.pack("<4f", 1, 2, 3, 4))
        with open(os.path.join(m, "0", "extra"), "wb") as f:
            f.write(struct.pack("<2q", 5, -6))
        os.setxattr(os.path.join(m, "0", "extra"), "user.burnstore.dtype", b"I64")
        os.unlink(os.path.join(m, "1", "running_var"))
        os.rename(os.path.join(m, "2", "weight"), os.path.join(m, "2", "w"))
        u = m.unmount()
    if not check(u.returncode == 0, "rw in place: %s" % u.stderr):
        return
    got = torch.load(path, weights_only=True)
    want = [k for k in orig if k not in ("1.running_var", "2.weight")]
    check(sorted(got) == sorted(want + ["0.extra", "2.w"]), "keys after the edit: %s" % list(got))
    check([k for k in got if k in want] == want, "the source's keys keep their order")
    check(torch.equal(got["0.bias"], torch.tensor([1.0, 2, 3, 4])), "the replaced tensor")
    check(torch.equal(got["0.extra"], torch.tensor([5, -6])), "the added tensor")
    check(torch.equal(got["2.w"], orig["2.weight"]), "the renamed tensor")
    for k in want:
        if k != "0.bias":
            check(torch.equal(got[k], orig[k]) and got[k].dtype == orig[k].dtype, "%s unchanged" % k)
    check(type(got).__name__ == "OrderedDict" and getattr(got, "_metadata", None) == orig._metadata,
          "the state dict's _metadata is kept: %r" % getattr(got, "_metadata", None))
    check(not aligned(path), "aligned")
    # A round trip that changes nothing: torch loads identical tensors.
    with Mount(path, os.path.join(tmp, "m0"), opts="rw") as m:
        u = m.unmount()
    again = torch.load(path, weights_only=True)
    check(list(again) == list(got) and all(torch.equal(again[k], got[k]) for k in got)
          and again._metadata == orig._metadata, "an unchanged rw round trip")
    # A plain dict with shared storages and views: stays a dict, values equal.
    path = os.path.join(tmp, "views.pt")
    with Mount(path, os.path.join(tmp, "m2"), opts="rw") as m:
        with open(os.path.join(m, "half"), "r+b") as f:
            f.write(struct.pack("<e", 3))
        u = m.unmount()
    if check(u.returncode == 0, "rw in place, views: %s" % u.stderr):
        got = torch.load(path, weights_only=True)
        check(type(got) is dict and list(got) == list(views), "a plain dict, keys in order: %s" % type(got))
        for k, v in views.items():
            want = torch.tensor([3.0, 1], dtype=torch.float16) if k == "half" else v
            check(torch.equal(got[k], want), "%s: torch sees the edit and nothing else" % k)
    # A nested checkpoint (model, optimizer state, epoch, floats, strings,
    # tuples, lists, an int key): an edit inside the model, a tensor added
    # there; everything else as torch had it.
    path = os.path.join(tmp, "nested.pth")
    orig = torch.load(path)
    with Mount(path, os.path.join(tmp, "m3"), opts="rw") as m:
        with open(os.path.join(m, "model", "0", "bias"), "r+b") as f:
            f.write(struct.pack("<f", 42))
        os.makedirs(os.path.join(m, "model", "9"))
        with open(os.path.join(m, "model", "9", "new"), "wb") as f:
            f.write(struct.pack("<2i", 1, 2))
        os.setxattr(os.path.join(m, "model", "9", "new"), "user.burnstore.dtype", b"I32")
        os.unlink(os.path.join(m, "model", "1", "running_var"))
        u = m.unmount()
    if check(u.returncode == 0, "rw in place, nested: %s" % u.stderr):
        got = torch.load(path)  # torch 1.13's weights_only has no BINFLOAT (the source's floats)
        check(list(got) == list(orig), "the checkpoint's keys: %s" % list(got))
        for k in orig:
            if k not in ("model", "optimizer"):
                check(got[k] == orig[k] and type(got[k]) is type(orig[k]), "%r kept: %r" % (k, got[k]))
        want = [k for k in orig["model"] if k != "1.running_var"] + ["9.new"]
        check(list(got["model"]) == want, "the model's keys: %s" % list(got["model"]))
        check(got["model"]["0.bias"][0] == 42 and torch.equal(got["model"]["0.bias"][1:], orig["model"]["0.bias"][1:]),
              "the edit")
        check(torch.equal(got["model"]["9.new"], torch.tensor([1, 2], dtype=torch.int32)), "the new tensor in the model")
        check(got["model"]._metadata == orig["model"]._metadata, "the model's _metadata")
        check(got["optimizer"]["param_groups"] == orig["optimizer"]["param_groups"], "the optimizer's param_groups")
        st, ost = got["optimizer"]["state"], orig["optimizer"]["state"]
        check(list(st) == list(ost) and all(torch.equal(st[i]["momentum_buffer"], ost[i]["momentum_buffer"]) for i in ost),
              "the optimizer's state (int keys, tensors)")
        check(not aligned(path), "aligned")
    # What cannot be kept is refused up front, naming it; the file untouched.
    for name, needle in (("args.pth", "'args' holds a value of type object"), ("legacy.pth", "legacy"),
                         ("bomb.pth", "more than 4194304 values"), ("cyc.pth", "deeper than 100")):
        path = os.path.join(tmp, name)
        before = open(path, "rb").read()
        mnt = os.path.join(tmp, "r-" + name)
        os.makedirs(mnt)
        r = run([BIN, path, mnt, "-o", "rw"], timeout=30)
        mounted = is_mounted(mnt)
        force_unmount(mnt)
        check(r.returncode == 1 and not mounted and len(r.stderr.strip().splitlines()) == 1
              and needle in r.stderr and "output=NEW.pth" in r.stderr,
              "%s: rw in place refused up front: %r" % (name, r.stderr))
        check(open(path, "rb").read() == before, "%s untouched" % name)
    # ... and with output= a new file it is a conversion of the tensors.
    out = os.path.join(tmp, "args-flat.pth")
    with Mount(os.path.join(tmp, "args.pth"), os.path.join(tmp, "m4"), opts="output=" + out) as m:
        u = m.unmount()
    check(u.returncode == 0 and "model.0.weight" in torch.load(out, weights_only=True),
          "output= a new .pth: the flat state dict of every tensor")


def refused(what, call, errno_=1):
    """call() fails with errno_ (EPERM)."""
    try:
        call()
    except OSError as e:
        return check(e.errno == errno_, "%s: refused with errno %d, not %d" % (what, errno_, e.errno))
    return check(False, "%s is refused when it is asked" % what)


def test_list_items_fixed(tmp):
    """A tensor that is an item of a list (or tuple) in a torch-made
    checkpoint has no key a rewrite in place could leave it out by: its
    unlink and rename (of it, of a directory above it, of another file onto
    it) are refused when asked, with EPERM and a log line naming it; its
    bytes, dtype and shape still change, and the write-back succeeds. Left
    out or renamed by key options, the mount is refused up front."""
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(3, 2))
    path = os.path.join(tmp, "ck.pth")
    hist = [torch.arange(4.0), torch.ones(2, 3)]
    torch.save({"model": m.state_dict(), "hist": hist, "pair": (torch.zeros(2), 3), "epoch": 4}, path)
    orig = torch.load(path)
    mnt = os.path.join(tmp, "m")
    with Mount(path, mnt, opts="rw") as mp:
        h0, h1 = os.path.join(mp, "hist", "0"), os.path.join(mp, "hist", "1")
        refused("unlink hist/0", lambda: os.unlink(h0))
        refused("rename hist/1", lambda: os.rename(h1, os.path.join(mp, "hist", "x")))
        refused("rename of the directory hist", lambda: os.rename(os.path.join(mp, "hist"), os.path.join(mp, "h2")))
        refused("unlink pair/0 (a tuple's item)", lambda: os.unlink(os.path.join(mp, "pair", "0")))
        tmpf = os.path.join(mp, "model", "t")
        with open(tmpf, "wb") as f:
            f.write(struct.pack("<4f", 9, 9, 9, 9))
        refused("rename of a new file onto hist/0", lambda: os.rename(tmpf, h0))
        os.unlink(tmpf)  # a file of the mount's own: removable
        os.unlink(os.path.join(mp, "model", "0", "bias"))  # a dict's tensor: removable
        st = run([BIN, "status", mp]).stdout
        check("unlink '0' refused: tensor 'hist.0': an item of a list" in st
              and "rename to 'x' refused: tensor 'hist.1'" in st and "rename to 'h2' refused: tensor 'hist." in st,
              "the log names each refused tensor and why: %r" % st[-1500:])
        with open(h0, "r+b") as f:
            f.write(struct.pack("<f", 42))
        os.setxattr(h1, "user.burnstore.dtype", b"I32")
        os.setxattr(h1, "user.burnstore.shape", b"[3,2]")
        u = mp.unmount()
    if check(u.returncode == 0, "the write-back succeeds: %s" % u.stderr):
        got = torch.load(path)
        check(list(got) == list(orig) and got["epoch"] == 4, "the checkpoint's keys: %s" % list(got))
        check(type(got["hist"]) is list and len(got["hist"]) == 2, "hist is a list of 2")
        check(torch.equal(got["hist"][0], torch.tensor([42.0, 1, 2, 3])), "hist[0]'s new bytes")
        check(got["hist"][1].dtype == torch.int32 and got["hist"][1].shape == (3, 2)
              and raw(got["hist"][1]) == raw(orig["hist"][1]), "hist[1]'s new dtype and shape, same bytes")
        check(type(got["pair"]) is tuple and torch.equal(got["pair"][0], orig["pair"][0]) and got["pair"][1] == 3,
              "the tuple kept")
        check(list(got["model"]) == ["0.weight"] and torch.equal(got["model"]["0.weight"], orig["model"]["0.weight"]),
              "the dict's tensor removed, the other kept")
    # key options that leave out or rename an item: refused at mount, the file untouched
    before = open(path, "rb").read()
    for opts, needle in (("rw,exclude=^hist\\.0$", "'hist.0' is an item of a list"),
                         ("rw,remap=^pair\\.0$=>p0", "'pair.0' is an item of a list")):
        mnt2 = os.path.join(tmp, "r")
        os.makedirs(mnt2, exist_ok=True)
        r = run([BIN, path, mnt2, "-o", opts])
        mounted = is_mounted(mnt2)
        force_unmount(mnt2)
        check(r.returncode == 1 and not mounted and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr,
              "%s: refused up front: %r" % (opts, r.stderr))
    check(open(path, "rb").read() == before, "untouched")


def test_enospc_and_finish(tmp):
    """The write-back's guarantees hold for .pth outputs: a full disk fails it
    with the reason, no partial file, staging kept; --finish completes it."""
    stg = os.path.join(tmp, "stg")
    os.makedirs(stg)
    small = os.path.join(tmp, "small")
    with small_tmpfs(small, "64k") as ok:
        if not ok:
            return
        out = os.path.join(small, "big.pth")
        data = bytes(range(256)) * 1024  # 256 KiB > 64 KiB
        with Mount(out, os.path.join(tmp, "f"), opts="staging=" + stg) as m:
            with open(os.path.join(m, "big"), "wb") as f:
                f.write(data)
            os.setxattr(os.path.join(m, "big"), "user.burnstore.dtype", b"U8")
            u = m.unmount()
        check(u.returncode != 0 and "no space" in u.stderr.lower(), "write-back fails on ENOSPC: %r" % u.stderr)
        check(os.listdir(small) == [], "no partial output, no temp file: %s" % os.listdir(small))
        left = os.listdir(stg)
        check(len(left) == 1, "staging kept: %r" % left)
        if left:
            check("pytorch" in open(os.path.join(stg, left[0], "INDEX")).read(), "the INDEX records the format")
            run(["mount", "-o", "remount,size=4m", small])
            r = run([BIN, "--finish", os.path.join(stg, left[0])])
            check(r.returncode == 0, "--finish: %s" % r.stderr)
            if check(os.path.exists(out), "--finish wrote %s" % out):
                sd = torch.load(out, weights_only=True)
                check(list(sd) == ["big"] and raw(sd["big"]) == data, "--finish wrote the .pth")
                check(not aligned(out), "aligned")


def test_kill_during_writeback(tmp):
    """kill -9 while a .pth is rewritten in place: the old file stays whole
    under its name; --finish writes the edit, _metadata kept."""
    target = os.path.join(tmp, "t.pth")
    sd = torch.nn.Linear(4, 2).state_dict()
    sd["big"] = torch.zeros(1 << 26, dtype=torch.uint8)  # 64 MiB
    torch.save(sd, target)
    old = open(target, "rb").read()
    stg = os.path.join(tmp, "stg")
    os.makedirs(stg)
    mnt = os.path.join(tmp, "k")
    hit = False
    with Mount(target, mnt, opts="rw,staging=" + stg) as m:
        with open(os.path.join(m, "big"), "r+b") as f:
            f.write(b"\xff" * 16)
        pid = daemon_pid(mnt)
        subprocess.run(["fusermount3", "-u", mnt], capture_output=True, timeout=60)
        deadline = time.time() + 30
        while time.time() < deadline and pid:
            if [f for f in os.listdir(tmp) if ".burnstore-tmp-" in f]:
                os.kill(pid, signal.SIGKILL)
                hit = True
                break
            time.sleep(0.001)
    if pid:
        wait_gone(pid)
    if not check(hit, "the kill landed during the write-back"):
        return
    check(open(target, "rb").read() == old, "the old file is intact after kill -9")
    left = os.listdir(stg)
    check(len(left) == 1, "staging kept: %r" % left)
    if left:
        r = run([BIN, "--finish", os.path.join(stg, left[0])], timeout=300)
        check(r.returncode == 0, "--finish: %s" % r.stderr)
        got = torch.load(target, weights_only=True)
        check(list(got) == ["weight", "bias", "big"] and raw(got["big"][:32]) == b"\xff" * 16 + bytes(16)
              and torch.equal(got["weight"], sd["weight"]), "--finish wrote the edit")
        check(getattr(got, "_metadata", None) == sd._metadata, "--finish kept _metadata")
        check(not [f for f in os.listdir(tmp) if ".burnstore-tmp-" in f], "no temp file left")


def test_beyond_4gib(tmp):
    """A member over 4 GiB and members whose headers start past 4 GiB: zip64
    extras as torch writes them, 64-byte alignment kept, and torch loads it.
    The source is sparse; the .pth is written in full."""
    src = os.path.join(tmp, "big.safetensors")
    n = (1 << 32) + 4096 + 3
    header = {"before": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "big": {"dtype": "U8", "shape": [n], "data_offsets": [8, 8 + n]},
              "after": {"dtype": "I64", "shape": [2], "data_offsets": [8 + n, 24 + n]}}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(src, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + struct.pack("<2f", 1.5, -2))
        f.seek(8 + len(h) + 8 + 12345)
        f.write(b"\x07")
        f.seek(8 + len(h) + 8 + n - 1)
        f.write(b"\x09" + struct.pack("<2q", 1 << 40, -5))
    out = os.path.join(tmp, "big.pth")
    r = run([BIN, "convert", "-q", src, out], timeout=1200)
    if not check(r.returncode == 0, "convert beyond 4 GiB: %r" % r.stderr):
        return
    check(not aligned(out), "every member aligned, also past 4 GiB")
    with open(out, "rb") as f, zipfile.ZipFile(out) as z:
        info = {i.filename: i for i in z.infolist()}
        check(info["big/data/1"].file_size == n, "the 4 GiB member's size from the zip64 extra")
        check(info["big/data/2"].header_offset > 1 << 32 and info["big/version"].header_offset > 1 << 32,
              "header offsets past 4 GiB from the zip64 extra")
        f.seek(info["big/data/1"].header_offset)
        lh = f.read(30)
        nlen, xlen = struct.unpack("<HH", lh[26:30])
        f.seek(info["big/data/1"].header_offset + 30 + nlen)
        x = f.read(xlen)
        check(x[:4] == b"\x01\x00\x10\x00" and struct.unpack("<QQ", x[4:20]) == (n, n)
              and x[20:22] == b"FB", "local zip64 extra with both sizes, then torch's padding: %r" % x[:24])
        data = info["big/data/1"].header_offset + 30 + nlen + xlen
        f.seek(data + 12345)
        check(f.read(1) == b"\x07", "a byte inside the big member")
        f.seek(data + n - 1)
        check(f.read(1) == b"\x09", "its last byte")
        f.seek(data + n)
        dd = f.read(24)
        check(dd[:4] == b"PK\x07\x08" and struct.unpack("<QQ", dd[8:24]) == (n, n), "24-byte data descriptor")
    r = run(["/usr/bin/python3", "-c", """
import sys, torch
sd = torch.load(sys.argv[1], weights_only=True)
b = sd['big']
assert list(sd) == ['before', 'big', 'after'], list(sd)
assert b.dtype == torch.uint8 and b.shape == (%d,)
assert int(b[12345]) == 7 and int(b[-1]) == 9 and int(b[:12345].sum()) == 0
assert sd['before'].tolist() == [1.5, -2.0] and sd['after'].tolist() == [1 << 40, -5]
print('ok')
""" % n, out], timeout=1200)
    check(r.returncode == 0 and r.stdout.strip() == "ok", "torch loads the > 4 GiB file: %s" % r.stderr[-500:])
    os.unlink(out)


def in_own_dir(t):
    """t run in a directory of its own under the scratch directory."""
    def run_it(tmp):
        d = os.path.join(tmp, t.__name__)
        os.makedirs(d)
        t(d)
    run_it.__name__ = t.__name__
    return run_it


def main():
    run_tests("test_pth_write", [in_own_dir(t) for t in (
        test_every_fixture, test_torch_dtypes_and_views, test_mount_outputs, test_refusals,
        test_training_checkpoint_values_noted, test_torch2_dtypes, test_f4,
        test_rw_in_place, test_list_items_fixed,
        test_enospc_and_finish, test_kill_during_writeback, test_beyond_4gib)], "pthw")


if __name__ == "__main__":
    main()
