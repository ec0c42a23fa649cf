"""The checkpoint CLI (issue 13): `burnstore ls|info|cat|diff|convert` on
torch-made checkpoints, each output compared with torch/numpy truth; the
converted files read back by the independent readers of bsmount.py; exit
statuses, one-line errors, --help for each subcommand, the progress line on a
terminal and none when piped. No mount."""
import json
import os
import pty
import select
import struct
import subprocess
import time

import numpy as np
import torch

from bsmount import BIN, FIX, SOURCE_DIR, Mount, check, finish, force_unmount, read_bpk, read_safetensors, run, tmpdir

NP = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
      torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64"}


def raw(t):
    t = t.detach().contiguous().reshape(-1)
    if t.is_complex():
        t = torch.view_as_real(t).reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def make_state():
    g = torch.Generator().manual_seed(13)
    base = torch.randn(4, 6, generator=g)
    sd = {
        "enc.layers.0.weight": torch.randn(8, 4, generator=g),
        "enc.layers.0.bias": torch.randn(8, generator=g),
        "enc.norm.weight": torch.ones(8),
        "dec.view_t": base.t(),                # strided: a transposed view
        "dec.view_slice": base[:, 1:5:2],      # strided: a step
        "f64": torch.randn(3, 2, dtype=torch.float64, generator=g),
        "f16": torch.randn(5, generator=g).half(),
        "bf16": torch.randn(2, 3, generator=g).bfloat16(),
        "i64": torch.arange(-5, 5),
        "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "i16": torch.arange(4, dtype=torch.int16),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.arange(250, 256, dtype=torch.uint8),
        "b": torch.tensor([True, False, True]),
        "c64": torch.randn(3, dtype=torch.complex64, generator=g),
        "scalar": torch.tensor(2.5),
    }
    return sd


def test_ls_info_cat(tmp, sd, pth):
    r = run([BIN, "ls", pth])
    check(r.returncode == 0 and r.stderr == "", "ls exits 0 quietly: %r" % r.stderr)
    rows = {l.split("\t")[0]: l.split("\t")[1:] for l in r.stdout.splitlines()}
    check(set(rows) == set(sd), "ls lists every key: %r" % sorted(rows))
    for k, t in sd.items():
        want = [NP[t.dtype], "[" + ",".join(str(x) for x in t.shape) + "]", str(len(raw(t)))]
        check(rows.get(k) == want, "ls %s: %r == %r" % (k, rows.get(k), want))
    r = run([BIN, "ls", "--json", pth])
    js = {e["key"]: e for e in json.loads(r.stdout)}
    for k, t in sd.items():
        e = js.get(k, {})
        check(e.get("dtype") == NP[t.dtype] and e.get("shape") == list(t.shape)
              and e.get("bytes") == len(raw(t)), "ls --json %s: %r" % (k, e))
    check(js["dec.view_t"].get("strided") is True, "ls --json marks the strided view")
    # the key options, as on the mount
    r = run([BIN, "ls", "-o", r"include=^(enc|block),remap=^enc\.layers\.(\d+)=>block$1", pth])
    keys = [l.split("\t")[0] for l in r.stdout.splitlines()]
    check(sorted(keys) == ["block0.bias", "block0.weight", "enc.norm.weight"],
          "ls with include and remap: %r" % keys)
    r = run([BIN, "ls", "-o", "include=(", pth])
    check(r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, "a bad regex: one line: %r" % r.stderr)
    # info
    r = run([BIN, "info", pth])
    out = r.stdout
    total = sum(len(raw(t)) for t in sd.values())
    check(r.returncode == 0 and "format: pytorch" in out and "tensors: %d\n" % len(sd) in out
          and "bytes: %d\n" % total in out, "info: format, count, bytes: %s" % out)
    check("F32=" in out and "BF16=1 (12 bytes)" in out and "strided views: 2" in out,
          "info: the dtype breakdown and the strided views: %s" % out)
    # cat: raw and --npy, every tensor
    for k, t in sd.items():
        r = subprocess.run([BIN, "cat", pth, k], capture_output=True, timeout=60)
        check(r.returncode == 0 and r.stdout == raw(t), "cat %s gives the bytes of torch" % k)
        r = subprocess.run([BIN, "cat", "--npy", pth, k], capture_output=True, timeout=60)
        npy = os.path.join(tmp, "c.npy")
        open(npy, "wb").write(r.stdout)
        a = np.load(npy)
        if t.dtype == torch.bfloat16:
            ok = a.dtype == np.uint16 and a.tobytes() == raw(t)
        else:
            ok = a.dtype == t.numpy().dtype and np.array_equal(a, t.numpy()) and a.shape == tuple(t.shape)
        check(r.returncode == 0 and ok, "cat --npy %s loads in numpy as the tensor" % k)
    r = run([BIN, "cat", pth, "nope"])
    check(r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "nope" in r.stderr,
          "cat of a missing key: one line, exit 1: %r" % r.stderr)


def write_st(path, tensors, meta):
    header, blobs, off = {}, [], 0
    for k, (dt, shape, b) in tensors.items():
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_info_meta(tmp):
    long = "".join("tok%d\n" % i for i in range(30000))  # ~250 KB, newlines included
    st = os.path.join(tmp, "meta.safetensors")
    write_st(st, {"w": ("F32", [2], struct.pack("<2f", 1, 2))}, {"vocab": long, "short": "x"})
    r = run([BIN, "info", st])
    check(r.returncode == 0 and "  short: x\n" in r.stdout and "(%d bytes in all)" % len(long) in r.stdout
          and len(r.stdout) < 5000, "info cuts long metadata: %r" % r.stdout[:600])
    r = run([BIN, "info", "--meta", "vocab", st])
    check(r.returncode == 0 and r.stdout == long + "\n", "info --meta prints the value in full")
    r = run([BIN, "info", "--meta", "nope", st])
    check(r.returncode == 1 and len(r.stderr.splitlines()) == 1, "info --meta of a missing key: %r" % r.stderr)


def test_diff(tmp, sd, pth):
    r = run([BIN, "diff", pth, pth])
    check(r.returncode == 0 and r.stdout == "", "diff of a file with itself: 0, silent: %r" % r.stdout)
    sd2 = dict(sd)
    sd2["enc.layers.0.weight"] = sd["enc.layers.0.weight"].clone()
    sd2["enc.layers.0.weight"][1, 2] += 0.5
    sd2["enc.layers.0.weight"][3, 0] -= 0.25
    f16 = sd["f16"].clone()
    f16[0] = f16[0] + 2
    sd2["f16"] = f16
    bf = sd["bf16"].clone()
    bf[1, 1] = bf[1, 1] - 4
    sd2["bf16"] = bf
    sd2["i64"] = sd["i64"].int()
    del sd2["u8"]
    sd2["new"] = torch.zeros(2)
    b = os.path.join(tmp, "b.pth")
    torch.save(sd2, b)
    r = run([BIN, "diff", pth, b])
    lines = r.stdout.splitlines()
    check(r.returncode == 1, "diff exits 1 on differences: %d %s" % (r.returncode, r.stderr))
    check("only in %s: u8" % pth in lines and "only in %s: new" % b in lines, "diff names keys only in one: %r" % lines)
    check("changed: i64: I64 [10] -> I32 [10]" in lines, "diff names the dtype change: %r" % lines)
    def maxdiff(key):
        for l in lines:
            if l.startswith("differs: %s:" % key):
                return float(l.rsplit(" ", 1)[1])
        return None
    for key in ("enc.layers.0.weight", "f16", "bf16"):
        want = (sd[key].double() - sd2[key].double()).abs().max().item()
        got = maxdiff(key)
        check(got is not None and abs(got - want) <= 1e-6 * max(1, want), "diff %s: max abs %r == %r" % (key, got, want))
    check(any(l.startswith("differs: enc.layers.0.weight: 2 elements") for l in lines), "diff counts elements: %r" % lines)
    check(len([l for l in lines if l.startswith("differs")]) == 3, "only the changed tensors differ: %r" % lines)
    r = run([BIN, "diff", "-q", pth, b])
    check(r.returncode == 1 and not any(l.startswith("differs") for l in r.stdout.splitlines()), "diff -q skips bytes")
    r = run([BIN, "diff", pth, os.path.join(tmp, "missing.pth")])
    check(r.returncode == 2 and len(r.stderr.splitlines()) == 1, "diff with a missing file: exit 2, one line: %r" % r.stderr)


def test_stdout_write_errors(tmp, pth):
    """Output that cannot be written (a full device, a closed stdout) fails
    the command in one line on stderr: 1 for ls, info, cat; 2 for diff."""
    other = os.path.join(tmp, "other.safetensors")
    write_st(other, {"w": ("F32", [2], struct.pack("<2f", 1, 2))}, {})
    cases = [(["ls", pth], 1), (["ls", "--json", pth], 1), (["info", pth], 1),
             (["info", "--meta", "format", other], None), (["cat", pth, "f16"], 1),
             (["cat", "--npy", pth, "f16"], 1), (["diff", pth, other], 2)]
    for args, want in cases:
        with open("/dev/full", "w") as full:
            r = subprocess.run([BIN] + args, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
        if want is None:  # no such key: its own one-line error, not a write error
            check(r.returncode == 1 and len(r.stderr.splitlines()) == 1, "%s: %r" % (args, r.stderr))
            continue
        lines = r.stderr.splitlines()
        check(r.returncode == want and len(lines) == 1 and "standard output" in lines[0]
              and "No space left" in lines[0],
              "%s > /dev/full: exit %d (want %d), stderr %r" % (" ".join(args[:2]), r.returncode, want, r.stderr))
    r = subprocess.run([BIN, "ls", pth], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       timeout=60, preexec_fn=lambda: os.close(1))
    check(r.returncode == 1 and "standard output" in r.stderr, "ls with stdout closed: %r" % r.stderr)
    r = run([BIN, "diff", pth, pth])
    check(r.returncode == 0 and r.stderr == "", "diff with nothing to print still exits 0")


def test_convert(tmp, sd, pth):
    for ext, reader in ((".bpk", read_bpk), (".safetensors", read_safetensors)):
        out = os.path.join(tmp, "conv" + ext)
        opts = ["-o", "exclude=^c64$"] if ext == ".bpk" else []  # Burnpack has no complex dtype
        r = run([BIN, "convert"] + opts + [pth, out])
        check(r.returncode == 0 and r.stderr == "", "convert to %s: %r" % (ext, r.stderr))
        if r.returncode != 0:
            continue
        skip = {"c64"} if ext == ".bpk" else set()
        try:
            got, _ = reader(out)
        except Exception as e:
            check(False, "the %s output reads back: %r" % (ext, e))
            continue
        for k, t in sd.items():
            if k in got:
                check(got[k][0] == NP[t.dtype] and list(got[k][1]) == list(t.shape) and got[k][2] == raw(t),
                      "convert %s: %s as torch has it" % (ext, k))
        r = run([BIN, "diff"] + opts + [pth, out])
        check(r.returncode == 0, "diff of the input and its %s conversion: %r" % (ext, r.stdout))
        os.unlink(out)
    # a dtype the output cannot hold: one line naming the tensor, no output left
    out = os.path.join(tmp, "c.bpk")
    r = run([BIN, "convert", pth, out])
    check(r.returncode == 1 and "c64" in r.stderr and len(r.stderr.strip().splitlines()) == 1 and not os.path.exists(out),
              "convert refuses what Burnpack cannot hold, naming it: %r" % r.stderr)
    out = os.path.join(tmp, "c2.safetensors")
    r = run([BIN, "convert", "-o", r"exclude=^dec\.", pth, out])
    got, _ = read_safetensors(out) if r.returncode == 0 else ({}, {})
    check(r.returncode == 0 and set(got) == set(sd) - {"dec.view_t", "dec.view_slice"}, "convert -o exclude=: %r" % sorted(got))
    r = run([BIN, "convert", pth, os.path.join(tmp, "x.txt")])
    check(r.returncode == 2 and len(r.stderr.splitlines()) == 1 and ".bpk" in r.stderr, "convert to an unknown extension: %r" % r.stderr)
    ro = os.path.join(tmp, "ro")
    os.makedirs(ro)
    os.chmod(ro, 0o500)
    if os.geteuid() != 0:
        r = run([BIN, "convert", pth, os.path.join(ro, "x.bpk")])
        check(r.returncode == 1 and len(r.stderr.splitlines()) == 1 and os.listdir(ro) == [], "convert into a read-only dir: %r" % r.stderr)
    os.chmod(ro, 0o700)
    # progress: none when piped (above: stderr empty), a line on a terminal
    env = dict(os.environ, BURNSTORE_PROGRESS_MIN="1")
    out = os.path.join(tmp, "tty.safetensors")
    rc, _, text = pty_run([BIN, "convert", pth, out], env)
    check(rc == 0 and b"convert" in text and b"100%" in text and b"/s" in text,
          "a progress line on a terminal: %r" % text[-300:])
    r = run([BIN, "convert", pth, out], env=env)
    check(r.returncode == 0 and r.stderr == "", "no progress when piped: %r" % r.stderr)
    # --progress / --no-progress override the terminal test (a log gets plain lines)
    r = run([BIN, "convert", "--progress", pth, out], env=env)
    check(r.returncode == 0 and "convert" in r.stderr and "100%" in r.stderr and "\r" not in r.stderr
          and "\033" not in r.stderr, "convert --progress when piped: plain lines: %r" % r.stderr)
    rc, _, text = pty_run([BIN, "convert", "--no-progress", pth, out], env)
    check(rc == 0 and b"%" not in text, "convert --no-progress on a terminal: nothing: %r" % text[-300:])


def pty_run(cmd, env, deadline=120):
    """Run cmd with stderr on a pseudo-terminal: (exit status, stdout, what
    the terminal got). Killed after `deadline` seconds (status then not 0)."""
    m, s = pty.openpty()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=s, env=env)
    os.close(s)
    text = b""
    end = time.time() + deadline
    try:
        while True:
            left = end - time.time()
            if left <= 0 or not select.select([m], [], [], left)[0]:
                p.kill()
                break
            try:
                chunk = os.read(m, 4096)
            except OSError:
                break
            if not chunk:
                break
            text += chunk
        out = p.communicate(timeout=max(1, end - time.time()))[0]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(m)
    return p.returncode, out, text


def test_unmount_progress(tmp):
    env = dict(os.environ, BURNSTORE_PROGRESS_MIN="1000000")
    # (stderr a terminal, flag, a progress line expected)
    for tty, flag, shown in ((True, None, True), (False, None, False), (False, "--progress", True),
                             (True, "--no-progress", False)):
        name = "%d%s" % (tty, flag or "")
        out = os.path.join(tmp, "u%s.bpk" % name)
        mnt = os.path.join(tmp, "mu%s" % name)
        os.makedirs(mnt, exist_ok=True)
        r = run([BIN, out, mnt], env=env)
        check(r.returncode == 0, "mount a new .bpk: %r" % r.stderr)
        try:
            with open(os.path.join(mnt, "w"), "wb") as f:
                f.write(os.urandom(8 << 20))
            os.setxattr(os.path.join(mnt, "w"), "user.burnstore.dtype", b"F32")
            cmd = [BIN, "-u", "-v"] + ([flag] if flag else []) + [mnt]
            if tty:
                rc, stdout, text = pty_run(cmd, env)
            else:
                r = run(cmd, env=env)
                rc, stdout, text = r.returncode, r.stdout.encode(), r.stderr.encode()
            check(rc == 0 and b"wrote " in stdout, "-u %s: -v prints the report: %r" % (name, stdout))
            if shown:
                check(b"write-back" in text and b"100%" in text and b"8.0 MiB" in text,
                      "burnstore -u (%s) shows the write-back's progress: %r" % (name, text[-300:]))
            else:
                check(b"%" not in text, "no progress line (%s): %r" % (name, text[-300:]))
        finally:
            force_unmount(mnt)
        got, _ = read_bpk(out)
        check(got.get("w", ("", [0]))[1] == [2 << 20], "the write-back wrote w")


def test_info_details(tmp, pth):
    """The lines each format adds to info (its registry row's describe): all of
    a Burnpack's info, a PyTorch file's container, a sharded set's shards."""
    bpk = os.path.join(FIX, "examples/mnist-inference-web/model.bpk")
    r = run([BIN, "info", bpk])
    check(r.returncode == 0 and r.stdout == "file: %s\nformat: burnpack\nversion: 1\ntensors: 18\n"
          "bytes: 1043240\ndtypes: F32=18 (1043240 bytes)\nmetadata: 0\n" % bpk, "info of model.bpk: %r" % r.stdout)
    r = run([BIN, "info", pth])
    check(r.returncode == 0 and "\nformat: pytorch\nversion: zip (torch >= 1.6)\ntensors: " in r.stdout,
          "info of a torch.save file names its container: %r" % r.stdout)
    out = os.path.join(tmp, "details.safetensors")
    r = run([BIN, "convert", "-o", "max_shard_size=300000", bpk, out])
    index = os.path.join(tmp, "details.safetensors.index.json")
    check(r.returncode == 0 and os.path.exists(index), "convert into shards: %s" % r.stderr)
    if os.path.exists(index):
        shards = set(json.load(open(index))["weight_map"].values())
        r = run([BIN, "info", index])
        check(r.returncode == 0 and len(shards) > 1 and
              "\nformat: safetensors-sharded\nshards: %d\ntensors: 18\n" % len(shards) in r.stdout,
              "info of a sharded set counts its %d shards: %r" % (len(shards), r.stdout))


def test_help(tmp):
    for cmd in ("ls", "info", "cat", "diff", "convert"):
        r = run([BIN, cmd, "--help"])
        check(r.returncode == 0 and r.stdout.startswith("usage: burnstore %s" % cmd) and "-o OPTIONS" in r.stdout,
              "%s --help: %r" % (cmd, r.stdout[:80]))
        r = run([BIN, cmd])
        check(r.returncode == 2 and len(r.stderr.splitlines()) == 1, "%s without arguments: one line, exit 2: %r" % (cmd, r.stderr))
        r = run([BIN, cmd, "--bogus", "x"])
        check(r.returncode == 2 and len(r.stderr.splitlines()) == 1, "%s --bogus: %r" % (cmd, r.stderr))
    r = run([BIN, "convert", "--help"])
    check(all(ext in r.stdout for ext in (".bpk", ".safetensors", ".safetensors.index.json", ".gguf")),
          "convert --help names every output it writes: %r" % r.stdout)
    man = open(os.path.join(SOURCE_DIR, "docs/burnstore.1")).read()
    conv = man[man.index(".B convert"):]
    check("\\fB.gguf\\fR" in conv[:conv.index(".SH")], "burnstore(1) names .gguf among convert's outputs")
    r = run([BIN, "--help"])
    check(all("burnstore %s " % c in r.stdout for c in ("ls", "info", "cat", "diff", "convert")), "burnstore --help lists the subcommands")
    r = run([BIN, "ls", "/nonexistent.pth"])
    check(r.returncode == 1 and r.stderr.count("\n") == 1 and "/nonexistent.pth" in r.stderr, "ls of a missing file: %r" % r.stderr)
    # The version is written once, in CMakeLists.txt's project(); the man
    # pages, which are not configured, must say the same.
    cmake = open(os.path.join(SOURCE_DIR, "CMakeLists.txt")).read()
    version = cmake[cmake.index("project(burnstore VERSION ") + 26:].split()[0]
    r = run([BIN, "--version"])
    check(r.returncode == 0 and r.stdout.startswith("burnstore %s " % version),
          "--version says CMakeLists.txt's %s: %r" % (version, r.stdout))
    for page in ("burnstore.1", "mount.burnstore.8"):
        th = open(os.path.join(SOURCE_DIR, "docs", page)).readline()
        check('"burnstore %s"' % version in th, "docs/%s says version %s: %r" % (page, version, th))


def test_diff_sub_byte(tmp):
    """diff counts the elements of F4 (2 a byte) and F6 (4 in 3 bytes) that
    differ, not their bytes. The changed bits are chosen so that the count
    is the same whichever end of a byte holds the first element."""
    a, b = os.path.join(tmp, "sub-a.safetensors"), os.path.join(tmp, "sub-b.safetensors")
    f4, f6 = bytes(4), bytes(6)
    write_st(a, {"f4": ("F4", [8], f4), "f6": ("F6_E2M3", [8], f6), "f6b": ("F6_E3M2", [4], f6[:3])}, {})
    # F4: both halves of byte 0, one half of byte 2: 3 elements in 2 bytes.
    # F6: bits 0 and 7 of byte 0, bits 0 and 7 of byte 1: elements 0, 1, 2 in 2 bytes.
    g4 = bytes([0x81, 0, 0x10, 0])
    g6 = bytes([0x81, 0x81, 0, 0, 0, 0])
    write_st(b, {"f4": ("F4", [8], g4), "f6": ("F6_E2M3", [8], g6), "f6b": ("F6_E3M2", [4], bytes([0, 0, 0x80]))}, {})
    r = run([BIN, "diff", a, b])
    lines = sorted(r.stdout.splitlines())
    check(r.returncode == 1 and lines == ["differs: f4: 3 elements, 2 bytes", "differs: f6: 3 elements, 2 bytes",
                                          "differs: f6b: 1 elements, 1 bytes"],
          "diff counts sub-byte elements: %d %r %s" % (r.returncode, lines, r.stderr))


def main():
    with tmpdir("cli") as tmp:
        sd = make_state()
        pth = os.path.join(tmp, "a.pth")
        torch.save(sd, pth)
        for t in (lambda: test_ls_info_cat(tmp, sd, pth), lambda: test_info_meta(tmp),
                  lambda: test_diff(tmp, sd, pth), lambda: test_diff_sub_byte(tmp), lambda: test_stdout_write_errors(tmp, pth),
                  lambda: test_convert(tmp, sd, pth), lambda: test_info_details(tmp, pth),
                  lambda: test_help(tmp), lambda: test_unmount_progress(tmp)):
            try:
                t()
            except Exception as e:
                import traceback
                traceback.print_exc()
                check(False, "raised %r" % e)
        for d in os.listdir(tmp):
            force_unmount(os.path.join(tmp, d))
    finish("test_cli")


if __name__ == "__main__":
    main()
