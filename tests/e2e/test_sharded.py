"""Sharded SafeTensors checkpoints in (issue 11), through real mounts: a
shard set made by hand in the layout the Hugging Face tools write
(model-00001-of-00002.safetensors, model.safetensors.index.json with
metadata.total_size and weight_map, indent=2, sorted keys), mounted by its
index and by its directory; every tensor's bytes, dtype, shape and shard
xattr; the index metadata at the root; conversions to one file; each error
case as one line with nothing mounted; an unmapped tensor mounted with a
note; and a mount of 8 GiB of sparse shards in well under a second per GiB
(the headers only are read)."""
import json
import os
import struct
import time

from bsmount import (BIN, Mount, check, finish, force_unmount, is_mounted, key_to_relpath, run,
                     tensor_files, tmpdir, xattrs)
from test_st_write import canonical, strict_read


def tensors():
    import numpy as np
    return {
        "model.embed_tokens.weight": ("BF16", [8, 4], np.arange(32, dtype="<u2").tobytes()),
        "model.layers.0.self_attn.q_proj.weight": ("F32", [4, 4], np.arange(16, dtype="<f4").tobytes()),
        "model.layers.0.input_layernorm.weight": ("F32", [4], np.ones(4, dtype="<f4").tobytes()),
        "model.layers.1.self_attn.q_proj.weight": ("F32", [4, 4], (np.arange(16, dtype="<f4") * 2).tobytes()),
        "model.norm.weight": ("F16", [4], np.ones(4, dtype="<f2").tobytes()),
        "lm_head.weight": ("F32", [8, 4], np.zeros(32, dtype="<f4").tobytes()),
    }


SHARD1 = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
          "model.layers.0.input_layernorm.weight"]


def make_set(d, ts=None, shard_of=None, index_extra=None, weight_map=None, name="model"):
    """Two shards and the index, as transformers' save_pretrained writes them."""
    ts = ts or tensors()
    os.makedirs(d, exist_ok=True)
    shard_of = shard_of or {k: 1 if k in SHARD1 else 2 for k in ts}
    n = max(shard_of.values())
    files = {i: "%s-%05d-of-%05d.safetensors" % (name, i, n) for i in range(1, n + 1)}
    for i, f in files.items():
        part = {k: v for k, v in ts.items() if shard_of[k] == i}
        open(os.path.join(d, f), "wb").write(canonical(part, {"format": "pt"}))
    index = {"metadata": {"total_size": sum(len(v[2]) for v in ts.values())},
             "weight_map": weight_map if weight_map is not None else {k: files[shard_of[k]] for k in ts}}
    if index_extra:
        index.update(index_extra)
    p = os.path.join(d, name + ".safetensors.index.json")
    with open(p, "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")
    return p, files


def test_mount_by_index_and_dir(tmp):
    d = os.path.join(tmp, "hf")
    idx, files = make_set(d)
    ts = tensors()
    for src in (idx, d):
        with Mount(src, os.path.join(tmp, "m")) as m:
            root = xattrs(m)
            check(root.get("user.burnstore.format") == "safetensors-sharded", "format xattr: %r" % root)
            check(root.get("user.burnstore.meta.total_size") == str(sum(len(v[2]) for v in ts.values())),
                  "total_size at the root: %r" % root)
            check("user.burnstore.meta.format" not in root, "the shards' own metadata is not the model's")
            got = tensor_files(m)
            check(set(got) == {key_to_relpath(k) for k in ts}, "%s: the union of the shards: %s" % (src, sorted(got)))
            for k, (dt, shape, raw) in ts.items():
                p = os.path.join(m, key_to_relpath(k))
                if not os.path.exists(p):
                    continue
                check(open(p, "rb").read() == raw, "%s bytes" % k)
                x = xattrs(p)
                check(x.get("user.burnstore.dtype") == dt and json.loads(x.get("user.burnstore.shape")) == shape,
                      "%s dtype/shape %r" % (k, x))
                want = files[1] if k in SHARD1 else files[2]
                check(x.get("user.burnstore.shard") == want, "%s shard xattr %r != %r" % (k, x.get("user.burnstore.shard"), want))
    # Converted to one SafeTensors file: the union, canonical.
    out = os.path.join(tmp, "one.safetensors")
    with Mount(idx, os.path.join(tmp, "m"), opts="output=" + out) as m:
        u = m.unmount()
    check(u.returncode == 0, "sharded -> one file: %s" % u.stderr)
    got, meta = strict_read(out)
    check(got == ts, "the single file holds every tensor")
    check(meta == {"total_size": str(sum(len(v[2]) for v in ts.values()))}, "metadata: %r" % meta)


def refused(tmp, name, src, *needles):
    mnt = os.path.join(tmp, "r-" + name)
    os.makedirs(mnt, exist_ok=True)
    r = run([BIN, src, mnt])
    err = r.stderr.strip()
    ok = check(r.returncode != 0, "%s: refused (rc %d)" % (name, r.returncode))
    ok &= check(len(err.splitlines()) == 1, "%s: one line: %r" % (name, err))
    for n in needles:
        ok &= check(n in err, "%s: %r in %r" % (name, n, err))
    check(not is_mounted(mnt), "%s: nothing mounted" % name)
    force_unmount(mnt)
    return err


def test_errors(tmp):
    ts = tensors()
    # A missing shard.
    d = os.path.join(tmp, "missing")
    idx, files = make_set(d)
    os.remove(os.path.join(d, files[2]))
    refused(tmp, "missing", idx, files[2], "cannot open")
    # An unreadable shard (not SafeTensors).
    d = os.path.join(tmp, "garbage")
    idx, files = make_set(d)
    open(os.path.join(d, files[2]), "wb").write(b"\x00" * 64)
    refused(tmp, "garbage", idx, "shard " + files[2])
    # A tensor the map names but its shard lacks.
    d = os.path.join(tmp, "lacks")
    wm = {k: ("model-00001-of-00002.safetensors" if k in SHARD1 else "model-00002-of-00002.safetensors") for k in ts}
    wm["model.ghost"] = "model-00002-of-00002.safetensors"
    idx, files = make_set(d, weight_map=wm)
    refused(tmp, "lacks", idx, "'model.ghost'", "does not hold it", files[2])
    # A tensor in two shards.
    d = os.path.join(tmp, "two")
    idx, files = make_set(d)
    extra = dict({k: v for k, v in ts.items() if k not in SHARD1})
    extra["model.embed_tokens.weight"] = ts["model.embed_tokens.weight"]
    open(os.path.join(d, files[2]), "wb").write(canonical(extra, {"format": "pt"}))
    refused(tmp, "two", idx, "'model.embed_tokens.weight'", "two shards", files[1], files[2])
    # Paths that leave the index's directory.
    for name, bad in (("dotdot", "../outside.safetensors"), ("abs", "/etc/passwd"), ("deep", "sub/../../x.safetensors")):
        d = os.path.join(tmp, name)
        wm = {k: bad for k in ts}
        idx, _ = make_set(d, weight_map=wm)
        refused(tmp, name, idx, bad[:10], "directory")
    # Not an index: no weight_map (sniffed as unknown JSON), weight_map not an object.
    d = os.path.join(tmp, "notmap")
    os.makedirs(d)
    p = os.path.join(d, "x.safetensors.index.json")
    open(p, "w").write('{"weight_map": ["a"], "metadata": {}}')
    refused(tmp, "notmap", p, "weight_map")
    # Directories: none, or two indexes.
    e = os.path.join(tmp, "empty")
    os.makedirs(e)
    refused(tmp, "emptydir", e, "without a *.safetensors.index.json")
    d = os.path.join(tmp, "twoidx")
    make_set(d)
    make_set(d, name="other")
    refused(tmp, "twoidx", d, "more than one")
    # A shard tensor the map does not name: mounted, with a note.
    d = os.path.join(tmp, "unmapped")
    wm = {k: ("model-00001-of-00002.safetensors" if k in SHARD1 else "model-00002-of-00002.safetensors")
          for k in ts if k != "lm_head.weight"}
    idx, files = make_set(d, weight_map=wm)
    with Mount(idx, os.path.join(tmp, "mu")) as m:
        check(os.path.exists(os.path.join(m, "lm_head", "weight")), "unmapped tensor mounted")
        notes = xattrs(m).get("user.burnstore.notes", "")
        check("'lm_head.weight'" in notes and "not in the weight_map" in notes, "note: %r" % notes)


def test_mount_reads_headers_only(tmp):
    """Four shards of 2 GiB each (sparse): mounting reads their headers only."""
    d = os.path.join(tmp, "big")
    os.makedirs(d)
    wm = {}
    for i in range(1, 5):
        name = "model-%05d-of-00004.safetensors" % i
        n = 2 << 30
        h = json.dumps({"__metadata__": {"format": "pt"},
                        "layers.%d.w" % i: {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}},
                       separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        p = os.path.join(d, name)
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
        os.truncate(p, 8 + len(h) + n)
        wm["layers.%d.w" % i] = name
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 4 * (2 << 30)}, "weight_map": wm}, f)
    t0 = time.monotonic()
    with Mount(d, os.path.join(tmp, "mb")) as m:
        took = time.monotonic() - t0
        check(os.path.getsize(os.path.join(m, "layers", "3", "w")) == 2 << 30, "size of a 2 GiB tensor")
        with open(os.path.join(m, "layers", "4", "w"), "rb") as f:
            f.seek((2 << 30) - 4)
            check(f.read() == b"\0\0\0\0", "read at the end of the last shard")
    check(took < 3.0, "mounting 8 GiB of shards took %.2f s (headers only)" % took)
    print("mount of 4 x 2 GiB sparse shards: %.3f s" % took)


def main():
    with tmpdir("shard") as tmp:
        for t in (test_mount_by_index_and_dir, test_errors, test_mount_reads_headers_only):
            d = os.path.join(tmp, t.__name__)
            os.makedirs(d)
            try:
                t(d)
            except Exception as e:
                check(False, "%s raised %r" % (t.__name__, e))
    finish("test_sharded")


if __name__ == "__main__":
    main()
