"""Files burnstore did not just create (issue 30): what another local user
(nobody, through setpriv) plants or swaps in a directory they may write (a
group-writable team directory without the sticky bit, a sticky 1777 one),
and FIFOs where burnstore expects files. Each case names the file and its
owner in one line, or goes on with its own files; nothing blocks, nothing is
read from or written to a file the other user chose. Every command runs
under a deadline: the old code hung in open(2) on a FIFO, which fails the
test by its timeout instead of hanging the suite."""
import glob
import json
import os
import pwd
import shutil
import stat
import subprocess

from bsmount import (BIN, Mount, check, force_unmount, kill_daemon, read_safetensors, run_tests, strace,
                     write_safetensors)

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
NOBODY_UID = 65534
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/", "LC_ALL": "C"}
QUICK = 15  # seconds: a command that blocks in open(2) fails by this deadline

A = bytes(range(256)) * 16            # 4 KiB, root's checkpoint
NEW = bytes([0xA5]) * 4096            # what root writes through its mount
SECRET = b"ROOT-ONLY KEY " * 292 + b"ROOTROOT"  # 4096 bytes: a tensor's size


def run(cmd, timeout=QUICK, text=True, **kw):
    """A command under a deadline: a hang is a failed check, never a hung suite."""
    try:
        return subprocess.run(cmd, capture_output=True, text=text, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        check(False, "%s did not end within %d s (blocked)" % (" ".join(cmd[:3]), timeout))
        return subprocess.CompletedProcess(cmd, -1, "", "timed out")


def as_nobody(script, *args):
    """A Python script run as nobody, with args in sys.argv."""
    r = run(NOBODY + ["/usr/bin/python3", "-c", script] + list(args), env=ENV)
    check(r.returncode == 0, "as nobody: %s" % r.stderr.strip())
    return r


def team_dir(tmp, name, mode=0o2770):
    """A directory root owns that the group nogroup (nobody's) may write:
    no sticky bit, so nobody may rename and remove what root puts there."""
    os.chmod(tmp, 0o755)
    d = os.path.join(tmp, name)
    os.makedirs(d)
    os.chown(d, 0, NOBODY_UID)
    os.chmod(d, mode)
    return d


def secret_file(tmp):
    p = os.path.join(tmp, "secret.key")
    with open(p, "wb") as f:
        f.write(SECRET)
    os.chmod(p, 0o600)
    return p


def one_line(r, *words):
    lines = r.stderr.strip().splitlines()
    return len(lines) == 1 and all(w in lines[0] for w in words)


def killed_staging(d, name, mnt):
    """root's rw mount of d/name, a write into tensor a, a kill -9: its
    staging directory (JOURNAL, lock, one staged file), or None."""
    src = os.path.join(d, name)
    with Mount(src, mnt, "rw") as m:
        with open(os.path.join(m, "a"), "r+b") as f:
            f.write(NEW)
        kill_daemon(mnt)
    stg = glob.glob(os.path.join(d, ".%s.staging-*" % name))
    return stg[0] if check(len(stg) == 1, "one staging directory left: %s" % stg) else None


SWAP = r"""
import os, sys
d, name, secret = sys.argv[1:4]
stg = [f for f in os.listdir(d) if f.startswith("." + name + ".staging-")]
assert len(stg) == 1, stg
os.rename(os.path.join(d, stg[0]), os.path.join(d, "away"))
os.mkdir(os.path.join(d, stg[0]), 0o755)
for i in range(1, 9):
    os.symlink(secret, os.path.join(d, stg[0], str(i)))
print(stg[0])
"""


def test_staging_swapped_while_mounted(tmp):
    """Item 1: nobody renames root's staging directory away while mounted and
    puts their own in its place, holding symlinks to a root-only key. The
    write-back reads the staged bytes through the directory it holds."""
    d = team_dir(tmp, "team1")
    secret = secret_file(tmp)
    src = os.path.join(d, "out.safetensors")
    write_safetensors(src, {"a": A})
    mnt = os.path.join(tmp, "mnt1")
    with Mount(src, mnt, "rw") as m:
        with open(os.path.join(m, "a"), "r+b") as f:
            f.write(NEW)
        r = as_nobody(SWAP, d, "out.safetensors", secret)
        planted = r.stdout.strip()
        u = m.unmount()
        check(u is not None and u.returncode == 0, "the write-back succeeds: %s" % (u and u.stderr))
    got, _ = read_safetensors(src)
    check(got["a"][2] == NEW, "the output holds what root wrote")
    check(SECRET[:64] not in open(src, "rb").read(), "no byte of the root-only key is in the 0644 output")
    if planted:
        p = os.path.join(d, planted)
        check(os.path.isdir(p) and os.stat(p).st_uid == NOBODY_UID,
              "nobody's planted directory is left as it was")
        shutil.rmtree(p, ignore_errors=True)


COPY_STAGING = r"""
import os, shutil, sys
tpl, theirs, made, secret = sys.argv[1:5]
os.mkdir(theirs, 0o700)
for f in os.listdir(tpl):
    if f != "lock":
        shutil.copyfile(os.path.join(tpl, f), os.path.join(theirs, f))
os.symlink(made, os.path.join(theirs, "lock"))
os.symlink(secret, os.path.join(theirs, "log"))
"""


def test_foreign_staging_is_refused(tmp):
    """Item 4: a staging directory nobody made (a copy of a real one, with
    `lock` a link to a new path and `log` a link to a root-only file) is
    refused by root's --finish and --list-staging in one line naming its
    owner: nothing is written to root's 0600 checkpoint, no file is created
    through the `lock` link, the root-only file is never printed. The same
    links in root's own staging directory are named, never followed."""
    d = team_dir(tmp, "team4")
    secret = secret_file(tmp)
    src = os.path.join(d, "w.safetensors")
    write_safetensors(src, {"a": A})
    os.chmod(src, 0o600)
    stg = killed_staging(d, "w.safetensors", os.path.join(tmp, "mnt4"))
    if not stg:
        return
    tpl = os.path.join(tmp, "tpl4")
    shutil.copytree(stg, tpl)
    for root, dirs, files in os.walk(tpl):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    theirs = os.path.join(d, ".w.safetensors.staging-EVIL00")
    made = os.path.join(tmp, "made-by-lock")
    as_nobody(COPY_STAGING, tpl, theirs, made, secret)
    before = open(src, "rb").read()
    r = run([BIN, "--list-staging", theirs])
    check(r.returncode == 1 and one_line(r, theirs, "owned by uid 65534 (nobody)", "not by you"),
          "--list-staging refuses nobody's directory in one line naming its owner: %d %r"
          % (r.returncode, r.stderr))
    check("ROOT-ONLY" not in r.stdout + r.stderr, "the root-only file behind `log` is not printed")
    r = run([BIN, "--finish", theirs])
    check(r.returncode == 1 and one_line(r, theirs, "owned by uid 65534 (nobody)"),
          "--finish refuses nobody's directory in one line naming its owner: %d %r"
          % (r.returncode, r.stderr))
    check(open(src, "rb").read() == before, "root's checkpoint is untouched")
    check(not os.path.lexists(made), "no file was created through the `lock` link")
    check(os.path.isdir(theirs) and os.stat(theirs).st_uid == NOBODY_UID, "nobody's directory is left as it was")
    # The same links in a directory of root's own: named, never followed.
    os.unlink(os.path.join(stg, "lock"))
    os.symlink(made, os.path.join(stg, "lock"))
    os.symlink(secret, os.path.join(stg, "log"))
    r = run([BIN, "--list-staging", stg])
    check("ROOT-ONLY" not in r.stdout and "log: not read" in r.stdout and "symbolic link" in r.stdout,
          "root's own directory: the `log` link is named, not read: %r" % r.stdout)
    r = run([BIN, "--finish", stg])
    check(r.returncode == 1 and one_line(r, "lock", "symbolic link", "not followed"),
          "root's own directory: a `lock` link is refused in one line: %d %r" % (r.returncode, r.stderr))
    check(not os.path.lexists(made), "still no file created through the `lock` link")
    os.unlink(os.path.join(stg, "lock"))
    os.unlink(os.path.join(stg, "log"))
    r = run([BIN, "--finish", stg])
    check(r.returncode == 0 and read_safetensors(src)[0]["a"][2] == NEW,
          "without the links --finish writes root's change: %r" % r.stderr)
    shutil.rmtree(theirs, ignore_errors=True)


def test_fifos_do_not_block(tmp):
    """Item 3: a FIFO `log` or `JOURNAL` in a staging directory makes neither
    --finish nor --list-staging block; the FIFO is named in one line."""
    d = team_dir(tmp, "team3")
    src = os.path.join(d, "f.safetensors")
    write_safetensors(src, {"a": A})
    stg = killed_staging(d, "f.safetensors", os.path.join(tmp, "mnt3"))
    if not stg:
        return
    log = os.path.join(stg, "log")
    os.mkfifo(log, 0o600)
    r = run([BIN, "--list-staging", stg])
    check(r.returncode == 1 and "log: not read" in r.stdout and "FIFO" in r.stdout,
          "--list-staging names the FIFO log: %d %r %r" % (r.returncode, r.stdout, r.stderr))
    os.unlink(log)
    journal = os.path.join(stg, "JOURNAL")
    os.rename(journal, journal + ".real")
    os.mkfifo(journal, 0o600)
    r = run([BIN, "--finish", stg])
    check(r.returncode == 1 and one_line(r, "JOURNAL", "FIFO"),
          "--finish refuses a FIFO JOURNAL in one line: %d %r" % (r.returncode, r.stderr))
    r = run([BIN, "--list-staging", stg])
    check(r.returncode == 1, "--list-staging of it ends: %d %r" % (r.returncode, r.stderr))
    os.unlink(journal)
    os.rename(journal + ".real", journal)
    r = run([BIN, "--finish", stg])
    check(r.returncode == 0 and read_safetensors(src)[0]["a"][2] == NEW, "then it finishes: %r" % r.stderr)


PLANT = r"""
import os, sys
stg = sys.argv[1]
os.mkdir(stg, 0o700)
open(os.path.join(stg, "lock"), "w").close()
os.mkfifo(os.path.join(stg, "JOURNAL"), 0o600)
"""


def test_planted_staging_at_mount(tmp):
    """Item 3: a planted `.new.safetensors.staging-AAAAAA/` holding `lock` and
    a FIFO `JOURNAL` does not hang root's writable mount of new.safetensors:
    nobody's is left alone with a line naming its owner, root's own is kept
    (a FIFO is not a journal of no change); the mount goes on."""
    d = team_dir(tmp, "team3b", 0o1777)
    src = os.path.join(d, "new.safetensors")
    write_safetensors(src, {"a": A})
    theirs = os.path.join(d, ".new.safetensors.staging-AAAAAA")
    as_nobody(PLANT, theirs)
    ours = os.path.join(d, ".new.safetensors.staging-BBBBBB")
    os.mkdir(ours, 0o700)
    open(os.path.join(ours, "lock"), "w").close()
    os.mkfifo(os.path.join(ours, "JOURNAL"), 0o600)
    mnt = os.path.join(tmp, "mnt3b")
    os.makedirs(mnt)
    r = run([BIN, src, mnt, "-o", "rw"])
    mounted = r.returncode == 0
    try:
        check(mounted, "the writable mount is not stopped by the planted directories: %d %r"
              % (r.returncode, r.stderr))
        check(theirs in r.stderr and "owned by uid 65534 (nobody)" in r.stderr and "left alone" in r.stderr,
              "nobody's directory is named with its owner: %r" % r.stderr)
    finally:
        if mounted:
            u = run([BIN, "-u", mnt], timeout=60)
            check(u.returncode == 0, "unmount: %s" % u.stderr)
        force_unmount(mnt)
    check(os.path.isdir(theirs) and os.stat(theirs).st_uid == NOBODY_UID, "nobody's directory is left alone")
    check(os.path.isdir(ours), "root's directory with a FIFO is kept")
    shutil.rmtree(theirs, ignore_errors=True)
    shutil.rmtree(ours, ignore_errors=True)


MKFIFO = r"""
import os, sys
os.mkfifo(sys.argv[1], 0o666)
"""


def test_set_journal_fifo(tmp):
    """Item 3: a FIFO nobody put at a set's journal name in a sticky
    directory (.X.safetensors.index.json.burnstore-journal) blocks none of
    root's ls, info, cat, diff and convert of X.safetensors (it records no
    write: the file is read as it is); a writer of that set refuses it in
    one line naming it."""
    d = team_dir(tmp, "sticky3", 0o1777)
    x = os.path.join(d, "X.safetensors")
    write_safetensors(x, {"a": A})
    j = os.path.join(d, ".X.safetensors.index.json.burnstore-journal")
    as_nobody(MKFIFO, j)
    out = os.path.join(d, "out.safetensors")
    for cmd in (["ls", x], ["info", x], ["cat", x, "a"], ["diff", x, x], ["convert", "-q", x, out]):
        r = run([BIN] + cmd, text=False)
        check(r.returncode == 0 and (cmd[0] != "cat" or r.stdout == A),
              "%s with a FIFO at the journal's name: %d %r" % (cmd[0], r.returncode, r.stderr))
    check(os.path.exists(out) and read_safetensors(out)[0]["a"][2] == A, "convert wrote its output")
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=2048", x, os.path.join(d, "X.safetensors.index.json")])
    check(r.returncode == 1 and one_line(r, j, "FIFO"),
          "a writer of the set refuses the FIFO in one line: %d %r" % (r.returncode, r.stderr))
    check(stat.S_ISFIFO(os.lstat(j).st_mode) and read_safetensors(x)[0]["a"][2] == A,
          "the FIFO and X.safetensors are left as they were")


PUT = r"""
import os, sys
path, text, mode = sys.argv[1], sys.argv[2], int(sys.argv[3], 8)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
os.write(fd, text.encode())
os.close(fd)
os.chmod(path, mode)
"""


def snapshot(d):
    out = {}
    for f in sorted(os.listdir(d)):
        p = os.path.join(d, f)
        st = os.lstat(p)
        out[f] = (st.st_uid, stat.S_IMODE(st.st_mode), open(p, "rb").read() if stat.S_ISREG(st.st_mode) else None)
    return out


def convert_with_umask(src, out, umask):
    """root's burnstore convert src out under umask (restored after)."""
    old_umask = os.umask(umask)
    try:
        return run([BIN, "convert", "-q", src, out])
    finally:
        os.umask(old_umask)


def test_planted_index(tmp):
    """Item 2: in a sticky directory, nobody's out.safetensors.index.json
    naming root's files as its shards. root's convert into that set (a
    reshard, or one that reuses the old shard names) is refused in one line
    naming the index's owner; root's files stay as they were. root's own
    index naming a shard nobody planted at a free name is refused the same
    way. A file another user planted at a new output's name is replaced
    with the caller's umask, never with its 0666."""
    d = team_dir(tmp, "sticky2", 0o1777)
    src = os.path.join(d, "src.safetensors")
    write_safetensors(src, {"a": A, "b": NEW})
    victim = os.path.join(d, "victim.safetensors")
    victim2 = os.path.join(d, "victim2.safetensors")
    write_safetensors(victim, {"v": b"victim"})
    write_safetensors(victim2, {"v": b"victim2"})
    index = os.path.join(d, "out.safetensors.index.json")
    planted = json.dumps({"metadata": {}, "weight_map": {"a": "victim.safetensors", "b": "victim2.safetensors"}})
    as_nobody(PUT, index, planted, "0666")
    before = snapshot(d)
    for opts in (["-o", "max_shard_size=5KB"], []):
        r = run([BIN, "convert", "-q"] + opts + [src, index])
        check(r.returncode == 1 and one_line(r, index, "owned by uid 65534 (nobody)"),
              "convert %s into nobody's index is refused in one line naming its owner: %d %r"
              % (opts, r.returncode, r.stderr))
        check(snapshot(d) == before, "convert %s: root's victim files and the index are as they were" % opts)
    os.unlink(index)
    # root's own index naming a shard whose name nobody took meanwhile.
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=5KB", src, index])
    check(r.returncode == 0, "root's own set: %r" % r.stderr)
    shards = json.load(open(index))["weight_map"]
    name = sorted(set(shards.values()))[-1]
    os.unlink(os.path.join(d, name))
    as_nobody(PUT, os.path.join(d, name), "nobody's own file", "0644")
    before = snapshot(d)
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=3KB", src, index])
    check(r.returncode == 1 and one_line(r, name, "owned by uid 65534 (nobody)"),
          "a shard of another user's is refused in one line naming its owner: %d %r" % (r.returncode, r.stderr))
    check(snapshot(d) == before, "nobody's file and root's set are as they were")
    # A single file planted at a new output's name: replaced, with root's umask.
    out = os.path.join(d, "new.bpk")
    as_nobody(PUT, out, "planted", "0666")
    r = convert_with_umask(src, out, 0o022)
    st = os.stat(out)
    check(r.returncode == 0 and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o644,
          "the new output is root's 0644, not the planted 0666: %d %o %r"
          % (st.st_uid, stat.S_IMODE(st.st_mode), r.stderr))


REWRITE = r"""
import sys
path, text = sys.argv[1], sys.argv[2]
with open(path, "r+") as f:  # in place: a group member may write the file, not replace it
    f.truncate(0)
    f.write(text)
"""


def group_index_case(tmp, name, owner, other):
    """owner's shard set m.safetensors.index.json (0664) in a sticky
    directory of the group nogroup, owner's other files precious and keep2
    (each holding one tensor) beside it; `other` (of the group) rewrites the
    index in place so that it also names them as shards. owner's convert
    reshards, then rewrites keeping the shards, then (root only) a writable
    mount writes back in place: the set is written each time, precious and
    keep2 are left as they were and named in one note line, and an index
    the owner left untouched still has its own old shards removed."""
    d = team_dir(tmp, name, 0o3775)  # setgid + sticky: a team directory
    env = dict(ENV)
    as_owner = []
    if owner != "root":
        run_dir = os.path.join(tmp, name + "-run")
        os.makedirs(run_dir, 0o700)
        os.chown(run_dir, NOBODY_UID, NOBODY_UID)
        env["BURNSTORE_RUN_DIR"] = run_dir
        as_owner = ["setpriv", "--reuid=%s" % owner, "--regid=nogroup", "--clear-groups"]
        # a copy of burnstore the owner runs: the build tree (a clone under
        # /root) may be out of its reach
        binary = os.path.join(run_dir, "burnstore")
        shutil.copy(shutil.which(BIN) or BIN, binary)
        os.chmod(binary, 0o755)
    else:
        binary = BIN
    as_other = ["setpriv", "--reuid=%s" % other, "--regid=nogroup", "--clear-groups"]
    src = os.path.join(d, "src.safetensors")
    ts = {"a": A, "b": NEW, "c": SECRET}
    index = os.path.join(d, "m.safetensors.index.json")

    def own(cmd):  # the owner's command, under umask 002 (a team's)
        return run(as_owner + ["sh", "-c", 'umask 002 && exec "$@"', "sh"] + cmd, env=env)

    for f, t in ((src, ts), (os.path.join(d, "precious.safetensors"), {"p": b"precious"}),
                 (os.path.join(d, "keep2.safetensors"), {"q": b"keep2"})):
        # written by root and handed over: the owner may not read the tests'
        # directory (a clone under /root), so it cannot import bsmount
        write_safetensors(f, t)
        os.chown(f, pwd.getpwnam(owner).pw_uid, NOBODY_UID)
        os.chmod(f, 0o664)
    r = own([binary, "convert", "-q", "-o", "max_shard_size=5KB", src, index])
    st = os.stat(index)
    if not check(r.returncode == 0 and stat.S_IMODE(st.st_mode) == 0o664 and st.st_gid == NOBODY_UID,
                 "%s's set, its index 0664 of the group: %o %r" % (owner, stat.S_IMODE(st.st_mode), r.stderr)):
        return
    theirs = {"p": b"precious", "q": b"keep2"}

    def tamper():
        wm = json.load(open(index))["weight_map"]
        wm.update({"p": "precious.safetensors", "q": "keep2.safetensors"})
        r = run(as_other + ["/usr/bin/python3", "-c", REWRITE, index,
                            json.dumps({"metadata": {}, "weight_map": wm})], env=ENV)
        check(r.returncode == 0 and os.stat(index).st_uid == os.stat(src).st_uid,
              "%s rewrote %s's index in place: %r" % (other, owner, r.stderr))

    def kept(what):
        for f, t in (("precious.safetensors", "p"), ("keep2.safetensors", "q")):
            p = os.path.join(d, f)
            check(os.path.exists(p) and read_safetensors(p)[0].get(t, (0, 0, None))[2] == theirs[t],
                  "%s: %s's %s is left as it was" % (what, owner, f))

    def the_set(what, want):
        wm = json.load(open(index))["weight_map"]
        check(set(wm) == set(want) and not set(wm.values()) & {"precious.safetensors", "keep2.safetensors"},
              "%s: the new index names the set's own shards: %r" % (what, wm))
        for k, v in want.items():
            got = read_safetensors(os.path.join(d, wm.get(k, "?")))[0] if k in wm else {}
            check(k in got and got[k][2] == v, "%s: %s read back" % (what, k))

    def noted(what, r):
        notes = [l for l in r.stderr.splitlines() if "note:" in l]
        check(len(notes) == 1 and "precious.safetensors" in notes[0] and "keep2.safetensors" in notes[0]
              and "left in place" in notes[0], "%s: one note naming what was left: %r" % (what, r.stderr))

    for opts in (["-o", "max_shard_size=6KB"], []):
        what = "%s's convert %s" % (owner, " ".join(opts) or "(keeping the shards)")
        tamper()
        r = own([binary, "convert", "-q"] + opts + [src, index])
        check(r.returncode == 0, "%s over %s's rewrite of the index: %r" % (what, other, r.stderr))
        kept(what)
        the_set(what, ts)
        noted(what, r)
    # the owner's own group-writable index, untouched: a reshard removes its old shards
    before = set(json.load(open(index))["weight_map"].values())
    r = own([binary, "convert", "-q", "-o", "max_shard_size=2KB", src, index])
    after = set(json.load(open(index))["weight_map"].values())
    check(r.returncode == 0 and "note:" not in r.stderr, "%s's own index resharded: %r" % (owner, r.stderr))
    check(all(not os.path.exists(os.path.join(d, f)) for f in before - after),
          "the old shards of %s's own index are removed: %r" % (owner, sorted(before - after)))
    if owner != "root":
        return
    # a writable mount of the set in place: it shows p and q (the index names them)
    tamper()
    mnt = os.path.join(tmp, name + "-mnt")
    os.makedirs(mnt)
    try:
        r = run([BIN, index, mnt, "-o", "rw"], timeout=60)
        if check(r.returncode == 0, "root mounts the set writable: %r" % r.stderr):
            with open(os.path.join(mnt, "a"), "r+b") as f:
                f.write(NEW)
            u = run([BIN, "-u", "-v", mnt], timeout=60)
            check(u.returncode == 0, "write-back: %r" % u.stderr)
            noted("the mount's write-back (its log)", subprocess.CompletedProcess([], 0, "", u.stdout + u.stderr))
            kept("the mount's write-back")
            the_set("the mount's write-back", dict(ts, a=NEW, **theirs))
    finally:
        force_unmount(mnt)


def test_group_writable_old_index(tmp):
    """A group-writable old index in a sticky team directory: the owner's
    0664 index (umask 002) may be rewritten by a group member so that its
    shards name the owner's other files; the owner's reshard then removed
    them, a rewrite keeping the shards overwrote them. Now only the shards of
    the set's own naming (STEM-NNNNN-of-NNNNN.safetensors) that are the
    caller's or root's are removed or reused; the others are left in place
    and named in one note (convert's stderr, the mount's log). root's set
    and nobody's rewrite; nobody's set and daemon's rewrite."""
    group_index_case(tmp, "team-root", "root", "nobody")
    group_index_case(tmp, "team-nobody", "nobody", "daemon")


def test_run_dir_fifo(tmp):
    """Run-directory files are opened as any file burnstore did not just
    create: a FIFO at a mount's log path blocks neither `burnstore status`
    nor `burnstore -u` (they read the log)."""
    d = os.path.join(tmp, "rundir")
    run_dir = os.path.join(d, "run")
    os.makedirs(run_dir, mode=0o700)
    env = dict(os.environ, BURNSTORE_RUN_DIR=run_dir)
    src = os.path.join(d, "m.safetensors")
    write_safetensors(src, {"a": A})
    mnt = os.path.join(d, "mnt")
    os.makedirs(mnt)
    r = run([BIN, src, mnt], env=env)
    if not check(r.returncode == 0, "mount: %r" % r.stderr):
        return
    try:
        logs = glob.glob(os.path.join(run_dir, "*.log"))
        check(len(logs) == 1, "the mount's log: %s" % logs)
        for log in logs:
            os.unlink(log)
            os.mkfifo(log, 0o600)
        r = run([BIN, "status", mnt], env=env)
        check(r.returncode == 0 and "served by burnstore" in r.stdout, "status with a FIFO log: %d %r %r"
              % (r.returncode, r.stdout, r.stderr))
        r = run([BIN, "-u", "-v", mnt], env=env)
        check(r.returncode == 0, "-u -v with a FIFO log: %d %r" % (r.returncode, r.stderr))
    finally:
        force_unmount(mnt)
    for f in glob.glob(os.path.join(run_dir, "*")):
        os.unlink(f)


LINK = r"""
import os, sys
os.symlink(sys.argv[1], sys.argv[2])
"""


def test_foreign_link_is_never_written_through(tmp):
    """In a sticky directory, nobody's out.safetensors, a link to a root-only
    file: root's mount with output= that name, and an rw mount of nobody's
    link to root's checkpoint, are refused in one line naming the link's
    owner (the link was followed by hand, bypassing protected_symlinks, and
    the write-back replaced the file it named: any file of root's). root's
    own link is still followed (test_writeback_edges.py)."""
    d = team_dir(tmp, "sticky5", 0o1777)
    secret = secret_file(tmp)
    src = os.path.join(d, "src.safetensors")
    write_safetensors(src, {"a": A})
    out = os.path.join(d, "out.safetensors")
    as_nobody(LINK, secret, out)
    rwlink = os.path.join(d, "rw.safetensors")
    as_nobody(LINK, src, rwlink)
    mnt = os.path.join(tmp, "mnt5")
    os.makedirs(mnt)
    before = open(src, "rb").read()
    for what, args in (("output=", [src, mnt, "-o", "output=" + out]), ("rw", [rwlink, mnt, "-o", "rw"])):
        try:
            r = run([BIN] + args)
            check(r.returncode == 1 and one_line(r, "symbolic link of uid 65534 (nobody)", "not yours"),
                  "%s nobody's link: refused in one line naming its owner: %d %r" % (what, r.returncode, r.stderr))
            if r.returncode == 0:
                run([BIN, "-u", mnt], timeout=60)
        finally:
            force_unmount(mnt)
    # nobody's link in nobody's own directory (0755: no one else may write
    # it) names a file of nobody's choosing all the same.
    theirs = os.path.join(tmp, "nobodys5")
    os.makedirs(theirs)
    os.chown(theirs, NOBODY_UID, NOBODY_UID)
    out2 = os.path.join(theirs, "out.safetensors")
    as_nobody(LINK, secret, out2)
    try:
        r = run([BIN, src, mnt, "-o", "output=" + out2])
        check(r.returncode == 1 and one_line(r, "symbolic link of uid 65534 (nobody)", "not yours"),
              "output= nobody's link in nobody's directory: refused: %d %r" % (r.returncode, r.stderr))
        if r.returncode == 0:
            run([BIN, "-u", mnt], timeout=60)
    finally:
        force_unmount(mnt)
    check(open(secret, "rb").read() == SECRET, "the root-only file the links name is untouched")
    check(open(src, "rb").read() == before, "root's checkpoint is untouched")
    check(os.path.islink(out) and os.path.islink(rwlink), "nobody's links are left as they were")


def test_foreign_link_mode_is_not_copied(tmp):
    """A convert over nobody's link to a set-uid program (or any root file
    whose mode is wider than root's umask) gives the new output root's
    umask: the mode of the file the link named was copied (04755: a
    set-uid root file holding the tensors; 0644 under umask 077)."""
    d = team_dir(tmp, "sticky6", 0o1777)
    src = os.path.join(d, "src.safetensors")
    write_safetensors(src, {"a": A})
    suid = os.path.join(tmp, "suid-program")
    with open(suid, "wb") as f:
        f.write(b"#!/bin/sh\n")
    os.chmod(suid, 0o4755)
    out = os.path.join(d, "out.safetensors")
    as_nobody(LINK, suid, out)
    r = convert_with_umask(src, out, 0o077)
    st = os.lstat(out)
    check(r.returncode == 0 and stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600,
          "the new output is root's 0600 (umask 077), not the linked file's 04755: %o %r"
          % (stat.S_IMODE(st.st_mode), r.stderr))
    check(stat.S_IMODE(os.stat(suid).st_mode) == 0o4755 and open(suid, "rb").read() == b"#!/bin/sh\n",
          "the file the link named is untouched")


def test_fifo_at_a_new_shard_name(tmp):
    """A FIFO nobody put at a new shard's name in a sticky directory: root's
    convert to a shard set ended only by its deadline (the check whether
    the shard already holds its bytes opened it blocking); now it writes
    the set."""
    d = team_dir(tmp, "sticky7", 0o1777)
    src = os.path.join(d, "src.safetensors")
    write_safetensors(src, {"a": A, "b": NEW})
    as_nobody(MKFIFO, os.path.join(d, "out-00001-of-00002.safetensors"))
    index = os.path.join(d, "out.safetensors.index.json")
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=5000", src, index])
    check(r.returncode == 0 and os.path.isfile(index), "the set is written: %d %r" % (r.returncode, r.stderr))
    shard = os.path.join(d, "out-00001-of-00002.safetensors")
    check(stat.S_ISREG(os.lstat(shard).st_mode) and os.lstat(shard).st_uid == 0,
          "the shard is root's regular file")


SWAP_IN = r"""
import os, sys, time
time.sleep(float(sys.argv[3]))
os.rename(sys.argv[1], sys.argv[2])
"""


def test_checkpoint_swapped_during_finish(tmp):
    """In a group-writable directory, nobody renames a file of theirs (the
    same layout, other bytes) over root's checkpoint while root's --finish
    of a killed mount opens it: the stat that found the checkpoint as the
    mount had it was of the name, the open then took nobody's file, and the
    output held nobody's bytes as its clean tensors beside root's edit. The
    file opened is now the one compared (strace holds that open 1.5 s)."""
    d = team_dir(tmp, "team8")
    src = os.path.join(d, "c.safetensors")
    write_safetensors(src, {"a": A, "b": A})
    stg = killed_staging(d, "c.safetensors", os.path.join(tmp, "mnt8"))
    if not stg:
        return
    theirs = os.path.join(d, "theirs.safetensors")
    write_safetensors(theirs, {"a": SECRET, "b": SECRET})
    os.chown(theirs, NOBODY_UID, NOBODY_UID)
    # The second open of the checkpoint's path is the one after the
    # stat of the INDEX's attach (the first: the journal's replay).
    p = subprocess.Popen(strace("-o", "/dev/null", "-P", src, "-e", "trace=openat") + [
                          "-e", "inject=openat:delay_enter=1500000:when=2", BIN, "--finish", stg],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    as_nobody(SWAP_IN, theirs, src, "0.7")
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    got = read_safetensors(src)[0]
    check(got["a"][2] == SECRET and got["b"][2] == SECRET, "the name holds nobody's file, as they put it")
    check(p.returncode == 1 and "changed since the write-back started" in err,
          "--finish refuses the file it opened: %d %r %r" % (p.returncode, out, err))
    check(os.path.isdir(stg), "the staging directory is kept")


MKDIR = r"""
import os, sys
os.mkdir(sys.argv[1], 0o755)
"""


def test_planted_name_is_one_line(tmp):
    """nobody's directory at a staging directory's name holding a newline
    and an escape (.n.safetensors.staging-\n\x1b[2J:): root's writable mount
    named it in a message of two lines, the second nobody's text (a line
    that could pass for burnstore's), the escape sent to root's terminal.
    Every name in a refusal has its control characters replaced."""
    d = team_dir(tmp, "sticky9", 0o1777)
    src = os.path.join(d, "n.safetensors")
    write_safetensors(src, {"a": A})
    theirs = os.path.join(d, ".n.safetensors.staging-\n\x1b[2J:")
    as_nobody(MKDIR, theirs)
    mnt = os.path.join(tmp, "mnt9")
    os.makedirs(mnt)
    r = run([BIN, src, mnt, "-o", "rw"])
    try:
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 0 and len(lines) == 1 and "owned by uid 65534 (nobody)" in lines[0]
              and "\x1b" not in r.stderr,
              "nobody's directory is named in one line, its control characters replaced: %d %r"
              % (r.returncode, r.stderr))
    finally:
        if r.returncode == 0:
            run([BIN, "-u", mnt], timeout=60)
        force_unmount(mnt)
    os.rmdir(theirs)


if __name__ == "__main__":
    run_tests("test_planted", [test_staging_swapped_while_mounted, test_foreign_staging_is_refused,
                               test_fifos_do_not_block, test_planted_staging_at_mount,
                               test_set_journal_fifo, test_planted_index, test_group_writable_old_index,
                               test_run_dir_fifo,
                               test_foreign_link_is_never_written_through, test_foreign_link_mode_is_not_copied,
                               test_fifo_at_a_new_shard_name, test_checkpoint_swapped_during_finish,
                               test_planted_name_is_one_line],
              "planted")
