"""Odd names written into a writable mount of each output format (issue 18,
"validate at the edge"): every name either reads back exactly, through an
independent reader of the format, or is refused when it is created or
renamed (EINVAL, EEXIST, ENAMETOOLONG), and the file it was meant for is
not written. A name that gets past creation but not the format (a directory
renamed so that a GGUF key grows past 63 bytes) fails the write-back before
anything is replaced: the target keeps its bytes."""
import errno
import glob
import json
import os
import shutil
import struct
import sys

import subprocess

from bsmount import (BIN, SOURCE_DIR, Mount, check, force_unmount, foreground_mount, is_mounted, read_bpk,
                     read_safetensors, run, run_tests)

sys.path.insert(0, os.path.join(SOURCE_DIR, "tests/support"))
import gguf_fixture as G  # noqa: E402

F32 = struct.pack("<2f", 1.5, -2.0)
BASE = {"enc.w": F32, "head": struct.pack("<2f", 3.0, 4.0)}
FORMATS = [("bpk", "m.bpk"), ("st", "m.safetensors"), ("sharded", "m.safetensors.index.json"),
           ("gguf", "m.gguf")]


def write_base(path):
    header, off, blob = {}, 0, b""
    for k, raw in BASE.items():
        header[k] = {"dtype": "F32", "shape": [2], "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob += raw
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


def read_any(fmt, path):
    """key -> bytes, by a reader that shares no code with burnstore (and
    decodes names strictly: a name that is not UTF-8 raises)."""
    if fmt == "bpk":
        return {k: v[2] for k, v in read_bpk(path)[0].items()}
    if fmt == "st":
        return {k: v[2] for k, v in read_safetensors(path)[0].items()}
    if fmt == "sharded":
        wm = json.load(open(path))["weight_map"]
        out = {}
        for shard in sorted(set(wm.values())):
            for k, v in read_safetensors(os.path.join(os.path.dirname(path), shard))[0].items():
                check(wm.get(k) == shard, "sharded: %r is in the index under its shard" % k)
                out[k] = v[2]
        check(set(out) == set(wm), "sharded: the index names exactly the shards' tensors")
        return out
    return {k: t["data"] for k, t in G.Reader(path).tensors.items()}


def snapshot(d):
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))
            if not f.startswith(".")}


def tensor(path, data=F32):
    with open(path, "xb") as f:
        f.write(data)
    os.setxattr(path, "user.burnstore.dtype", b"F32")


def expect(fn, want, what):
    """fn() succeeds (want None) or fails with errno want."""
    try:
        fn()
        return check(want is None, "%s: succeeded, expected %s" % (what, errno.errorcode.get(want)))
    except OSError as e:
        return check(e.errno == want, "%s: %s, expected %s" % (
            what, errno.errorcode.get(e.errno), errno.errorcode.get(want) if want else "success"))


def odd_names(fmt):
    """(path under the mount, errno or None, key it becomes or None)."""
    gguf, st = fmt == "gguf", fmt in ("st", "sharded")
    return [
        # Accepted everywhere: text with control bytes, UTF-8, escapes.
        (b"ctl\x01\x1f", None, "ctl\x01\x1f"),
        (b"nl\nname", None, "nl\nname"),
        ("caf\u00e9".encode(), None, "caf\u00e9"),
        ("\U0001F600".encode(), None, "\U0001F600"),
        (b"50%25", None, "50%"),
        (b"x%2Fy", None, "x/y"),
        (b"N" * 63, None, "N" * 63),
        (b"enc/" + b"n" * 59, None, "enc." + "n" * 59),
        # Names a reader of some formats refuses.
        (b"L" * 255, errno.EINVAL if gguf else None, None if gguf else "L" * 255),
        (b"enc/" + b"n" * 60, errno.EINVAL if gguf else None, None if gguf else "enc." + "n" * 60),
        (b"__metadata__", errno.EINVAL if st else None, None if st else "__metadata__"),
        # Refused everywhere: not UTF-8, a NUL, not an escape, two names for
        # one key, over NAME_MAX.
        (b"caf\xe9", errno.EINVAL, None),
        (b"enc/\xff\xfe", errno.EINVAL, None),
        (b"\xed\xa0\x80", errno.EINVAL, None),  # a UTF-16 surrogate
        (b"a%00b", errno.EINVAL, None),
        (b"bad%zz", errno.EINVAL, None),
        (b"%65nc2", errno.EINVAL, None),  # "enc2", spelled with an escape
        (b"a%2Eb", errno.EINVAL, None),  # "a.b", spelled with an escape
        (b"enc.w", errno.EEXIST, None),  # the key of enc/w
        (b"L" * 256, errno.ENAMETOOLONG, None),
    ]


def test_matrix(tmp):
    base = os.path.join(tmp, "base.safetensors")
    write_base(base)
    for fmt, name in FORMATS:
        d = os.path.join(tmp, fmt)
        os.makedirs(d)
        target = os.path.join(d, name)
        r = run([BIN, "convert", "-q", base, target])
        if not check(r.returncode == 0, "%s: convert the source: %s" % (fmt, r.stderr)):
            continue
        mnt = os.path.join(tmp, fmt + "-mnt")
        want = dict(BASE)
        with Mount(target, mnt, opts="rw") as m:
            mb = os.fsencode(mnt)
            for rel, err, key in odd_names(fmt):
                p = os.path.join(mb, rel)
                if expect(lambda: tensor(p), err, "%s: create %r" % (fmt, rel[:40])) and key:
                    want[key] = F32
                if err:
                    check(not os.path.lexists(p), "%s: refused %r left no file" % (fmt, rel[:40]))
            expect(lambda: os.mkdir(os.path.join(mb, b"dir\xe9")), errno.EINVAL,
                   fmt + ": mkdir of a name that is not UTF-8")
            expect(lambda: os.mkdir(os.path.join(mb, b"%64ir")), errno.EINVAL,
                   fmt + ": mkdir of an escaped plain name")
            # A dotted file beside the directories its key would name.
            os.mkdir(os.path.join(mb, b"q"))
            tensor(os.path.join(mb, b"q", b"r"))
            want["q.r"] = F32
            expect(lambda: tensor(os.path.join(mb, b"q.r")), errno.EEXIST, fmt + ": q.r beside q/r")
            tensor(os.path.join(mb, b"s.t"))
            want["s.t"] = F32
            os.mkdir(os.path.join(mb, b"s"))
            expect(lambda: tensor(os.path.join(mb, b"s", b"t")), errno.EEXIST, fmt + ": s/t beside s.t")
            # Renames are checked like creations; a refused one leaves the file.
            w = os.path.join(mb, b"enc", b"w")
            expect(lambda: os.rename(w, os.path.join(mb, b"w\xff")), errno.EINVAL,
                   fmt + ": rename to a name that is not UTF-8")
            expect(lambda: os.rename(w, os.path.join(mb, b"head%2Ex")), errno.EINVAL,
                   fmt + ": rename to an escaped dot")
            check(os.path.exists(w), fmt + ": enc/w still there after refused renames")
            expect(lambda: os.rename(os.path.join(mb, b"head"), os.path.join(mb, b"h\xc3\xa9ad")),
                   None, fmt + ": rename to a UTF-8 name")
            want["h\u00e9ad"] = want.pop("head")
            # Replacing a file by rename is no collision.
            tensor(os.path.join(mb, b"tmpfile"), struct.pack("<2f", 7.0, 8.0))
            expect(lambda: os.rename(os.path.join(mb, b"tmpfile"), os.path.join(mb, b"ctl\x01\x1f")),
                   None, fmt + ": rename over an existing file")
            want["ctl\x01\x1f"] = struct.pack("<2f", 7.0, 8.0)
            u = m.unmount()
            check(u is not None and u.returncode == 0, "%s: write-back: %s" % (fmt, u and u.stderr))
        try:
            got = read_any(fmt, target)
        except Exception as e:  # a name the reader refuses lands here
            check(False, "%s: the output does not read back: %r" % (fmt, e))
            continue
        check(set(got) == set(want), "%s: keys: extra %r, missing %r" % (
            fmt, sorted(set(got) - set(want)), sorted(set(want) - set(got))))
        for k in set(got) & set(want):
            check(got[k] == want[k], "%s: bytes of %r" % (fmt, k))
        r = run([BIN, "ls", "--json", target])
        check(r.returncode == 0, "%s: burnstore ls reads the output: %s" % (fmt, r.stderr))


def test_writeback_refuses_before_replacing(tmp):
    """A directory renamed so that a key outgrows GGUF's 63 bytes: the
    rename passes (the directory's own key fits), the write-back refuses
    naming the key, and the target is untouched."""
    base = os.path.join(tmp, "base2.safetensors")
    write_base(base)
    d = os.path.join(tmp, "guard")
    os.makedirs(d)
    target = os.path.join(d, "m.gguf")
    r = run([BIN, "convert", "-q", base, target])
    check(r.returncode == 0, "convert: %s" % r.stderr)
    before = snapshot(d)
    mnt = os.path.join(tmp, "guard-mnt")
    with Mount(target, mnt, opts="rw") as m:
        os.rename(os.path.join(mnt, "enc"), os.path.join(mnt, "e" * 62))
        u = m.unmount()
        check(u.returncode != 0, "write-back of a 64-byte GGUF name fails")
        check("e" * 62 + ".w" in u.stderr and "63" in u.stderr, "-u names the key and the limit: %r" % u.stderr)
    check(snapshot(d) == before, "the target is untouched")
    for s in glob.glob(os.path.join(d, ".m.gguf.staging-*")):
        shutil.rmtree(s)


def test_convert_refuses_a_key_the_target_cannot_hold(tmp):
    """convert of a GGUF whose tensor name is not UTF-8: one line naming the
    input and the key, exit 1, no output file."""
    src = os.path.join(tmp, "latin1.gguf")
    G.write(src, [], [(b"caf\xe9", 0, [2], F32), (b"ok", 0, [2], F32)])
    for out in ("o.safetensors", "o.bpk", "o.gguf", "o.safetensors.index.json"):
        p = os.path.join(tmp, out)
        r = run([BIN, "convert", "-q", src, p])
        check(r.returncode == 1, "convert to %s exits 1: %d" % (out, r.returncode))
        lines = r.stderr.strip().split("\n")
        check(len(lines) == 1 and src in lines[0] and "caf\\xe9" in lines[0] and "UTF-8" in lines[0],
              "convert to %s: one line naming file and key: %r" % (out, r.stderr))
        check(not os.path.exists(p), "no %s written" % out)
    # With the key renamed away it converts.
    p = os.path.join(tmp, "o2.safetensors")
    r = run([BIN, "convert", "-q", "-o", "exclude=^caf", src, p])
    check(r.returncode == 0 and set(read_safetensors(p)[0]) == {"ok"}, "exclude= leaves it out: %s" % r.stderr)
    # A writable mount of such a file is refused up front, naming the key.
    mnt = os.path.join(tmp, "latin1-mnt")
    os.makedirs(mnt)
    r = run([BIN, src, mnt, "-o", "rw"])
    check(r.returncode != 0 and "caf\\xe9" in r.stderr, "rw mount refused: %r" % r.stderr)


def test_refusal_is_logged(tmp):
    """The daemon says why, in one line of its log (stderr with -f)."""
    mnt = os.path.join(tmp, "log-mnt")
    os.makedirs(mnt)
    with foreground_mount(os.path.join(tmp, "log.safetensors"), mnt) as p:
        expect(lambda: tensor(os.path.join(os.fsencode(mnt), b"caf\xe9")), errno.EINVAL, "create caf\\xe9")
    err = p.stderr.read()
    lines = [l for l in err.decode(errors="replace").splitlines() if "refused" in l]
    check(len(lines) == 1 and "create 'caf\\xe9' refused" in lines[0] and "not valid UTF-8" in lines[0],
          "one log line says why: %r" % err)


if __name__ == "__main__":
    run_tests("test_names", [test_matrix, test_writeback_refuses_before_replacing,
                             test_convert_refuses_a_key_the_target_cannot_hold, test_refusal_is_logged],
              "names")
