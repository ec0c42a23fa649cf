"""The Python module (python/burnstore, ctypes over libburnstore) against
torch.load and against real mounts, for every format (Burnpack, SafeTensors,
a shard set, PyTorch zip, legacy, re-zipped with deflate and with strided
views, GGUF), local and over nginx (ranges, ETags):

  - the mapping: the keys a mount shows, each array the bytes of its file,
    its dtype and shape the file's xattrs (BF16 as uint16, a ggml block type
    as uint8 rows of its bytes), ck.attrs(key) the file's user.burnstore.*
    xattrs, ck.metadata the root's meta.*; a PyTorch file's tensors equal
    torch.load's, dtype for dtype;
  - a local tensor that is one range of its file comes as a read-only
    np.memmap of it (no copy); a URL's, a strided view's, a deflated
    member's and a decoded one's as a fresh array;
  - as_="F32": the bytes of a mount with -o as=F32;
  - save(): arrays of every NumPy dtype and Tensor (BF16) to each writable
    format, read back by burnstore ls/cat (and torch.load for .pth); a
    Checkpoint saved is `burnstore convert` (burnstore diff: the same); ck.ref
    streams one tensor; refusals (metadata to .pth, an unknown extension, a
    NumPy dtype without a burnstore one) raise and write nothing;
  - errors: FileNotFoundError, OSError(EINVAL) naming the option, KeyError,
    ValueError once closed; reads from four threads at once.

The module and library come from $PYTHONPATH and $BURNSTORE_LIB (the build's,
set by ctest) or, with BS_EXPECT_INSTALLED=1 (tests/package/test_package.sh),
from the python3-burnstore and libburnstore packages, which is checked. In
an ASan build python3 runs with the ASan runtime preloaded (leak checks off:
the interpreter's own); a TSan library cannot be loaded into python3: the
test says so and passes (lib/examples runs the C examples under TSan)."""
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from bsmount import BIN, FIX, SANITIZE, SOURCE_DIR, Mount, check, key_to_relpath, run, run_tests, xattrs  # noqa: E402


def reexec_sanitized():
    """In an ASan build, run again with the runtime preloaded (the library
    needs it loaded first)."""
    if SANITIZE in ("ON", "address") and "libasan" not in os.environ.get("LD_PRELOAD", ""):
        rt = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                            text=True).stdout.strip()
        env = dict(os.environ, LD_PRELOAD=rt, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0")
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    if SANITIZE == "thread":
        print("test_python: skipped: a ThreadSanitizer libburnstore cannot be loaded into python3 "
              "(lib/examples runs the C examples under TSan)")
        sys.exit(0)


reexec_sanitized()
import numpy as np  # noqa: E402
import torch  # noqa: E402

import burnstore  # noqa: E402
import gguf_fixture as G  # noqa: E402
from httpfault import Nginx  # noqa: E402

BPK = os.path.join(FIX, "examples/mnist-inference-web/model.bpk")
ST = os.path.join(FIX, "burn-store/safetensors-tests/tests/multi_layer/multi_layer.safetensors")
PT = os.path.join(SOURCE_DIR, "tests/fixtures/complex_nested.pt")
RD = os.path.join(FIX, "burn-store/src/pytorch/tests/reader/test_data")
LEGACY = os.path.join(RD, "simple_legacy.pt")
BF16PT = os.path.join(RD, "bfloat16.pt")

NP_OF = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
         "I16": "<i2", "I8": "|i1", "U8": "|u1", "BOOL": "|b1"}


def test_module(tmp):
    """Which module and library this is."""
    lib = burnstore._lib._name
    print("   burnstore %s from %s, library %s" % (burnstore.version(), burnstore.__file__, lib))
    if os.environ.get("BS_EXPECT_INSTALLED") == "1":
        check(burnstore.__file__ == "/usr/lib/python3/dist-packages/burnstore/__init__.py",
              "the installed module: %s" % burnstore.__file__)
        check(lib == "libburnstore.so.0.2" and "BURNSTORE_LIB" not in os.environ,
              "loaded by its SONAME: %s" % lib)
        maps = open("/proc/self/maps").read()
        check("/usr/lib/" in maps and "libburnstore.so.0.2" in maps, "the installed library is mapped")
    else:
        check(os.environ.get("BURNSTORE_LIB") == lib, "the build's library: %s" % lib)
    cmake = open(os.path.join(SOURCE_DIR, "CMakeLists.txt")).read()
    version = cmake[cmake.index("project(burnstore VERSION ") + 26:].split()[0]
    check(burnstore.version() == version, "version %s = project()'s %s" % (burnstore.version(), version))


# ---- the sources ------------------------------------------------------------------------------

def make_sources(tmp):
    """{name: path}: every format, made or vendored."""
    d = os.path.join(tmp, "src")
    os.makedirs(os.path.join(d, "set"))
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=300KB", BPK, os.path.join(d, "set/model.safetensors")])
    check(r.returncode == 0, "a shard set: %s" % r.stderr)
    G.write_tiny(os.path.join(d, "tiny.gguf"))
    # torch.save of views (saved as their storages: strided for burnstore),
    # BF16, F16, integers, bool; and the same file re-zipped with deflate
    # (burnstore inflates its members to a temp file).
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    torch.save({"t": x.t(), "every_other": x[:, ::2], "row": x[1], "bf": x.to(torch.bfloat16),
                "h": x.half(), "i": torch.arange(5), "b": torch.tensor([True, False, True]),
                "u8": torch.arange(7, dtype=torch.uint8), "scalar": torch.tensor(2.5),
                "nested": {"w": torch.ones(2, 2, dtype=torch.float64)}},
               os.path.join(d, "views.pth"))
    with zipfile.ZipFile(os.path.join(d, "views.pth")) as zin, \
            zipfile.ZipFile(os.path.join(d, "deflated.pth"), "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    return {"bpk": BPK, "st": ST, "set": os.path.join(d, "set"), "pt": PT, "legacy": LEGACY,
            "views": os.path.join(d, "views.pth"), "deflated": os.path.join(d, "deflated.pth"),
            "bf16": BF16PT, "gguf": os.path.join(d, "tiny.gguf")}


def served(ng, name, path):
    """path (a file or a shard set's directory) copied under nginx's root: its URL."""
    if os.path.isdir(path):
        shutil.copytree(path, ng.path(name))
        idx = [f for f in os.listdir(path) if f.endswith(".safetensors.index.json")][0]
        return ng.url("%s/%s" % (name, idx))
    shutil.copy(path, ng.path(name + os.path.splitext(path)[1]))
    return ng.url(name + os.path.splitext(path)[1])


def flatten(obj, prefix=""):
    """torch.load's object as burnstore's keys -> tensors."""
    out = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, "%s.%s" % (prefix, k) if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten(v, "%s.%d" % (prefix, i) if prefix else str(i)))
    return out


def torch_bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


# ---- reading ---------------------------------------------------------------------------------

def compare_with_mount(name, ck, mnt, url):
    """Every tensor of ck against the mount's file of it."""
    files = {}
    for d, _dirs, fs in os.walk(mnt):
        for f in fs:
            files[os.path.relpath(os.path.join(d, f), mnt)] = os.path.join(d, f)
    want = {key_to_relpath(k): k for k in ck}
    check(set(files) == set(want), "%s: the mount's files %s = ck's keys %s" % (
        name, sorted(files)[:4], sorted(want)[:4]))
    root = xattrs(mnt)
    check(ck.format == root.get("user.burnstore.format"), "%s: format %s" % (name, ck.format))
    meta = {k[len("user.burnstore.meta."):]: v for k, v in root.items() if k.startswith("user.burnstore.meta.")}
    check(ck.metadata == meta, "%s: metadata = the root's meta.* (%d keys vs %d)" % (name, len(ck.metadata), len(meta)))
    check(ck.notes == root.get("user.burnstore.notes"), "%s: notes" % name)
    for rel, key in want.items():
        if rel not in files:
            continue
        a = ck[key]
        x = xattrs(files[rel])
        data = open(files[rel], "rb").read()
        check(a.tobytes() == data, "%s: %s: the bytes of the mount's file" % (name, key))
        got = {"user.burnstore." + k: v for k, v in ck.attrs(key).items()}
        check(got == x, "%s: %s: attrs %s = the file's xattrs %s" % (name, key, got, x))
        dt = ck.dtype(key)
        check(dt == x["user.burnstore.dtype"] and list(ck.shape(key)) == json.loads(x["user.burnstore.shape"]),
              "%s: %s: dtype, shape" % (name, key))
        if dt in NP_OF:
            check(a.dtype.str == NP_OF[dt] and a.shape == ck.shape(key),
                  "%s: %s: numpy %s %s for %s %s" % (name, key, a.dtype.str, a.shape, dt, ck.shape(key)))
        if dt in ("Q8_0", "Q4_0"):
            e, b = (32, 34) if dt == "Q8_0" else (32, 18)
            sh = ck.shape(key)
            check(a.dtype == np.uint8 and a.shape == sh[:-1] + (sh[-1] // e * b,),
                  "%s: %s: %s as uint8 rows of blocks: %s" % (name, key, dt, a.shape))
        fr = ck.file_range(key)
        if url:
            check(fr is None and not isinstance(a, np.memmap), "%s: %s: a URL's tensor is read, not mapped" % (name, key))
        elif fr is not None:
            check(isinstance(a, np.memmap) and not a.flags.writeable and a.filename == fr[0] and a.offset == fr[1],
                  "%s: %s: mapped from %s at %d" % (name, key, fr, a.offset if isinstance(a, np.memmap) else -1))
        else:
            check(not isinstance(a, np.memmap), "%s: %s: read into a fresh array" % (name, key))


def compare_with_torch(name, ck, path):
    want = flatten(torch.load(path, weights_only=False))
    check(set(want) <= set(ck), "%s: torch's tensors %s are ck's keys" % (name, sorted(set(want) - set(ck))[:4]))
    for key, t in want.items():
        if key not in ck:
            continue
        a = ck[key]
        check(a.tobytes() == torch_bytes(t), "%s: %s: torch's bytes" % (name, key))
        check(tuple(t.shape) == ck.shape(key), "%s: %s: torch's shape" % (name, key))
        if t.dtype == torch.bfloat16:
            check(ck.dtype(key) == "BF16" and a.dtype == np.uint16, "%s: %s: BF16 as uint16" % (name, key))
        else:
            check(np.array_equal(a, t.numpy()) and a.dtype == t.numpy().dtype,
                  "%s: %s: equal to torch's, as %s" % (name, key, t.numpy().dtype))


def test_read_every_format(tmp):
    src = make_sources(tmp)
    mnt = os.path.join(tmp, "mnt")
    with Nginx(tmp) as ng:
        for name, path in src.items():
            url = served(ng, name, path)
            with Mount(path, mnt):
                for where, s in (("local", path), ("url", url)):
                    try:
                        with burnstore.open(s) as ck:
                            check(len(ck) > 0, "%s %s: tensors" % (name, where))
                            compare_with_mount("%s %s" % (name, where), ck, mnt, where == "url")
                            if path.endswith((".pt", ".pth")):
                                compare_with_torch("%s %s" % (name, where), ck, path)
                    except OSError as e:
                        check(False, "%s %s: %s" % (name, where, e))
        # which tensors were mapped: the plain local ones, not the others
        with burnstore.open(src["views"]) as ck:
            check(isinstance(ck["row"], np.memmap), "views: a contiguous view is mapped")
            check(ck.file_range("t") is None and not isinstance(ck["t"], np.memmap), "views: a transposed one is read")
            check(np.array_equal(ck["t"], torch.arange(24.).reshape(4, 6).t().numpy()), "views: t's values")
        with burnstore.open(src["deflated"]) as ck:
            check(all(ck.file_range(k) is None for k in ck), "deflated: no member is one range of the file")
        # a checkpoint read from four threads at once (a URL: the cache and read-ahead shared)
        url = served(ng, "threads", BPK)
        with burnstore.open(url) as ck:
            ref = {k: ck[k].tobytes() for k in ck}
            bad = []

            def reader():
                for k in ck:
                    if ck[k].tobytes() != ref[k]:
                        bad.append(k)
            ts = [threading.Thread(target=reader) for _ in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(120)
            check(not bad and not any(t.is_alive() for t in ts), "four threads read the same bytes: %s" % bad[:3])


def test_as_f32(tmp):
    g = os.path.join(tmp, "tiny.gguf")
    G.write_tiny(g)
    mnt = os.path.join(tmp, "mnt")
    with Nginx(tmp) as ng:
        for path in (g, BF16PT):
            url = served(ng, os.path.basename(path).split(".")[0], path)
            with Mount(path, mnt, opts="as=F32"):
                for s in (path, url):
                    with burnstore.open(s, as_="F32") as ck:
                        for key in ck:
                            f = os.path.join(mnt, key_to_relpath(key))
                            a = ck[key]
                            check(a.tobytes() == open(f, "rb").read(), "as=F32 %s %s: the mount's bytes" % (s, key))
                            if ck.dtype(key) == "F32":
                                check(a.dtype == np.float32 and not isinstance(a, np.memmap) or
                                      ck.stored_dtype(key) == "F32",
                                      "as=F32 %s %s: float32, read (stored %s)" % (s, key, ck.stored_dtype(key)))
                                check(ck.attrs(key).get("stored_dtype") == xattrs(f).get("user.burnstore.stored_dtype"),
                                      "as=F32 %s %s: stored_dtype" % (s, key))
    with burnstore.open(BF16PT, options=["as=F32"]) as ck:
        check(ck["tensor"].tolist() == [1.5, -2.5, 3.5] and ck.stored_dtype("tensor") == "BF16",
              "options as a list: %r" % ck["tensor"])


# ---- writing ---------------------------------------------------------------------------------

ARRAYS = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "f64": np.linspace(-1, 1, 5),
    "f16": np.array([1.5, -2, 65504], dtype=np.float16),
    "i64": np.array([-2**63, 0, 2**63 - 1], dtype=np.int64),
    "i32": np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
    "i16": np.array([-7, 8], dtype=np.int16),
    "i8": np.array([-128, 127], dtype=np.int8),
    "u8": np.arange(10, dtype=np.uint8),
    "bool": np.array([True, False, True]),
    "scalar": np.float32(2.5),
    "big_endian": np.arange(4, dtype=">f4"),
    "fortran": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
    "a.b.c": np.zeros((2, 0), dtype=np.float32),
}
BF16 = np.array([0x3fc0, 0xc020, 0x4060], dtype=np.uint16)  # 1.5, -2.5, 3.5
NOT_IN = {".gguf": {"u8", "bool"}}


def test_save_round_trips(tmp):
    for ext in (".bpk", ".safetensors", ".gguf", ".pth", "-set/m.safetensors"):
        out = os.path.join(tmp, "out" + ext)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        tensors = {k: v for k, v in ARRAYS.items() if k not in NOT_IN.get(ext, ())}
        tensors["bf"] = burnstore.Tensor(BF16, "BF16")
        meta = None if ext == ".pth" else {"note": "made by test_python", "general.name": "x"}
        opts = "max_shard_size=64" if "set" in ext else None
        try:
            burnstore.save(out, tensors, metadata=meta, options=opts)
        except (OSError, TypeError) as e:
            check(False, "save %s: %s" % (ext, e))
            continue
        back = os.path.dirname(out) if "set" in ext else out
        with burnstore.open(back) as ck:
            check(set(ck) == set(tensors), "%s: keys %s" % (ext, sorted(set(ck) ^ set(tensors))))
            for k, v in tensors.items():
                if k not in ck:
                    continue
                want = np.asarray(v.data if isinstance(v, burnstore.Tensor) else v)
                got = ck[k]
                check(np.array_equal(got, want) and got.shape == want.shape,
                      "%s: %s round trips: %r vs %r" % (ext, k, got, want))
                cli = subprocess.run([BIN, "cat", back, k], capture_output=True, timeout=60)
                check(cli.stdout == np.ascontiguousarray(want).astype(want.dtype.newbyteorder("<")).tobytes(),
                      "%s: %s: burnstore cat gives its bytes" % (ext, k))
            check(ck.dtype("bf") == "BF16" and ck.dtype("f16") == "F16" and ck.dtype("i8") == "I8",
                  "%s: dtypes %s" % (ext, {k: ck.dtype(k) for k in ck}))
            if meta:
                m = ck.metadata
                check(all(m.get(k) == v for k, v in meta.items()), "%s: metadata %s" % (ext, m))
        if ext == ".pth":
            sd = torch.load(out)
            for k, v in tensors.items():
                want = np.asarray(v.data if isinstance(v, burnstore.Tensor) else v)
                t = sd.get(k)
                if k == "bf":
                    check(t is not None and t.dtype == torch.bfloat16 and t.tolist() == [1.5, -2.5, 3.5],
                          "torch.load: bf: %r" % t)
                else:
                    check(t is not None and np.array_equal(t.numpy(), want), "torch.load: %s: %r" % (k, t))


def test_save_a_checkpoint_is_convert(tmp):
    g = os.path.join(tmp, "tiny.gguf")
    G.write_tiny(g)
    for src, out in ((BPK, "a.safetensors"), (BPK, "b.gguf"), (BPK, "c.pth"), (PT, "d.bpk"),
                     (g, "e.gguf"), (ST, "f.bpk")):
        # (the same base name: a .pth's archive is named after it)
        mine, ref = os.path.join(tmp, "py", out), os.path.join(tmp, "cli", out)
        os.makedirs(os.path.dirname(mine), exist_ok=True)
        os.makedirs(os.path.dirname(ref), exist_ok=True)
        with burnstore.open(src) as ck:
            burnstore.save(mine, ck)
        r = run([BIN, "convert", "-q", src, ref])
        check(r.returncode == 0 and open(mine, "rb").read() == open(ref, "rb").read(),
              "save(%s, open(%s)) writes what burnstore convert writes: %s" % (out, os.path.basename(src), r.stderr))
        d = run([BIN, "diff", src, mine])
        check(d.returncode == 0, "burnstore diff %s %s: %s" % (src, out, d.stdout + d.stderr))
    r = run([BIN, "info", "--meta", "general.alignment", os.path.join(tmp, "py", "e.gguf")])
    check(r.stdout.strip() == "32", "a GGUF's typed metadata carried over: %r" % r.stdout)
    # ck.ref: one tensor streamed under another key, beside an array
    out = os.path.join(tmp, "refs.safetensors")
    with burnstore.open(BPK) as ck:
        burnstore.save(out, {"bias": ck.ref("fc3.bias"), "extra": np.ones(3, np.float32)}, metadata={"k": "v"})
        with burnstore.open(out) as back:
            check(sorted(back) == ["bias", "extra"] and back["bias"].tobytes() == ck["fc3.bias"].tobytes(),
                  "ck.ref streamed: %s" % list(back))
    # a decoded view saved: F32
    with burnstore.open(BF16PT, as_="F32") as ck:
        burnstore.save(os.path.join(tmp, "bf.safetensors"), ck)
    with burnstore.open(os.path.join(tmp, "bf.safetensors")) as ck:
        check(ck.dtype("tensor") == "F32" and ck["tensor"].tolist() == [1.5, -2.5, 3.5], "as_=F32 saved as F32")


def test_refusals(tmp):
    def raises(exc, fn, what, code=None, text=None):
        try:
            fn()
        except exc as e:
            check(code is None or getattr(e, "errno", None) == code, "%s: errno %s" % (what, getattr(e, "errno", None)))
            check(text is None or text in str(e), "%s: %r names %r" % (what, str(e), text))
            return
        except Exception as e:  # noqa: BLE001
            check(False, "%s: raised %r, not %s" % (what, e, exc.__name__))
            return
        check(False, "%s: did not raise" % what)

    raises(FileNotFoundError, lambda: burnstore.open(os.path.join(tmp, "none.bpk")), "a missing file",
           errno.ENOENT, "none.bpk")
    raises(OSError, lambda: burnstore.open(BPK, options="npy"), "a mount-only option", errno.EINVAL, "'npy'")
    raises(OSError, lambda: burnstore.open(BPK, as_="I8"), "as_=I8", errno.EINVAL, "as=")
    raises(OSError, lambda: burnstore.open(os.path.join(SOURCE_DIR, "README.md")), "README.md",
           errno.EINVAL, "unknown format")
    with burnstore.open(BPK) as ck:
        raises(KeyError, lambda: ck["nope"], "a missing key")
        check("nope" not in ck and "fc3.bias" in ck, "in")
        check(len(ck) == 18 and list(ck)[0] == "conv1.conv.bias", "len and order")
    raises(ValueError, lambda: ck["fc3.bias"], "a closed checkpoint")
    with Nginx(tmp) as ng:
        raises(OSError, lambda: burnstore.open(ng.url("missing.gguf")), "a missing URL", None, "404")
    for path, tensors, meta, exc, text in (
            (os.path.join(tmp, "m.pth"), {"a": np.zeros(2)}, {"k": "v"}, ValueError, "metadata"),
            (os.path.join(tmp, "m.npz"), {"a": np.zeros(2)}, None, OSError, "cannot write .npz"),
            (os.path.join(tmp, "m.bpk"), {"a": np.zeros(2, dtype=np.longdouble)}, None, TypeError, "float128"),
            (os.path.join(tmp, "m.bpk"), {"a": burnstore.Tensor(BF16, "BF16", (4,))}, None, OSError, "'a'"),
            (os.path.join(tmp, "m.safetensors"), {"a": np.zeros(2), "b": np.zeros(1, np.uint32)}, None, None, None)):
        if exc is None:
            burnstore.save(path, tensors)
            check(os.path.exists(path), "saved %s" % path)
            continue
        raises(exc, lambda: burnstore.save(path, tensors, metadata=meta), "save %s" % os.path.basename(path),
               None, text)
        check(not os.path.exists(path), "nothing written at %s" % path)
    # A new file's mode: the umask's (0666 less it), as open(2) gives.
    old = os.umask(0o027)
    try:
        p = os.path.join(tmp, "mode.safetensors")
        burnstore.save(p, {"a": np.zeros(2)})
        check(stat.S_IMODE(os.stat(p).st_mode) == 0o640, "mode %o" % stat.S_IMODE(os.stat(p).st_mode))
    finally:
        os.umask(old)


if __name__ == "__main__":
    run_tests("test_python", [test_module, test_read_every_format, test_as_f32, test_save_round_trips,
                              test_save_a_checkpoint_is_convert, test_refusals], "python")
