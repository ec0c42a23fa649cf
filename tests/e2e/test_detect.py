"""Format detection through real mounts: SafeTensors files whose header length
makes them start like a pickle (80 02..80 05) or that hold "ustar" at byte
257 mount as SafeTensors, and files burnstore cannot read are refused with one
line that says what they look like."""
import gzip
import os
import struct

from bsmount import BIN, Mount, check, finish, run, tmpdir, xattrs, run_tests

TENSOR = b'"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
DATA = struct.pack("<2f", 1.5, -2.25)


def st_file(path, hlen, ustar=False):
    """A valid SafeTensors file with a header of exactly hlen bytes."""
    if ustar:
        pad = 257 - 8 - len(b'{"__metadata__":{"p":"')
        h = b'{"__metadata__":{"p":"' + b"x" * pad + b'ustar"},' + TENSOR + b"}"
    else:
        h = b"{" + TENSOR + b"}"
    assert len(h) <= hlen
    h += b" " * (hlen - len(h))
    blob = struct.pack("<Q", hlen) + h + DATA
    if ustar:
        assert blob[257:262] == b"ustar"
    with open(path, "wb") as f:
        f.write(blob)
    return blob


def test_lookalike_safetensors(tmp):
    cases = [(640, False), (896, False), (1152, False), (1408, False), (400, True), (640, True)]
    for hlen, ustar in cases:
        name = "h%d%s.safetensors" % (hlen, "-ustar" if ustar else "")
        path = os.path.join(tmp, name)
        blob = st_file(path, hlen, ustar)
        if not ustar:
            check(blob[:2] == bytes([0x80, 2 + (hlen - 640) // 256]), "%s starts like a pickle" % name)
        mnt = os.path.join(tmp, "m-" + name)
        try:
            with Mount(path, mnt):
                check(xattrs(mnt).get("user.burnstore.format") == "safetensors", "%s: format xattr" % name)
                with open(os.path.join(mnt, "w"), "rb") as f:
                    check(f.read() == DATA, "%s: tensor bytes" % name)
        except RuntimeError as e:
            check(False, "%s: %s" % (name, e))


def test_unknown_formats_say_what_they_are(tmp):
    mnt = os.path.join(tmp, "never")
    os.makedirs(mnt, exist_ok=True)
    cases = [("model.mpk.gz", gzip.compress(b"\x83\xa8metadata" + b"\0" * 64), "gzip"),
             ("model.mpk", b"\x83\xa8metadata\x85\xa5float\xa3f32" + b"\0" * 32, "MessagePack"),
             ("other.mpk", b"\x12\x34\x56\x78" * 8, "NamedMpkFileRecorder")]
    for name, blob, needle in cases:
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(blob)
        r = run([BIN, path, mnt], timeout=30)
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1, "%s: exit status %d" % (name, r.returncode))
        check(len(lines) == 1 and needle in r.stderr and "unknown format" in r.stderr,
              "%s: one line naming %s: %r" % (name, needle, r.stderr))


if __name__ == "__main__":
    run_tests("test_detect", [
        test_lookalike_safetensors,
        test_unknown_formats_say_what_they_are,
    ], "detect")
