"""kill -9 of a daemon during its write-back leaves a full-size temp file
beside the target; the next write of that target removes it (its writer is
dead: the temp file's lock is free), and the target is never half written."""
import os
import signal
import subprocess
import time

from bsmount import BIN, Mount, check, finish, read_bpk, run, tmpdir


def leftovers(d, target):
    """Files beside `target` that belong to it (temp files), staging dirs aside."""
    base = os.path.basename(target)
    return sorted(f for f in os.listdir(d)
                  if base in f and f != base and not os.path.isdir(os.path.join(d, f)))


def main():
    with tmpdir("stale") as tmp:
        work = os.path.join(tmp, "work.bpk")
        mnt = os.path.join(tmp, "m")
        with Mount(work, mnt) as m:
            with open(os.path.join(mnt, "a"), "wb") as f:
                f.write(b"first")
            check(m.unmount().returncode == 0, "first write")
        old = open(work, "rb").read()

        # A write-back killed half way.
        with Mount(work, mnt, opts="rw") as m:
            with open(os.path.join(mnt, "huge"), "wb") as f:
                chunk = b"\7" * (1 << 20)
                for _ in range(256):
                    f.write(chunk)
            pids = [int(p) for p in run(["pgrep", "-f", "burnstore %s" % work]).stdout.split()]
            check(len(pids) == 1, "one daemon for %s" % work)
            um = subprocess.Popen(["fusermount3", "-u", mnt])
            seen = []
            deadline = time.time() + 30
            while time.time() < deadline and not seen:
                seen = leftovers(tmp, work)
            for p in pids:
                os.kill(p, signal.SIGKILL)
            um.wait(timeout=60)
            u = run([BIN, "-u", mnt])
            check(u.returncode == 1, "-u after kill -9 fails: %r" % u.stderr)
        check(bool(seen), "caught the write-back in progress (temp file seen)")
        stale = leftovers(tmp, work)
        check(len(stale) == 1, "kill -9 leaves one temp file: %s" % stale)
        if stale:
            check(stale[0].startswith(".work.bpk.burnstore-tmp-"), "recognisable name: %s" % stale[0])
        check(open(work, "rb").read() == old, "the target is intact after kill -9")

        # The next write of the target removes it.
        with Mount(work, mnt, opts="rw") as m:
            with open(os.path.join(mnt, "b"), "wb") as f:
                f.write(b"second")
            u = m.unmount()
            check(u.returncode == 0, "second write: %s" % u.stderr)
        check(leftovers(tmp, work) == [], "the stale temp file is gone: %s" % leftovers(tmp, work))
        got, _ = read_bpk(work)
        check(sorted(got) == ["a", "b"], "the second write is the target: %s" % sorted(got))
    finish("test_stale_temp")


if __name__ == "__main__":
    main()
