"""Shared mounts (issue 24): the modes a mount shows are the modes the kernel
enforces (default_permissions on every mount). An unprivileged user (nobody,
through setpriv) against root's rw,allow_other mount cannot create,
overwrite, truncate, rename, unlink, setfattr, mkdir, chmod nor chown, reads
what the modes allow, and root's write-back is unchanged by the attempts; a
read-only allow_other mount serves reads only. uid=/gid=/umask= set what is
shown and enforced; chmod and chown hold for the life of the mount; a file
another user creates is theirs. Staging and status files keep other users
out. An unprivileged mount that the system does not allow says why."""
import hashlib
import json
import os
import shutil
import stat
import subprocess

from bsmount import (BIN, SOURCE_DIR, Mount, check, fnv1a, force_unmount, is_mounted, read_bpk, read_safetensors,
                     run, run_path, run_tests, strace, write_safetensors)

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
NOBODY_UID = 65534
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/", "LC_ALL": "C"}

# Runs as nobody: a JSON list of [op, path, ...]; prints one JSON list of
# results ("ok", the sha256 of what was read, a listing, or an errno name).
HELPER = r"""
import errno, hashlib, json, os, sys
os.umask(0o022)
def do(op, a):
    if op == "read":
        with open(a[0], "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    if op == "list":
        return sorted(os.listdir(a[0]))
    if op == "getxattr":
        return os.getxattr(a[0], a[1]).decode()
    if op == "create":
        os.close(os.open(a[0], os.O_CREAT | os.O_WRONLY, 0o644))
    elif op == "write":
        fd = os.open(a[0], os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, bytes.fromhex(a[1]), int(a[2]) if len(a) > 2 else 0)
        finally:
            os.close(fd)
    elif op == "truncate":
        os.truncate(a[0], 0)
    elif op == "rename":
        os.rename(a[0], a[1])
    elif op == "unlink":
        os.unlink(a[0])
    elif op == "setxattr":
        os.setxattr(a[0], a[1], a[2].encode())
    elif op == "mkdir":
        os.mkdir(a[0])
    elif op == "rmdir":
        os.rmdir(a[0])
    elif op == "chmod":
        os.chmod(a[0], int(a[1], 8))
    elif op == "chown":
        os.chown(a[0], int(a[1]), int(a[2]))
    elif op == "stat":
        st = os.stat(a[0])
        return [st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)]
    else:
        raise SystemExit("unknown op " + op)
    return "ok"
out = []
for item in json.loads(sys.argv[1]):
    try:
        out.append(do(item[0], item[1:]))
    except OSError as e:
        out.append(errno.errorcode[e.errno])
print(json.dumps(out))
"""

A = bytes(range(256)) * 16          # 4 KiB
B = bytes([7] * 1024)
C = bytes([1, 2, 3, 4]) * 64


def sha(b):
    return hashlib.sha256(b).hexdigest()


def as_nobody(*ops):
    """Run ops as nobody; their results, in order."""
    r = run(NOBODY + ["/usr/bin/python3", "-c", HELPER, json.dumps(ops)], env=ENV)
    if r.returncode != 0:
        check(False, "the helper as nobody failed (%d): %s" % (r.returncode, r.stderr.strip()))
        return [None] * len(ops)
    return json.loads(r.stdout)


def shared_dir(tmp, name):
    """A fresh directory nobody can reach (every parent 0755)."""
    os.chmod(tmp, 0o755)
    d = os.path.join(tmp, name)
    os.makedirs(d)
    os.chmod(d, 0o755)
    return d


def mount_opts(mnt):
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mounts") as f:
        for line in f:
            p = line.split()
            if p[1] == mnt:
                return p[3].split(",")
    return []


def expect(name, got, want):
    check(len(got) == len(want), "%s: %d results for %d expectations" % (name, len(got), len(want)))
    for (op, w), g in zip(want, got):
        ok = g in w if isinstance(w, tuple) else g == w
        check(ok, "%s: nobody's %s gave %r, expected %r" % (name, op, g, w))


def test_rw_allow_other(tmp):
    d = shared_dir(tmp, "rw")
    src = os.path.join(d, "model.safetensors")
    write_safetensors(src, {"a": A, "sub.b": B, "c": C})
    before = open(src, "rb").read()
    mnt = os.path.join(d, "mnt")
    with Mount(src, mnt, "rw,allow_other") as m:
        check("default_permissions" in mount_opts(m), "rw,allow_other: default_permissions is on: %s"
              % mount_opts(m))
        st = os.stat(os.path.join(m, "a"))
        check((st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o644),
              "rw: root's tensor shows as root:root 0644: %d:%d %o" % (st.st_uid, st.st_gid, st.st_mode))
        st = os.stat(m)
        check(stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == 0, "rw: the root directory is root's 0755")
        a, b, sub = (os.path.join(m, p) for p in ("a", "sub/b", "sub"))
        got = as_nobody(["read", a], ["list", m], ["list", sub], ["getxattr", a, "user.burnstore.dtype"],
                        ["stat", a],
                        ["create", os.path.join(m, "new")], ["write", a, "deadbeef"], ["truncate", a],
                        ["rename", a, os.path.join(m, "a2")], ["unlink", a], ["unlink", b],
                        ["setxattr", a, "user.burnstore.dtype", "F32"], ["setxattr", a, "user.x", "1"],
                        ["mkdir", os.path.join(m, "d")], ["mkdir", os.path.join(sub, "d")],
                        ["rmdir", sub], ["chmod", a, "666"], ["chown", a, str(NOBODY_UID), str(NOBODY_UID)],
                        ["rename", b, os.path.join(m, "b")])
        expect("rw,allow_other", got, [
            ("read", sha(A)), ("list", ["a", "c", "sub"]), ("list sub", ["b"]), ("getxattr", "U8"),
            ("stat", [0, 0, "0o644"]),
            ("create", "EACCES"), ("overwrite", "EACCES"), ("truncate", "EACCES"), ("rename", "EACCES"),
            ("unlink", "EACCES"), ("unlink in sub", "EACCES"), ("setfattr dtype", "EACCES"),
            ("setfattr user.x", "EACCES"), ("mkdir", "EACCES"), ("mkdir in sub", "EACCES"),
            ("rmdir", "EACCES"), ("chmod", "EPERM"), ("chown", "EPERM"), ("rename out of sub", "EACCES")])
        check(sorted(os.listdir(m)) == ["a", "c", "sub"], "rw: the tree is unchanged: %s" % os.listdir(m))
        check(open(a, "rb").read() == A, "rw: root's tensor is unchanged")
        # Root's own change is written back, and only it.
        with open(os.path.join(m, "c"), "r+b") as f:
            f.write(b"\xff" * 4)
        r = m.unmount()
        check(r.returncode == 0, "rw: burnstore -u: %s" % r.stderr)
    out, _ = read_safetensors(src)
    check({k: v[2] for k, v in out.items()} == {"a": A, "sub.b": B, "c": b"\xff" * 4 + C[4:]},
          "rw: the write-back holds root's change and nothing of nobody's attempts")
    check(open(src, "rb").read() != before, "rw: the write-back happened")


def test_ro_allow_other(tmp):
    d = shared_dir(tmp, "ro")
    src = os.path.join(d, "model.safetensors")
    write_safetensors(src, {"a": A, "sub.b": B})
    before = open(src, "rb").read()
    mnt = os.path.join(d, "mnt")
    with Mount(src, mnt, "allow_other") as m:
        check("default_permissions" in mount_opts(m), "ro: default_permissions is on")
        a = os.path.join(m, "a")
        st = os.stat(a)
        check((st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o444), "ro: root's 0444 tensor")
        got = as_nobody(["read", a], ["read", os.path.join(m, "sub/b")], ["list", m],
                        ["create", os.path.join(m, "new")], ["write", a, "00"], ["truncate", a],
                        ["rename", a, os.path.join(m, "a2")], ["unlink", a], ["setxattr", a, "user.x", "1"],
                        ["mkdir", os.path.join(m, "d")], ["chmod", a, "666"])
        denied = ("EROFS", "EACCES", "EPERM")
        expect("ro,allow_other", got, [
            ("read", sha(A)), ("read sub/b", sha(B)), ("list", ["a", "sub"]),
            ("create", denied), ("write", denied), ("truncate", denied), ("rename", denied),
            ("unlink", denied), ("setfattr", denied), ("mkdir", denied), ("chmod", denied)])
    check(open(src, "rb").read() == before, "ro: the source is unchanged")
    # A private checkpoint stays private: its modes are the source's.
    os.chmod(src, 0o600)
    with Mount(src, mnt, "allow_other") as m:
        st, sd = os.stat(os.path.join(m, "a")), os.stat(os.path.join(m, "sub"))
        check((stat.S_IMODE(st.st_mode), stat.S_IMODE(sd.st_mode)) == (0o400, 0o500),
              "ro of a 0600 source: %o %o" % (st.st_mode, sd.st_mode))
        got = as_nobody(["read", os.path.join(m, "a")], ["list", os.path.join(m, "sub")])
        expect("ro of a 0600 source", got, [("read", "EACCES"), ("list", "EACCES")])


def test_owner_options(tmp):
    """uid=, gid=, umask= are what is shown and what the kernel enforces."""
    d = shared_dir(tmp, "own")
    src = os.path.join(d, "model.safetensors")
    write_safetensors(src, {"a": A, "sub.b": B})
    mnt = os.path.join(d, "mnt")
    with Mount(src, mnt, "allow_other,uid=1234,gid=5678,umask=027") as m:
        st, sd = os.stat(os.path.join(m, "a")), os.stat(os.path.join(m, "sub"))
        check((st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 5678, 0o440),
              "ro uid/gid/umask: file %d:%d %o" % (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)))
        check(stat.S_IMODE(sd.st_mode) == 0o550, "ro umask: directory %o" % stat.S_IMODE(sd.st_mode))
        got = as_nobody(["read", os.path.join(m, "a")], ["list", m])
        expect("umask=027", got, [("read", "EACCES"), ("list", "EACCES")])
    with Mount(src, mnt, "allow_other,uid=nobody,gid=nogroup,umask=077") as m:
        st = os.stat(os.path.join(m, "a"))
        check((st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY_UID, NOBODY_UID, 0o400),
              "uid=nobody: %d:%d %o" % (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)))
        got = as_nobody(["read", os.path.join(m, "sub/b")], ["list", m])
        expect("uid=nobody", got, [("read", sha(B)), ("list", ["a", "sub"])])
    # rw with uid=nobody: nobody owns the checkpoint's files and may change them.
    with Mount(src, mnt, "rw,allow_other,uid=%d,gid=%d" % (NOBODY_UID, NOBODY_UID)) as m:
        st = os.stat(os.path.join(m, "a"))
        check((st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY_UID, 0o644), "rw uid=: nobody's 0644")
        got = as_nobody(["write", os.path.join(m, "a"), "cafe"], ["create", os.path.join(m, "n")])
        expect("rw uid=nobody", got, [("write", "ok"), ("create", "ok")])
        r = m.unmount()
        check(r.returncode == 0, "rw uid=: burnstore -u: %s" % r.stderr)
    out, _ = read_safetensors(src)
    check(out["a"][2] == b"\xca\xfe" + A[2:], "rw uid=: nobody's write is written back")
    # The source's write bits are about the source: a 0444 file mounted
    # writable is its owner's to edit (0644), as before.
    os.chmod(src, 0o444)
    with Mount(src, mnt, "rw,allow_other,uid=nobody") as m:
        st = os.stat(os.path.join(m, "a"))
        check(stat.S_IMODE(st.st_mode) == 0o644, "rw of a 0444 source: %o" % stat.S_IMODE(st.st_mode))
        got = as_nobody(["write", os.path.join(m, "a"), "beef"])
        expect("rw of a 0444 source", got, [("write", "ok")])
        r = m.unmount()
        check(r.returncode == 0, "rw of a 0444 source: burnstore -u: %s" % r.stderr)
    os.chmod(src, 0o644)
    for bad, needle in (("uid=no-such-user-xyz", "uid=no-such-user-xyz"), ("umask=0999", "umask=0999"),
                        ("gid=-1", "gid=-1"), ("uid=4294967295", "uid=4294967295")):
        r = run([BIN, src, mnt, "-o", bad])
        check(r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1,
              "-o %s refused in one line (exit %d): %r" % (bad, r.returncode, r.stderr))
        force_unmount(mnt)


def test_fstab_options(tmp):
    """The options of an fstab line (through mount.burnstore, which mount(8)
    runs with rw added): allow_other with uid=, gid=, umask=."""
    d = shared_dir(tmp, "fstab")
    src = os.path.join(d, "model.safetensors")
    write_safetensors(src, {"a": A})
    mnt = os.path.join(d, "mnt")
    os.makedirs(mnt)
    helper = os.path.join(SOURCE_DIR, "mount-helpers/mount.burnstore")
    try:
        r = run(["sh", helper, src, mnt, "-o", "rw,nofail,allow_other,uid=nobody,gid=nogroup,umask=077"],
                env=dict(os.environ, BURNSTORE_BIN=BIN))
        check(r.returncode == 0 and is_mounted(mnt), "mount.burnstore with fstab options: %s" % r.stderr)
        if is_mounted(mnt):
            st = os.stat(os.path.join(mnt, "a"))
            check((st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY_UID, NOBODY_UID, 0o400),
                  "fstab: %d:%d %o" % (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)))
            check("default_permissions" in mount_opts(mnt), "fstab: default_permissions")
            got = as_nobody(["read", os.path.join(mnt, "a")], ["write", os.path.join(mnt, "a"), "00"])
            expect("fstab", got, [("read", sha(A)), ("write", "EROFS")])
        r = run([BIN, "-u", mnt])
        check(r.returncode == 0, "burnstore -u: %s" % r.stderr)
    finally:
        force_unmount(mnt)


def test_chmod_chown_created(tmp):
    """chmod and chown hold for the life of the mount (files and directories),
    the kernel checks them, and a file another user creates is theirs."""
    d = shared_dir(tmp, "chown")
    src = os.path.join(d, "model.safetensors")
    write_safetensors(src, {"a": A, "sub.b": B, "c": C})
    mnt = os.path.join(d, "mnt")
    with Mount(src, mnt, "rw,allow_other") as m:
        a, c, sub = (os.path.join(m, p) for p in ("a", "c", "sub"))
        os.mkdir(os.path.join(m, "shared"))
        os.chmod(os.path.join(m, "shared"), 0o1777)
        os.chmod(a, 0o600)
        os.chown(c, NOBODY_UID, NOBODY_UID)
        os.chown(sub, NOBODY_UID, 0)
        st = os.stat(c)
        check((st.st_uid, st.st_gid) == (NOBODY_UID, NOBODY_UID), "chown is kept: %d:%d" % (st.st_uid, st.st_gid))
        check(stat.S_IMODE(os.stat(os.path.join(m, "shared")).st_mode) == 0o1777, "chmod of a directory is kept")
        new = os.path.join(m, "shared", "n")
        got = as_nobody(["read", a], ["write", c, "abcd", "8"], ["setxattr", c, "user.note", "mine"],
                        ["write", new, "0102"], ["stat", new], ["chmod", new, "600"],
                        ["mkdir", os.path.join(sub, "d")], ["chmod", c, "640"], ["unlink", os.path.join(m, "shared")])
        expect("chmod/chown", got, [
            ("read of a 0600 file", "EACCES"), ("write to a chowned file", "ok"), ("setfattr", "ok"),
            ("create in a 1777 dir", "ok"), ("stat of nobody's file", [NOBODY_UID, NOBODY_UID, "0o644"]),
            ("chmod of nobody's file", "ok"), ("mkdir in a chowned dir", "ok"), ("chmod of a chowned file", "ok"),
            ("unlink of a dir", ("EISDIR", "EPERM", "EACCES"))])
        st = os.stat(new)
        check((st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY_UID, 0o600), "nobody's file: %d %o" % (st.st_uid, st.st_mode))
        # Root may still read it; a set-group-ID directory hands its group down.
        check(open(new, "rb").read() == b"\x01\x02", "root reads nobody's 0600 file")
        g = os.path.join(m, "g")
        os.mkdir(g)
        os.chown(g, 0, 4321)
        os.chmod(g, 0o2775)
        open(os.path.join(g, "f"), "wb").close()
        os.mkdir(os.path.join(g, "d"))
        sf, sdd = os.stat(os.path.join(g, "f")), os.stat(os.path.join(g, "d"))
        check(sf.st_gid == 4321 and sdd.st_gid == 4321 and sdd.st_mode & stat.S_ISGID,
              "set-group-ID directory: gids %d %d, dir mode %o" % (sf.st_gid, sdd.st_gid, sdd.st_mode))
        os.unlink(os.path.join(g, "f"))
        os.rmdir(os.path.join(g, "d"))
        os.rmdir(g)
        r = m.unmount()
        check(r.returncode == 0, "chown: burnstore -u: %s" % r.stderr)
    out, _ = read_safetensors(src)
    check(out.get("shared.n", (0, 0, None))[2] == b"\x01\x02", "nobody's new file is written back")
    check(out["c"][2] == C[:8] + b"\xab\xcd" + C[10:], "nobody's write to the chowned file is written back")
    st = os.stat(src)
    check(st.st_uid == 0, "the output stays root's")


def test_private_modes(tmp):
    """A private source in a shared staging directory: the staging
    directory is 0700 and its files 0600; the status file and its directory
    are root's alone; nobody can list or read any of them."""
    d = shared_dir(tmp, "priv")
    src = os.path.join(d, "model.safetensors")
    write_safetensors(src, {"a": A, "c": C})
    os.chmod(src, 0o600)
    stg = os.path.join(d, "stg")
    os.makedirs(stg)
    os.chmod(stg, 0o1777)
    mnt = os.path.join(d, "mnt")
    with Mount(src, mnt, "rw,allow_other,staging=" + stg) as m:
        st = os.stat(os.path.join(m, "a"))
        check(stat.S_IMODE(st.st_mode) == 0o600 and stat.S_IMODE(os.stat(m).st_mode) == 0o700,
              "a 0600 source shows 0600 files in a 0700 root: %o" % st.st_mode)
        with open(os.path.join(m, "a"), "r+b") as f:
            f.write(b"\x00")
        with open(os.path.join(m, "new"), "wb") as f:
            f.write(b"\x01" * 64)
        dirs = os.listdir(stg)
        check(len(dirs) == 1, "one staging directory: %s" % dirs)
        sdir = os.path.join(stg, dirs[0])
        check(stat.S_IMODE(os.stat(sdir).st_mode) == 0o700, "staging dir mode %o" % os.stat(sdir).st_mode)
        files = os.listdir(sdir)
        check(len(files) >= 3, "staged files and the lock: %s" % files)
        for f in files:
            st = os.stat(os.path.join(sdir, f))
            check(stat.S_IMODE(st.st_mode) & 0o077 == 0 and st.st_uid == 0,
                  "staging file %s: %o uid %d" % (f, stat.S_IMODE(st.st_mode), st.st_uid))
        status = run_path(os.path.realpath(mnt), ".status")
        check(os.path.exists(status), "the status file %s exists" % status)
        for p in ("/run/burnstore", status):
            st = os.stat(p)
            check(st.st_uid == 0 and stat.S_IMODE(st.st_mode) & 0o077 == 0,
                  "%s: %o uid %d" % (p, stat.S_IMODE(st.st_mode), st.st_uid))
        staged = [os.path.join(sdir, f) for f in files if f.isdigit()]
        got = as_nobody(["list", sdir], *[["read", p] for p in staged], ["read", status],
                        ["read", os.path.join(m, "a")])
        check(all(g == "EACCES" for g in got), "nobody reads no staging nor status file: %s" % got)
        r = m.unmount()
        check(r.returncode == 0, "private: burnstore -u: %s" % r.stderr)
    check(os.listdir(stg) == [], "the staging directory is gone: %s" % os.listdir(stg))
    check(stat.S_IMODE(os.stat(src).st_mode) == 0o600, "the output keeps its 0600")


def nobody_dir(tmp, name, own):
    """A shared directory `name` with model.safetensors ({"a": A}), a
    directory `own` of nobody's in it, and a copy of burnstore nobody runs
    (the build tree may be out of its reach): (dir, source, own, binary)."""
    d = shared_dir(tmp, name)
    src = os.path.join(d, "model.safetensors")
    write_safetensors(src, {"a": A})
    own = os.path.join(d, own)
    os.makedirs(own)
    os.chown(own, NOBODY_UID, NOBODY_UID)
    binary = os.path.join(d, "burnstore")
    shutil.copy(shutil.which(BIN) or BIN, binary)
    os.chmod(binary, 0o755)
    return d, src, own, binary


def test_unprivileged_mount(tmp):
    """nobody mounts where the system allows it; else the message names the
    cause (/dev/fuse's mode, fusermount3 not setuid, user_allow_other)."""
    d, src, mnt, binary = nobody_dir(tmp, "unpriv", "mnt")
    dev = os.stat("/dev/fuse")
    fm = "/usr/bin/fusermount3"
    fst = os.stat(fm)
    dev_ok = dev.st_mode & 0o006 == 0o006
    setuid_ok = fst.st_uid == 0 and fst.st_mode & stat.S_ISUID
    conf_ok = False
    if os.path.exists("/etc/fuse.conf"):
        conf_ok = any(l.split("#")[0].strip() == "user_allow_other" for l in open("/etc/fuse.conf"))
    for opts in ("", "allow_other"):
        cmd = NOBODY + [binary, src, mnt] + (["-o", opts] if opts else [])
        try:
            r = run(cmd, env=ENV)
            mounted = is_mounted(mnt)
            if mounted:
                got = as_nobody(["read", os.path.join(mnt, "a")])
                check(got == [sha(A)], "nobody's mount serves reads: %s" % got)
                u = run(NOBODY + ["fusermount3", "-u", mnt], env=ENV)
                check(u.returncode == 0, "nobody unmounts with fusermount3 -u: %s" % u.stderr)
        finally:
            force_unmount(mnt)
        if not dev_ok:
            want = "read and write /dev/fuse"
        elif not setuid_ok:
            want = "not setuid root"
        elif opts and not conf_ok:
            want = "user_allow_other"
        else:
            want = None
        if want is None:
            check(r.returncode == 0 and mounted, "nobody mounts (-o %r): %d %s" % (opts, r.returncode, r.stderr))
        else:
            line = [l for l in r.stderr.splitlines() if l.startswith("burnstore: cannot mount")]
            check(r.returncode == 1 and not mounted, "nobody's mount (-o %r) fails: %d" % (opts, r.returncode))
            check(len(line) == 1 and want in line[0], "the failure (-o %r) names %r: %r" % (opts, want, r.stderr))
        print("  unprivileged mount -o %r: %s" % (opts, (r.stderr.strip().splitlines() or ["mounted"])[-1]))


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_output_modes(tmp):
    """A new output is as private as its source (cp keeps the mode, filtered
    by the umask): convert, -o output=, a new shard set. An existing target
    keeps its own mode; a new checkpoint (no source) is 0644 & ~umask."""
    old_umask = os.umask(0o022)
    try:
        d = shared_dir(tmp, "newmodes")
        # convert of a private .pth, and of a 0640 source into a shard set.
        pth = os.path.join(d, "private.pth")
        shutil.copyfile(os.path.join(SOURCE_DIR, "tests/fixtures/complex_nested.pt"), pth)
        os.chmod(pth, 0o600)
        out = os.path.join(d, "out.safetensors")
        r = run([BIN, "convert", "-q", pth, out])
        check(r.returncode == 0, "convert: %s" % r.stderr)
        check(mode_of(out) == 0o600, "convert of a 0600 .pth: %o" % mode_of(out))
        os.chmod(out, 0o604)
        r = run([BIN, "convert", "-q", pth, out])
        check(r.returncode == 0 and mode_of(out) == 0o604, "an existing output keeps its 0604: %o" % mode_of(out))
        src = os.path.join(d, "model.safetensors")
        write_safetensors(src, {"a": A, "b": B, "c": C})
        os.chmod(src, 0o640)
        r = run([BIN, "convert", "-q", "-o", "max_shard_size=4096", src, os.path.join(d, "cs.safetensors.index.json")])
        check(r.returncode == 0, "convert to a shard set: %s" % r.stderr)
        files = sorted(f for f in os.listdir(d) if f.startswith("cs"))
        check(len(files) >= 3, "a set of shards and an index: %s" % files)
        for f in files:
            check(mode_of(os.path.join(d, f)) == 0o640, "convert's new set: %s is %o" % (f, mode_of(os.path.join(d, f))))
        # A mount's new output= and a new shard set: the source's mode.
        os.chmod(src, 0o600)
        mnt = os.path.join(d, "mnt")
        outb = os.path.join(d, "out.bpk")
        with Mount(src, mnt, "output=" + outb) as m:
            r = m.unmount()
            check(r.returncode == 0, "output=: burnstore -u: %s" % r.stderr)
        check(mode_of(outb) == 0o600, "output= of a 0600 source: %o" % mode_of(outb))
        os.chmod(src, 0o664)
        with Mount(src, mnt, "max_shard_size=4096,output=" + os.path.join(d, "ms.safetensors.index.json")) as m:
            r = m.unmount()
            check(r.returncode == 0, "shard set: burnstore -u: %s" % r.stderr)
        files = sorted(f for f in os.listdir(d) if f.startswith("ms"))
        check(len(files) >= 3, "the mount wrote a set: %s" % files)
        for f in files:
            check(mode_of(os.path.join(d, f)) == 0o644, "the mount's new set (0664 source, umask 022): %s is %o"
                  % (f, mode_of(os.path.join(d, f))))
        # A new checkpoint has no source: 0644 & ~umask.
        newck = os.path.join(d, "fresh.bpk")
        with Mount(newck, mnt) as m:
            with open(os.path.join(m, "w"), "wb") as f:
                f.write(B)
            r = m.unmount()
            check(r.returncode == 0, "new checkpoint: burnstore -u: %s" % r.stderr)
        check(mode_of(newck) == 0o644, "a new checkpoint: %o" % mode_of(newck))
    finally:
        os.umask(old_umask)


def finish_after_failed_writeback(d, src, outdir, name, change, before_finish=None):
    """Mount src with output=outdir/name (src None: a new checkpoint there),
    change the tree, make the write-back fail (outdir a read-only tmpfs),
    call before_finish(), then --finish it with outdir writable again: the
    output's path, or None."""
    stg = os.path.join(d, "stg-" + name)
    os.makedirs(stg)
    mnt = os.path.join(d, "mnt-" + name)
    out = os.path.join(outdir, name)
    opts = "staging=%s,output=%s" % (stg, out) if src else "staging=" + stg
    with Mount(src or out, mnt, opts) as m:
        change(m)
        run(["mount", "-o", "remount,ro", outdir])
        u = m.unmount()
    run(["mount", "-o", "remount,rw", outdir])
    check(u is not None and u.returncode != 0, "%s: the write-back fails on a read-only directory" % name)
    left = os.listdir(stg)
    if not check(len(left) == 1, "%s: the staging is kept: %s" % (name, left)):
        return None
    if before_finish:
        before_finish()
    r = run([BIN, "--finish", os.path.join(stg, left[0])])
    check(r.returncode == 0, "%s: --finish: %s" % (name, r.stderr))
    return out


def test_finish_modes(tmp):
    """--finish gives a new target the mode the mount's write-back would
    have given it (the INDEX records it): its checkpoint's mode at mount,
    even when the checkpoint's mode changed since; a new checkpoint (no
    source) gets 0644 & ~umask."""
    old_umask = os.umask(0o022)
    d = shared_dir(tmp, "finishmodes")
    outdir = os.path.join(d, "out")
    os.makedirs(outdir)
    r = run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", outdir])
    if not check(r.returncode == 0, "mount a tmpfs: %s" % r.stderr):
        os.umask(old_umask)
        return
    try:
        src = os.path.join(d, "model.safetensors")
        write_safetensors(src, {"a": A, "c": C})
        os.chmod(src, 0o640)

        def add_one(m):
            with open(os.path.join(m, "n"), "wb") as f:
                f.write(B)

        out = finish_after_failed_writeback(d, src, outdir, "kept.bpk", add_one)
        if out:
            check(mode_of(out) == 0o640, "--finish of a 0640 checkpoint: %o" % mode_of(out))
            check(sorted(read_bpk(out)[0]) == ["a", "c", "n"], "--finish wrote the tensors")
        # The checkpoint was 0600 at mount: opened to 0644 before --finish,
        # the output still gets 0600, as the write-back would have made it.
        os.chmod(src, 0o600)
        out = finish_after_failed_writeback(d, src, outdir, "private.bpk", add_one,
                                            lambda: os.chmod(src, 0o644))
        if out:
            check(mode_of(out) == 0o600, "--finish of a checkpoint 0600 at mount, 0644 now: %o" % mode_of(out))
        out = finish_after_failed_writeback(d, None, outdir, "fresh.bpk", add_one)
        if out:
            check(mode_of(out) == 0o644, "--finish of a new checkpoint: %o" % mode_of(out))
            check(sorted(read_bpk(out)[0]) == ["n"], "--finish wrote the new checkpoint")
    finally:
        os.umask(old_umask)
        run(["umount", "-l", outdir])


def test_run_dir_checked(tmp):
    """The run directory of a user other than root ($XDG_RUNTIME_DIR/burnstore
    or /tmp/burnstore-UID, for the target lock and the status files) is used
    only if it is a real directory of that user that no one else may write
    to: a symlink, another user's directory or a group/world-writable one is
    refused in one line naming it (nobody's convert takes the target lock)."""
    d, src, outd, binary = nobody_dir(tmp, "rundir", "out")
    victim = os.path.join(d, "victim")
    os.makedirs(victim)
    os.chmod(victim, 0o777)

    def xdg(name, plant):
        x = os.path.join(d, name)
        os.makedirs(x)
        os.chmod(x, 0o1777)  # as /tmp: anyone may plant a name in it
        if plant:
            plant(os.path.join(x, "burnstore"))
        return x

    def symlink(p):
        os.symlink(victim, p)

    def others(p):
        os.makedirs(p)
        os.chmod(p, 0o777)

    def writable(p):
        os.makedirs(p)
        os.chown(p, NOBODY_UID, NOBODY_UID)
        os.chmod(p, 0o770)

    def afile(p):
        open(p, "w").close()

    cases = [("xok", None, None), ("xlink", symlink, "a symbolic link"), ("xother", others, "belongs to uid 0"),
             ("xwrite", writable, "writable by others (mode 0770)"), ("xfile", afile, "not a directory")]
    for name, plant, want in cases:
        x = xdg(name, plant)
        out = os.path.join(outd, name + ".bpk")
        r = run(NOBODY + [binary, "convert", "-q", src, out], env=dict(ENV, XDG_RUNTIME_DIR=x))
        run_dir = os.path.join(x, "burnstore")
        if want is None:
            check(r.returncode == 0 and os.path.exists(out), "nobody's convert with a fresh run directory: %s" % r.stderr)
            st = os.lstat(run_dir)
            check(stat.S_ISDIR(st.st_mode) and st.st_uid == NOBODY_UID and stat.S_IMODE(st.st_mode) == 0o700,
                  "the run directory is nobody's 0700: %o uid %d" % (st.st_mode, st.st_uid))
            # Used again as it is: nobody's, 0700.
            r = run(NOBODY + [binary, "convert", "-q", src, out], env=dict(ENV, XDG_RUNTIME_DIR=x))
            check(r.returncode == 0, "nobody's second convert: %s" % r.stderr)
            continue
        check(r.returncode != 0 and not os.path.exists(out), "%s: nobody's convert is refused (%d)" % (name, r.returncode))
        lines = r.stderr.strip().splitlines()
        check(len(lines) == 1 and run_dir in lines[0] and want in lines[0],
              "%s: one line naming %s and %r: %r" % (name, run_dir, want, r.stderr))
        planted = os.listdir(run_dir) if os.path.isdir(run_dir) else []
        check(planted == [], "%s: nothing was created in the planted directory: %s" % (name, planted))


def test_sharded_modes(tmp):
    """A sharded checkpoint shows the read bits every file of the set grants
    (its index and each shard): a 0600 shard in a set whose index is 0644
    keeps every tensor private, and a new output= gets those bits too."""
    old_umask = os.umask(0o022)
    try:
        d = shared_dir(tmp, "shardmodes")
        one = os.path.join(d, "one.safetensors")
        write_safetensors(one, {"a": A, "b": B, "c": C})
        index = os.path.join(d, "model.safetensors.index.json")
        r = run([BIN, "convert", "-q", "-o", "max_shard_size=4096", one, index])
        check(r.returncode == 0, "convert to a set: %s" % r.stderr)
        shards = sorted(f for f in os.listdir(d) if f.startswith("model-"))
        check(len(shards) >= 2, "a set of several shards: %s" % shards)
        for f in [index] + [os.path.join(d, x) for x in shards]:
            os.chmod(f, 0o644)
        os.chmod(os.path.join(d, shards[-1]), 0o600)
        mnt = os.path.join(d, "mnt")
        with Mount(index, mnt, "allow_other") as m:
            st, sd = os.stat(os.path.join(m, "a")), os.stat(m)
            check((stat.S_IMODE(st.st_mode), stat.S_IMODE(sd.st_mode)) == (0o400, 0o500),
                  "a set with a 0600 shard shows %o files in a %o root"
                  % (stat.S_IMODE(st.st_mode), stat.S_IMODE(sd.st_mode)))
            got = as_nobody(["read", os.path.join(m, "a")], ["list", m])
            expect("a set with a 0600 shard", got, [("read", "EACCES"), ("list", "EACCES")])
        os.chmod(os.path.join(d, shards[-1]), 0o640)
        with Mount(index, mnt, "allow_other") as m:
            st = os.stat(os.path.join(m, "a"))
            check(stat.S_IMODE(st.st_mode) == 0o440, "a set with a 0640 shard: %o" % stat.S_IMODE(st.st_mode))
        out = os.path.join(d, "out.bpk")
        with Mount(d, mnt, "output=" + out) as m:
            r = m.unmount()
            check(r.returncode == 0, "output= of the set: %s" % r.stderr)
        check(mode_of(out) == 0o640, "output= of a set with a 0640 shard: %o" % mode_of(out))
    finally:
        os.umask(old_umask)


def test_stale_journal_does_not_stop_other_readers(tmp):
    """A writer of a shard set killed before its commit point leaves a
    journal its user owns; the old set is whole, so another user (who may
    not write the journal) still lists it, and the journal stays for a
    writer to roll back."""
    d, _, _, binary = nobody_dir(tmp, "stalejournal", "own")
    one = os.path.join(d, "one.safetensors")
    write_safetensors(one, {"a": A, "b": B, "c": C})
    index = os.path.join(d, "model.safetensors.index.json")
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=4096", one, index])
    check(r.returncode == 0, "convert to a set: %s" % r.stderr)
    # Killed at its third fsync (the target lock's, the journal's record of
    # the set, then its directory's): before any temp file or commit.
    r = subprocess.run(strace("-o", "/dev/null", "-e", "trace=fsync") + [
                        "-e", "inject=fsync:signal=SIGKILL:when=3",
                        BIN, "convert", "-q", "-o", "max_shard_size=8192", index, index],
                       capture_output=True, text=True, timeout=60)
    journal = os.path.join(d, ".model.safetensors.index.json.burnstore-journal")
    check(r.returncode in (-9, 137) and os.path.exists(journal),
          "a reshard killed before its commit leaves its journal: exit %d %s" % (r.returncode, r.stderr))
    r = subprocess.run(NOBODY + [binary, "ls", index], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and r.stdout.startswith("a\t"),
          "another user lists the old set: exit %d %s %s" % (r.returncode, r.stdout, r.stderr))
    check(os.path.exists(journal), "the journal is left for a writer")
    r = run([BIN, "ls", index])
    check(r.returncode == 0 and not os.path.exists(journal), "its owner's ls rolls it back: %s" % r.stderr)
    # The killed convert could not remove its target lock's file, and no
    # mount follows here to sweep it: the test does, leaving nothing behind.
    lock = run_path(os.path.join(os.path.realpath(d), "model.safetensors"), ".target")
    check(os.path.exists(lock), "the killed convert left its target lock's file %s" % lock)
    if os.path.exists(lock):
        os.unlink(lock)


def planted_journal(index, tmp_name, final, old):
    """A committed set journal's text that renames tmp_name over final and
    removes old (the format of src/core/set_journal.h)."""
    text = "burnstore-set-journal 1\nindex\t%s\nnew\t%s\nnew\t%s\nold\t%s\nprepared\nrename\t%s\t%s\n" % (
        index, index, final, old, tmp_name, final)
    return text + "commit\t%s\n" % fnv1a(text)


def test_planted_journal_is_not_applied(tmp):
    """A set journal, or a temporary file it renames, that another user
    could have planted or written (in a 1777 directory) makes no reader nor
    writer rename or remove anything: a committed one is refused in one
    line and every file stays; an uncommitted one leaves the old set, which
    is read."""
    d = shared_dir(tmp, "planted")
    drop = os.path.join(d, "drop")
    os.makedirs(drop)
    os.chmod(drop, 0o1777)
    one = os.path.join(drop, "one.safetensors")
    write_safetensors(one, {"a": A, "b": B, "c": C})
    index = os.path.join(drop, "model.safetensors.index.json")
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=4096", one, index])
    shards = sorted(f for f in os.listdir(drop) if f.startswith("model-"))
    check(r.returncode == 0 and len(shards) >= 2, "convert to a set: %s %s" % (r.stderr, shards))
    if len(shards) < 2:
        return
    journal = os.path.join(drop, ".model.safetensors.index.json.burnstore-journal")
    tmp_name = "." + shards[0] + ".burnstore-tmp-evil00"
    text = planted_journal("model.safetensors.index.json", tmp_name, shards[0], shards[1])

    def snapshot():
        return {f: sha(open(os.path.join(drop, f), "rb").read()) for f in sorted(os.listdir(drop))}

    # (who owns the journal, its mode, who owns the temp file, committed)
    cases = [("nobody's journal", NOBODY_UID, 0o644, NOBODY_UID, True),
             ("root's journal that others may write", 0, 0o666, 0, True),
             ("root's journal, nobody's temp file", 0, 0o644, NOBODY_UID, True),
             ("nobody's uncommitted journal", NOBODY_UID, 0o644, NOBODY_UID, False)]
    for name, juid, jmode, tuid, committed in cases:
        body = text if committed else text[:text.index("rename")]
        for path, data, uid, mode in [(journal, body.encode(), juid, jmode),
                                      (os.path.join(drop, tmp_name), b"planted", tuid, 0o644)]:
            with open(path, "wb") as f:
                f.write(data)
            os.chown(path, uid, uid)
            os.chmod(path, mode)
        before = snapshot()
        for cmd in ([BIN, "ls", index], [BIN, "convert", "-q", index, os.path.join(d, "out.bpk")]):
            r = run(cmd)
            if committed:
                lines = r.stderr.strip().splitlines()
                check(r.returncode != 0 and len(lines) == 1 and "journal" in lines[0],
                      "%s: %s is refused in one line: %d %r" % (name, cmd[1], r.returncode, r.stderr))
            else:
                check(r.returncode == 0, "%s: %s reads the old set: %s" % (name, cmd[1], r.stderr))
            check(snapshot() == before, "%s: %s renamed or removed nothing" % (name, cmd[1]))
        r = run([BIN, "convert", "-q", one, index])
        check(r.returncode != 0 and snapshot() == before,
              "%s: a writer of the set refuses it and changes nothing: %d %s" % (name, r.returncode, r.stderr))
        for path in (journal, os.path.join(drop, tmp_name)):
            if os.path.exists(path):
                os.unlink(path)
    r = run([BIN, "ls", index])
    check(r.returncode == 0 and r.stdout.startswith("a\t"), "the set reads once they are gone: %s" % r.stderr)


if __name__ == "__main__":
    run_tests("test_shared_mounts", [test_rw_allow_other, test_ro_allow_other, test_owner_options,
                                     test_fstab_options, test_chmod_chown_created, test_private_modes,
                                     test_unprivileged_mount, test_new_output_modes, test_finish_modes,
                                     test_run_dir_checked, test_sharded_modes,
                                     test_stale_journal_does_not_stop_other_readers, test_planted_journal_is_not_applied],
             "shared")
