"""Damaged staging journals (issue 30, items 5 and 12): a killed mount's
JOURNAL with one bit flipped in record 3 (BASE is record 1) is not the torn
tail of the last write: --finish refuses it in one line naming the record
and its offset and keeps the staging directory; --finish --salvage writes
what the records before it describe, lists what it dropped and keeps the
directory. A tail cut by the kill is still applied up to the cut, and said.
A failing fdatasync (injected with strace into the daemon) is said in the
mount's log, recorded in the journal, reported by --finish and by the
write-back at unmount."""
import glob
import os
import struct
import subprocess
import time

from bsmount import (BIN, Mount, check, force_unmount, is_mounted, kill_daemon, read_safetensors,
                     run, run_tests, strace, write_safetensors)

A = bytes(range(256)) * 4
B = bytes([7]) * 1024
NEW = bytes([0xA5]) * 1024
HDR = 12  # u32 length + u64 checksum (src/core/journal.h)


def records(journal):
    """[(offset, payload length)] of a JOURNAL's whole records."""
    data = open(journal, "rb").read()
    out, off = [], 8
    while len(data) - off >= HDR:
        n = struct.unpack_from("<I", data, off)[0]
        if n > len(data) - off - HDR:
            break
        out.append((off, n))
        off += HDR + n
    return out


def killed(tmp, name):
    """A mount of NAME.safetensors changed four ways (a rename, a write, a
    setfattr of metadata, a new file), then killed: (target, staging dir)."""
    d = os.path.join(tmp, name)
    os.makedirs(d)
    target = os.path.join(d, "m.safetensors")
    write_safetensors(target, {"a": A, "b": B})
    mnt = os.path.join(d, "mnt")
    with Mount(target, mnt, "rw") as m:
        os.rename(os.path.join(m, "a"), os.path.join(m, "renamed"))   # record 2: KEY
        with open(os.path.join(m, "b"), "r+b") as f:                  # record 3: STAGE
            f.write(NEW)
        os.setxattr(m, "user.burnstore.meta.note", b"kept")           # record 4: MSET
        with open(os.path.join(m, "c"), "wb") as f:                   # KEY, STAGE...
            f.write(b"new file")
        kill_daemon(mnt)
    stg = glob.glob(os.path.join(d, ".m.safetensors.staging-*"))
    check(len(stg) == 1, "one staging directory left: %s" % stg)
    return target, (stg[0] if stg else None)


def test_damaged_record_is_refused_then_salvaged(tmp):
    target, stg = killed(tmp, "damaged")
    if not stg:
        return
    journal = os.path.join(stg, "JOURNAL")
    recs = records(journal)
    check(len(recs) >= 5, "the journal holds BASE and the changes: %d records" % len(recs))
    off, n = recs[2]  # record 3
    with open(journal, "r+b") as f:
        f.seek(off + HDR + n - 1)
        c = f.read(1)
        f.seek(off + HDR + n - 1)
        f.write(bytes([c[0] ^ 1]))
    before = open(target, "rb").read()
    r = run([BIN, "--finish", stg])
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 1 and len(lines) == 1 and "record 3 (offset %d) is damaged" % off in lines[0]
          and "--salvage" in lines[0],
          "--finish refuses record 3 in one line naming its offset: %d %r" % (r.returncode, r.stderr))
    check(open(target, "rb").read() == before, "nothing written")
    check(os.path.exists(journal), "the staging directory and its journal are kept")
    r = run([BIN, "--finish", "--salvage", stg])
    check(r.returncode == 0, "--finish --salvage: %d %r" % (r.returncode, r.stderr))
    out = r.stdout
    check("records 1 to 2 applied" in out and "record 3 at offset %d: damaged" % off in out,
          "it says where it stopped: %r" % out)
    check("metadata set 'note'" in out and "named 'c'" in out,
          "it lists the records it dropped: %r" % out)
    got, meta = read_safetensors(target)
    check(set(got) == {"renamed", "b"} and got["b"][2] == B and "note" not in meta,
          "the output is the state after record 2: %s %s" % (sorted(got), meta))
    check(os.path.isdir(stg) and os.path.exists(journal), "the staging directory is kept after a salvage")


def test_cut_tail_is_applied_and_said(tmp):
    target, stg = killed(tmp, "cut")
    if not stg:
        return
    journal = os.path.join(stg, "JOURNAL")
    size = os.path.getsize(journal)
    os.truncate(journal, size - 3)  # the last append, cut by the kill
    r = run([BIN, "--finish", stg])
    check(r.returncode == 0 and "were not applied" in r.stdout,
          "a cut tail is applied up to the cut and said: %d %r %r" % (r.returncode, r.stdout, r.stderr))
    got, meta = read_safetensors(target)
    check("renamed" in got and got["b"][2] == NEW and meta.get("note") == "kept",
          "every whole record is written: %s %s" % (sorted(got), meta))
    check(not os.path.exists(stg), "the staging directory is removed")


def test_damaged_base_is_not_swept(tmp):
    """A killed mount that renamed a file and set metadata (no staged file),
    one bit flipped in its BASE record's length: the next writable mount's
    sweep of dead staging directories took the journal for one cut while
    mounting (nothing changed) and removed it, the rename and the metadata
    lost without a word. The directory is kept; --finish refuses the
    damage."""
    d = os.path.join(tmp, "base")
    os.makedirs(d)
    target = os.path.join(d, "m.safetensors")
    write_safetensors(target, {"a": A, "b": B})
    mnt = os.path.join(d, "mnt")
    with Mount(target, mnt, "rw") as m:
        os.rename(os.path.join(m, "a"), os.path.join(m, "renamed"))
        os.setxattr(m, "user.burnstore.meta.note", b"kept")
        kill_daemon(mnt)
    stg = glob.glob(os.path.join(d, ".m.safetensors.staging-*"))
    if not check(len(stg) == 1 and sorted(os.listdir(stg[0])) == ["JOURNAL", "lock"],
                 "a staging directory of its JOURNAL and lock: %s" % stg):
        return
    journal = os.path.join(stg[0], "JOURNAL")
    with open(journal, "r+b") as f:
        f.seek(9)  # BASE's length, its second byte: +1024, past the end of the file
        c = f.read(1)
        f.seek(9)
        f.write(bytes([c[0] ^ 4]))
    with Mount(target, mnt, "rw") as m:
        check(os.path.exists(journal), "the next writable mount's sweep keeps the damaged journal")
        m.unmount()
    r = run([BIN, "--finish", stg[0]])
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 1 and len(lines) == 1 and "record 1 (BASE, offset 8) is damaged" in lines[0]
          and os.path.exists(journal),
          "--finish refuses it in one line naming the damage, and keeps it: %d %r" % (r.returncode, r.stderr))


def strace_mount(src, mnt):
    """burnstore -f under strace, every fdatasync failing with EIO (the
    journal's flusher; its BASE is fsynced). strace counts calls per thread."""
    os.makedirs(mnt, exist_ok=True)
    p = subprocess.Popen(strace("-o", "/dev/null", "-e", "trace=fdatasync") + [
                          "-e", "inject=fdatasync:error=EIO:when=1+", BIN, src, mnt, "-f", "-o", "rw"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    end = time.time() + 30
    while not is_mounted(mnt) and time.time() < end and p.poll() is None:
        time.sleep(0.05)
    check(is_mounted(mnt), "mounted under strace")
    return p


def test_fdatasync_errors_are_said(tmp):
    d = os.path.join(tmp, "sync")
    os.makedirs(d)
    target = os.path.join(d, "m.safetensors")
    write_safetensors(target, {"a": A, "b": B})
    mnt = os.path.join(d, "mnt")
    p = strace_mount(target, mnt)
    try:
        os.rename(os.path.join(mnt, "a"), os.path.join(mnt, "renamed"))
        time.sleep(1.6)  # past the flusher's window: its fdatasync fails
        os.setxattr(mnt, "user.burnstore.meta.after", b"x")
        kill_daemon(mnt)
    finally:
        force_unmount(mnt)
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
    check("staging journal is no longer durable: fdatasync: Input/output error" in err,
          "the daemon says the journal stopped being durable: %r" % err[-600:])
    stg = glob.glob(os.path.join(d, ".m.safetensors.staging-*"))
    if not check(len(stg) == 1, "one staging directory left: %s" % stg):
        return
    r = run([BIN, "--finish", stg[0]])
    check(r.returncode == 0 and "stopped being durable at record 3" in r.stdout
          and "Input/output error" in r.stdout,
          "--finish reports where the journal stopped being durable: %d %r %r"
          % (r.returncode, r.stdout, r.stderr))
    got, meta = read_safetensors(target)
    check("renamed" in got and meta.get("after") == "x", "and writes every record: %s %s" % (sorted(got), meta))
    # A clean unmount: the write-back reports it too.
    p = strace_mount(target, mnt)
    try:
        os.rename(os.path.join(mnt, "b"), os.path.join(mnt, "b2"))
        time.sleep(1.6)
        u = run([BIN, "-u", mnt], timeout=120)
        check(u.returncode == 0 and "note: the staging journal stopped being durable" in u.stderr,
              "burnstore -u reports it: %d %r" % (u.returncode, u.stderr))
    finally:
        force_unmount(mnt)
        try:
            p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
    got, _ = read_safetensors(target)
    check("b2" in got, "the write-back is unaffected")


if __name__ == "__main__":
    run_tests("test_damaged_journal", [test_damaged_record_is_refused_then_salvaged,
                                       test_cut_tail_is_applied_and_said, test_damaged_base_is_not_swept,
                                       test_fdatasync_errors_are_said],
              "djournal")
