"""The xattr table through real mounts: the reserved user.burnstore.
namespace (unknown, out-of-scope and computed names are never stored), the
writers' metadata rules at setxattr time (non-UTF-8 and NUL values refused
with EINVAL, the target untouched), the memory of GGUF metadata edits, and a
root with 5,000 GGUF keys that getfattr -d and rsync -aX can copy."""
import errno
import os
import sys
import time

from bsmount import (BIN, SOURCE_DIR, Mount, check, foreground_mount, mem_limit_kb, run, run_tests, vmhwm_kb,
                     xattrs)
from test_sharded import make_set
from test_st_write import canonical

sys.path.insert(0, os.path.join(SOURCE_DIR, "tests/support"))
import gguf_fixture as G  # noqa: E402

X = "user.burnstore."


def errno_of(fn, *args):
    try:
        fn(*args)
        return 0
    except OSError as e:
        return e.errno


def sources(tmp):
    """One checkpoint of each writable format: (name, path to mount, a file in it)."""
    import numpy as np
    st = os.path.join(tmp, "x.safetensors")
    open(st, "wb").write(canonical({"enc.w": ("F32", [2, 2], np.arange(4, dtype="<f4").tobytes())},
                                   {"author": "me"}))
    bpk = os.path.join(tmp, "x.bpk")
    r = run([BIN, "convert", st, bpk])
    check(r.returncode == 0, "convert to .bpk: %r" % r.stderr)
    idx, _ = make_set(os.path.join(tmp, "hf"))
    gg = os.path.join(tmp, "x.gguf")
    G.write(gg, [("general.name", G.VSTRING, "tiny"), ("k.u32", G.VU32, 7)],
            [("enc.w", 0, [2, 2], np.arange(4, dtype="<f4").tobytes())])
    return [("burnpack", bpk, "enc/w"), ("safetensors", st, "enc/w"),
            ("sharded", idx, "model/layers/0/self_attn/q_proj/weight"), ("gguf", gg, "enc/w")]


def test_reserved_names(tmp):
    for fmt, src, f in sources(tmp):
        before = open(src, "rb").read()
        mnt = os.path.join(tmp, "m-" + fmt)
        with Mount(src, mnt) as m:
            p = os.path.join(m, f)
            check(errno_of(os.setxattr, p, X + "dtype", b"F16") == errno.EROFS, "%s: read-only mount: EROFS" % fmt)
        with Mount(src, mnt, opts="rw") as m:
            p = os.path.join(m, f)
            d = os.path.dirname(p)
            for path, name in ((p, X + "bogus"), (m, X + "bogus"), (d, X + "dtype"), (p, X + "meta.k"),
                               (p, X + "format"), (m, X + "shard"), (d, X + "meta.k")):
                check(errno_of(os.setxattr, path, name, b"x") == errno.EPERM,
                      "%s: setxattr %s on %s: EPERM" % (fmt, name, os.path.relpath(path, m)))
                check(errno_of(os.getxattr, path, name) == errno.ENODATA, "%s: %s not stored" % (fmt, name))
                check(name not in os.listxattr(path), "%s: %s not listed" % (fmt, name))
            # setfattr, as a user types it
            r = run(["setfattr", "-n", X + "shard", "-v", "x", p])
            names = os.listxattr(p)
            if fmt == "sharded":
                check(r.returncode != 0 and "not permitted" in r.stderr,
                      "setfattr of a file's shard to another value is refused: %r" % r.stderr)
                shard = os.getxattr(p, X + "shard").decode()
                check(shard == "model-00001-of-00002.safetensors", "the real shard still shows: %r" % shard)
                check(names.count(X + "shard") == 1, "listed once: %r" % names)
                r = run(["setfattr", "-n", X + "shard", "-v", shard, p])
                check(r.returncode == 0, "its own value (a copy between mounts) is accepted: %r" % r.stderr)
            else:
                check(r.returncode == 0, "%s: a file with no shard takes a copy's (rsync -aX): %r" % (fmt, r.stderr))
                check(X + "shard" not in names and errno_of(os.getxattr, p, X + "shard") == errno.ENODATA,
                      "%s: and keeps nothing: %r" % (fmt, names))
            # key and format: the destination decides, a copy's value is dropped
            os.setxattr(p, X + "key", b"some.other.key")
            check(os.getxattr(p, X + "key") != b"some.other.key", "%s: key not stored" % fmt)
            os.setxattr(m, X + "format", b"pytorch")
            check(os.getxattr(m, X + "format") != b"pytorch", "%s: format not stored" % fmt)
            # foreign user.* names keep working
            os.setxattr(p, "user.rsync.junk", b"1")
            check(os.getxattr(p, "user.rsync.junk") == b"1", "%s: a foreign user.* name is kept" % fmt)
            r = run(["getfattr", "-d", "-m", "-", p])
            check(r.returncode == 0 and "bogus" not in r.stdout and "some.other" not in r.stdout,
                  "%s: getfattr -d shows no fake value: %r" % (fmt, r.stdout))
            u = m.unmount()
            check(u.returncode == 0, "%s: unmount: %r" % (fmt, u.stderr))
        check(open(src, "rb").read() == before, "%s: nothing to write back, the file is untouched" % fmt)


def test_root_into_a_subdirectory(tmp):
    """The guide: a root copied into a subdirectory of another mount is
    refused its root names (rsync exits 23) unless they are filtered out;
    with the filter the files keep their dtype and shape."""
    fmt, src, f = sources(tmp)[1]
    with Mount(src, os.path.join(tmp, "ra")) as a, Mount(os.path.join(tmp, "sub.bpk"), os.path.join(tmp, "rb")) as b:
        r = run(["rsync", "-aX", a + "/", os.path.join(b, "plain") + "/"])
        check(r.returncode == 23 and "user.burnstore.format" in r.stderr, "unfiltered: %r" % r.stderr[-300:])
        r = run(["rsync", "-aX", "--filter=-x user.burnstore.[fmnv]*", a + "/", os.path.join(b, "sub") + "/"])
        check(r.returncode == 0, "filtered rsync: %r" % r.stderr[-300:])
        x = xattrs(os.path.join(b, "sub", f))
        check(x.get(X + "dtype") == "F32" and x.get(X + "shape") == "[2,2]", "dtype and shape copied: %r" % x)
        check(X + "format" not in xattrs(os.path.join(b, "sub")), "no root name on the subdirectory")
        u = b.unmount()
        check(u.returncode == 0, "write-back: %r" % u.stderr)


def test_metadata_values_checked_at_the_edge(tmp):
    """A value the target's reader would refuse is refused at setxattr
    (EINVAL), so the write-back never writes an unreadable checkpoint."""
    for fmt, src, f in sources(tmp):
        mnt = os.path.join(tmp, "e-" + fmt)
        key, old = {"gguf": ("general.name", "tiny"), "sharded": ("author", None)}.get(fmt, ("author", "me"))
        before = open(src, "rb").read()
        with Mount(src, mnt, opts="rw") as m:
            cases = [(key, b"a\0b", "a NUL"), (key, b"caf\xe9", "not UTF-8"), ("new", b"\xff", "not UTF-8, new key")]
            if fmt == "gguf":
                cases.append(("k.u32", b"seven", "not a uint32"))
            for k, v, what in cases:
                check(errno_of(os.setxattr, m, X + "meta." + k, v) == errno.EINVAL,
                      "%s: %s refused with EINVAL" % (fmt, what))
            check(errno_of(os.setxattr, m, X + "meta.caf\udce9", b"v") == errno.EINVAL,
                  "%s: a key that is not UTF-8 refused" % fmt)
            check(errno_of(os.getxattr, m, X + "meta.new") == errno.ENODATA, "%s: nothing kept" % fmt)
            u = m.unmount()
            check(u.returncode == 0, "%s: unmount: %r" % (fmt, u.stderr))
        check(open(src, "rb").read() == before, "%s: refused values leave the target untouched" % fmt)
        with Mount(src, mnt, opts="rw") as m:
            os.setxattr(m, X + "meta.k2", "café".encode())  # UTF-8 is fine
            check(os.getxattr(m, X + "meta.k2") == "café".encode(), "%s: UTF-8 kept" % fmt)
            u = m.unmount()
            check(u.returncode == 0, "%s: write-back: %r" % (fmt, u.stderr))
        with Mount(src, mnt) as m:  # the target reads back
            root = xattrs(m)
            check(root.get(X + "meta." + key) == old, "%s: %s unchanged: %r" % (fmt, key, root.get(X + "meta." + key)))
            check(root.get(X + "meta.k2") == "café", "%s: the good value written" % fmt)


def test_gguf_edits_cost_memory_of_the_edit(tmp):
    """Three setxattr on a GGUF holding one 8 MB string: the daemon's peak
    memory grows by little, not by a re-parse of the header per call."""
    src = os.path.join(tmp, "big.gguf")
    G.write(src, [("general.name", G.VSTRING, "n"), ("big", G.VSTRING, "x" * (8 << 20)), ("k.u32", G.VU32, 1)],
            [("w", 0, [2], b"\0" * 8)])
    with foreground_mount(src, os.path.join(tmp, "mem"), "rw") as p:
        mnt = os.path.join(tmp, "mem")
        os.listxattr(mnt)
        base = vmhwm_kb(p.pid)
        t0 = time.time()
        for i, (k, v) in enumerate(((b"general.name", b"renamed"), (b"k.u32", b"12"), (b"general.name", b"again"))):
            os.setxattr(mnt, X + "meta." + k.decode(), v)
        dt = time.time() - t0
        grew = vmhwm_kb(p.pid) - base
        print("VmHWM after mount %d kB, +%d kB after 3 setxattr (%.3f s)" % (base, grew, dt))
        check(grew < mem_limit_kb(4096), "3 setxattr grew the daemon's peak by %d kB" % grew)
        check(os.getxattr(mnt, X + "meta.k.u32") == b"12", "the value set")
    check(p.returncode == 0, "the daemon wrote back and exited 0: %r" % p.stderr.read()[-500:])
    kv = G.Reader(src).kv
    check(kv["general.name"] == (G.VSTRING, "again") and kv["k.u32"] == (G.VU32, 12), "written back typed")
    check(kv["big"] == (G.VSTRING, "x" * (8 << 20)), "the big string kept whole")


def test_root_with_5000_keys(tmp):
    """listxattr of a root with 5,000 GGUF keys fits what the kernel takes,
    so getfattr -d and rsync -aX of the root work; every key still answers."""
    src = os.path.join(tmp, "keys.gguf")
    kvs = [("general.name", G.VSTRING, "many")]
    kvs += [("tokenizer.ggml.some_key_%05d" % i, G.VU32, i) for i in range(5000)]
    kvs.append(("tokenizer.ggml.tokens", G.VARRAY, (G.VSTRING, ["tok%05d" % i for i in range(12000)])))
    G.write(src, kvs, [("w", 0, [2], b"\0" * 8)])
    with Mount(src, os.path.join(tmp, "a")) as a:
        names = os.listxattr(a)
        check(sum(len(n) + 1 for n in names) <= 65536, "the listing fits XATTR_LIST_MAX")
        check(len(names) > 1000, "as many keys as fit are listed: %d" % len(names))
        check(os.getxattr(a, X + "meta.tokenizer.ggml.some_key_04999") == b"4999", "an unlisted key answers")
        r = run(["getfattr", "-d", "-m", "-", a])
        check(r.returncode == 0, "getfattr -d of the root: %r" % r.stderr[-300:])
        with Mount(os.path.join(tmp, "copy.bpk"), os.path.join(tmp, "b")) as b:
            r = run(["rsync", "-aX", a + "/", b + "/"], timeout=300)
            check(r.returncode == 0, "rsync -aX of the root: %r" % r.stderr[-500:])
            check(os.getxattr(b, X + "meta.general.name") == b"many", "the listed metadata copied")
            u = b.unmount()
            check(u.returncode == 0, "write-back of the copy: %r" % u.stderr)


if __name__ == "__main__":
    run_tests("test_xattr", [test_reserved_names, test_root_into_a_subdirectory, test_metadata_values_checked_at_the_edge,
                             test_gguf_edits_cost_memory_of_the_edit, test_root_with_5000_keys], "xattr")
