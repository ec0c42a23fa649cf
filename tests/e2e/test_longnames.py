"""Key segments longer than NAME_MAX (255 bytes), through real mounts: they
are shown under shortened names (prefix, "%~", hash; docs/interface-notes.md)
beside their ordinary siblings, read like any file, keep the full key in
user.burnstore.key, and round-trip through a write-back under the full key."""
import errno
import json
import os
import re
import struct
import subprocess

from bsmount import Mount, check, finish, force_unmount, read_bpk, run, tmpdir, xattrs

SEG300 = "a" * 300
SEG1000 = "b" * 999 + "\u00e9"  # 1001 bytes, ends in a 2-byte UTF-8 character
SEG2000 = "c" * 2000  # past FUSE's own limit of 1024: the kernel gave EIO for the directory
SEG_DIR = "d" * 400  # a long directory segment
KEYS = {
    "enc." + SEG300: b"\x01" * 16,
    "enc." + SEG1000: b"\x02" * 32,
    "enc." + "a" * 301: b"\x03" * 8,  # same 200-byte prefix as SEG300
    "enc." + SEG2000: b"\x08" * 8,
    "enc.weight": b"\x04" * 12,
    "enc.bias": b"\x05" * 4,
    SEG_DIR + ".w": b"\x06" * 8,
    "head": b"\x07" * 4,
}
SHORT = re.compile(r"^(.{1,200})%~[0-9a-f]{16}$", re.S)


def write_safetensors(path, tensors):
    header, off, blob = {}, 0, b""
    for k, raw in tensors.items():
        header[k] = {"dtype": "U8", "shape": [len(raw)], "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


def by_key(mnt):
    """full key -> (path, bytes) of every file, by the key xattr."""
    out = {}
    for d, _dirs, files in os.walk(mnt):
        for f in files:
            p = os.path.join(d, f)
            check(len(f.encode()) <= 255, "name of %d bytes" % len(f.encode()))
            out[os.getxattr(p, "user.burnstore.key").decode()] = (p, open(p, "rb").read())
    return out


def test_readonly(tmp, src):
    mnt = os.path.join(tmp, "ro")
    with Mount(src, mnt):
        r = run(["ls", os.path.join(mnt, "enc")])
        check(r.returncode == 0, "ls of a directory with long segments: %r" % r.stderr)
        names = r.stdout.split("\n")[:-1]
        check(len(names) == 6 and "weight" in names and "bias" in names,
              "ls lists all six: %r" % [n[:20] for n in names])
        longs = [n for n in names if SHORT.match(n)]
        check(len(longs) == 4, "four shortened names: %r" % [n[-24:] for n in names])
        for n in longs:
            check(len(n.encode()) <= 255, "shortened name fits NAME_MAX")
        check(sorted(os.listdir(mnt)) == sorted(["enc", "head", [n for n in os.listdir(mnt)
                                                               if n.startswith("d" * 200)][0]]),
              "root lists enc, head and the long directory")
        got = by_key(mnt)
        check(set(got) == set(KEYS), "every key is a file: missing %r" % [k[:20] for k in set(KEYS) - set(got)])
        for k, raw in KEYS.items():
            if k in got:
                check(got[k][1] == raw, "bytes of %.30s" % k)
        # cat works by the shortened name, and lookups are stable.
        for n in longs:
            p = os.path.join(mnt, "enc", n)
            r = subprocess.run(["cat", p], capture_output=True, timeout=60)
            key = os.getxattr(p, "user.burnstore.key").decode()
            check(r.returncode == 0 and r.stdout == KEYS[key], "cat %s..." % n[:20])
            check(xattrs(p)["user.burnstore.shape"] == "[%d]" % len(KEYS[key]), "shape xattr")
        # The 1000-byte segment's key xattr is whole (1001 bytes + "enc.").
        check(("enc." + SEG1000) in got, "the key xattr holds the whole 1000-byte segment")
        # Names fit NAME_MAX, so the tree copies to an ordinary file system.
        r = run(["cp", "-r", mnt, os.path.join(tmp, "copy")])
        check(r.returncode == 0, "cp -r to %s: %s" % (tmp, r.stderr[:200]))
        # The full segment is not a name of the mount (only the shortened one is).
        try:
            os.stat(os.path.join(mnt, "enc", SEG300))
            check(False, "stat of the 300-byte name succeeded")
        except OSError as e:
            check(e.errno in (errno.ENOENT, errno.ENAMETOOLONG), "300-byte name: %s" % errno.errorcode.get(e.errno))
    with Mount(src, mnt, opts="flat"):
        got = by_key(mnt)
        check(set(got) == set(KEYS), "flat: every key is a file")
        check(all(got[k][1] == v for k, v in KEYS.items() if k in got), "flat: bytes")


def test_writeback(tmp, src):
    """rw: clean long-named tensors are written under their full keys; a
    written one too; one moved to another directory keeps its key; one
    renamed takes the new name's key."""
    out = os.path.join(tmp, "conv.bpk")
    mnt = os.path.join(tmp, "rw")
    with Mount(src, mnt, opts="output=" + out) as m:
        u = m.unmount()
        check(u.returncode == 0, "conversion: %s" % u.stderr)
    got, _ = read_bpk(out)
    check(set(got) == set(KEYS), "converted under the full keys: %r" % [k[:20] for k in got])
    with Mount(out, mnt, opts="rw") as m:
        enc = os.path.join(mnt, "enc")
        name = {os.getxattr(os.path.join(enc, n), "user.burnstore.key").decode(): n for n in os.listdir(enc)}
        with open(os.path.join(enc, name["enc." + SEG300]), "r+b") as f:
            f.write(b"\x11" * 16)
        os.mkdir(os.path.join(mnt, "moved"))
        n1000 = name["enc." + SEG1000]
        os.rename(os.path.join(enc, n1000), os.path.join(mnt, "moved", n1000))
        check(os.getxattr(os.path.join(mnt, "moved", n1000), "user.burnstore.key").decode() == "moved." + SEG1000,
              "a moved shortened name keeps its segment")
        os.rename(os.path.join(enc, name["enc." + "a" * 301]), os.path.join(enc, "renamed"))
        try:
            os.rename(os.path.join(enc, "weight"), os.path.join(enc, name["enc." + SEG300]))
            check(False, "renaming another file onto a shortened name succeeded")
        except OSError as e:
            check(e.errno == errno.EINVAL, "rename onto a shortened name: %s" % errno.errorcode.get(e.errno))
        try:
            open(os.path.join(enc, "x" * 200 + "%~0123456789abcdef"), "wb")
            check(False, "creating a shortened name succeeded")
        except OSError as e:
            check(e.errno == errno.EINVAL, "create a shortened name: %s" % errno.errorcode.get(e.errno))
        u = m.unmount()
        check(u.returncode == 0, "write-back: %s" % u.stderr)
    got, _ = read_bpk(out)
    want = dict(KEYS)
    want["enc." + SEG300] = b"\x11" * 16
    want["moved." + SEG1000] = want.pop("enc." + SEG1000)
    want["enc.renamed"] = want.pop("enc." + "a" * 301)
    check(set(got) == set(want), "written keys: extra %r missing %r" % (
        [k[:20] for k in set(got) - set(want)], [k[:20] for k in set(want) - set(got)]))
    for k, raw in want.items():
        if k in got:
            check(got[k][2] == raw, "written bytes of %.30s" % k)


if __name__ == "__main__":
    with tmpdir("longnames") as tmp:
        src = os.path.join(tmp, "long.safetensors")
        write_safetensors(src, KEYS)
        for t in (test_readonly, test_writeback):
            print("--", t.__name__, flush=True)
            try:
                t(tmp, src)
            except Exception as e:  # keep going: report every failure
                check(False, "%s raised %r" % (t.__name__, e))
        for d in os.listdir(tmp):
            force_unmount(os.path.join(tmp, d))
    finish("test_longnames")
