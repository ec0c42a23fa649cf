"""Mounts that would lose or mangle data are refused before anything is
mounted (issue 9, "write-side traps"): exit status 1, one line on stderr,
nothing mounted, no file created. And the cases next to them still work."""
import glob
import gzip
import os
import shutil
import subprocess

from bsmount import (BIN, SOURCE_DIR, Mount, check, finish, force_unmount, is_mounted, read_bpk,
                     run, tmpdir)

FIXTURES = os.path.join(SOURCE_DIR, "tests", "fixtures")
PT = os.path.join(FIXTURES, "complex_nested.pt")
ST = os.path.join(FIXTURES, "burn/burn-store/safetensors-tests/tests/multi_layer/multi_layer.safetensors")


def refused(tmp, name, source, opts, *needles, absent=()):
    """burnstore SOURCE MNT [-o opts] must exit 1 with one line naming
    `needles`, mount nothing and create none of `absent` (nor a staging dir)."""
    mnt = os.path.join(tmp, "mnt-" + name)
    os.makedirs(mnt, exist_ok=True)
    before = set(os.listdir(tmp))
    try:
        r = run([BIN, source, mnt] + (["-o", opts] if opts else []), timeout=30)
        mounted = is_mounted(mnt)
    finally:
        force_unmount(mnt)
    err = r.stderr
    check(r.returncode == 1, "%s: exit status %d, expected 1 (stderr %r)" % (name, r.returncode, err))
    check(err.count("\n") == 1 and err.startswith("burnstore: "), "%s: one line: %r" % (name, err))
    for n in needles:
        check(n in err, "%s: the message names %r: %r" % (name, n, err))
    check(not mounted, "%s: nothing mounted" % name)
    check(not is_mounted(mnt), "%s: nothing left mounted" % name)
    for p in absent:
        check(not os.path.exists(p), "%s: %s not created" % (name, p))
    new = set(os.listdir(tmp)) - before
    check(not [f for f in new if "staging" in f or "burnstore-tmp" in f],
          "%s: no staging or temp file left: %s" % (name, sorted(new)))
    return err


def make_bpk(tmp, path):
    """A small Burnpack file, written by burnstore itself."""
    mnt = os.path.join(tmp, "mk")
    with Mount(path, mnt) as m:
        with open(os.path.join(mnt, "w"), "wb") as f:
            f.write(bytes(range(16)))
        os.setxattr(os.path.join(mnt, "w"), "user.burnstore.dtype", b"F32")
        u = m.unmount()
        check(u.returncode == 0, "make %s: %s" % (path, u.stderr))


def test_outputs_that_name_no_writable_format(tmp):
    for name, opts, needle in (("ckpt", "output=%s/m.ckpt", ".ckpt"),
                               ("npz", "output=%s/m.npz", ".npz"),
                               ("upper-ckpt", "output=%s/M.CKPT", ".CKPT")):
        out = opts.split("=", 1)[1] % tmp
        refused(tmp, "output-" + name, PT, opts % tmp, "output=", needle, "cannot write", ".bpk",
                absent=[out])
    # The trap of issue 9: output= the source itself. A .pth is rewritten in
    # place only if the writer keeps everything its pickle holds (not a set).
    work = os.path.join(tmp, "m.pth")
    r = run(["/usr/bin/python3", "-c",
             "import torch, sys; torch.save({'model': {'w': torch.ones(2)}, 'tags': {1, 2}}, sys.argv[1])",
             work], timeout=300)
    check(r.returncode == 0, "torch.save: %s" % r.stderr)
    before = open(work, "rb").read()
    refused(tmp, "output-over-source", work, "output=" + work, "m.pth", "rewritten in place",
            "'tags' holds a value of type set", "output=NEW.pth")
    check(open(work, "rb").read() == before, "the .pth source is untouched")
    # No extension: nothing says which format to write.
    refused(tmp, "output-noext", ST, "output=%s/converted" % tmp, "no extension", ".bpk",
            absent=[os.path.join(tmp, "converted")])
    # rw in place on a .pth holding what the writer cannot keep.
    refused(tmp, "rw-pth", work, "rw", "output=NEW.pth", "'tags'")
    check(open(work, "rb").read() == before, "the .pth source is untouched")


def test_new_paths_that_name_no_writable_format(tmp):
    for name, path, opts in (("typo-ckpt", "modle.ckpt", None),
                             ("typo-pkl", "modle.pkl", None),
                             ("noext", "newmodel", None),
                             ("rw-ckpt", "other.ckpt", "rw"),
                             ("with-output", "modle.ckpt", "output=%s/out.bpk" % tmp)):
        p = os.path.join(tmp, path)
        refused(tmp, "new-" + name, p, opts, "does not exist", path, ".bpk",
                absent=[p, os.path.join(tmp, "out.bpk")])
    # A new .bpk source is fine, but not into an output burnstore cannot write.
    refused(tmp, "new-bpk-output-ckpt", os.path.join(tmp, "fresh.bpk"), "output=%s/o.ckpt" % tmp,
            ".ckpt", absent=[os.path.join(tmp, "o.ckpt"), os.path.join(tmp, "fresh.bpk")])


def test_conversions_that_cannot_succeed(tmp):
    cpt = os.path.join(tmp, "complex.pt")
    r = run(["/usr/bin/python3", "-c",
             "import torch, sys; torch.save({'w': torch.ones(3), 'z': torch.zeros(2, dtype=torch.complex64)}, sys.argv[1])",
             cpt], timeout=300)
    if not check(r.returncode == 0, "torch.save: %s" % r.stderr):
        return
    out = os.path.join(tmp, "c.bpk")
    refused(tmp, "complex", cpt, "output=" + out, "'z'", "C64", "burnpack", "exclude=", absent=[out])
    # A filter that leaves the tensor out makes the conversion possible.
    mnt = os.path.join(tmp, "conv")
    with Mount(cpt, mnt, opts="exclude=^z$,output=" + out) as m:
        u = m.unmount()
        check(u.returncode == 0, "conversion without the complex tensor: %s" % u.stderr)
    got, _ = read_bpk(out) if os.path.exists(out) else ({}, {})
    check(sorted(got) == ["w"], "the converted file holds w only: %s" % sorted(got))
    # A read-only mount of the same file is fine (nothing is written).
    with Mount(cpt, mnt):
        check(os.path.getsize(os.path.join(mnt, "z")) == 16, "z readable in a read-only mount")


def test_unknown_formats_say_what_they_look_like(tmp):
    raw = open(PT, "rb").read()
    mpkgz = os.path.join(tmp, "model.mpk.gz")
    with gzip.open(mpkgz, "wb") as f:
        f.write(b"\x82\xa8metadata" + bytes(100))
    refused(tmp, "mpk-gz", mpkgz, None, "model.mpk.gz", "1f 8b", ".mpk.gz", "BurnpackStore")
    gz = os.path.join(tmp, "model.pt.gz")
    with gzip.open(gz, "wb") as f:
        f.write(raw)
    refused(tmp, "gzip", gz, None, "gzip", "1f 8b", "gunzip")
    mpk = os.path.join(tmp, "model.mpk")
    with open(mpk, "wb") as f:
        f.write(b"\x82\xa8metadata\x84\xa6format\xa3mpk" + bytes(100))
    refused(tmp, "mpk", mpk, None, "model.mpk", "NamedMpkFileRecorder", "BurnpackStore")
    # Something unknown keeps the generic message.
    txt = os.path.join(tmp, "notes.txt")
    with open(txt, "w") as f:
        f.write("hello, these are not weights\n")
    refused(tmp, "text", txt, None, "unknown format")


def test_what_still_mounts(tmp):
    # A new path ending in .bpk (any case) is an empty writable mount.
    for name in ("new.bpk", "NEW2.BPK"):
        out = os.path.join(tmp, name)
        mnt = os.path.join(tmp, "m-" + name)
        with Mount(out, mnt) as m:
            check(os.listdir(mnt) == [], "%s: empty mount" % name)
            with open(os.path.join(mnt, "t"), "wb") as f:
                f.write(b"abcd")
            u = m.unmount()
            check(u.returncode == 0, "%s: -u: %s" % (name, u.stderr))
        check(os.path.exists(out) and read_bpk(out)[0].get("t", (0, 0, 0))[2] == b"abcd",
              "%s written as Burnpack" % name)
    # rw in place keeps the format the file holds, whatever its name.
    plain = os.path.join(tmp, "model")
    make_bpk(tmp, plain + ".bpk")
    os.rename(plain + ".bpk", plain)
    mnt = os.path.join(tmp, "m-plain")
    with Mount(plain, mnt, opts="rw") as m:
        with open(os.path.join(mnt, "extra"), "wb") as f:
            f.write(b"zz")
        u = m.unmount()
        check(u.returncode == 0, "rw of an extension-less Burnpack file: %s" % u.stderr)
    got, _ = read_bpk(plain)
    check(sorted(got) == ["extra", "w"], "rw in place wrote Burnpack: %s" % sorted(got))
    check(not glob.glob(os.path.join(tmp, "*burnstore-tmp*")) and
          not glob.glob(os.path.join(tmp, ".*burnstore-tmp*")), "no temp file left")
    # output= with a .bpk extension converts, as before.
    out = os.path.join(tmp, "st.bpk")
    with Mount(ST, os.path.join(tmp, "m-st"), opts="output=" + out) as m:
        u = m.unmount()
        check(u.returncode == 0, "safetensors to .bpk: %s" % u.stderr)
    check(os.path.exists(out) and len(read_bpk(out)[0]) == 9, "9 tensors converted")


def test_staging_paths_too_long(tmp):
    """A staging directory whose path would be over PATH_MAX (staging= a
    directory 4085 bytes deep), or whose name would be over NAME_MAX (beside
    an output of a 245-byte name), is refused with ENAMETOOLONG, never
    created from a cut template."""
    deep = tmp
    while len(deep) < 4085:
        deep = os.path.join(deep, "d" * min(200, 4085 - len(deep) - 1))
        os.makedirs(deep, exist_ok=True)
    new = os.path.join(tmp, "new.bpk")
    refused(tmp, "deep-staging", new, "staging=" + deep, "File name too long", "staging=",
            absent=(new,))
    check(os.listdir(deep) == [], "nothing created in the deep directory")
    long = os.path.join(tmp, "x" * 245 + ".bpk")
    refused(tmp, "long-name", long, None, "File name too long", "-o staging=DIR", absent=(long,))


def main():
    with tmpdir("refusals") as tmp:
        for t in (test_outputs_that_name_no_writable_format,
                  test_new_paths_that_name_no_writable_format,
                  test_conversions_that_cannot_succeed,
                  test_unknown_formats_say_what_they_look_like,
                  test_what_still_mounts,
                  test_staging_paths_too_long):
            d = os.path.join(tmp, t.__name__)
            os.makedirs(d)
            t(d)
    finish("test_refusals")


if __name__ == "__main__":
    main()
