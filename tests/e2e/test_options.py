"""Key options through real mounts: include, exclude, remap, top_level_key,
contiguous_indices, flat, their combinations, the same options through
mount(8) and an fstab file, and every refusal."""
import os

from bsmount import (BIN, FIX, Mount, check, finish, force_unmount, is_mounted, run,
                     tensor_files, tmpdir, xattrs, run_tests)

T = os.path.join(FIX, "burn-store/pytorch-tests/tests")
R = os.path.join(FIX, "burn-store/src/pytorch/tests/reader/test_data")
CHAINED = os.path.join(T, "key_remap_chained/key_remap.pt")
NONCONT = os.path.join(T, "non_contiguous_indexes/non_contiguous_indexes.pt")
TOPKEY = os.path.join(T, "top_level_key/top_level_key.pt")
CHECKPOINT = os.path.join(R, "checkpoint.pt")
BPK = os.path.join(FIX, "examples/mnist-inference-web/model.bpk")


def keys_of(mnt):
    """The presented keys (paths with / as .) of every file."""
    return sorted(rel.replace("/", ".") for rel in tensor_files(mnt))


def expect_keys(tmp, src, opts, want, name):
    mnt = os.path.join(tmp, "m")
    try:
        with Mount(src, mnt, opts=opts):
            got = keys_of(mnt)
            check(got == sorted(want), "%s: keys\n  got  %s\n  want %s" % (name, got, sorted(want)))
            return mnt
    except RuntimeError as e:
        check(False, "%s: %s" % (name, e))


def test_include_exclude(tmp):
    all_keys = ["conv1.conv.bias", "conv1.conv.weight", "conv1.norm.beta", "conv1.norm.gamma",
                "conv1.norm.running_mean", "conv1.norm.running_var", "conv2.conv.bias",
                "conv2.conv.weight", "conv2.norm.beta", "conv2.norm.gamma", "conv2.norm.running_mean",
                "conv2.norm.running_var", "fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight",
                "fc3.bias", "fc3.weight"]
    expect_keys(tmp, BPK, None, all_keys, "no options")
    expect_keys(tmp, BPK, r"include=^fc", [k for k in all_keys if k.startswith("fc")], "include")
    expect_keys(tmp, BPK, r"include=^fc1\.,include=bias$",
                [k for k in all_keys if k.startswith("fc1.") or k.endswith("bias")], "include OR")
    expect_keys(tmp, BPK, r"exclude=norm", [k for k in all_keys if "norm" not in k], "exclude")
    expect_keys(tmp, BPK, r"include=^conv1,exclude=running",
                [k for k in all_keys if k.startswith("conv1") and "running" not in k], "include+exclude")


def test_remap(tmp):
    # burn's own chained remap test (key_remap_chained).
    opts = r"remap=(.+)\.block\.0\.(.+)=>$1.conv.$2,remap=(.+)\.block\.1\.(.+)=>$1.bn.$2,remap=layer\.([0-9])\.(.+)=>layer.blocks.$1.$2"
    want = ["conv.weight", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
            "bn.num_batches_tracked"]
    for i in (0, 1):
        want += ["layer.blocks.%d.conv.weight" % i] + ["layer.blocks.%d.bn.%s" % (i, s) for s in
                                                        ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")]
    mnt = expect_keys(tmp, CHAINED, opts, want, "chained remap")
    with Mount(CHAINED, os.path.join(tmp, "rk"), opts=opts) as m:
        x = xattrs(os.path.join(m, "layer/blocks/1/bn/running_mean"))
        check(x.get("user.burnstore.key") == "layer.1.block.1.running_mean", "key xattr is the source key: %r" % x)
    # Every match replaced; a comma inside a remap written as \,
    expect_keys(tmp, os.path.join(R, "nested_dict.pt"), r"remap=\.=>_", ["layer1_weight", "layer1_bias",
                                                                         "layer2_weight", "layer2_bias"], "every match")
    expect_keys(tmp, os.path.join(R, "nested_dict.pt"), r"remap=^layer(\d)=>l${1}x\,y",
                ["l1x,y.weight", "l1x,y.bias", "l2x,y.weight", "l2x,y.bias"], "escaped comma, ${1}")
    # Rust's replacement syntax: ${1}a is group 1 then "a"; $1a is the group named "1a" (empty).
    expect_keys(tmp, os.path.join(R, "nested_dict.pt"), r"remap=^layer(\d)=>${1}a",
                ["1a.weight", "1a.bias", "2a.weight", "2a.bias"], "${1}a")
    r = run([BIN, os.path.join(R, "nested_dict.pt"), os.path.join(tmp, "m"), "-o", r"remap=^layer(\d)=>$1a"])
    check(r.returncode != 0 and "both become" in r.stderr, "$1a empties the group, so keys collide: %r" % r.stderr)
    force_unmount(os.path.join(tmp, "m"))
    # remap that makes two keys collide is refused, naming both.
    r = run([BIN, os.path.join(R, "nested_dict.pt"), os.path.join(tmp, "m"), "-o", r"remap=layer\d=>layer"])
    check(r.returncode != 0 and "'layer1." in r.stderr and "'layer2." in r.stderr and "both become 'layer." in r.stderr,
          "collision names both keys: %r" % r.stderr)
    force_unmount(os.path.join(tmp, "m"))


def test_top_level_and_indices(tmp):
    expect_keys(tmp, TOPKEY, "top_level_key=my_state_dict", ["conv1.weight", "conv1.bias"], "top_level_key")
    expect_keys(tmp, CHECKPOINT, "top_level_key=model_state_dict",
                ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"], "top_level_key on a checkpoint")
    r = run([BIN, CHECKPOINT, os.path.join(tmp, "m"), "-o", "top_level_key=nope"])
    check(r.returncode != 0 and "nope" in r.stderr and "model_state_dict" in r.stderr,
          "missing top_level_key lists the keys: %r" % r.stderr)
    want = ["fc.%d.%s" % (i, s) for i in range(5) for s in ("weight", "bias")]
    expect_keys(tmp, NONCONT, "contiguous_indices", want, "contiguous_indices")
    expect_keys(tmp, NONCONT, None, ["fc.%d.%s" % (i, s) for i in (0, 2, 4, 6, 8) for s in ("weight", "bias")],
                "indices kept by default")
    # top_level_key + contiguous_indices + include, together.
    expect_keys(tmp, CHECKPOINT, r"top_level_key=optimizer_state_dict,contiguous_indices",
                ["state.0.momentum_buffer"], "top_level_key + contiguous_indices")
    expect_keys(tmp, NONCONT, r"contiguous_indices,include=\.1\.,remap=^fc=>dense",
                ["dense.1.weight", "dense.1.bias"], "indices + include + remap")


def test_flat_and_refusals(tmp):
    mnt = os.path.join(tmp, "m")
    with Mount(TOPKEY, mnt, opts="flat,top_level_key=my_state_dict"):
        check(sorted(os.listdir(mnt)) == ["conv1.bias", "conv1.weight"], "flat + top_level_key")
    for opts, needle in (("include=(", "include"), ("exclude=[a-", "exclude"), ("remap=abc", "=>"),
                         ("remap=(=>x", "remap"), ("nosuchoption", "unknown option"),
                         ("top_level_key", "top_level_key")):
        r = run([BIN, BPK, mnt, "-o", opts])
        check(r.returncode != 0 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1,
              "-o %s refused with one line mentioning %r: %r" % (opts, needle, r.stderr))
        check(not is_mounted(mnt), "-o %s: nothing mounted" % opts)
        force_unmount(mnt)


def test_mount8_and_fstab(tmp):
    mnt = os.path.join(tmp, "m8")
    os.makedirs(mnt, exist_ok=True)
    try:
        r = run(["mount", "-t", "burnstore", NONCONT, mnt, "-o", r"contiguous_indices,remap=^fc=>layers,include=weight"])
        check(r.returncode == 0, "mount -t burnstore with options: %s" % r.stderr)
        check(keys_of(mnt) == ["layers.%d.weight" % i for i in range(5)], "options through mount(8): %s" % keys_of(mnt))
        run([BIN, "-u", mnt])
        fstab = os.path.join(tmp, "fstab")
        with open(fstab, "w") as f:
            f.write("%s %s burnstore ro,nofail,top_level_key=model_state_dict,include=fc1 0 0\n" % (CHECKPOINT, mnt))
        r = run(["mount", "-T", fstab, mnt])
        check(r.returncode == 0, "mount -T fstab: %s" % r.stderr)
        check(keys_of(mnt) == ["fc1.bias", "fc1.weight"], "options through fstab: %s" % keys_of(mnt))
        run([BIN, "-u", mnt])
        # A writable mount through mount(8) is asked for with "writable".
        out = os.path.join(tmp, "viafstab.bpk")
        with open(fstab, "w") as f:
            f.write("%s %s burnstore writable,nofail 0 0\n" % (out, mnt))
        r = run(["mount", "-T", fstab, mnt])
        check(r.returncode == 0, "writable through fstab: %s" % r.stderr)
        with open(os.path.join(mnt, "x"), "wb") as f:
            f.write(b"abc")
        r = run([BIN, "-u", mnt])
        check(r.returncode == 0 and os.path.exists(out), "written back after a mount(8) mount: %s" % r.stderr)
    finally:
        force_unmount(mnt)


def test_include_on_writeback(tmp):
    """rw + include: the output holds what the mount shows."""
    work = os.path.join(tmp, "part.bpk")
    out = os.path.join(tmp, "enc-only.bpk")
    mnt = os.path.join(tmp, "wb")
    with Mount(BPK, mnt, opts="include=^conv1\\.,output=" + out) as m:
        u = m.unmount()
        check(u.returncode == 0, "output= with include: %s" % u.stderr)
    with Mount(out, mnt):
        check(keys_of(mnt) == sorted(["conv1.conv.bias", "conv1.conv.weight", "conv1.norm.beta", "conv1.norm.gamma",
                                      "conv1.norm.running_mean", "conv1.norm.running_var"]),
              "partial conversion with include=: %s" % keys_of(mnt))
    # Files created or renamed in a filtered writable mount are written whatever their name.
    out2 = os.path.join(tmp, "enc-plus.bpk")
    with Mount(BPK, mnt, opts="include=^conv1\\.,output=" + out2) as m:
        os.makedirs(os.path.join(mnt, "head"))
        with open(os.path.join(mnt, "head", "new"), "wb") as f:
            f.write(b"abc")
        os.rename(os.path.join(mnt, "conv1", "conv"), os.path.join(mnt, "moved"))
        u = m.unmount()
        check(u.returncode == 0, "output= with include and new files: %s" % u.stderr)
    with Mount(out2, mnt):
        k = keys_of(mnt)
        check("head.new" in k and "moved.weight" in k and "moved.bias" in k,
              "created and renamed files outside include= are written: %s" % k)


if __name__ == "__main__":
    run_tests("test_options", [
        test_include_exclude,
        test_remap,
        test_top_level_and_indices,
        test_flat_and_refusals,
        test_mount8_and_fstab,
        test_include_on_writeback,
    ], "opts")
