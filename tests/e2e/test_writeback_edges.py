"""Write-back edges of issue 30: --finish of 1,500 staged files under
`ulimit -n 1024` (item 8); `-o rw LINK` and `output=LINK` where LINK is a
symbolic link to a checkpoint edit the file it names, and the link stays a
link (item 9); a kill while the write-back removes its staging directory
after the commit leaves a directory that --finish and the next mount's
sweep remove, saying the write-back had completed (item 11)."""
import glob
import os
import subprocess
import time

from bsmount import (BIN, Mount, check, force_unmount, is_mounted, kill_daemon, read_safetensors,
                     run, run_tests, strace, write_safetensors)

A = bytes(range(256)) * 4
NEW = bytes([0xA5]) * 1024


def staging_of(d, name):
    stg = glob.glob(os.path.join(d, ".%s.staging-*" % name))
    check(len(stg) == 1, "one staging directory of %s: %s" % (name, stg))
    return stg[0] if stg else None


def test_finish_many_files_few_fds(tmp):
    """Item 8: 1,500 files written, the daemon killed; --finish under
    `ulimit -n 1024` (soft and hard) writes them all."""
    d = os.path.join(tmp, "many")
    os.makedirs(d)
    target = os.path.join(d, "m.safetensors")
    write_safetensors(target, {"a": A})
    mnt = os.path.join(d, "mnt")
    with Mount(target, mnt, "rw") as m:
        for i in range(1500):
            with open(os.path.join(m, "f%04d" % i), "wb") as f:
                f.write(i.to_bytes(4, "little") * 2)
        kill_daemon(mnt)
    stg = staging_of(d, "m.safetensors")
    if not stg:
        return
    r = run(["bash", "-c", 'ulimit -n 1024 && exec "$0" --finish "$1"', BIN, stg], timeout=300)
    check(r.returncode == 0, "--finish of 1,500 staged files under ulimit -n 1024: %d %r"
          % (r.returncode, r.stderr[-400:]))
    got, _ = read_safetensors(target)
    check(len(got) == 1501 and got["f1499"][2] == (1499).to_bytes(4, "little") * 2,
          "every file is written: %d tensors" % len(got))


def test_rw_through_a_symlink(tmp):
    """Item 9: the write-back edits the checkpoint a link names (the target
    lock is that file's), and the link stays a link."""
    d = os.path.join(tmp, "link")
    os.makedirs(d)
    real = os.path.join(d, "real.safetensors")
    write_safetensors(real, {"a": A})
    link = os.path.join(d, "link.safetensors")
    os.symlink("real.safetensors", link)
    mnt = os.path.join(d, "mnt")
    with Mount(link, mnt, "rw") as m:
        with open(os.path.join(m, "a"), "r+b") as f:
            f.write(NEW)
        r = run([BIN, "convert", "-q", real, real])
        check(r.returncode != 0 and "target of a writable mount" in r.stderr,
              "the file the link names is locked as the mount's target: %r" % r.stderr)
        u = m.unmount()
        check(u.returncode == 0, "the write-back: %s" % u.stderr)
    check(os.path.islink(link) and os.readlink(link) == "real.safetensors", "the link stays a link")
    check(read_safetensors(real)[0]["a"][2] == NEW, "the checkpoint it names holds the edit")
    check(not glob.glob(os.path.join(d, ".*staging*")), "no staging directory is left")
    # output= through a link: the file it names is written.
    out_real = os.path.join(d, "out_real.safetensors")
    write_safetensors(out_real, {"old": A})
    out_link = os.path.join(d, "out.safetensors")
    os.symlink(out_real, out_link)
    with Mount(real, mnt, "output=" + out_link) as m:
        u = m.unmount()
        check(u.returncode == 0, "output= a link: %s" % u.stderr)
    check(os.path.islink(out_link), "output=: the link stays a link")
    check(set(read_safetensors(out_real)[0]) == {"a"}, "output=: the file it names is the output")


def test_set_in_a_linked_directory(tmp):
    """A directory the user names through a link stays theirs to name so:
    a shard set written, resharded and read through a linked directory."""
    d = os.path.join(tmp, "linkdir")
    os.makedirs(os.path.join(d, "real"))
    os.symlink("real", os.path.join(d, "link"))
    one = os.path.join(d, "one.safetensors")
    write_safetensors(one, {"a": A, "b": NEW})
    index = os.path.join(d, "link", "m.safetensors.index.json")
    for size in ("1500", "700"):
        r = run([BIN, "convert", "-q", "-o", "max_shard_size=" + size, one, index])
        check(r.returncode == 0, "a set through a linked directory (%s): %r" % (size, r.stderr))
    r = run([BIN, "ls", index])
    check(r.returncode == 0 and r.stdout.startswith("a\t"), "ls of it: %r" % r.stderr)
    check(len(glob.glob(os.path.join(d, "real", "m-*"))) == 2, "the old shards went, the new ones are there")


def strace_mount(src, mnt, kill_at, env):
    """burnstore -f under strace, killed (SIGKILL) at its kill_at-th unlinkat
    (a run directory of its own: no dead daemon's files for its sweep)."""
    os.makedirs(mnt, exist_ok=True)
    p = subprocess.Popen(strace("-o", "/dev/null", "-e", "trace=unlinkat") + [
                          "-e", "inject=unlinkat:signal=SIGKILL:when=%d" % kill_at, BIN, src, mnt,
                          "-f", "-o", "rw"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=env)
    end = time.time() + 30
    while not is_mounted(mnt) and time.time() < end and p.poll() is None:
        time.sleep(0.05)
    check(is_mounted(mnt), "mounted under strace")
    return p


def killed_in_cleanup(d, kill_at, env):
    """A write-back of d/m.safetensors (two files changed) killed at the
    kill_at-th unlinkat of its cleanup: the staging directory, or None."""
    target = os.path.join(d, "m.safetensors")
    write_safetensors(target, {"a": A, "b": A})
    mnt = os.path.join(d, "mnt")
    p = strace_mount(target, mnt, kill_at, env)
    try:
        for n in ("a", "b"):
            with open(os.path.join(mnt, n), "r+b") as f:
                f.write(NEW)
        subprocess.run(["fusermount3", "-u", mnt], capture_output=True, timeout=60)
        p.communicate(timeout=60)
    finally:
        force_unmount(mnt)
        if p.poll() is None:
            p.kill()
            p.communicate()
    got = read_safetensors(target)[0]
    check(got["a"][2] == NEW and got["b"][2] == NEW, "the write-back had committed (kill at %d)" % kill_at)
    stg = glob.glob(os.path.join(d, ".m.safetensors.staging-*"))
    check(len(stg) == 1 and os.path.exists(os.path.join(stg[0], "lock")),
          "a kill in the cleanup (unlinkat %d) leaves the directory with its lock: %s" % (kill_at, stg))
    return stg[0] if stg else None


def test_kill_during_cleanup(tmp):
    """Item 11: killed after the journal and the INDEX went (its 3rd and 4th
    unlinkat: the staged files, DONE and the lock are left), then --finish or
    the next mount's sweep; killed at DONE's removal (5th) and at the lock's
    (6th: only the lock is left)."""
    for kill_at, how in ((3, "finish"), (3, "sweep"), (4, "finish"), (5, "sweep"), (6, "finish")):
        d = os.path.join(tmp, "cleanup-%s-%d" % (how, kill_at))
        os.makedirs(os.path.join(d, "run"), mode=0o700)
        env = dict(os.environ, BURNSTORE_RUN_DIR=os.path.join(d, "run"))
        stg = killed_in_cleanup(d, kill_at, env)
        if not stg:
            continue
        target = os.path.join(d, "m.safetensors")
        if how == "finish":
            r = run([BIN, "--finish", stg], env=env)
            said = "held nothing to finish" if kill_at == 6 else "had completed"  # (DONE gone)
            check(r.returncode == 0 and said in r.stdout and not os.path.exists(stg),
                  "--finish removes it, saying the write-back had completed: %d %r %r"
                  % (r.returncode, r.stdout, r.stderr))
        else:
            mnt = os.path.join(d, "mnt2")
            os.makedirs(mnt, exist_ok=True)
            r = run([BIN, target, mnt, "-o", "rw"], env=env)
            try:
                check(r.returncode == 0 and "had completed" in r.stderr,
                      "the mount's sweep says the write-back had completed: %r" % r.stderr)
                check(not os.path.exists(stg), "the sweep removed it")
            finally:
                if is_mounted(mnt):
                    run([BIN, "-u", mnt], env=env)
                force_unmount(mnt)
        check(read_safetensors(target)[0]["a"][2] == NEW, "the target keeps the write-back's bytes")


def test_names_with_control_characters(tmp):
    """A checkpoint whose name holds a tab: its writable mount was refused
    ("cannot create a staging directory ...: Invalid argument": the staging
    directory's name, .NAME.staging-XXXXXX, had to be a name read from a
    file's); now it mounts, writes back and leaves nothing. A shard set of
    such a name cannot be journaled (its names are one a line): convert
    exited 0 having written nothing but temp files; now it is refused in one
    line and leaves nothing."""
    d = os.path.join(tmp, "ctrl")
    os.makedirs(d)
    target = os.path.join(d, "tab\tname.safetensors")
    write_safetensors(target, {"a": A})
    mnt = os.path.join(d, "mnt")
    with Mount(target, mnt, "rw") as m:
        with open(os.path.join(m, "a"), "r+b") as f:
            f.write(NEW)
        u = m.unmount()
        check(u is not None and u.returncode == 0, "the write-back: %s" % (u and u.stderr))
    check(read_safetensors(target)[0]["a"][2] == NEW, "the edit is written")
    check(sorted(os.listdir(d)) == ["mnt", "tab\tname.safetensors"], "nothing left: %s" % os.listdir(d))
    index = os.path.join(d, "set\tx.safetensors.index.json")
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=600", target, index])
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 1 and len(lines) == 1 and "control character" in lines[0],
          "a set of such a name is refused in one line: %d %r" % (r.returncode, r.stderr))
    check(sorted(os.listdir(d)) == ["mnt", "tab\tname.safetensors"], "and leaves nothing: %s" % os.listdir(d))


if __name__ == "__main__":
    run_tests("test_writeback_edges", [test_finish_many_files_few_fds, test_rw_through_a_symlink,
                                       test_kill_during_cleanup, test_set_in_a_linked_directory,
                                       test_names_with_control_characters],
              "wbedges")
