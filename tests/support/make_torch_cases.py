#!/usr/bin/env python3
"""Write PyTorch checkpoints with real torch for test_pth.c.

Usage: make_torch_cases.py OUTDIR [MAKE_PTH_FIXTURES_PY]
(default: make-pth-fixtures.py beside this file)

For every case OUTDIR/<case>.pth it writes
  <case>.json         {key: {"shape": [...], "dtype": "F32", "sha256": hex}}
  <case>.<i>.bin      raw contiguous little-endian bytes of the i-th key in <case>.json
  <case>.expect.json  optional: {"error": substring} (the reader must refuse the file),
                      {"values": {key: value}} (entries values_json must have),
                      {"note": substring} (a line cat->notes must have),
                      {"absent": path} (a file that must NOT exist afterwards)
The make-pth-fixtures.py cases come first, then ours. Everything is
deterministic (no RNG).
"""
import collections
import hashlib
import importlib.util
import io
import json
import os
import sys
import zipfile

import torch
import torch.nn as nn

OUT = sys.argv[1]
MPF = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "make-pth-fixtures.py")
spec = importlib.util.spec_from_file_location("mpf", MPF)
mpf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mpf)

NAMES = dict(mpf.DTYPE_NAMES)
NAMES[torch.complex64] = "C64"
NAMES[torch.complex128] = "C128"


def tensor_bytes(t):
    t = t.detach().cpu().contiguous().reshape(-1)
    if t.is_complex():
        t = torch.view_as_real(t).reshape(-1)
    return bytes(t.view(torch.uint8).tolist()) if t.numel() else b""


def write_case(name, obj, save_kwargs=None, expect=None, tensors=True, path_writer=None,
               manifest_obj=None):
    path = os.path.join(OUT, name + ".pth")
    if path_writer:
        path_writer(path)
    else:
        torch.save(obj, path, **(save_kwargs or {}))
    man = collections.OrderedDict()
    if tensors:
        flat = mpf.flatten(obj if manifest_obj is None else manifest_obj, "",
                           collections.OrderedDict())
        for i, (key, t) in enumerate(flat.items()):
            data = tensor_bytes(t)
            man[key] = {"shape": list(t.shape), "dtype": NAMES[t.dtype],
                        "sha256": hashlib.sha256(data).hexdigest(), "bin": "%s.%d.bin" % (name, i)}
            with open(os.path.join(OUT, man[key]["bin"]), "wb") as f:
                f.write(data)
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(man, f, indent=1)
    if expect:
        with open(os.path.join(OUT, name + ".expect.json"), "w") as f:
            json.dump(expect, f, indent=1)


def fill(module):
    return mpf.fill_deterministic(module)


class Net(nn.Module):
    """A user model class (pickled as __main__.Net by torch.save(model))."""
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)


class Boom:
    """Unpickling this would run a shell command (a pickle 'gadget')."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch " + self.marker,))


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (obj, kw) in mpf.build_fixtures().items():
        write_case("fx_" + name, obj, kw)

    sd = fill(mpf.TinyNet()).state_dict()
    write_case("proto4", sd, {"pickle_protocol": 4})
    write_case("proto5", {"sd": sd, "epoch": 7}, {"pickle_protocol": 5},
               expect={"values": {"epoch": 7}})

    base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    big = torch.arange(100000, dtype=torch.float64)
    conv = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    views = collections.OrderedDict([
        ("transpose", base[0].t()),
        ("permute", base.permute(2, 0, 1)),
        ("step_slice", base[:, :, ::3]),
        ("expand", torch.arange(3, dtype=torch.int32).reshape(3, 1).expand(3, 5)),
        ("channels_last", conv.contiguous(memory_format=torch.channels_last)),
        ("narrow_big", big.narrow(0, 5000, 10)),
        ("narrow_2d", big[:40000].view(200, 200)[10:12, 100:103]),
        ("scalar_view", big[99999]),
    ])
    write_case("views", views)
    write_case("views_proto4", views, {"pickle_protocol": 4})

    leg = collections.OrderedDict([("w", base), ("w_t", base[1].t()), ("tail", base.view(-1)[20:]),
                                   ("i", torch.tensor([5, 6, 7], dtype=torch.int64))])
    write_case("legacy_views", leg, {"_use_new_zipfile_serialization": False})
    write_case("legacy_proto4", sd, {"_use_new_zipfile_serialization": False,
                                     "pickle_protocol": 4})

    model = fill(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)))
    opt = torch.optim.Adam(model.parameters(), lr=0.001)
    loss = model(torch.ones(5, 3)).sum()
    loss.backward()
    opt.step()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
            "best": 0.75, "name": "run-1", "flags": [True, False], "nothing": None}
    write_case("adam_checkpoint", ckpt, expect={"values": {
        "epoch": 3, "best": 0.75, "name": "run-1", "flags": [True, False], "nothing": None,
        "optimizer.param_groups.0.lr": 0.001, "optimizer.param_groups.0.betas": [0.9, 0.999],
        "optimizer.param_groups.0.params": [0, 1, 2, 3]}})

    # A re-zipped copy: same records, DEFLATED, with directory entries.
    def rezip(path):
        raw = io.BytesIO()
        torch.save(sd, raw)
        src = zipfile.ZipFile(io.BytesIO(raw.getvalue()))
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as dst:
            dst.writestr(zipfile.ZipInfo("archive/"), b"")
            for info in src.infolist():
                dst.writestr(info.filename, src.read(info.filename))
    write_case("rezipped_deflate", sd, path_writer=rezip)

    dt = collections.OrderedDict([
        ("f16", torch.tensor([1.5, -2.25, 65504.0], dtype=torch.float16)),
        ("bf16", torch.tensor([1.5, -2.5, 3.0e38], dtype=torch.bfloat16)),
        ("bool", torch.tensor([True, False, True])),
        ("i8", torch.tensor([-128, 127, 0], dtype=torch.int8)),
        ("u8", torch.tensor([0, 128, 255], dtype=torch.uint8)),
        ("i16", torch.tensor([-32768, 1, 32767], dtype=torch.int16)),
        ("c64", torch.tensor([1 + 2j, -3.5 - 0.25j], dtype=torch.complex64)),
        ("c128", torch.tensor([1 + 2j], dtype=torch.complex128)),
        ("f64_2d", torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64).t()),
    ])
    write_case("dtypes_more", dt)

    # torch.save(model) of a class of __main__: named by its class, not by the
    # first submodule met (issue 34), in the zip and the legacy formats
    write_case("whole_module", fill(Net()), tensors=False,
               expect={"error": "pickles a whole nn.Module (__main__.Net, holding "
                                "torch.nn.modules.linear.Linear); save model.state_dict() instead"})
    write_case("whole_module_legacy", fill(Net()), save_kwargs={"_use_new_zipfile_serialization": False},
               tensors=False, expect={"error": "__main__.Net"})
    write_case("whole_module_builtin", fill(nn.Linear(2, 2)), tensors=False,
               expect={"error": "torch.nn.modules.linear.Linear"})

    # Roots that are not dicts: a bare tensor is named "tensor", a list by index.
    t = torch.arange(6, dtype=torch.int16).reshape(2, 3)
    write_case("root_tensor", t, manifest_obj={"tensor": t})
    write_case("root_list", [t, {"x": t.t()}, 5], expect={"values": {"2": 5}})

    marker = os.path.join(OUT, "PWNED")
    evil = collections.OrderedDict([("w", torch.tensor([1.0, 2.0])),
                                    ("payload", Boom(marker)),
                                    ("b", torch.tensor([3], dtype=torch.int64))])
    write_case("malicious", evil, expect={"note": "skipped object of class posix.system",
                                          "absent": marker})
    print("torch", torch.__version__)


if __name__ == "__main__":
    main()
