"""kill -9 (and every 4th round SIGTERM) during write-backs, at random points (issue 9): after each kill the
target is the old file or the complete new one (never a partial file under
its name), a staging directory with an INDEX is finished by
`burnstore --finish` into exactly the expected tensors, and the INDEX is
there whenever the writer has started (a temp file beside the target).

Each round mounts a copy of an existing Burnpack file read-write, rewrites
one tensor, adds one of a random size (so the kill lands in different
phases: before the INDEX, while the writer streams, around the rename,
after it), unmounts with fusermount3 -u and kills the daemon after a random
delay. BS_KILL_ROUNDS sets the number of rounds (default 40)."""
import glob
import os
import random
import shutil
import signal
import subprocess
import time

from bsmount import BIN, Mount, check, daemon_pid, finish, force_unmount, is_mounted, read_bpk, run, tmpdir, wait_gone

ROUNDS = int(os.environ.get("BS_KILL_ROUNDS", "40"))
BUDGET = 110  # seconds: stop starting rounds after this


def make_base(tmp):
    """An existing Burnpack file with two tensors, written by a mount."""
    base = os.path.join(tmp, "base.bpk")
    mnt = os.path.join(tmp, "mk")
    with Mount(base, mnt) as m:
        with open(os.path.join(mnt, "keep"), "wb") as f:
            f.write(bytes(range(256)) * 64)
        os.setxattr(os.path.join(mnt, "keep"), "user.burnstore.dtype", b"U16")
        os.makedirs(os.path.join(mnt, "enc"))
        with open(os.path.join(mnt, "enc", "w"), "wb") as f:
            f.write(b"\x11" * 4096)
        os.setxattr(os.path.join(mnt, "enc", "w"), "user.burnstore.dtype", b"F32")
        u = m.unmount()
        check(u.returncode == 0, "base written: %s" % u.stderr)
    return base


def finish_into(stg, target, expected, what):
    """burnstore --finish STG: it succeeds, removes STG, and target holds expected."""
    r = run([BIN, "--finish", stg])
    ok = check(r.returncode == 0, "%s: --finish: %s" % (what, r.stderr))
    ok &= check(not os.path.exists(stg), "%s: --finish removed the staging" % what)
    try:
        got, _ = read_bpk(target)
    except Exception as e:
        got = repr(e)
    return ok & check(got == expected, "%s: --finish wrote the expected tensors" % what)


def calibrate(tmp, base, pool):
    d = os.path.join(tmp, "cal")
    os.makedirs(d)
    target = os.path.join(d, "m.bpk")
    shutil.copyfile(base, target)
    mnt = os.path.join(d, "mnt")
    took = []
    for _ in range(2):
        with Mount(target, mnt, "rw"):
            with open(os.path.join(mnt, "big"), "wb") as f:
                f.write(pool)
            pid = daemon_pid(os.path.realpath(mnt))
            t = time.time()
            run(["fusermount3", "-u", mnt])
            wait_gone(pid)
            took.append(time.time() - t)
    shutil.rmtree(d, ignore_errors=True)
    return min(took)


def main(tmp):
    rng = random.Random(int(os.environ.get("BS_KILL_SEED", "0")) or None)
    base = make_base(tmp)
    old_bytes = open(base, "rb").read()
    old, _ = read_bpk(base)
    pool = os.urandom(48 << 20)
    # Calibrate: how long does the write-back of the largest round take here?
    cal = calibrate(tmp, base, pool)
    print("write-back of 48 MiB after fusermount3 -u: %.3f s" % cal, flush=True)
    phases = {}
    survived = 0
    t0 = time.time()
    rounds = 0
    for i in range(ROUNDS):
        if time.time() - t0 > BUDGET:
            break
        rounds += 1
        d = os.path.join(tmp, "r%02d" % i)
        os.makedirs(d)
        target = os.path.join(d, "m.bpk")
        shutil.copyfile(base, target)
        mnt = os.path.join(d, "mnt")
        size = rng.choice([0, 1, 4, 16, 48]) << 20 or rng.randrange(4, 65536, 4)
        start = rng.randrange(0, len(pool) - size + 1)
        big = pool[start:start + size]
        w = bytes([i]) * 4096
        expected = dict(old)
        expected["enc.w"] = ("F32", [1024], w, old["enc.w"][3])
        expected["big"] = ("U8", [size], big, None)
        # Spread the kills over this round's expected write-back, a bit past it.
        delay = rng.uniform(0, 1.2) * (0.003 + cal * size / (48 << 20))
        with Mount(target, mnt, "rw"):
            with open(os.path.join(mnt, "enc", "w"), "r+b") as f:
                f.write(w)
            with open(os.path.join(mnt, "big"), "wb") as f:
                f.write(big)
            pid = daemon_pid(os.path.realpath(mnt))
            check(pid is not None, "round %d: daemon found" % i)
            r = run(["fusermount3", "-u", mnt])
            check(r.returncode == 0, "round %d: fusermount3 -u: %s" % (i, r.stderr))
            time.sleep(delay)
            sig = signal.SIGTERM if i % 4 == 3 else signal.SIGKILL
            try:
                os.kill(pid, sig)
                killed = True
            except (ProcessLookupError, TypeError):
                killed = False
            wait_gone(pid)  # really gone (its fds closed)
        ok = True
        data = open(target, "rb").read()
        is_old = data == old_bytes
        is_new = False
        if not is_old:
            try:
                got, _ = read_bpk(target)
                is_new = got == expected
            except Exception:
                is_new = False
        ok &= check(is_old or is_new, "round %d (size %d, delay %.3f): the target is the old or the "
                    "complete new file" % (i, size, delay))
        stg = glob.glob(os.path.join(d, ".m.bpk.staging-*"))
        tmps = glob.glob(target + ".*.tmp")
        has_index = bool(stg) and os.path.exists(os.path.join(stg[0], "INDEX"))
        if not killed or not stg:
            phase = "finished before the kill"
        elif not has_index:
            phase = "cleanup after the rename" if is_new else "before the INDEX"
        elif tmps:
            phase = "writer running"
        elif is_new:
            phase = "after the rename"
        else:
            phase = "INDEX saved, writer not started"
        done = bool(stg) and os.path.exists(os.path.join(stg[0], "DONE"))
        if done:
            phase = "cleanup after the rename"
        phases[phase] = phases.get(phase, 0) + 1
        if tmps:
            ok &= check(has_index, "round %d: the writer started, so the INDEX is there" % i)
        if done:
            # Killed while it removed its staging after the commit: DONE says
            # so; --finish (and a mount's sweep) remove the rest.
            ok &= check(is_new, "round %d: DONE, so the target is the new file" % i)
            l = run([BIN, "--list-staging", stg[0]])
            ok &= check(l.returncode == 0 and "completed (DONE)" in l.stdout,
                        "round %d: --list-staging of a completed write-back: %r" % (i, l.stdout))
            r = run([BIN, "--finish", stg[0]])
            ok &= check(r.returncode == 0 and "had completed" in r.stdout and not os.path.exists(stg[0]),
                        "round %d: --finish removes it: %r %r" % (i, r.stdout, r.stderr))
        elif stg and has_index:
            l = run([BIN, "--list-staging", stg[0]])
            ok &= check(l.returncode == 0 and "big\tU8\t[%d]" % size in l.stdout,
                        "round %d: --list-staging: %r %r" % (i, l.stdout[-300:], l.stderr))
            ok &= finish_into(stg[0], target, expected, "round %d (%s)" % (i, phase))
        elif stg and os.path.exists(os.path.join(stg[0], "JOURNAL")):
            # Killed before the write-back saved its INDEX (like a kill while
            # mounted: the old file is intact): the staging journal names
            # what the mount held, and --finish writes it.
            ok &= check(is_old and not tmps, "round %d: no INDEX, so the writer had not started" % i)
            ok &= finish_into(stg[0], target, expected, "round %d (%s, journal)" % (i, phase))
        elif stg:
            # Killed at the very end of that removal (DONE gone, the lock
            # left), or before anything was staged: nothing to finish, and
            # --finish removes it.
            l = run([BIN, "--list-staging", stg[0]])
            ok &= check(l.returncode == 1 and "no INDEX" in l.stdout, "round %d: --list-staging without INDEX: %r" % (i, l.stdout))
            r = run([BIN, "--finish", stg[0]])
            ok &= check(r.returncode == 0 and not os.path.exists(stg[0]),
                        "round %d: --finish of what held only its lock: %r" % (i, r.stderr))
            ok &= check(is_old or not tmps, "round %d: no INDEX, so the writer had not started" % i)
        survived += ok
        force_unmount(mnt)
        shutil.rmtree(d, ignore_errors=True)
    took = time.time() - t0
    print("kill loop: %d rounds, %d survived, %.1f s; phases: %s" % (
        rounds, survived, took, ", ".join("%s %d" % kv for kv in sorted(phases.items()))), flush=True)
    check(rounds >= min(ROUNDS, 20), "at least 20 rounds ran (%d)" % rounds)


if __name__ == "__main__":
    with tmpdir("kill") as tmp:
        try:
            main(tmp)
        except Exception as e:
            check(False, "kill loop raised %r" % e)
        for d in glob.glob(os.path.join(tmp, "*", "mnt")) + glob.glob(os.path.join(tmp, "mk")):
            force_unmount(d)
    finish("test_killloop")
