"""Nothing lost (issue 18): the commit protocol of multi-file outputs and the
rule that a writer removes only what it owns.

1. Kill at every system call: the writer runs under strace, which kills it
   (SIGKILL) on entry to the N-th call of one of rename, renameat, renameat2,
   unlink, unlinkat, fsync, fdatasync, for every N the unkilled run makes
   (counted first with strace). Writers: `burnstore convert` of a single
   file, into a new shard set, a reshard of an existing set in place, and a
   rewrite of a set keeping its shards (one unchanged, one changed, one
   tensor renamed, one removed); `burnstore --finish` of a writable
   mount's write-back that was itself killed in the middle of its commit;
   and a writable mount (reshard) killed at every call of its daemon.
   After each kill, recovery runs (a reader, `burnstore ls`, for a convert:
   readers complete or roll back a pending set first; `--finish` again for
   a write-back; the next writer for a single file), then the directory
   must hold exactly the old set or exactly the new set, byte for byte
   (compared with this file's own copies): no shard, temp file or journal of
   the other.
2. An old index that names something the set does not own (the index
   itself, a path through a symlinked subdirectory, `..`, a file that is no
   shard) is refused up front, naming the entry, and nothing is touched.

The quick mode (default, CI) runs every scenario once at every call: 116
rounds in about 16 s; BS_COMMIT_KILL_FULL=1 makes the reshard bigger."""
import json
import os
import shutil
import subprocess
import time

from bsmount import BIN, check, force_unmount, is_mounted, read_safetensors, run, run_tests, strace
from test_sharded import make_set, tensors
from test_st_write import canonical

CALLS = ["rename", "renameat", "renameat2", "unlink", "unlinkat", "fsync", "fdatasync"]
FULL = os.environ.get("BS_COMMIT_KILL_FULL") == "1"
BUDGET = 600 if FULL else 150  # seconds for all the kill rounds
ROUNDS = [0]


def snapshot(d):
    """{name: bytes} of every entry of d (a directory or symlink is named, not read)."""
    out = {}
    for f in sorted(os.listdir(d)):
        p = os.path.join(d, f)
        out[f] = open(p, "rb").read() if os.path.isfile(p) and not os.path.islink(p) else "<%s>" % (
            "link" if os.path.islink(p) else "dir")
    return out


def strace_cmd(cmd, call=None, n=None, out="/dev/null"):
    s = strace("-o", out, "-e", "trace=" + ",".join(CALLS))
    if call:
        s += ["-e", "inject=%s:signal=SIGKILL:when=%d" % (call, n)]
    return s + cmd


def count_calls(cmd, setup):
    """{call: times} of an unkilled run of cmd (after setup())."""
    setup()
    log = os.path.join(os.environ.get("TMPDIR", "/tmp"), "bs-strace-%d.log" % os.getpid())
    r = subprocess.run(strace_cmd(cmd, out=log), capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, "unkilled run of %s: %s" % (cmd, r.stderr))
    counts = calls_in(log)
    os.unlink(log)
    return counts


def calls_in(log):
    counts = {}
    for line in open(log):
        parts = line.split(None, 1)
        name = parts[1].split("(", 1)[0] if len(parts) == 2 else ""
        if name in CALLS and "resumed>" not in line:
            counts[name] = counts.get(name, 0) + 1
    return counts


def cli_killer(cmd):
    """Run cmd killed at the n-th call: whether it was killed, and its stderr."""
    def killed(call, n):
        r = subprocess.run(strace_cmd(cmd, call, n), capture_output=True, text=True, timeout=60)
        return r.returncode in (-9, 137), "exit %d: %s" % (r.returncode, r.stderr[-300:])
    return killed


def kill_loop(name, counts, setup, killed, recover, d, want_old, want_new, allow_tmp=False,
              may_finish=False):
    """For each call and each N (counts: an unkilled run's calls): setup(),
    killed(call, N), recover(), then directory d holds exactly want_old or
    want_new ({name: bytes})."""
    check(snapshot(d) == want_new, "%s: the unkilled run writes the new set: %s" % (name, sorted(snapshot(d))))
    check(sum(counts.values()) > 0, "%s: the writer makes the calls the test kills at: %r" % (name, counts))
    print("%s: %r" % (name, counts), flush=True)
    start = time.time()
    for call, c in sorted(counts.items()):
        for n in range(1, c + 1):
            if time.time() - start > BUDGET:
                check(False, "%s: out of time after %d rounds" % (name, ROUNDS[0]))
                return
            setup()
            ok, why = killed(call, n)
            ROUNDS[0] += 1
            tag = "%s: killed at %s #%d" % (name, call, n)
            if not ok and may_finish:  # the call did not come this time (a timed progress write)
                check(snapshot(d) == want_new, "%s: not killed, and the write is complete" % tag)
                continue
            if not check(ok, "%s: the writer was killed (%s)" % (tag, why)):
                continue
            recover(tag)
            got = snapshot(d)
            if allow_tmp:  # a single file's dead temp file: the next writer removes it (checked below)
                got = {f: v for f, v in got.items() if ".burnstore-tmp-" not in f}
            check(got == want_old or got == want_new,
                  "%s: after recovery the directory is neither the old set nor the new one: "
                  "extra %s, missing %s, differing %s" % (
                      tag, sorted(set(got) - set(want_new) - set(want_old)),
                      sorted(set(want_new) - set(got)),
                      sorted(f for f in got if f in want_new and got[f] != want_new[f]
                             and got[f] != want_old.get(f))))


def cli_kill_loop(name, cmd, setup, recover, d, old, new, allow_tmp=False):
    kill_loop(name, count_calls(cmd, setup), setup, cli_killer(cmd), recover, d, old, new, allow_tmp)


def write_files(d, files):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for f, b in files.items():
        with open(os.path.join(d, f), "wb") as fh:
            fh.write(b)


def ls_recovers(index):
    """A reader recovers first; an index that is still missing (a new set
    rolled back) is the one thing it may then not find."""
    def recover(tag):
        r = run([BIN, "ls", index])
        check(r.returncode == 0 or (not os.path.exists(index) and "No such file" in r.stderr),
              "%s: burnstore ls after the kill: %s" % (tag, r.stderr.strip()))
    return recover


def test_kill_convert_single(tmp):
    d = os.path.join(tmp, "single")
    src = os.path.join(tmp, "single-src.safetensors")
    ts = tensors()
    open(src, "wb").write(canonical(ts, {"format": "pt"}))
    old_ts = {k: v for k, v in ts.items() if k != "lm_head.weight"}
    old = {"m.safetensors": canonical(old_ts, {"format": "pt"})}
    new = {"m.safetensors": canonical(ts, {"format": "pt"})}
    out = os.path.join(d, "m.safetensors")
    cmd = [BIN, "convert", "-q", src, out]

    def recover(tag):
        # The target is whole (old or new) right after the kill; a dead
        # temp file may be beside it, and the next writer removes it.
        got = snapshot(d)
        check(got.get("m.safetensors") in (old["m.safetensors"], new["m.safetensors"]), "%s: the target is whole" % tag)
        r = run(cmd)
        check(r.returncode == 0 and snapshot(d) == new, "%s: the next writer leaves only its file: %s %s" % (
            tag, r.stderr, sorted(snapshot(d))))
        write_files(d, got)  # back to the state after the kill, for the general check

    cli_kill_loop("single file", cmd, lambda: write_files(d, old), recover, d, old, new, allow_tmp=True)


def set_files(d, **kw):
    shutil.rmtree(d, ignore_errors=True)
    make_set(d, **kw)
    return snapshot(d)


def test_kill_convert_new_set(tmp):
    d = os.path.join(tmp, "newset")
    src = os.path.join(tmp, "newset-src.safetensors")
    open(src, "wb").write(canonical(tensors(), {"format": "pt"}))
    idx = os.path.join(d, "model.safetensors.index.json")
    cmd = [BIN, "convert", "-q", "-o", "max_shard_size=100", src, idx]
    old = {"notes.txt": b"not ours\n"}
    write_files(d, old)
    subprocess.run(cmd, check=True, capture_output=True)
    new = snapshot(d)
    check(len([f for f in new if f.endswith(".safetensors")]) >= 3, "a set of several shards: %s" % sorted(new))
    cli_kill_loop("new set", cmd, lambda: write_files(d, old), ls_recovers(idx), d, old, new)


def test_kill_reshard(tmp):
    d = os.path.join(tmp, "reshard")
    idx = os.path.join(d, "model.safetensors.index.json")
    old = set_files(d)
    size = 40 if FULL else 60
    cmd = [BIN, "convert", "-q", "-o", "max_shard_size=%d" % size, idx, idx]
    subprocess.run(cmd, check=True, capture_output=True)
    new = snapshot(d)
    check(set(new) != set(old), "the reshard changes the shard names: %s" % sorted(new))
    cli_kill_loop("reshard", cmd, lambda: write_files(d, old), ls_recovers(idx), d, old, new)


def test_kill_set_replaces_file(tmp):
    """NAME.safetensors written as a set (max_shard_size): the set replaces the file."""
    d = os.path.join(tmp, "replace")
    src = os.path.join(tmp, "replace-src.safetensors")
    open(src, "wb").write(canonical(tensors(), {"format": "pt"}))
    out = os.path.join(d, "w.safetensors")
    old = {"w.safetensors": canonical({"x": ("U8", [3], b"old")}, {"format": "pt"})}
    cmd = [BIN, "convert", "-q", "-o", "max_shard_size=150", src, out]
    write_files(d, old)
    subprocess.run(cmd, check=True, capture_output=True)
    new = snapshot(d)
    check("w.safetensors" not in new and "w.safetensors.index.json" in new, "the set replaced the file: %s" % sorted(new))
    cli_kill_loop("set replaces a file", cmd, lambda: write_files(d, old), ls_recovers(out), d, old, new)


def test_kill_keep_shards(tmp):
    """Shards kept by name: one unchanged, one rewritten with a changed
    tensor, a tensor renamed (to the last shard) and one removed."""
    import numpy as np
    d = os.path.join(tmp, "keep")
    idx = os.path.join(d, "model.safetensors.index.json")
    old = set_files(d)
    ts = tensors()
    ts["model.norm.weight"] = ("F16", [4], np.full(4, 3, dtype="<f2").tobytes())
    ts["lm_head.renamed"] = ts.pop("lm_head.weight")
    del ts["model.layers.1.self_attn.q_proj.weight"]
    src = os.path.join(tmp, "keep-src.safetensors")
    open(src, "wb").write(canonical(ts, {"format": "pt"}))
    cmd = [BIN, "convert", "-q", src, idx]
    subprocess.run(cmd, check=True, capture_output=True)
    new = snapshot(d)
    check(sorted(new) == sorted(old), "the same shard names: %s" % sorted(new))
    check(new["model-00001-of-00002.safetensors"] == old["model-00001-of-00002.safetensors"], "shard 1 unchanged")
    cli_kill_loop("keep shards", cmd, lambda: write_files(d, old), ls_recovers(idx), d, old, new)


def hardlink_tree(src, dst):
    """dst gets src's tree, every file a hard link (same inode: the staging
    INDEX records the checkpoint's inode and mtime)."""
    shutil.rmtree(dst, ignore_errors=True)
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for f in files:
            os.link(os.path.join(root, f), os.path.join(dst, rel, f))


def rw_session(mount, mnt, log, call=None, n=None):
    """Mount (rw) under strace, killed at the n-th call; rename lm_head.weight
    and change model.norm.weight; unmount. Whether a process was killed."""
    import numpy as np
    p = subprocess.Popen(strace_cmd(mount, call, n, out=log), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        end = time.time() + 30
        while not is_mounted(mnt) and time.time() < end and p.poll() is None:
            time.sleep(0.01)
        try:
            os.rename(os.path.join(mnt, "lm_head", "weight"), os.path.join(mnt, "lm_head", "renamed"))
            with open(os.path.join(mnt, "model", "norm", "weight"), "r+b") as f:
                f.write(np.array([5], dtype="<f2").tobytes())
        except OSError:
            pass  # killed while mounted: the edits never happen
        if is_mounted(mnt):
            run([BIN, "-u", mnt], timeout=120)
        p.wait(timeout=60)
    finally:
        force_unmount(mnt)
        if p.poll() is None:
            p.kill()
            p.wait()
    return "killed by SIGKILL" in open(log).read()


def test_kill_finish(tmp):
    """A writable mount of a set (a tensor renamed, one changed) whose
    daemon is killed in the middle of its commit (first shard rename), then
    `burnstore --finish` of its staging killed at every call."""
    import numpy as np
    w = os.path.join(tmp, "fin")
    d, stg, mnt = os.path.join(w, "hf"), os.path.join(w, "stg"), os.path.join(tmp, "fin-m")
    idx = os.path.join(d, "model.safetensors.index.json")
    os.makedirs(stg)
    old = set_files(d)
    os.makedirs(mnt, exist_ok=True)
    killed = rw_session([BIN, idx, mnt, "-o", "rw,staging=" + stg], mnt, os.path.join(tmp, "fin.log"),
                        "renameat", 2)
    check(killed, "the daemon died in its write-back (after the INDEX's rename, at the first shard's)")
    staged = [os.path.join(stg, f) for f in os.listdir(stg)]
    if not check(len(staged) == 1 and os.path.exists(os.path.join(staged[0], "INDEX")),
                 "a staging directory with an INDEX: %r" % staged):
        return
    check(any(f.endswith(".burnstore-journal") for f in os.listdir(d)), "the daemon died with a journal: %s" % sorted(os.listdir(d)))
    pristine = os.path.join(tmp, "fin-pristine")
    hardlink_tree(w, pristine)
    cmd = [BIN, "--finish", staged[0]]

    def setup():
        shutil.rmtree(w, ignore_errors=True)
        hardlink_tree(pristine, w)

    setup()
    r = run(cmd)
    check(r.returncode == 0, "--finish of the killed write-back: %s" % r.stderr)
    new = snapshot(d)
    got = {}
    for f, b in new.items():
        if f.endswith(".safetensors"):
            got.update({k: v[:3] for k, v in read_safetensors(os.path.join(d, f))[0].items()})
    want = tensors()
    want["lm_head.renamed"] = want.pop("lm_head.weight")
    nw = bytearray(want["model.norm.weight"][2])
    nw[0:2] = np.array([5], dtype="<f2").tobytes()
    want["model.norm.weight"] = ("F16", [4], bytes(nw))
    check(got == {k: (v[0], v[1], v[2]) for k, v in want.items()}, "--finish wrote the mount's changes: %s" % sorted(got))
    ix = json.load(open(idx))
    check(set(ix["weight_map"]) == set(want), "the index names the new set")

    def recover(tag):
        if os.path.exists(staged[0]) and os.path.exists(os.path.join(staged[0], "INDEX")):
            r = run(cmd)
            check(r.returncode == 0, "%s: --finish again: %s" % (tag, r.stderr.strip()))
        else:  # the INDEX went first: the result was complete; a reader recovers nothing
            r = run([BIN, "ls", idx])
            check(r.returncode == 0, "%s: ls: %s" % (tag, r.stderr.strip()))

    cli_kill_loop("--finish", cmd, setup, recover, d, new, new)
    shutil.rmtree(pristine, ignore_errors=True)


def test_kill_writeback(tmp):
    """The write-back of `rw,max_shard_size=` (a reshard, a tensor renamed,
    one changed) killed at every call its daemon makes from mount to exit;
    recovery: `--finish` of its staging directory when it has an INDEX,
    else a reader."""
    d, stg, mnt = os.path.join(tmp, "wb"), os.path.join(tmp, "wb-stg"), os.path.join(tmp, "wb-m")
    idx = os.path.join(d, "model.safetensors.index.json")
    old = set_files(d)
    os.makedirs(mnt, exist_ok=True)
    mount = [BIN, idx, mnt, "-o", "rw,max_shard_size=100,staging=" + stg]
    log = os.path.join(tmp, "wb-strace.log")

    def setup():
        write_files(d, old)
        shutil.rmtree(stg, ignore_errors=True)
        os.makedirs(stg)

    def session(call=None, n=None):
        return rw_session(mount, mnt, log, call, n), "strace log %s" % log

    def recover(tag):
        staged = [os.path.join(stg, f) for f in os.listdir(stg)]
        if staged and os.path.exists(os.path.join(staged[0], "INDEX")):
            r = run([BIN, "--finish", staged[0]])
            check(r.returncode == 0, "%s: --finish: %s" % (tag, r.stderr.strip()))
        r = run([BIN, "ls", idx])
        check(r.returncode == 0, "%s: ls: %s" % (tag, r.stderr.strip()))

    setup()
    killed, _ = session()
    check(not killed, "the unkilled session")
    counts = calls_in(log)
    new = snapshot(d)
    check(new != old and any("00003" in f for f in new), "the write-back resharded: %s" % sorted(new))
    kill_loop("write-back", counts, setup, session, recover, d, old, new, may_finish=True)


def test_mount_recovers_first(tmp):
    """A set left mid-commit (killed after its first shard's rename) is
    completed by a read-only mount before it is read: the mount shows the
    new set, and the directory holds only it."""
    from bsmount import Mount, key_to_relpath, tensor_files
    d = os.path.join(tmp, "mnt-rec")
    idx = os.path.join(d, "model.safetensors.index.json")
    old = set_files(d)
    cmd = [BIN, "convert", "-q", "-o", "max_shard_size=60", idx, idx]
    subprocess.run(cmd, check=True, capture_output=True)
    new = snapshot(d)
    write_files(d, old)
    r = subprocess.run(strace_cmd(cmd, "renameat", 2), capture_output=True, text=True, timeout=60)
    check(r.returncode in (-9, 137), "killed after the first rename: %d %s" % (r.returncode, r.stderr))
    check(any(f.endswith(".burnstore-journal") for f in os.listdir(d)), "a journal is pending")
    with Mount(idx, os.path.join(tmp, "mnt-rec-m")) as m:
        check(set(tensor_files(m)) == {key_to_relpath(k) for k in tensors()}, "the mount shows every tensor")
        for k, (_, _, raw) in tensors().items():
            check(open(os.path.join(m, key_to_relpath(k)), "rb").read() == raw, "%s: bytes" % k)
    check(snapshot(d) == new, "the mount completed the set: %s" % sorted(snapshot(d)))


def test_refuses_what_it_does_not_own(tmp):
    base = os.path.join(tmp, "own")
    src = os.path.join(tmp, "own-src.safetensors")
    open(src, "wb").write(canonical(tensors(), {"format": "pt"}))
    outside = os.path.join(tmp, "own-outside")
    cases = [
        ("the index itself", "model.safetensors.index.json", None),
        ("a symlinked subdirectory", "up/x.safetensors", "up"),
        ("a file that is no shard", "precious.txt", None),
        ("a path through ..", "../own-outside/x.safetensors", None),
    ]
    for what, entry, link in cases:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)
        os.makedirs(outside)
        open(os.path.join(outside, "x.safetensors"), "wb").write(b"outside the set")
        wm = {k: "model-00001-of-00002.safetensors" for k in tensors()}
        wm["lm_head.weight"] = entry
        idx, _ = make_set(base, weight_map=wm)
        open(os.path.join(base, "precious.txt"), "wb").write(b"precious")
        if link:
            os.symlink(outside, os.path.join(base, link))
        before, before_out = snapshot(base), snapshot(outside)
        for opts in (["-o", "max_shard_size=100"], []):
            r = run([BIN, "convert", "-q"] + opts + [src, idx])
            tag = "%s (%s)" % (what, " ".join(opts) or "keeping the shards")
            check(r.returncode != 0, "%s: refused (exit %d)" % (tag, r.returncode))
            check(entry in r.stderr and "lm_head.weight" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
                  "%s: one line naming the entry and its tensor: %r" % (tag, r.stderr))
            check(snapshot(base) == before and snapshot(outside) == before_out, "%s: nothing touched" % tag)


def main():
    if not shutil.which("strace"):
        check(False, "strace is needed (apt-get install strace)")
    run_tests("test_set_commit", [test_refuses_what_it_does_not_own, test_mount_recovers_first,
                                  test_kill_convert_single,
                                  test_kill_convert_new_set, test_kill_reshard, test_kill_set_replaces_file,
                                  test_kill_keep_shards,
                                  test_kill_finish, test_kill_writeback], "setcommit")
    print("rounds: %d" % ROUNDS[0])


if __name__ == "__main__":
    main()
