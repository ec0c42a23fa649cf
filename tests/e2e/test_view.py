"""-o view=safetensors|gguf|bpk (issue 33): a read-only mount holding one
file whose bytes are exactly what `burnstore convert SOURCE OUT.EXT` writes
with the same options, computed from the writer's plan (never written).

For every source format (bpk, safetensors, a shard set, pth, gguf) and every
view format, local and through the tests' nginx: stat's size before any
read, the whole file equal to convert's byte for byte, mmap (shared,
read-only) equal to read, reads at random offsets, os.sendfile and
os.copy_file_range out of the mount, and a cp of it a valid checkpoint.
Readers shown working: the SafeTensors view by a strict reader written here
from the spec and by torch via NumPy (/usr/bin/python3), the GGUF view by
tests/support/gguf_fixture.py's reader (written from the spec; the issue's
npm readers are not in the tests), the Burnpack view by burnstore's own
reader (ls, cat). Refusals in one line, as convert's; what a view leaves
out of the source in its log and in the root's user.burnstore.omitted.
Every mount runs under a deadline and is always unmounted."""
import json
import mmap
import os
import random
import shutil
import signal
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
from bsmount import (BIN, FIX, Mount, check, foreground_mount, run, run_tests,  # noqa: E402
                     write_safetensors)
import gguf_fixture as G  # noqa: E402
from httpfault import NGINX  # noqa: E402
from test_remote import Nginx  # noqa: E402

ST = os.path.join(FIX, "burn-store/safetensors-tests/tests/multi_layer/multi_layer.safetensors")
BPK = os.path.join(FIX, "examples/mnist-inference-web/model.bpk")
PT = os.path.join(FIX, "burn-store/src/pytorch/tests/reader/test_data/checkpoint.pt")
PT_BOOL = os.path.join(FIX, "burn-store/src/pytorch/tests/reader/test_data/bool.pt")
SYS_PY = "/usr/bin/python3"  # the one with torch and numpy
VIEWS = ("safetensors", "gguf", "bpk")


def convert(src, out, opts=None, as_=None):
    cmd = [BIN, "convert", "-q"] + (["--as", as_] if as_ else []) + (["-o", opts] if opts else []) + [src, out]
    r = run(cmd)
    check(r.returncode == 0, "convert %s: %s" % (" ".join(cmd[2:]), r.stderr))
    return open(out, "rb").read() if r.returncode == 0 else None


def sources(tmp):
    """name -> local path of each source format."""
    d = os.path.join(tmp, "src")
    os.makedirs(d, exist_ok=True)
    shards = os.path.join(d, "set")
    os.makedirs(shards, exist_ok=True)
    idx = os.path.join(shards, "model.safetensors.index.json")
    r = run([BIN, "convert", "-q", "-o", "max_shard_size=8KB", ST, idx])
    check(r.returncode == 0 and len(os.listdir(shards)) >= 3, "a shard set made: %s" % r.stderr)
    gguf = os.path.join(d, "plain.gguf")  # dtypes every view holds
    G.write(gguf, [("general.architecture", G.VSTRING, "llama"), ("general.name", G.VSTRING, "plain"),
                   ("llama.block_count", G.VU32, 1)],
            [("token_embd.weight", G.TYPE_ID["F32"], [2, 3], struct.pack("<6f", *range(6))),
             ("blk.0.attn_norm.weight", G.TYPE_ID["F16"], [4], struct.pack("<4e", 1, -2, .5, 3)),
             ("output.weight", G.TYPE_ID["I32"], [2], struct.pack("<2i", -1, 7))])
    return {"bpk": BPK, "safetensors": ST, "shards": idx, "pth": PT, "gguf": gguf}


def write_i8_safetensors(path, ts):
    """A SafeTensors file of I8 tensors {key: bytes} (a dtype every view holds)."""
    header, off = {}, 0
    for k, raw in ts.items():
        header[k] = {"dtype": "I8", "shape": [len(raw)], "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(ts.values()))


def view_file(mnt):
    names = os.listdir(mnt)
    check(len(names) == 1, "%s holds one file: %r" % (mnt, names))
    return os.path.join(mnt, names[0]) if names else None


def same_bytes(path, want, what, deep):
    """Size from stat first, then the bytes by read, and with deep: mmap,
    random offsets, sendfile and copy_file_range."""
    st = os.stat(path)
    check(st.st_size == len(want), "%s: stat gives %d bytes, convert wrote %d" % (what, st.st_size, len(want)))
    with open(path, "rb") as f:
        got = f.read()
    check(got == want, "%s: the view's bytes are convert's (%d vs %d bytes)" % (what, len(got), len(want)))
    if not deep:
        return
    with open(path, "rb") as f:
        with mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as m:
            check(m[:] == want, "%s: mmap (shared, read-only) agrees with read" % what)
        rnd = random.Random(33)
        bad = 0
        for _ in range(300):
            off = rnd.randrange(0, len(want) + 16)
            n = rnd.choice((1, 7, 100, 4096, 65536, 200000))
            bad += os.pread(f.fileno(), n, off) != want[off:off + n]
        check(bad == 0, "%s: %d of 300 reads at random offsets differ" % (what, bad))
    out = path + ".copy"
    for how in ("sendfile", "copy_file_range"):
        dst = os.path.join(os.path.dirname(os.path.dirname(path)), "out-" + how)
        with open(path, "rb") as fi, open(dst, "wb") as fo:
            done = 0
            try:
                while done < len(want):
                    n = (os.sendfile(fo.fileno(), fi.fileno(), done, 1 << 20) if how == "sendfile" else
                         os.copy_file_range(fi.fileno(), fo.fileno(), 1 << 20, done, done))
                    if n <= 0:
                        break
                    done += n
            except OSError as e:
                # Linux 5.19+ copies between two file systems only of one
                # type: EXDEV is the kernel's answer (cp and the loaders then
                # read), never a short or wrong copy.
                check(how == "copy_file_range" and e.errno == 18 and done == 0,
                      "%s: %s out of the mount: %r" % (what, how, e))
                continue
        check(open(dst, "rb").read() == want, "%s: %s out of the mount" % (what, how))
        os.unlink(dst)
    del out


def matrix(tmp, remote=None):
    """Every source x every view: the view == convert's output."""
    srcs = sources(tmp)
    ng = remote
    for sname, src in srcs.items():
        if ng:  # the same files through nginx (a shard set's shards beside its index)
            if sname == "shards":
                for f in os.listdir(os.path.dirname(src)):
                    ng.put(os.path.join(os.path.dirname(src), f))
            else:
                ng.put(src)
            where = ng.url(os.path.basename(src))
        else:
            where = src
        for v in VIEWS:
            what = "%s %s as view=%s" % ("remote" if ng else "local", sname, v)
            want = convert(where, os.path.join(tmp, "conv-%s.%s" % (sname, v)))
            if want is None:
                continue
            if ng:
                local = convert(src, os.path.join(tmp, "local-%s.%s" % (sname, v)))
                check(local == want, "%s: convert of the URL writes what convert of the file does" % what)
            mnt = os.path.join(tmp, "m-%s-%s" % (sname, v))
            try:
                with Mount(where, mnt, opts="view=" + v) as m:
                    p = view_file(m)
                    base = os.path.basename(src)
                    stem = base[:-len(".safetensors.index.json")] if base.endswith(".index.json") else \
                        os.path.splitext(base)[0]
                    check(os.path.basename(p) == stem + "." + v, "%s: named %s" % (what, os.path.basename(p)))
                    same_bytes(p, want, what, deep=True)
                    check(os.listxattr(p) == [], "%s: the file has no tensor's xattrs: %r" % (what, os.listxattr(p)))
            except RuntimeError as e:
                check(False, "%s: %s" % (what, e))


def local_pairs(tmp):
    matrix(tmp)


def remote_pairs(tmp):
    if not os.path.exists(NGINX):
        print("SKIP remote pairs: no nginx")
        return
    with Nginx(tmp) as ng:
        matrix(tmp, ng)
        # The first 4 KiB of a remote view: at most 2 requests after the mount.
        big = os.path.join(tmp, "big.safetensors")
        write_i8_safetensors(big, {"t%03d" % i: os.urandom(3 << 20) for i in range(8)})
        ng.put(big)
        log = os.path.join(ng.dir, "access.log")
        for v in VIEWS:
            with Mount(ng.url("big.safetensors"), os.path.join(tmp, "mbig-" + v), opts="view=" + v) as m:
                p = view_file(m)
                before = len(open(log).readlines())
                with open(p, "rb") as f:
                    head = f.read(4096)
                after = len(open(log).readlines())
                want = convert(big, os.path.join(tmp, "big." + v))
                check(head == want[:4096], "remote view=%s: its first 4 KiB" % v)
                check(after - before <= 2, "remote view=%s: the first 4 KiB in %d requests (<= 2)" % (v, after - before))
                print("remote view=%s: first 4 KiB after %d requests" % (v, after - before))


def options(tmp):
    """Key options, adapter= and as= apply as convert's -o and --as."""
    srcs = sources(tmp)
    q = os.path.join(tmp, "quant.gguf")
    G.write_tiny(q)  # Q8_0 and Q4_0 tensors: only a decoded view holds them as SafeTensors
    cases = [
        (ST, "include=^conv1\\.,remap=^conv1\\.(.*)$=>first.$1", None, "safetensors"),
        (ST, "exclude=num_batches", None, "gguf"),
        (PT, "top_level_key=model_state_dict", None, "bpk"),
        (os.path.join(FIX, "burn-store/pytorch-tests/tests/layer_norm/layer_norm.pt"), "adapter=pytorch", None, "bpk"),
        (q, None, "F16", "safetensors"),  # a GGUF as an F16 .safetensors
        (q, None, "F32", "bpk"),
        (srcs["gguf"], None, "BF16", "gguf"),
    ]
    for i, (src, opts, as_, v) in enumerate(cases):
        what = "view=%s of %s with %s%s" % (v, os.path.basename(src), opts or "", " as=" + as_ if as_ else "")
        want = convert(src, os.path.join(tmp, "opt%d.%s" % (i, v)), opts=opts, as_=as_)
        mopts = ",".join(x for x in ("view=" + v, opts, "as=" + as_ if as_ else None) if x)
        if want is None:
            continue
        try:
            with Mount(src, os.path.join(tmp, "mo%d" % i), opts=mopts) as m:
                same_bytes(view_file(m), want, what, deep=False)
        except RuntimeError as e:
            check(False, "%s: %s" % (what, e))


def strict_safetensors(data):
    """The SafeTensors spec's rules, checked: header length, JSON object of
    {dtype, shape, data_offsets} whose ranges tile the data exactly, with
    the sizes their dtypes and shapes make. {name: (dtype, shape, bytes)}."""
    sizes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
    n = struct.unpack("<Q", data[:8])[0]
    assert n % 8 == 0 and 8 + n <= len(data), "header length"
    hdr = json.loads(data[8:8 + n].decode("utf-8"))
    assert isinstance(hdr.get("__metadata__", {}), dict)
    out, spans = {}, []
    for k, d in hdr.items():
        if k == "__metadata__":
            assert all(isinstance(x, str) for x in d.values())
            continue
        assert set(d) == {"dtype", "shape", "data_offsets"}, k
        s, e = d["data_offsets"]
        numel = 1
        for x in d["shape"]:
            numel *= x
        assert e - s == numel * sizes[d["dtype"]], k
        spans.append((s, e))
        out[k] = (d["dtype"], d["shape"], data[8 + n + s:8 + n + e])
    spans.sort()
    pos = 0
    for s, e in spans:
        assert s == pos, "a gap or an overlap at %d" % s
        pos = e
    assert 8 + n + pos == len(data), "the file ends where the data does"
    return out


def cat_bytes(src, key):
    r = subprocess.run([BIN, "cat", src, key], capture_output=True, timeout=60)
    return r.stdout if r.returncode == 0 else None


def readers(tmp):
    """Each view read by a reader of its format; a cp of it is a checkpoint."""
    srcs = sources(tmp)
    # SafeTensors: the strict reader, and torch through NumPy.
    with Mount(BPK, os.path.join(tmp, "r1"), opts="view=safetensors") as m:
        p = view_file(m)
        got = strict_safetensors(open(p, "rb").read())
        keys = [line.split("\t")[0] for line in run([BIN, "ls", BPK]).stdout.splitlines()]
        check(sorted(got) == sorted(keys), "the strict reader finds every tensor")
        check(all(got[k][2] == cat_bytes(BPK, k) for k in keys[:5]), "the strict reader reads their bytes")
        if os.path.exists(SYS_PY):
            code = ("import json, struct, sys, numpy as np, torch\n"
                    "d = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', d[:8])[0]\n"
                    "h = json.loads(d[8:8 + n]); h.pop('__metadata__', None); s = 0\n"
                    "for k, v in h.items():\n"
                    "    a, b = v['data_offsets']\n"
                    "    t = torch.from_numpy(np.frombuffer(d[8 + n + a:8 + n + b], dtype={'F32': np.float32, 'I64': np.int64}[v['dtype']]).reshape(v['shape']).copy())\n"
                    "    s += t.numel()\n"
                    "print(len(h), s)\n")
            r = run([SYS_PY, "-c", code, p])
            check(r.returncode == 0 and int(r.stdout.split()[0]) == len(keys),
                  "torch via numpy loads the view's tensors: %s %s" % (r.stdout, r.stderr[-300:]))
        # cp of the view: a valid checkpoint burnstore reads back
        cp = os.path.join(tmp, "copied.safetensors")
        subprocess.run(["cp", p, cp], check=True, timeout=60)
        r = run([BIN, "ls", cp])
        check(r.returncode == 0 and len(r.stdout.splitlines()) == len(keys), "cp of the view is a checkpoint")
    # GGUF: the spec's reader of tests/support/gguf_fixture.py.
    with Mount(srcs["safetensors"], os.path.join(tmp, "r2"), opts="view=gguf") as m:
        g = G.Reader(view_file(m))
        keys = [line.split("\t")[0] for line in run([BIN, "ls", ST]).stdout.splitlines()]
        check(sorted(g.tensors) == sorted(keys), "the GGUF reader finds every tensor")
        check(all(g.tensors[k]["data"] == cat_bytes(ST, k) for k in keys), "the GGUF reader reads their bytes")
    # Burnpack: burnstore's own reader, and a mount of the view's file.
    with Mount(srcs["gguf"], os.path.join(tmp, "r3"), opts="view=bpk") as m:
        p = view_file(m)
        src_keys = [line.split("\t")[0] for line in run([BIN, "ls", srcs["gguf"]]).stdout.splitlines()]
        r = run([BIN, "ls", p])
        check(r.returncode == 0 and sorted(line.split("\t")[0] for line in r.stdout.splitlines()) == sorted(src_keys),
              "burnstore ls reads the Burnpack view: %s" % r.stderr)
        check(all(cat_bytes(p, k) == cat_bytes(srcs["gguf"], k) for k in src_keys), "burnstore cat of the view")
        with Mount(p, os.path.join(tmp, "r3in")) as inner:
            check(sorted(os.listdir(inner)) == sorted({k.split(".")[0] for k in src_keys}),
                  "the Burnpack view mounted: %r" % os.listdir(inner))


def refusals(tmp):
    """What the format cannot hold: refused at mount in convert's words;
    view= with rw or output=, or a format without a plan: one line."""
    q = os.path.join(tmp, "quant.gguf")
    G.write_tiny(q)
    longname = os.path.join(tmp, "long.safetensors")
    write_safetensors(longname, {"x" * 64: b"abcd"})
    for src, v in ((PT_BOOL, "gguf"), (q, "safetensors"), (q, "bpk"), (longname, "gguf")):
        mnt = os.path.join(tmp, "rf")
        os.makedirs(mnt, exist_ok=True)
        r = run([BIN, src, mnt, "-o", "view=" + v])
        c = run([BIN, "convert", "-q", src, os.path.join(tmp, "refused." + v)])
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1, "view=%s of %s refused in one line: %r" % (v, src, r.stderr))
        check(c.returncode != 0 and r.stderr == c.stderr,
              "the refusal is convert's: %r vs %r" % (r.stderr, c.stderr))
        check(not os.path.ismount(mnt), "nothing mounted")
    for opts, want in (("view=gguf,rw", "read-only view"), ("view=gguf,output=%s/o.gguf" % tmp, "read-only view"),
                       ("view=pth", "view= takes safetensors, gguf or bpk"), ("view=bpk,npy", "npy")):
        r = run([BIN, ST, os.path.join(tmp, "rf"), "-o", opts])
        check(r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and want in r.stderr,
              "-o %s refused in one line: %r" % (opts, r.stderr))
        check(not os.path.ismount(os.path.join(tmp, "rf")), "nothing mounted")
    # A source that does not exist: said so, not refused as if rw or output= had been asked
    # (a missing SOURCE is a new checkpoint only for a writable mount).
    missing = os.path.join(tmp, "missing.gguf")
    for opts in ("view=gguf", "view=safetensors,as=F16", "npy"):
        r = run([BIN, missing, os.path.join(tmp, "rf"), "-o", opts])
        check(r.returncode == 1 and r.stderr.count("\n") == 1 and "%s: no such file" % missing in r.stderr and
              "rw" not in r.stderr, "-o %s of a missing source: %r" % (opts, r.stderr))
        check(not os.path.ismount(os.path.join(tmp, "rf")) and not os.path.exists(missing), "nothing mounted or made")


def left_out(tmp):
    """A .pth's non-tensor values (epoch, loss) are not in any view: said in
    the mount's log and in the root's user.burnstore.omitted, as convert's
    note says it."""
    for v in VIEWS:
        mnt = os.path.join(tmp, "lo-" + v)
        c = run([BIN, "convert", PT, os.path.join(tmp, "lo." + v)])
        note = [line for line in c.stderr.splitlines() if "non-tensor" in line]
        check(len(note) == 1, "convert notes the values: %r" % c.stderr)
        with foreground_mount(PT, mnt, "view=" + v) as p:
            x = os.getxattr(mnt, "user.burnstore.omitted").decode()
            check("user.burnstore.omitted" in os.listxattr(mnt), "listed on the root")
            check(note and note[0].split(": ", 3)[3] + "\n" == x, "the xattr says what convert says: %r" % x)
            check("epoch" in x and "loss" in x, "the values named: %r" % x)
        err = p.stderr.read().decode()
        check("view: 2 non-tensor values" in err, "the mount's log names them: %r" % err)
    with Mount(PT, os.path.join(tmp, "lo-status"), opts="view=bpk") as m:
        r = run([BIN, "status", m])
        check("view: 2 non-tensor values" in r.stdout, "burnstore status shows the log's line: %r" % r.stdout)
    # Burnpack's parameter ids: kept by a Burnpack view, dropped (and said) by the others.
    for v in VIEWS:
        c = run([BIN, "convert", BPK, os.path.join(tmp, "ids." + v)])
        with Mount(BPK, os.path.join(tmp, "ids-" + v), opts="view=" + v) as m:
            try:
                x = os.getxattr(m, "user.burnstore.omitted").decode()
            except OSError:
                x = ""
        if v == "bpk":
            check(x == "" and c.stderr == "", "a Burnpack view keeps the param ids: %r %r" % (x, c.stderr))
        else:
            check("18 tensors' parameter ids" in x and x.strip() in c.stderr,
                  "view=%s: the dropped param ids said as convert says them: %r vs %r" % (v, x, c.stderr))
    with Mount(ST, os.path.join(tmp, "lo-none"), opts="view=gguf") as m:
        try:
            os.getxattr(m, "user.burnstore.omitted")
            check(False, "nothing left out: no omitted xattr")
        except OSError:
            pass


def changed_source(tmp):
    """A source rewritten in place under a view (same size, other bytes):
    every read of its bytes is EIO with one log line naming it, whether the
    range is a GGUF view's long metadata value (a segment of the source
    itself) or straddles tensors (gathered); never the new bytes."""
    for v in ("gguf", "safetensors"):
        src = os.path.join(tmp, "chg-%s.gguf" % v)
        G.write(src, [("general.architecture", G.VSTRING, "llama"), ("tokenizer.chat_template", G.VSTRING, "Q" * 10000)],
                [("a.weight", G.TYPE_ID["F32"], [4], struct.pack("<4f", 1, 2, 3, 4)),
                 ("b.weight", G.TYPE_ID["F32"], [4], struct.pack("<4f", 5, 6, 7, 8))])
        mnt = os.path.join(tmp, "chg-" + v)
        with foreground_mount(src, mnt, "view=" + v) as p:
            path = view_file(mnt)
            before = open(path, "rb").read()
            data = open(src, "rb").read()
            with open(src, "r+b") as f:  # the value's bytes and the tensors', same size
                f.write(data.replace(b"Q" * 10000, b"W" * 10000).replace(struct.pack("<4f", 1, 2, 3, 4),
                                                                         struct.pack("<4f", 9, 9, 9, 9)))
                os.utime(f.fileno(), (1, 1))  # (an mtime surely other than the mount's)
            # the header alone (a GGUF view: built bytes and the source's value), then the whole
            ranges = ((0, 8192), (0, len(before))) if v == "gguf" else ((0, len(before)),)
            for off, n in ranges:
                with open(path, "rb") as f:
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # (not from the page cache)
                    got, eio = b"", False
                    while len(got) < n and not eio:  # (a short read, then EIO past it)
                        try:
                            b = os.pread(f.fileno(), n - len(got), off + len(got))
                        except OSError as e:
                            check(e.errno == 5, "view=%s: EIO after the change: %r" % (v, e))
                            eio = True
                            continue
                        if not b:
                            break
                        got += b
                check(got == before[off:off + len(got)], "view=%s [%d, +%d) after the change: the old bytes, never "
                      "the new ones (%d bytes, %d W)" % (v, off, n, len(got), got.count(b"W")))
                check(eio, "view=%s [%d, +%d): EIO after the change (%d bytes read)" % (v, off, n, len(got)))
        lines = [line for line in p.stderr.read().decode().splitlines() if "changed since it was mounted" in line]
        check(len(lines) == 1 and src in lines[0], "view=%s: one log line names the changed source: %r" % (v, lines))


def names(tmp):
    """The view's name: the source's name less its format's extension, or a
    checkpoint extension no writer has (.ckpt); a name's own dots are kept
    (Qwen2.5-0.5B was cut to Qwen2.5-0.safetensors)."""
    d = os.path.join(tmp, "names")
    os.makedirs(d)
    for src, fixture, view, want in (("Qwen2.5-0.5B", ST, "safetensors", "Qwen2.5-0.5B.safetensors"),
                                     ("run.ckpt", PT, "safetensors", "run.safetensors"),
                                     ("weights.v2.safetensors", ST, "gguf", "weights.v2.gguf"),
                                     ("pytorch_model.bin", PT, "bpk", "pytorch_model.bpk")):
        path = os.path.join(d, src)
        shutil.copy(fixture, path)
        mnt = os.path.join(tmp, "mn-" + src)
        try:
            with Mount(path, mnt, opts="view=" + view) as m:
                got = os.listdir(m)
                check(got == [want], "%s with view=%s: named %r, not %r" % (src, view, got, want))
        except RuntimeError as e:
            check(False, "%s: %s" % (src, e))


def main():
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("deadline")))
    signal.alarm(800)
    run_tests("test_view", [local_pairs, remote_pairs, options, readers, refusals, left_out, changed_source, names],
              "view")


if __name__ == "__main__":
    main()
