"""GGUF through real mounts (issue 12): files written by the test suite's
own GGUF writer (tests/support/gguf_fixture.py, from the spec) are mounted
and compared with its independent reader: bytes, dtype and shape xattrs
(row-major: ne reversed), metadata xattrs of every type; metadata changed
with setfattr is written back with its GGUF type and everything else byte
identical; tensors removed and added; read -> write -> read round trips;
a new .gguf output; hostile files refused with a one-line error."""
import errno
import glob
import os
import shutil
import struct
import subprocess
import sys
import time

from bsmount import (BIN, DEADLINE, SOURCE_DIR, Mount, check, force_unmount, foreground_mount, is_mounted,
                     key_to_relpath, SANITIZE, mem_limit_kb, run, run_tests, tensor_files, vmhwm_kb, xattrs)

sys.path.insert(0, os.path.join(SOURCE_DIR, "tests/support"))
import gguf_fixture as G  # noqa: E402

META = "user.burnstore.meta."


def expected_text(vt, v):
    """The text burnstore shows for a typed value (strings as they are,
    arrays as JSON)."""
    import json

    def js(vt, v):
        if vt == G.VARRAY:
            et, items = v
            return "[" + ",".join(js(et, x) for x in items) + "]"
        if vt == G.VSTRING:
            return json.dumps(v, ensure_ascii=False)
        if vt == G.VBOOL:
            return "true" if v else "false"
        if vt == G.VF32:
            return "%.9g" % v
        if vt == G.VF64:
            return "%.17g" % v
        return str(v)
    return v if vt == G.VSTRING else js(vt, v)


def test_mount_matches_the_python_reader(tmp):
    src = os.path.join(tmp, "tiny.gguf")
    G.write_tiny(src)
    matches_the_python_reader(tmp, src)


def test_version_1_is_read(tmp):
    """Issue 34: llama.cpp's first GGUF files (version 1: u32 counts, lengths
    and dimensions) mount as the spec's reader reads them; converted or
    written back they become version 3 with the same values and bytes."""
    src = os.path.join(tmp, "v1.gguf")
    G.write_v1(src)
    ref = G.Reader(src)
    check(ref.version == 1, "the fixture is version 1")
    matches_the_python_reader(tmp, src)
    r = run([BIN, "ls", src])
    check(r.returncode == 0 and len(r.stdout.splitlines()) == len(ref.tensors), "ls: %s" % r.stderr.strip())
    for how in ("output", "convert"):
        out = os.path.join(tmp, "v1-%s.gguf" % how)
        if how == "output":
            with Mount(src, os.path.join(tmp, "m"), opts="output=" + out) as m:
                u = m.unmount()
        else:
            u = run([BIN, "convert", src, out])
        check(u.returncode == 0, "%s: %s" % (how, u.stderr.strip()))
        got = G.Reader(out) if os.path.exists(out) else None
        check(got is not None and got.version == 3, "%s: written as version 3" % how)
        if got is None:
            continue
        check(got.kv == ref.kv, "%s: every value as the version 1 file has it" % how)
        check({k: (t["type"], t["shape"], t["data"]) for k, t in got.tensors.items()}
              == {k: (t["type"], t["shape"], t["data"]) for k, t in ref.tensors.items()},
              "%s: every tensor's type, shape and bytes" % how)


def matches_the_python_reader(tmp, src):
    ref = G.Reader(src)
    with Mount(src, os.path.join(tmp, "m")) as m:
        root = xattrs(m)
        check(root.get("user.burnstore.format") == "gguf", "format xattr: %r" % root.get("user.burnstore.format"))
        for k, (vt, v) in ref.kv.items():
            got = root.get(META + k)
            check(got == expected_text(vt, v), "meta %s: %r, want %r" % (k, got, expected_text(vt, v)))
        files = tensor_files(m)
        check(len(files) == len(ref.tensors), "one file per tensor: %r" % sorted(files))
        for name, t in ref.tensors.items():
            p = os.path.join(m, key_to_relpath(name))
            check(os.path.isfile(p), "%s is a file" % name)
            if not os.path.isfile(p):
                continue
            check(open(p, "rb").read() == t["data"], "%s: bytes" % name)
            x = xattrs(p)
            check(x.get("user.burnstore.dtype") == t["type"], "%s: dtype %r" % (name, x.get("user.burnstore.dtype")))
            check(x.get("user.burnstore.shape") == "[" + ",".join(map(str, t["shape"])) + "]",
                  "%s: shape %r (row-major, ne reversed)" % (name, x.get("user.burnstore.shape")))
        # numpy reads an F32 tensor through the mount as the fixture wrote it
        import numpy as np
        a = np.fromfile(os.path.join(m, "token_embd/weight"), dtype="<f4").reshape(2, 3)
        check(a.tolist() == [[0, 1, 2], [3, 4, 5]], "token_embd.weight as numpy: %r" % a)
        # extract one tensor with cp
        out = os.path.join(tmp, "q.bin")
        r = run(["cp", os.path.join(m, "blk/0/attn_q/weight"), out])
        check(r.returncode == 0 and open(out, "rb").read() == ref.tensors["blk.0.attn_q.weight"]["data"],
              "cp extracts the Q8_0 blocks")


def test_long_values_are_E2BIG_and_not_listed(tmp):
    src = os.path.join(tmp, "vocab.gguf")
    tokens = ["tok%05d" % i for i in range(12000)]  # ~ 130 KB as JSON
    G.write(src, [("general.name", G.VSTRING, "v"), ("tokenizer.ggml.tokens", G.VARRAY, (G.VSTRING, tokens))],
            [("w", 0, [2], struct.pack("<2f", 1, 2))])
    with Mount(src, os.path.join(tmp, "m"), opts="rw") as m:
        names = os.listxattr(m)
        # Listed, it would make getfattr -d and rsync -aX of the root fail.
        check(META + "tokenizer.ggml.tokens" not in names, "a value getxattr cannot return is not listed")
        check(META + "general.name" in names, "the others are: %r" % names)
        r = run(["getfattr", "-d", "-m", "-", m])
        check(r.returncode == 0, "getfattr -d of the root: %r" % r.stderr)
        try:
            os.getxattr(m, META + "tokenizer.ggml.tokens")
            check(False, "a value over 64 KiB is E2BIG")
        except OSError as e:
            check(e.errno == errno.E2BIG, "E2BIG, got %r" % e)
        os.setxattr(m, META + "general.name", b"renamed")
        u = m.unmount()
    check(u.returncode == 0, "write-back: %s" % u.stderr)
    ref = G.Reader(src)
    check(ref.kv["tokenizer.ggml.tokens"] == (G.VARRAY, (G.VSTRING, tokens)), "the vocabulary kept whole")
    check(ref.kv["general.name"] == (G.VSTRING, "renamed"), "the name changed")
    import json
    r = subprocess.run([BIN, "info", "--meta", "tokenizer.ggml.tokens", src], capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0 and json.loads(r.stdout) == tokens,
          "burnstore info --meta prints the long value in full: %r" % (r.stdout[:200] + r.stderr))


def test_setfattr_writes_back_typed_metadata(tmp):
    src = os.path.join(tmp, "edit.gguf")
    G.write_tiny(src)
    before = G.Reader(src)
    template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}\n"
    with Mount(src, os.path.join(tmp, "m"), opts="rw") as m:
        r = run(["setfattr", "-n", META + "general.name", "-v", "Renamed Model", m])
        check(r.returncode == 0, "setfattr general.name: %s" % r.stderr)
        os.setxattr(m, META + "tokenizer.chat_template", template.encode())
        os.setxattr(m, META + "t.u32", b"7")
        os.setxattr(m, META + "a.nested", b"[[9], [8, 7]]")
        os.setxattr(m, META + "new.note", b"added")
        r = run(["getfattr", "--only-values", "-n", META + "general.name", m])
        check(r.stdout == "Renamed Model", "getfattr shows the new name: %r" % r.stdout)
        u = m.unmount()
    check(u.returncode == 0, "write-back: %s" % u.stderr)
    after = G.Reader(src)
    check(after.kv["general.name"] == (G.VSTRING, "Renamed Model"), "general.name %r" % (after.kv["general.name"],))
    check(after.kv["tokenizer.chat_template"] == (G.VSTRING, template), "chat template")
    check(after.kv["t.u32"] == (G.VU32, 7), "t.u32 keeps its type: %r" % (after.kv["t.u32"],))
    check(after.kv["a.nested"] == (G.VARRAY, (G.VARRAY, [(G.VU8, [9]), (G.VU8, [8, 7])])),
          "nested array keeps its element types: %r" % (after.kv["a.nested"],))
    check(after.kv["new.note"] == (G.VSTRING, "added"), "a new key is a string")
    changed = {"general.name", "tokenizer.chat_template", "t.u32", "a.nested", "new.note"}
    for k in before.kv:
        if k not in changed:
            check(after.kv_raw.get(k) == before.kv_raw[k], "%s byte-identical" % k)
    check(list(after.kv)[:len(before.kv)] == list(before.kv), "key order kept, new keys last")
    for name, t in before.tensors.items():
        check(after.tensors[name]["data"] == t["data"], "%s unchanged" % name)
    # the whole file is what the spec writer makes of the expected content
    kvs = [(k, vt, v) for k, (vt, v) in after.kv.items()]
    tens = [(n, t["gtype"], t["shape"], t["data"]) for n, t in before.tensors.items()]
    check(open(src, "rb").read() == G.write(os.path.join(tmp, "want.gguf"), kvs, tens),
          "the written file is the canonical GGUF of its content")
    check(not glob.glob(os.path.join(tmp, ".edit.gguf*")), "no temp or staging left")


def test_bad_typed_value_is_refused_by_setfattr(tmp):
    src = os.path.join(tmp, "bad.gguf")
    G.write_tiny(src)
    with Mount(src, os.path.join(tmp, "m"), opts="rw") as m:
        for k, v in (("t.u32", b"not a number"), ("t.u8", b"256"), ("a.i32", b"[1, 2"),
                     ("general.alignment", b"48"), ("t.bool", b"maybe")):
            try:
                os.setxattr(m, META + k, v)
                check(False, "setxattr %s=%r is refused" % (k, v))
            except OSError as e:
                check(e.errno == errno.EINVAL, "%s=%r: EINVAL, got %r" % (k, v, e))
        r = run(["setfattr", "-n", META + "t.u32", "-v", "abc", m])
        check(r.returncode != 0 and "Invalid argument" in r.stderr, "setfattr reports EINVAL: %r" % r.stderr)
        try:  # an empty key: the reader refuses a file holding one
            os.setxattr(m, META, b"x")
            check(False, "setxattr of an empty metadata key is refused")
        except OSError as e:
            check(e.errno == errno.EINVAL, "empty key: EINVAL, got %r" % e)
        os.setxattr(m, META + "t.u32", b"12")
        os.setxattr(m, META + "general.alignment", b"64\n")  # accepted, so written
        check(os.getxattr(m, META + "t.u32") == b"12", "the good value is kept")
        u = m.unmount()
    check(u.returncode == 0, "write-back: %s" % u.stderr)
    ref = G.Reader(src)
    check(ref.kv["t.u32"] == (G.VU32, 12), "t.u32 written: %r" % (ref.kv["t.u32"],))
    check(ref.alignment == 64 and ref.data_offset % 64 == 0, "the new alignment is used")
    check(all(t["offset"] % 64 == 0 for t in ref.tensors.values()), "offsets aligned to 64")
    check(ref.tensors["blk.0.attn_q.weight"]["data"] == G.q8_0_bytes(4), "data intact after realignment")


def test_refusal_reason_reaches_the_user_without_syslog(tmp):
    """setfattr only says "Invalid argument": the reason is in the mount's
    log, which `burnstore status MNT` and `burnstore -u -v MNT` print, with
    no syslog (this machine has no /dev/log, like most containers); in the
    foreground it is on stderr."""
    src = os.path.join(tmp, "why.gguf")
    G.write_tiny(src)
    mnt = os.path.join(tmp, "why")
    with Mount(src, mnt, opts="rw") as m:
        r = run(["setfattr", "-n", META + "t.u32", "-v", "abc", m])
        check(r.returncode != 0 and "Invalid argument" in r.stderr, "setfattr refused: %r" % r.stderr)
        st = run([BIN, "status", m])
        check(st.returncode == 0 and "served by burnstore pid" in st.stdout,
              "burnstore status names the daemon: %r %r" % (st.stdout, st.stderr))
        line = [l for l in st.stdout.splitlines() if META + "t.u32" in l]
        check(len(line) == 1 and "refused" in line[0] and "expected an integer" in line[0],
              "burnstore status shows the refusal and its reason: %r" % st.stdout)
        # refusals of names and file types, explained in the same log
        for what, call in (("mkdir a%zz", lambda: os.mkdir(os.path.join(m, "a%zz"))),
                           ("mknod fifo", lambda: os.mkfifo(os.path.join(m, "fifo")))):
            try:
                call()
                check(False, "%s is refused" % what)
            except OSError:
                pass
        st = run([BIN, "status", m]).stdout
        check("mkdir 'a%zz' refused: 'a%zz': a '%' starts an escape" in st and "mknod fifo refused" in st,
              "the log explains the refused mkdir and mknod: %r" % st)
        u = run([BIN, "-u", "-v", m])
        check(u.returncode == 0, "-u -v: %s" % u.stderr)
        check(any(META + "t.u32" in l and l.startswith("burnstore: log: ") for l in u.stdout.splitlines()),
              "-u -v prints the log: %r" % u.stdout)
    r = run([BIN, "status", mnt])
    check(r.returncode == 1 and "no burnstore daemon serves it" in r.stderr,
          "status of an unmounted directory: %d %r" % (r.returncode, r.stderr))
    # In the foreground, on stderr.
    with foreground_mount(src, mnt, "rw") as p:
        if is_mounted(mnt):
            run(["setfattr", "-n", META + "t.u8", "-v", "256", mnt])
    err = p.stderr.read()
    check(META + "t.u8" in err.decode() and "refused" in err.decode(),
          "-f: the refusal on stderr: %r" % err)


def test_remove_and_add_tensors(tmp):
    src = os.path.join(tmp, "t.gguf")
    G.write_tiny(src)
    before = G.Reader(src)
    newq = G.q8_0_bytes(2, 9)
    with Mount(src, os.path.join(tmp, "m"), opts="rw") as m:
        os.remove(os.path.join(m, "blk/0/ffn_down/weight"))
        os.makedirs(os.path.join(m, "extra"))
        p = os.path.join(m, "extra", "q")
        with open(p, "wb") as f:
            f.write(newq)
        os.setxattr(p, "user.burnstore.dtype", b"Q8_0")
        os.setxattr(p, "user.burnstore.shape", b"[2,32]")
        # replace the bytes of an F32 tensor
        with open(os.path.join(m, "token_embd/weight"), "r+b") as f:
            f.write(struct.pack("<f", 9.5))
        u = m.unmount()
    check(u.returncode == 0, "write-back: %s" % u.stderr)
    after = G.Reader(src)
    want = [n for n in before.tensors if n != "blk.0.ffn_down.weight"] + ["extra.q"]
    check(list(after.tensors) == want, "tensor order: %r" % list(after.tensors))
    q = after.tensors.get("extra.q", {})
    check(q.get("type") == "Q8_0" and q.get("shape") == [2, 32] and q.get("data") == newq, "the new Q8_0 tensor")
    emb = after.tensors["token_embd.weight"]["data"]
    check(emb[:4] == struct.pack("<f", 9.5) and emb[4:] == before.tensors["token_embd.weight"]["data"][4:],
          "the replaced bytes")
    for n in want[:-1]:
        if n != "token_embd.weight":
            check(after.tensors[n]["data"] == before.tensors[n]["data"], "%s unchanged" % n)
    for t in after.tensors.values():
        check(t["offset"] % after.alignment == 0, "aligned offsets")


def test_round_trip_and_new_output(tmp):
    src = os.path.join(tmp, "rt.gguf")
    data = G.write_tiny(src)
    out = os.path.join(tmp, "copy.gguf")
    with Mount(src, os.path.join(tmp, "m"), opts="output=" + out) as m:
        u = m.unmount()
    check(u.returncode == 0, "extraction: %s" % u.stderr)
    check(os.path.exists(out) and open(out, "rb").read() == data, "read -> write is byte-identical")
    back = os.path.join(tmp, "back.gguf")
    with Mount(out, os.path.join(tmp, "m2"), opts="output=" + back) as m:
        u = m.unmount()
    check(os.path.exists(back) and open(back, "rb").read() == data, "read -> write -> read -> write")
    # A new .gguf path: the GGUF writer is chosen by the extension.
    new = os.path.join(tmp, "new.gguf")
    with Mount(new, os.path.join(tmp, "n")) as m:
        check(os.getxattr(m, "user.burnstore.format") == b"gguf", "a new .gguf mount says gguf: %r"
              % os.getxattr(m, "user.burnstore.format"))
        with open(os.path.join(m, "w"), "wb") as f:
            f.write(struct.pack("<4f", 1, 2, 3, 4))
        os.setxattr(os.path.join(m, "w"), "user.burnstore.dtype", b"F32")
        os.setxattr(os.path.join(m, "w"), "user.burnstore.shape", b"[2,2]")
        os.setxattr(m, META + "general.name", b"fresh")
        u = m.unmount()
    check(u.returncode == 0, "new .gguf: %s" % u.stderr)
    ref = G.Reader(new) if os.path.exists(new) else None
    check(ref is not None and ref.tensors["w"]["shape"] == [2, 2] and ref.tensors["w"]["type"] == "F32"
          and ref.tensors["w"]["data"] == struct.pack("<4f", 1, 2, 3, 4), "new .gguf tensor")
    check(ref is not None and ref.kv.get("general.name") == (G.VSTRING, "fresh"), "new .gguf metadata")
    # A U8 file cannot be GGUF: refused in one line naming it.
    bad = os.path.join(tmp, "u8.gguf")
    stg = os.path.join(tmp, "stg-u8")
    os.makedirs(stg)
    with Mount(bad, os.path.join(tmp, "b"), opts="staging=" + stg) as m:
        with open(os.path.join(m, "raw"), "wb") as f:
            f.write(b"abc")
        u = m.unmount()
    check(u.returncode != 0 and "raw" in u.stderr and "GGUF has no type for U8" in u.stderr,
          "a U8 file is refused: %r" % u.stderr)
    shutil.rmtree(stg, ignore_errors=True)


def hostile(tmp):
    """(name, bytes, message part) of files burnstore must refuse."""
    def hdr(version=3, nt=0, nkv=0):
        return b"GGUF" + struct.pack("<IQQ", version, nt, nkv)

    def ti(name, ne, gt, off):
        return (struct.pack("<Q", len(name)) + name + struct.pack("<I", len(ne))
                + b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", gt, off))

    def padded(b):
        return b + b"\0" * ((-len(b)) % 32)
    return [
        ("huge_count", hdr(nt=2**62), "tensor count"),
        ("huge_kv", hdr(nkv=2**40), "metadata count"),
        ("big_endian", b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
        ("version4", hdr(version=4), "versions 1 to 3 are"),
        # an early big-endian writer's file: its magic (a u32) byte-swapped
        ("fugg", b"FUGG" + struct.pack(">IQQ", 3, 0, 0), "its magic reads 'FUGG'"),
        # version 1's sizes are u32: a count that does not fit what is left
        ("v1_huge_kv", b"GGUF" + struct.pack("<III", 1, 0, 2**31), "metadata count"),
        ("misaligned", padded(hdr(nt=1) + ti(b"t", [4], 0, 8)) + bytes(64), "alignment"),
        ("overlap", padded(hdr(nt=2) + ti(b"a", [16], 0, 0) + ti(b"b", [4], 0, 32)) + bytes(96), "overlaps"),
        ("unknown_type", padded(hdr(nt=1) + ti(b"t", [4], 77, 0)) + bytes(32), "unknown ggml type 77"),
        ("removed_type", padded(hdr(nt=1) + ti(b"t", [32], 31, 0)) + bytes(64), "Q4_0_4_4"),
        ("past_end", padded(hdr(nt=1) + ti(b"t", [1000], 0, 0)) + bytes(32), "outside the file"),
        ("bad_alignment", hdr(nkv=1) + struct.pack("<Q", 17) + b"general.alignment" + struct.pack("<II", 4, 24),
         "power of two"),
        # a newline in a name from the file does not split the error line
        ("newline_key", hdr(nkv=2) + (struct.pack("<Q", 12) + b"a\nfake: line" + struct.pack("<IB", 0, 1)) * 2,
         "appears twice"),
    ]


def test_hostile_files_are_refused(tmp):
    for name, data, sub in hostile(tmp):
        p = os.path.join(tmp, name + ".gguf")
        with open(p, "wb") as f:
            f.write(data)
        mnt = os.path.join(tmp, "h")
        os.makedirs(mnt, exist_ok=True)
        r = run([BIN, p, mnt])
        if r.returncode == 0:
            run(["fusermount3", "-u", mnt])
        err = r.stderr.strip()
        check(r.returncode != 0, "%s: refused" % name)
        check(sub in err, "%s: the message names the problem: %r" % (name, err))
        check("\n" not in err, "%s: one line: %r" % (name, err))


def test_metadata_edit_streams_the_tensors(tmp):
    """Changing general.name of a model with a 192 MiB tensor: the daemon
    (in the foreground, so its peak RSS is ours to read) copies the tensor
    in chunks, never whole."""
    src = os.path.join(tmp, "big.gguf")
    n = 48 << 20  # F32 elements: 192 MiB
    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 1, 1))
    head += struct.pack("<Q", 12) + b"general.name" + struct.pack("<I", G.VSTRING) + struct.pack("<Q", 3) + b"old"
    head += struct.pack("<Q", 1) + b"w" + struct.pack("<IQIQ", 1, n, 0, 0)
    head += b"\0" * ((-len(head)) % 32)
    with open(src, "wb") as f:
        f.write(head)
        f.seek(len(head) + 4 * n - 4)
        f.write(struct.pack("<f", 2.5))  # sparse zeros, then one value at the end
    mnt = os.path.join(tmp, "big")
    os.makedirs(mnt, exist_ok=True)
    p = subprocess.Popen([BIN, "-f", src, mnt, "-o", "rw"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        import time
        for _ in range(600):
            if is_mounted(mnt) or p.poll() is not None:
                break
            time.sleep(0.1)
        check(is_mounted(mnt), "foreground mount")
        os.setxattr(mnt, META + "general.name", b"new name")
        run(["fusermount3", "-u", mnt], timeout=600)
        end = time.time() + 600
        while True:  # the daemon's own rusage, reaped with a deadline
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid or time.time() > end:
                break
            time.sleep(0.05)
        check(pid != 0, "the daemon exits after the unmount")
        status = status if pid else -1
        p.returncode = status
    finally:
        force_unmount(mnt)
        if p.poll() is None:
            p.kill()
            p.wait()
    check(status != -1 and os.waitstatus_to_exitcode(status) == 0, "daemon exit status %r" % status)
    check(ru.ru_maxrss < mem_limit_kb(64 * 1024),
          "peak daemon memory %d KiB while rewriting 192 MiB (< 64 MiB)" % ru.ru_maxrss)
    ref = G.Reader(src)
    check(ref.kv["general.name"] == (G.VSTRING, "new name"), "the name changed")
    t = ref.tensors["w"]
    check(t["nbytes"] == 4 * n and t["data"][-4:] == struct.pack("<f", 2.5) and not any(t["data"][:4096]),
          "the tensor copied")


def test_finish_after_enospc_keeps_types(tmp):
    """A write-back that fails for lack of space keeps its staging; --finish
    completes it later, still with the metadata's GGUF types."""
    small = os.path.join(tmp, "small")
    os.makedirs(small)
    r = run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", small])
    if not check(r.returncode == 0, "mount a small tmpfs: %s" % r.stderr):
        return
    stg = os.path.join(tmp, "stg-finish")
    os.makedirs(stg)
    try:
        src = os.path.join(small, "m.gguf")
        G.write_tiny(src)
        with Mount(src, os.path.join(tmp, "f"), opts="rw,staging=" + stg) as m:
            os.setxattr(m, META + "t.u32", b"99")
            with open(os.path.join(m, "big"), "wb") as f:
                f.write(bytes(60000))
            os.setxattr(os.path.join(m, "big"), "user.burnstore.dtype", b"I8")
            u = m.unmount()
        check(u.returncode != 0, "the write-back fails for lack of space: %r" % u.stderr)
        left = os.listdir(stg)
        check(len(left) == 1, "staging kept: %r" % left)
        if left:
            run(["mount", "-o", "remount,size=4m", small])
            r = run([BIN, "--finish", os.path.join(stg, left[0])])
            check(r.returncode == 0, "--finish: %s" % r.stderr)
            ref = G.Reader(src)
            check(ref.kv["t.u32"] == (G.VU32, 99), "--finish kept the uint32 type: %r" % (ref.kv["t.u32"],))
            check(ref.tensors["big"]["type"] == "I8" and ref.tensors["big"]["nbytes"] == 60000, "the new tensor")
            check(ref.kv["a.nested"][1][0] == G.VARRAY, "other metadata intact")
    finally:
        run(["umount", small])
        if is_mounted(small):
            run(["umount", "-l", small])
        shutil.rmtree(stg, ignore_errors=True)


def test_diff_counts_blocks_of_quantized_tensors(tmp):
    """diff of two Q8_0 tensors counts the blocks that differ (32 elements,
    34 bytes each), never bytes as elements."""
    a, b = os.path.join(tmp, "qa.gguf"), os.path.join(tmp, "qb.gguf")
    qa = G.q8_0_bytes(3)
    qb = bytearray(qa)
    for i in range(34, 68):  # every byte of the second block
        qb[i] ^= 0xFF
    qb[70] ^= 1  # one byte of the third
    G.write(a, [], [("q", G.TYPE_ID["Q8_0"], [96], qa), ("f", 0, [2], struct.pack("<2f", 1, 2))])
    G.write(b, [], [("q", G.TYPE_ID["Q8_0"], [96], bytes(qb)), ("f", 0, [2], struct.pack("<2f", 1, 3))])
    r = run([BIN, "diff", a, b])
    lines = r.stdout.splitlines()
    check(r.returncode == 1, "diff exits 1: %d %s" % (r.returncode, r.stderr))
    check("differs: q: 2 blocks of 32 elements, 35 bytes" in lines, "Q8_0 counted in blocks: %r" % lines)
    check(any(l.startswith("differs: f: 1 elements, ") for l in lines), "F32 still in elements: %r" % lines)


def peak_kb(cmd):
    """(exit status, peak RSS in KiB) of cmd, measured by /usr/bin/time (a
    child forked from this Python would count the interpreter's pages)."""
    r = run(["/usr/bin/time", "-f", "@@ %M"] + cmd)
    rss = [int(l.split()[1]) for l in r.stderr.splitlines() if l.startswith("@@ ")]
    return r.returncode, rss[0] if rss else 1 << 40


def test_long_string_costs_what_its_text_needs(tmp):
    """A value of one long string is held once; a string in an array is
    escaped straight into its JSON text, sized first: ls's peak memory is
    about the text (6 bytes a control character) plus the file's string,
    where it was twice the text and more (87 MB for a 6.7 MB file)."""
    tiny = os.path.join(tmp, "tiny-str.gguf")
    G.write(tiny, [("general.name", G.VSTRING, "x")], [("w", 0, [2], struct.pack("<2f", 1, 2))])
    n = 6500 * 1024
    cases = [("plain", (G.VSTRING, "x" * (8 << 20)), 8 << 20),
             ("array", (G.VARRAY, (G.VSTRING, ["\x01" * n])), 6 * n + 4)]
    rc, base = peak_kb([BIN, "ls", tiny])
    check(rc == 0, "ls of the tiny file")
    for what, (vt, v), text in cases:
        src = os.path.join(tmp, "long-%s.gguf" % what)
        G.write(src, [("general.x", vt, v)], [("w", 0, [2], struct.pack("<2f", 1, 2))])
        size = os.path.getsize(src)
        rc, peak = peak_kb([BIN, "ls", src])
        check(rc == 0, "ls of a %s string of %d bytes" % (what, size))
        r = run([BIN, "info", "--meta", "general.x", src])
        check(r.returncode == 0 and len(r.stdout) == text + 1,
              "%s: info --meta prints the whole value (%d bytes, want %d)" % (what, len(r.stdout) - 1, text))
        if SANITIZE != "OFF":
            continue  # sanitizers keep freed blocks: the measure is of the release build
        limit = (text + size) // 1024 + 8 * 1024
        check(peak - base < limit, "%s: ls of a %d-byte file: %d KiB over a tiny file's (< %d KiB)"
              % (what, size, peak - base, limit))



def tokenizer_kvs(seed=3):
    """Metadata shaped as a Llama 3 tokenizer's (128,256 tokens, 280,147
    merges, their types: about 8 MB), generated."""
    import random
    r = random.Random(seed)
    alpha = "abcdefghijklmnopqrstuvwxyz\u0120\u010a"

    def tok():
        return "".join(r.choice(alpha) for _ in range(r.randint(1, 12)))
    toks = [tok() for _ in range(128256)]
    return [("general.architecture", G.VSTRING, "llama"), ("general.name", G.VSTRING, "tok"),
            ("llama.context_length", G.VU32, 8192), ("tokenizer.ggml.model", G.VSTRING, "gpt2"),
            ("tokenizer.ggml.tokens", G.VARRAY, (G.VSTRING, toks)),
            ("tokenizer.ggml.token_type", G.VARRAY, (G.VI32, [1] * len(toks))),
            ("tokenizer.ggml.merges", G.VARRAY, (G.VSTRING, [tok() + " " + tok() for _ in range(280147)])),
            ("tokenizer.ggml.bos_token_id", G.VU32, 128000)]


def daemon_peak_kb(src, mnt, edits):
    """A writable mount of src in the foreground (its own VmHWM: no fork),
    `edits` setfattr of the root's metadata, a getxattr of every listed
    name, then the write-back: (peak over all of it in KiB, peak after the
    mount, peak after the edits)."""
    import threading
    peak = [0]
    with foreground_mount(src, mnt, opts="rw") as p:
        def poll():
            while p.poll() is None:
                try:
                    peak[0] = max(peak[0], vmhwm_kb(p.pid))
                except OSError:
                    pass
                time.sleep(0.01)
        th = threading.Thread(target=poll)
        th.start()
        mounted = vmhwm_kb(p.pid)
        for i, (k, v) in enumerate(edits):
            os.setxattr(mnt, META + k, v)
        edited = vmhwm_kb(p.pid)
        for name in os.listxattr(mnt):
            os.getxattr(mnt, name)
        r = run([BIN, "-u", mnt])
        check(r.returncode == 0, "write-back of %s: %s" % (src, r.stderr))
        p.wait(timeout=DEADLINE)
        th.join()
    return max(peak[0], edited), mounted, edited


def test_metadata_costs_its_bytes_not_its_text(tmp):
    """Issue 30: an 8 MB GGUF whose metadata is one array of a string of
    control bytes (48 MB as JSON text) cost ls 63 MB and a writable mount's
    daemon 204 MB (the text held four times: the catalog, the edit, the
    journal's base and its INDEX text); a Llama 3 tokenizer's block 36 MB.
    The values now stay in the file, their text made only for what is asked
    (an xattr of 64 KiB at most, info --meta): ls under 2x the block, the
    mount with edits and its write-back under 3x; an edit writes the value
    it changed, every other one byte for byte as it was."""
    tiny = os.path.join(tmp, "tiny-meta.gguf")
    G.write(tiny, [("general.name", G.VSTRING, "x")], [("w", 0, [2], struct.pack("<2f", 1, 2))])
    ctrl = [("general.name", G.VSTRING, "c"), ("general.x", G.VARRAY, (G.VSTRING, ["\x01" * (7800 << 10)]))]
    for what, kvs in (("tokenizer", tokenizer_kvs()), ("control bytes", ctrl)):
        src = os.path.join(tmp, "meta-%s.gguf" % what.replace(" ", "-"))
        G.write(src, kvs, [("w", 0, [2], struct.pack("<2f", 1, 2))])
        block = os.path.getsize(src)
        before = G.Reader(src)
        rc, ls_kb = peak_kb([BIN, "ls", src])
        check(rc == 0, "%s: ls" % what)
        edits = [("general.name", b"edited %d" % i) for i in range(5)] + [("new.key", b"added")]
        peak, mounted, edited = daemon_peak_kb(src, os.path.join(tmp, "m-" + what.replace(" ", "-")), edits)
        print("%s block of %d bytes: ls %d KiB, writable mount %d KiB mounted, %d after %d edits, %d at most "
              "(write-back included)" % (what, block, ls_kb, mounted, edited, len(edits), peak), flush=True)
        after = G.Reader(src)
        check(after.kv["general.name"] == (G.VSTRING, "edited 4") and after.kv["new.key"] == (G.VSTRING, "added"),
              "%s: the edits written" % what)
        for k in before.kv:
            if k != "general.name":
                check(after.kv_raw[k] == before.kv_raw[k], "%s: %s written byte for byte" % (what, k))
        r = subprocess.run([BIN, "info", "--meta", kvs[-1][0] if what == "control bytes" else "tokenizer.ggml.merges",
                            src], capture_output=True, timeout=DEADLINE)
        check(r.returncode == 0 and len(r.stdout) > 1 << 20, "%s: info --meta prints the long value" % what)
        if SANITIZE != "OFF":
            continue  # the sanitizers' allocators: the measure is of the release build
        check(ls_kb * 1024 < 2 * block, "%s: ls of a %d-byte block peaks at %d KiB (< 2x)" % (what, block, ls_kb))
        check(peak * 1024 < 3 * block, "%s: a writable mount of it peaks at %d KiB (< 3x)" % (what, peak))
        check(edited - mounted < 1024, "%s: %d edits cost the daemon %d KiB (the value changed, not the header)"
              % (what, len(edits), edited - mounted))

def test_many_small_values_cost_little(tmp):
    """Issue 34: 500,000 one-byte values in an 11 MB GGUF cost ls 106 MB and a
    writable mount 256 MB: the parse's copy of every key/value beside the
    catalog's, the edit layer's copy of the catalog's, and the journal BASE's
    catalog a third copy. The reader now parses into the catalog, the edit
    layer and the BASE borrow its entries: here 200,000 values (5.6 MB),
    ls under the base + 5x the file, the writable mount under the base + 13x
    (the BASE's text, 31 bytes a value, is what is left: the aim of 2x and 3x
    is not reached; docs/performance.md)."""
    src = os.path.join(tmp, "many.gguf")
    # made and read back in another python: this one's pages would count in the
    # peak of every daemon it forks later (a child starts with its parent's)
    sup = os.path.join(SOURCE_DIR, "tests/support")
    r = run([sys.executable, "-c", "import sys, struct; sys.path.insert(0, %r); import gguf_fixture as G; "
             "G.write(%r, [('meta.key.%%06d' %% i, G.VU8, i %% 256) for i in range(200000)], "
             "[('w', 0, [2], struct.pack('<2f', 1, 2))])" % (sup, src)])
    check(r.returncode == 0, "the file made: %s" % r.stderr)
    size = os.path.getsize(src)
    rc, ls_kb = peak_kb([BIN, "ls", src])
    check(rc == 0, "ls")
    peak, mounted, edited = daemon_peak_kb(src, os.path.join(tmp, "m"), [("meta.key.000007", b"9")])
    print("200,000 values in %d bytes: ls %d KiB, writable mount %d KiB mounted, %d at most (write-back included)"
          % (size, ls_kb, mounted, peak), flush=True)
    r = run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import gguf_fixture as G; "
             "kv = G.Reader(%r).kv; print(kv['meta.key.000007'], kv['meta.key.199999'], len(kv))" % (sup, src)])
    check(r.stdout.split() == ["(0,", "9)", "(0,", "%d)" % (199999 % 256), "200000"],
          "the edit written, the rest as they were: %r %s" % (r.stdout, r.stderr))
    if SANITIZE != "OFF":
        return  # the sanitizers' allocators: the measure is of the release build
    base = 10 << 20
    check(ls_kb * 1024 < base + 5 * size, "ls peaks at %d KiB (< 10 MiB + 5x %d)" % (ls_kb, size))
    check(peak * 1024 < base + 13 * size, "a writable mount peaks at %d KiB (< 10 MiB + 13x)" % peak)


if __name__ == "__main__":
    run_tests("test_gguf", [test_mount_matches_the_python_reader, test_version_1_is_read,
                            test_long_values_are_E2BIG_and_not_listed,
                            test_setfattr_writes_back_typed_metadata, test_bad_typed_value_is_refused_by_setfattr,
                            test_refusal_reason_reaches_the_user_without_syslog,
                            test_remove_and_add_tensors, test_round_trip_and_new_output,
                            test_hostile_files_are_refused, test_metadata_edit_streams_the_tensors,
                            test_finish_after_enospc_keeps_types, test_long_string_costs_what_its_text_needs,
                            test_diff_counts_blocks_of_quantized_tensors,
                            test_metadata_costs_its_bytes_not_its_text, test_many_small_values_cost_little],
              "gguf")
