"""The staging journal (issue 18, item 8): surgery in a writable mount (cp,
rsync -aX, rename of a file and of a directory, rm, setfattr of dtype,
shape and metadata, a write into a tensor), a wait past the journal's
batch window, kill -9 of the daemon, then `burnstore --finish` of its
staging directory writes a checkpoint whose keys, dtypes, shapes,
metadata and bytes are what the mount showed (read back with bsmount's
own Burnpack reader). A checkpoint changed after the kill is refused in
one line; -o nojournal keeps none."""
import glob
import json
import os
import shutil
import struct
import subprocess
import time

from bsmount import (BIN, FIX, Mount, check, kill_daemon, read_bpk, run, run_tests, tensor_files,
                     xattrs)

MODEL = os.path.join(FIX, "examples", "mnist-inference-web", "model.bpk")
WINDOW = 1.0  # BS_JOURNAL_SYNC_MS
WIDTH = {"U8": 1, "I32": 4, "F32": 4}


def sh(cmd, cwd):
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, "`%s`: %s" % (cmd, r.stderr.strip()))
    return r


def shown(mnt):
    """What the mount shows: {key: (dtype, shape, bytes, param_id)}, root metadata."""
    out = {}
    for rel, p in tensor_files(mnt).items():
        x = xattrs(p)
        with open(p, "rb") as f:
            raw = f.read()
        pid = x.get("user.burnstore.param_id")
        # Not set: U8, 1-D by size (interface.md §5); the mount shows no xattr then.
        dt = x.get("user.burnstore.dtype", "U8")
        shape = x.get("user.burnstore.shape")
        shape = json.loads(shape) if shape else [len(raw) // WIDTH[dt]]
        out[x["user.burnstore.key"]] = (dt, shape, raw, int(pid) if pid is not None else None)
    meta = {n[len("user.burnstore.meta."):]: v for n, v in xattrs(mnt).items()
            if n.startswith("user.burnstore.meta.")}
    return out, meta


def fresh(tmp, name):
    """tmp/name/ with a copy of the model as m.bpk: (directory, m.bpk, mountpoint)."""
    d = os.path.join(tmp, name)
    os.makedirs(d)
    target = os.path.join(d, "m.bpk")
    shutil.copyfile(MODEL, target)
    return d, target, os.path.join(d, "mnt")


def surgery(tmp, mnt):
    """Changes of every kind the journal records, as a user makes them."""
    src = os.path.join(tmp, "incoming")
    os.makedirs(src, exist_ok=True)
    for i in range(3):
        p = os.path.join(src, "extra%d" % i)
        with open(p, "wb") as f:
            f.write(struct.pack("<8f", *[i + j / 8 for j in range(8)]))
        os.setxattr(p, "user.burnstore.dtype", b"F32")
        os.setxattr(p, "user.burnstore.shape", b"[2, 4]")
    sh("rsync -aX incoming/ %s/added/" % mnt, tmp)                   # create (temp + rename), xattrs
    sh("cp %s/conv1/conv/weight %s/copied" % (mnt, mnt), tmp)        # create, no xattrs: U8 ...
    sh("setfattr -n user.burnstore.dtype -v F32 %s/copied" % mnt, tmp)  # ... then typed
    sh("setfattr -n user.burnstore.shape -v '[64, 9]' %s/copied" % mnt, tmp)
    sh("mv %s/conv2 %s/moved" % (mnt, mnt), tmp)                     # a directory renamed
    sh("mv %s/conv1/conv/bias %s/bias_renamed" % (mnt, mnt), tmp)    # a file renamed
    sh("rm %s/conv1/norm/beta" % mnt, tmp)                           # unlinked
    sh("setfattr -n user.burnstore.shape -v '[8, 8]' %s/conv1/norm/gamma" % mnt, tmp)
    sh("setfattr -n user.burnstore.param_id -v 4242 %s/conv1/norm/gamma" % mnt, tmp)
    sh("setfattr -n user.burnstore.meta.surgery -v 'an hour of it' %s" % mnt, tmp)
    sh("dd if=/dev/urandom of=%s/conv1/norm/running_mean bs=256 count=1 conv=notrunc status=none" % mnt, tmp)
    sh("printf 'abcd' > %s/tmpfile && mv %s/tmpfile %s/bias_renamed" % (mnt, mnt, mnt), tmp)  # replaced
    sh("setfattr -n user.burnstore.dtype -v I32 %s/bias_renamed" % mnt, tmp)


def test_kill_while_mounted(tmp):
    d, target, mnt = fresh(tmp, "kill")
    with Mount(target, mnt, "rw"):
        stg = glob.glob(os.path.join(d, ".m.bpk.staging-*"))
        check(len(stg) == 1 and os.path.exists(os.path.join(stg[0], "JOURNAL")),
              "the mount keeps a JOURNAL in its staging directory: %r" % stg)
        surgery(d, mnt)
        want, meta = shown(mnt)
        time.sleep(WINDOW + 0.5)  # past the batch window: on disk
        kill_daemon(mnt)
    check(open(target, "rb").read() == open(MODEL, "rb").read(), "the kill left the checkpoint as it was")
    stg = glob.glob(os.path.join(d, ".m.bpk.staging-*"))
    if not check(len(stg) == 1, "one staging directory left: %r" % stg):
        return
    check(not os.path.exists(os.path.join(stg[0], "INDEX")), "killed while mounted: no INDEX")
    l = run([BIN, "--list-staging", stg[0]])
    check(l.returncode == 1 and "JOURNAL" in l.stdout and "--finish" in l.stdout,
          "--list-staging names the journal: %r" % l.stdout)
    r = run([BIN, "--finish", stg[0]])
    check(r.returncode == 0, "--finish from the journal: %r" % r.stderr)
    check(not os.path.exists(stg[0]), "--finish removed the staging directory")
    got, gmeta = read_bpk(target)
    check(set(got) == set(want), "the keys the mount showed: extra %s missing %s" % (
        sorted(set(got) - set(want)), sorted(set(want) - set(got))))
    for k in sorted(set(got) & set(want)):
        check(got[k] == want[k], "%s: %r != %r" % (k, got[k][:2] + (len(got[k][2]), got[k][3]),
                                                   want[k][:2] + (len(want[k][2]), want[k][3])))
    for k, v in meta.items():
        check(gmeta.get(k) == v, "metadata %s: %r != %r" % (k, gmeta.get(k), v))
    check("added.extra1" in got and got["added.extra1"][:2] == ("F32", [2, 4]), "rsync -aX's file, typed")
    check("moved.conv.weight" in got and "conv2.conv.weight" not in got, "the directory's rename")


def test_changed_checkpoint_is_refused(tmp):
    d, source, mnt = fresh(tmp, "stale")
    out = os.path.join(d, "out.bpk")
    with Mount(source, mnt, "rw,output=" + out):
        sh("mv %s/conv1 %s/renamed" % (mnt, mnt), d)
        time.sleep(WINDOW + 0.5)
        kill_daemon(mnt)
    with open(source, "ab") as f:
        f.write(b"\0" * 8)
    stg = glob.glob(os.path.join(d, ".out.bpk.staging-*"))
    if not check(len(stg) == 1, "one staging directory left: %r" % stg):
        return
    r = run([BIN, "--finish", stg[0]])
    check(r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "m.bpk" in r.stderr,
          "a changed checkpoint is refused in one line naming it: %r" % r.stderr)
    check(not os.path.exists(out), "nothing written")
    check(os.path.exists(os.path.join(stg[0], "JOURNAL")), "the journal is kept")


def test_filtered_in_place_keeps_what_it_hides(tmp):
    """rw in place with exclude=: the journal's BASE keeps the hidden tensors,
    so --finish after a kill writes them back untouched, as a write-back would."""
    d, target, mnt = fresh(tmp, "hidden")
    before, _ = read_bpk(target)
    with Mount(target, mnt, "rw,exclude=^conv2"):
        sh("mv %s/conv1 %s/c1" % (mnt, mnt), d)
        time.sleep(WINDOW + 0.5)
        kill_daemon(mnt)
    stg = glob.glob(os.path.join(d, ".m.bpk.staging-*"))
    r = run([BIN, "--finish"] + stg[:1])
    check(r.returncode == 0, "--finish: %r" % r.stderr)
    got, _ = read_bpk(target)
    check(all(got.get(k) == v for k, v in before.items() if k.startswith("conv2.")) and
          "c1.conv.weight" in got and "conv1.conv.weight" not in got,
          "hidden tensors kept, the rename applied: %s" % sorted(got)[:8])


def safetensors_f32(path, values):
    """A SafeTensors file of one F32 tensor w."""
    data = struct.pack("<%df" % len(values), *values)
    head = json.dumps({"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, len(data)]}}).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + data)


def test_journal_copied_into_another_staging_directory(tmp):
    """Nothing tied a JOURNAL to its directory: kill -9 two writable mounts
    of same-sized one/m.safetensors and two/m.safetensors, copy one's
    JOURNAL into two's staging directory, and --finish of it exited 0
    having written one/m.safetensors with two's staged bytes. The journal's
    BASE names its staging directory: refused in one line naming both."""
    dirs, stgs = {}, {}
    for name, first in (("one", 1.0), ("two", 100.0)):
        d = os.path.join(tmp, "copied", name)
        os.makedirs(d)
        target = os.path.join(d, "m.safetensors")
        safetensors_f32(target, [first, first + 1, first + 2, first + 3])
        mnt = os.path.join(d, "mnt")
        with Mount(target, mnt, "rw"):
            with open(os.path.join(mnt, "w"), "r+b") as f:
                f.write(struct.pack("<4f", first + 10, first + 11, first + 12, first + 13))
            time.sleep(WINDOW + 0.5)
            kill_daemon(mnt)
        stg = glob.glob(os.path.join(d, ".m.safetensors.staging-*"))
        if not check(len(stg) == 1, "%s: one staging directory left: %r" % (name, stg)):
            return
        dirs[name], stgs[name] = d, stg[0]
    before = {n: open(os.path.join(d, "m.safetensors"), "rb").read() for n, d in dirs.items()}
    two_journal = os.path.join(stgs["two"], "JOURNAL")
    shutil.copyfile(two_journal, os.path.join(tmp, "two.JOURNAL"))
    shutil.copyfile(os.path.join(stgs["one"], "JOURNAL"), two_journal)
    r = run([BIN, "--finish", stgs["two"]])
    lines = r.stderr.strip().splitlines()
    check(r.returncode != 0 and len(lines) == 1 and os.path.basename(stgs["one"]) in lines[0]
          and os.path.basename(stgs["two"]) in lines[0] and "copied from another" in lines[0],
          "a journal copied from another staging directory is refused in one line naming both: %r" % r.stderr)
    for n, d in dirs.items():
        check(open(os.path.join(d, "m.safetensors"), "rb").read() == before[n], "%s/m.safetensors untouched" % n)
    check(os.path.isdir(stgs["two"]), "the staging directory is kept")
    # each in its own directory finishes with its own bytes
    shutil.copyfile(os.path.join(tmp, "two.JOURNAL"), two_journal)
    for name, first in (("one", 1.0), ("two", 100.0)):
        r = run([BIN, "--finish", stgs[name]])
        check(r.returncode == 0, "%s: --finish: %r" % (name, r.stderr))
        got = open(os.path.join(dirs[name], "m.safetensors"), "rb").read()
        check(got.endswith(struct.pack("<4f", first + 10, first + 11, first + 12, first + 13)),
              "%s: its own staged bytes" % name)


def test_nojournal(tmp):
    d, target, mnt = fresh(tmp, "nojournal")
    with Mount(target, mnt, "rw,nojournal") as m:
        stg = glob.glob(os.path.join(d, ".m.bpk.staging-*"))
        check(len(stg) == 1 and not os.path.exists(os.path.join(stg[0], "JOURNAL")),
              "-o nojournal keeps no JOURNAL: %r" % (os.listdir(stg[0]) if stg else stg))
        sh("mv %s/conv1 %s/renamed" % (mnt, mnt), d)
        u = m.unmount()
        check(u.returncode == 0, "write-back: %r" % u.stderr)
    got, _ = read_bpk(target)
    check("renamed.conv.weight" in got, "the write-back without a journal")


if __name__ == "__main__":
    run_tests("test_journal", [test_kill_while_mounted, test_changed_checkpoint_is_refused,
                               test_filtered_in_place_keeps_what_it_hides, test_nojournal,
                               test_journal_copied_into_another_staging_directory], "journal")
