"""The three examples of docs/library.md (docs/examples/*.c), compiled against
a libburnstore and run:

    check_examples.py --bin BURNSTORE --cflags "-I.../include" --lib LIB.so   # a build's
    check_examples.py --bin BURNSTORE --pkg-config [--define-prefix]          # an install's

  - list_tensors lists what `burnstore ls` lists (Burnpack, SafeTensors, a
    shard set's directory, PyTorch zip and legacy, GGUF), prints a tensor's
    first values, and refuses a file that is no checkpoint in one line;
  - read_f32 reads every floating tensor of a GGUF (F32, F16, Q8_0, Q4_0)
    from nginx (ranges, ETags: tests/support/httpfault.py) as F32: the bytes
    `burnstore cat --as F32` gives of the local file, and the summary line
    made from them; a missing tensor and a missing file fail in one line;
  - convert writes what `burnstore convert` writes, byte for byte (Burnpack,
    SafeTensors, a shard set, GGUF, PyTorch; with IN's options: as=BF16,
    exclude=), and `burnstore diff` finds IN and OUT the same; an output no
    writer has fails and leaves nothing.

The BURNSTORE binary is the reference (the CLI on the static core). The
examples are compiled with -Wall -Wextra -Werror, and must load LIB (ldd).
With --sanitize FLAGS (the build's -fsanitize=...), they are compiled with
it, so that the library's leaks and errors show in them. Exit 0, or 1 with
every failed expectation listed."""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "support"))
import gguf_fixture as G  # noqa: E402
from httpfault import Nginx  # noqa: E402

FIX = os.path.join(SRC, "tests", "fixtures")
BPK = os.path.join(FIX, "burn/examples/mnist-inference-web/model.bpk")
ST = os.path.join(FIX, "burn/burn-store/safetensors-tests/tests/multi_layer/multi_layer.safetensors")
PT = os.path.join(FIX, "complex_nested.pt")
LEGACY = os.path.join(FIX, "burn/burn-store/src/pytorch/tests/reader/test_data/simple_legacy.pt")
DEADLINE = 120
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)
    return cond


def run(cmd, env=None):
    return subprocess.run(cmd, capture_output=True, timeout=DEADLINE, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--cflags", default="")
    ap.add_argument("--lib")
    ap.add_argument("--pkg-config", action="store_true")
    ap.add_argument("--define-prefix", action="store_true")
    ap.add_argument("--sanitize", default="")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bs-examples-")
    try:
        exe = build(a, tmp)
        if exe:
            examples(a.bin, exe, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILURES:
        print("check_examples: %d expectation(s) failed" % len(FAILURES))
        sys.exit(1)
    print("check_examples: the three examples build and run as documented")


def build(a, tmp):
    """Compile each example; {name: path}, or None."""
    if a.pkg_config:
        pc = ["pkg-config"] + (["--define-prefix"] if a.define_prefix else [])
        flags = subprocess.run(pc + ["--cflags", "--libs", "burnstore"], capture_output=True,
                               text=True, check=True).stdout.split()
        lib = os.path.join(subprocess.run(pc + ["--variable=libdir", "burnstore"], capture_output=True,
                                          text=True, check=True).stdout.strip(), "libburnstore.so")
    else:
        lib = a.lib
        flags = a.cflags.split() + [lib, "-Wl,-rpath," + os.path.dirname(lib)]
    flags += a.sanitize.split()
    exe = {}
    for name in ("list_tensors", "read_f32", "convert"):
        out = os.path.join(tmp, name)
        r = run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-g",
                 os.path.join(SRC, "docs/examples", name + ".c")] + flags + ["-o", out])
        if not check(r.returncode == 0, "%s.c compiles: %s" % (name, r.stderr.decode()[-2000:])):
            return None
        ldd = run(["ldd", out]).stdout.decode()
        loaded = [ln.split()[2] for ln in ldd.splitlines() if ln.strip().startswith("libburnstore.so")]
        check(loaded and os.path.realpath(loaded[0]) == os.path.realpath(lib),
              "%s loads %s: %s" % (name, lib, ldd))
        exe[name] = out
    print("ok: the examples compile against", lib, flush=True)
    return exe


def tiny_gguf(path):
    G.write_tiny(path)
    return path


def examples(bs, exe, tmp):
    gguf = tiny_gguf(os.path.join(tmp, "tiny.gguf"))
    shards = os.path.join(tmp, "set")
    os.makedirs(shards)
    r = run([bs, "convert", "-q", "-o", "max_shard_size=300KB", BPK,
             os.path.join(shards, "model.safetensors")])
    check(r.returncode == 0, "a shard set to list: %s" % r.stderr)

    # ---- list_tensors
    for src in (BPK, ST, shards, PT, LEGACY, gguf):
        got, want = run([exe["list_tensors"], src]), run([bs, "ls", src])
        check(got.returncode == 0 and want.stdout and got.stdout == want.stdout,
              "list_tensors %s lists what burnstore ls does: %r vs %r (%s)" % (
                  src, got.stdout[:200], want.stdout[:200], got.stderr))
    vals = struct.unpack("<8f", run([bs, "cat", BPK, "fc3.bias"]).stdout[:32])
    got = run([exe["list_tensors"], BPK, "fc3.bias"])
    check(got.stdout.decode() == "fc3.bias: %s\n" % " ".join("%g" % v for v in vals),
          "list_tensors prints fc3.bias's values: %r" % got.stdout)
    bad = run([exe["list_tensors"], os.path.join(SRC, "README.md")])
    err = bad.stderr.decode()
    check(bad.returncode == 1 and "README.md: " in err and "unknown format" in err
          and err.count("\n") == 1, "list_tensors refuses README.md in one line: %r" % err)
    print("ok: list_tensors", flush=True)

    # ---- read_f32, over HTTP
    with Nginx(tmp) as ng:
        shutil.copy(gguf, ng.path("tiny.gguf"))
        url = ng.url("tiny.gguf")
        floats = [name for name, gt, _s, _b in G.tiny_tensors() if G.GGML[gt][0] != "I32"]
        for key in floats:
            out = os.path.join(tmp, "out.f32")
            got = run([exe["read_f32"], url, key, out])
            want = run([bs, "cat", "--as", "F32", gguf, key])
            if not check(got.returncode == 0 and want.returncode == 0,
                         "read_f32 URL %s: %s %s" % (key, got.stderr, want.stderr)):
                continue
            check(open(out, "rb").read() == want.stdout, "read_f32 %s: the bytes of cat --as F32" % key)
            v = struct.unpack("<%df" % (len(want.stdout) // 4), want.stdout)
            shape = [s for n, _g, s, _b in G.tiny_tensors() if n == key][0]
            stored = G.GGML[[g for n, g, _s, _b in G.tiny_tensors() if n == key][0]][0]
            line = "%s: %s as F32, shape [%s], %d values:%s%s sum %s\n" % (
                key, stored, ",".join(map(str, shape)), len(v), "".join(" %s" % f9(x) for x in v[:4]),
                " ..." if len(v) > 4 else "", f17(sum_d(v)))
            check(got.stdout.decode() == line, "read_f32 %s prints %r, not %r" % (key, got.stdout, line))
        nokey = run([exe["read_f32"], url, "nope"])
        check(nokey.returncode == 1 and "no tensor 'nope'" in nokey.stderr.decode()
              and url in nokey.stderr.decode(), "read_f32 of a missing tensor: %r" % nokey.stderr)
        nofile = run([exe["read_f32"], ng.url("missing.gguf"), "x"])
        e = nofile.stderr.decode()
        check(nofile.returncode == 1 and "404" in e and e.count("\n") == 1,
              "read_f32 of a missing URL, in one line: %r" % e)
        ints = run([exe["read_f32"], url, "output.weight"])
        check(ints.returncode == 1 and "not a floating tensor" in ints.stderr.decode(),
              "read_f32 of an I32 tensor: %r" % ints.stderr)
    print("ok: read_f32 over nginx", flush=True)

    # ---- convert: the same bytes as burnstore convert
    cases = [(BPK, "a.safetensors", [], "safetensors"), (PT, "b.bpk", [], "burnpack"),
             (gguf, "c.gguf", [], "gguf"), (ST, "d.pth", [], "pytorch"),
             (BPK, "set/m.safetensors", ["-w", "max_shard_size=300KB"], "safetensors-sharded"),
             (ST, "e.safetensors", ["-o", "as=BF16"], "safetensors"),
             (BPK, "f.bpk", ["-o", "exclude=^conv"], "burnpack")]
    for src, out, opts, fmt in cases:
        mine, ref = os.path.join(tmp, "ex", out), os.path.join(tmp, "cli", out)
        for d in (mine, ref):
            os.makedirs(os.path.dirname(d), exist_ok=True)
        got = run([exe["convert"]] + opts + [src, mine])
        cli = [bs, "convert", "-q"]
        for flag, val in zip(opts[::2], opts[1::2]):
            cli += ["--as", val[3:]] if val.startswith("as=") else ["-o", val]
        want = run(cli + [src, ref])
        if not check(got.returncode == 0 and want.returncode == 0,
                     "convert %s %s: %s / %s" % (opts, out, got.stderr, want.stderr)):
            continue
        n = len(run([bs, "ls", os.path.dirname(ref) if "/" in out else ref]).stdout.splitlines())
        check(got.stdout.decode() == "%s: %d tensors written as %s\n" % (mine, n, fmt),
              "convert's line: %r" % got.stdout)
        ls = (lambda p: sorted(os.listdir(os.path.dirname(p)))) if "/" in out else (
            lambda p: [os.path.basename(p)] if os.path.exists(p) else [])
        a, b = ls(mine), ls(ref)
        check(a == b, "convert %s wrote %s, burnstore convert %s" % (out, a, b))
        for f in set(a) & set(b):
            check(open(os.path.join(os.path.dirname(mine), f), "rb").read()
                  == open(os.path.join(os.path.dirname(ref), f), "rb").read(),
                  "convert %s %s: %s is burnstore convert's, byte for byte" % (opts, out, f))
        if not opts or opts[0] == "-w":
            d = run([bs, "diff", src, os.path.dirname(mine) if "/" in out else mine])
            check(d.returncode == 0, "burnstore diff %s %s: %s %s" % (src, mine, d.stdout, d.stderr))
    bad = os.path.join(tmp, "ex", "x.npz")
    got = run([exe["convert"], BPK, bad])
    check(got.returncode == 1 and "cannot write .npz" in got.stderr.decode() and not os.path.exists(bad),
          "convert to .npz refused, nothing written: %r" % got.stderr)
    print("ok: convert writes what burnstore convert writes", flush=True)


def f9(x):
    """C's %.9g of a float widened to double."""
    return "%.9g" % x


def f17(x):
    return "%.17g" % x


def sum_d(v):
    s = 0.0
    for x in v:
        s += x
    return s


if __name__ == "__main__":
    main()
