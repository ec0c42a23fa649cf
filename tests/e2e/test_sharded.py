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
import subprocess
import time

from bsmount import (BIN, Mount, check, daemon_pid, finish, force_unmount, is_mounted, key_to_relpath, run,
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


def snapshot(d):
    return {f: (open(os.path.join(d, f), "rb").read(), os.stat(os.path.join(d, f)).st_mtime_ns)
            for f in sorted(os.listdir(d)) if not f.startswith(".")}


def read_set(index):
    """The union of a shard set by the strict reader; the index; each shard's metadata."""
    d = os.path.dirname(index)
    ix = json.load(open(index))
    out, metas = {}, {}
    for shard in sorted(set(ix["weight_map"].values())):
        t, m = strict_read(os.path.join(d, shard))
        metas[shard] = m
        for k, v in t.items():
            check(ix["weight_map"].get(k) == shard, "%s: %s is where the map says" % (index, k))
            out[k] = v
    check(set(out) == set(ix["weight_map"]), "every mapped tensor is in its shard")
    check(ix["metadata"]["total_size"] == sum(len(v[2]) for v in out.values()), "total_size")
    return out, ix, metas


def test_sharded_out(tmp):
    import numpy as np
    ts = tensors()
    d = os.path.join(tmp, "hf")
    idx, files = make_set(d)
    before = snapshot(d)
    mnt = os.path.join(tmp, "m")
    # rw with no change: no shard rewritten, the index byte for byte the same.
    with Mount(idx, mnt, opts="rw") as m:
        u = m.unmount()
    check(u.returncode == 0, "rw, no change: %s" % u.stderr)
    check(snapshot(d) == before, "rw with no change rewrites nothing (same bytes, same mtimes of shards): %r"
          % [f for f in before if snapshot(d).get(f) != before[f]])
    # rw editing one tensor of shard 2: only shard 2 (and the index) rewritten.
    with Mount(idx, mnt, opts="rw") as m:
        with open(os.path.join(m, "model", "norm", "weight"), "r+b") as f:
            f.write(np.array([7], dtype="<f2").tobytes())
        with open(os.path.join(m, "extra"), "wb") as f:
            f.write(b"abc")
        u = m.unmount()
    check(u.returncode == 0, "rw edit: %s" % u.stderr)
    after = snapshot(d)
    check(after[files[1]] == before[files[1]], "shard 1 untouched (bytes and mtime)")
    check(after[files[2]][0] != before[files[2]][0], "shard 2 rewritten")
    got, ix, metas = read_set(idx)
    want = dict(ts)
    nw = bytearray(ts["model.norm.weight"][2])
    nw[0:2] = np.array([7], dtype="<f2").tobytes()
    want["model.norm.weight"] = ("F16", [4], bytes(nw))
    want["extra"] = ("U8", [3], b"abc")
    check(got == want, "the edited set: %s" % sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k)))
    check(ix["weight_map"]["extra"] == files[2], "a new tensor goes to the last shard")
    check(all(m == {"format": "pt"} for m in metas.values()), "shards keep format=pt: %r" % metas)
    check(open(idx).read() == json.dumps(ix, indent=2, sort_keys=True) + "\n", "the index as transformers writes it")
    # Reshard in place: -o rw,max_shard_size=100 -> more, smaller shards; the old ones go.
    with Mount(idx, mnt, opts="rw,max_shard_size=100") as m:
        u = m.unmount()
    check(u.returncode == 0, "reshard: %s" % u.stderr)
    got2, ix2, _ = read_set(idx)
    check(got2 == want, "reshard keeps every tensor")
    n = len(set(ix2["weight_map"].values()))
    check(n >= 3 and all(f.startswith("model-") and f.endswith("-of-%05d.safetensors" % n)
                         for f in ix2["weight_map"].values()), "resharded into %d: %r" % (n, ix2["weight_map"]))
    left = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    check(left == sorted(set(ix2["weight_map"].values())), "old shards removed: %r" % left)

    # Conversion of a single file (and of a .pth) into shards: output=x.safetensors,max_shard_size=.
    one = os.path.join(tmp, "one.safetensors")
    open(one, "wb").write(canonical(ts, {"format": "pt"}))
    outd = os.path.join(tmp, "out")
    os.makedirs(outd)
    with Mount(one, mnt, opts="output=%s/model.safetensors,max_shard_size=1KB" % outd) as m:
        u = m.unmount()
    check(u.returncode == 0, "st -> shards: %s" % u.stderr)
    got3, ix3, _ = read_set(os.path.join(outd, "model.safetensors.index.json"))
    check(got3 == ts, "st -> shards: every tensor")
    check(not os.path.exists(os.path.join(outd, "model.safetensors")), "no single file besides the set")
    # ... and the shard set mounts back as the same model.
    with Mount(outd, mnt) as m:
        files_ = tensor_files(m)
        check(set(files_) == {key_to_relpath(k) for k in ts}, "the written set mounts")
    # rw of a single file with max_shard_size: the set replaces the file.
    inplace = os.path.join(tmp, "inplace")
    os.makedirs(inplace)
    single = os.path.join(inplace, "w.safetensors")
    open(single, "wb").write(canonical(ts, {"format": "pt"}))
    with Mount(single, mnt, opts="rw,max_shard_size=100") as m:
        u = m.unmount()
    check(u.returncode == 0, "rw,max_shard_size on one file: %s" % u.stderr)
    check(not os.path.exists(single), "the single file is replaced by the set")
    got5, _, _ = read_set(os.path.join(inplace, "w.safetensors.index.json"))
    check(got5 == ts, "rw,max_shard_size: every tensor in the set")
    # A new sharded checkpoint: burnstore NEW.safetensors.index.json MNT.
    newd = os.path.join(tmp, "new")
    os.makedirs(newd)
    new = os.path.join(newd, "m.safetensors.index.json")
    with Mount(new, mnt, opts="max_shard_size=16") as m:
        for i in range(3):
            with open(os.path.join(m, "t%d" % i), "wb") as f:
                f.write(bytes([i]) * 12)
        u = m.unmount()
    check(u.returncode == 0, "new sharded: %s" % u.stderr)
    got4, ix4, _ = read_set(new)
    check(len(set(ix4["weight_map"].values())) == 3 and len(got4) == 3, "3 shards of 12 bytes under 16")
    # max_shard_size on a Burnpack output is refused.
    r = run([BIN, one, mnt, "-o", "output=%s/x.bpk,max_shard_size=1GB" % tmp])
    force_unmount(mnt)
    check(r.returncode != 0 and "max_shard_size" in r.stderr, "max_shard_size on .bpk: %r" % r.stderr)
    r = run([BIN, one, mnt, "-o", "output=%s/x.safetensors,max_shard_size=5XB" % tmp])
    force_unmount(mnt)
    check(r.returncode != 0 and "max_shard_size=5XB" in r.stderr, "a bad size: %r" % r.stderr)
    # one size grammar with http_cache=: 16M (binary) as well as 16MB; 0 is no size
    out = os.path.join(tmp, "binary", "b.safetensors.index.json")
    os.makedirs(os.path.dirname(out))
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=16M", one, out])
    check(r.returncode == 0 and os.path.exists(out), "convert -o max_shard_size=16M: %r" % r.stderr)
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=0", one, out])
    check(r.returncode == 2 and "max_shard_size=0" in r.stderr, "max_shard_size=0: %r" % r.stderr)


def test_set_commit_is_atomic(tmp):
    """ENOSPC while the new set is written: the old set stays as it was."""
    import numpy as np
    small = os.path.join(tmp, "small")
    os.makedirs(small)
    r = run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", small])
    if not check(r.returncode == 0, "mount a small tmpfs: %s" % r.stderr):
        return
    try:
        ts = {"a": ("U8", [30000], bytes(30000)), "b": ("U8", [30000], bytes(30000))}
        idx, files = make_set(small, ts=ts, shard_of={"a": 1, "b": 2})
        before = snapshot(small)
        stg = os.path.join(tmp, "stg")
        os.makedirs(stg)
        with Mount(idx, os.path.join(tmp, "m"), opts="rw,staging=" + stg) as m:
            for k in ("a", "b"):
                with open(os.path.join(m, k), "r+b") as f:
                    f.write(b"\x01" * 30000)
            u = m.unmount()
        check(u.returncode != 0 and "no space" in u.stderr.lower(), "the set does not fit: %r" % u.stderr)
        check(snapshot(small) == before, "the old set is intact: %r" % sorted(snapshot(small)))
        left = os.listdir(stg)
        if check(len(left) == 1, "staging kept for --finish"):
            run(["mount", "-o", "remount,size=4m", small])
            r = run([BIN, "--finish", os.path.join(stg, left[0])])
            check(r.returncode == 0, "--finish: %s" % r.stderr)
            got, _, _ = read_set(idx)
            check(got == {"a": ("U8", [30000], b"\x01" * 30000), "b": ("U8", [30000], b"\x01" * 30000)},
                  "--finish wrote the new set")
    finally:
        run(["umount", small])
        if is_mounted(small):
            run(["umount", "-l", small])


def test_many_shards_few_fds(tmp):
    """1,100 shards under `ulimit -n 1024` (issue 18): ls, a mount that reads every tensor, and
    convert all work, with the shards' fds from a bounded pool (the daemon holds far fewer)."""
    import resource
    import numpy as np
    n = 1100
    ts = {"layers.%04d.w" % i: ("F32", [2], np.array([i, -i], dtype="<f4").tobytes()) for i in range(n)}
    shard_of = {"layers.%04d.w" % i: i + 1 for i in range(n)}
    idx, files = make_set(os.path.join(tmp, "many"), ts, shard_of)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        r = run([BIN, "ls", idx])
        check(r.returncode == 0, "ls of %d shards: rc %d: %s" % (n, r.returncode, r.stderr.strip()))
        check(len(r.stdout.splitlines()) == n, "ls lists %d tensors" % len(r.stdout.splitlines()))
        with Mount(idx, os.path.join(tmp, "m")) as m:
            bad = [k for k, v in ts.items() if open(os.path.join(m, key_to_relpath(k)), "rb").read() != v[2]]
            check(not bad, "every tensor of %d shards reads back (%d differ: %s)" % (n, len(bad), bad[:3]))
            pid = daemon_pid(m)
            nfd = len(os.listdir("/proc/%d/fd" % pid)) if pid else -1
            check(0 < nfd <= 100, "the daemon holds %d fds for %d shards" % (nfd, n))
        out = os.path.join(tmp, "one.safetensors")
        r = run([BIN, "convert", idx, out])
        check(r.returncode == 0, "convert of %d shards: rc %d: %s" % (n, r.returncode, r.stderr.strip()))
        if r.returncode == 0:
            got, _ = strict_read(out)
            check(got == ts, "the converted file holds every tensor")
            # ... and back into 1,100 shards: the writer syncs and closes each
            # shard's temp file as it goes (it held two fds a shard until the
            # commit, and failed near shard 500).
            back = os.path.join(tmp, "back", "model.safetensors.index.json")
            os.makedirs(os.path.dirname(back))
            r = run([BIN, "convert", "-o", "max_shard_size=8", out, back])
            nshards = len([f for f in os.listdir(os.path.dirname(back)) if f.startswith("model-")])
            check(r.returncode == 0 and nshards == n,
                  "convert into %d shards: rc %d, %d shards: %s" % (n, r.returncode, nshards, r.stderr.strip()))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_not_regular_files(tmp):
    """A FIFO, a device or a directory, as the source or as a shard (issue 18): refused in one
    line naming what it is, before open can block on it; every command under a deadline."""
    fifo = os.path.join(tmp, "pipe.safetensors")
    os.mkfifo(fifo)
    cases = [("fifo-source", fifo, None, "is a FIFO"), ("device-source", "/dev/zero", None, "is a character device")]
    for kind, make, needle in (("fifo", os.mkfifo, "is a FIFO"),
                               ("device", lambda p: os.symlink("/dev/zero", p), "is a character device"),
                               ("directory", os.mkdir, "is a directory")):
        idx, files = make_set(os.path.join(tmp, kind))
        p = os.path.join(tmp, kind, files[2])
        os.remove(p)
        make(p)
        cases.append((kind + "-shard", idx, files[2], needle))
    for name, src, shard, needle in cases:
        try:
            r = run([BIN, "ls", src], timeout=20)
        except subprocess.TimeoutExpired:
            check(False, "%s: ls hangs" % name)
            continue
        err = r.stderr.strip()
        check(r.returncode != 0 and len(err.splitlines()) == 1 and needle in err and (not shard or shard in err),
              "%s: ls refuses in one line (rc %d): %r" % (name, r.returncode, err))
        try:
            refused(tmp, name, src, needle, *([shard] if shard else []))
        except subprocess.TimeoutExpired:
            check(False, "%s: the mount hangs" % name)


def main():
    with tmpdir("shard") as tmp:
        for t in (test_mount_by_index_and_dir, test_errors, test_mount_reads_headers_only, test_sharded_out,
                  test_set_commit_is_atomic, test_many_shards_few_fds, test_not_regular_files):
            d = os.path.join(tmp, t.__name__)
            os.makedirs(d)
            try:
                t(d)
            except Exception as e:
                check(False, "%s raised %r" % (t.__name__, e))
    finish("test_sharded")


if __name__ == "__main__":
    main()
