#!/usr/bin/python3
"""burnstore benchmark (not a test): every figure of issue 14 as a median of
runs and a ratio against a baseline measured in the same run.

  /usr/bin/python3 tests/bench/bench.py [--quick] [--bin build/burnstore] [--dir DIR] [--json FILE]

Sections (each prints its rows as it goes; the table is repeated at the end):
  read      a tensor of --size-mib MiB: native dd of the same byte range of
            the backing file (in the page cache), burnstore first and
            repeated reads of a SafeTensors file and of a .pth, -o direct_io,
            squashfuse_ll on an uncompressed squashfs of the extracted tensor,
            fuse-zip -r on the .pth; time to the first 4 KiB (mount + read)
  readers   8 concurrent readers of 8 tensors vs one reader of the same bytes
  sshfs     the checkpoint on sshfs (a local sshd on a high port, temp keys):
            read through burnstore vs dd of the same bytes through sshfs
  list      mount + find of 100,000 tensors, flat and LLM-shaped nesting, vs
            find on a real tree (warm); second find; both after drop_caches;
            ls -lR of 20,000 tensors vs a real tree
  memory    true peak (VmHWM of the daemon in the foreground, -f) for the
            100k listings; mount time and peak for 1,000,000 tensors
  write     dd bs=32k and bs=1M into a writable mount vs into a native file;
            rsync in + burnstore -u vs cp + sync and vs native rsync + sync
  convert   burnstore convert of a --convert-mib MiB .safetensors (64 tensors) to
            .pth, + sync, vs cp + sync of the same bytes; peak RSS of the
            convert at that size and at 1/8 of it
  decoded   -o as=F32: first reads of BF16, F16 and F4 decoded to F32 vs a raw
            F32 read of the same output size (output bytes/s); -o as=F16:
            first reads of the F32 and the BF16 tensor narrowed to F16 (output
            bytes/s, against the same raw read); convert --as F16 of the BF16
            tensor vs a plain convert of the F32 one; a Burn QFloat tensor
            (Q8S, block scales) read as F32 vs a raw F32 read of a Burnpack,
            and the daemon's peak memory for it vs for one of 1/8 its size
  remote    a --size-mib MiB tensor of a SafeTensors file on nginx (127.0.0.1):
            burnstore mount of its URL vs curl of the same byte range, direct
            (and the daemon's CPU seconds a GiB against curl's: at least 7
            runs of each in turn, quietest and medians) and through
            the fault proxy with 20 ms added a request; through the proxy
            capping each connection at 40 MB/s and adding 20 ms a request, vs
            aria2c -x16 -s16 of the file; vs
            burnstore on `rclone mount` of the same server; time to the first
            byte of a tensor of a mounted model (in round trips); requests and
            bytes to mount a 100,000-tensor file (nginx's access log); mount of
            a 4-shard index through the proxy (round trips in series: its
            mount time with 20 ms added, less without, over 20 ms)
  journal   the staging journal's cost: dd (1 MiB and 32 KiB writes) and
            rsync -aX of a many-tensor model into a mount, with the journal
            and with -o nojournal
  quants    ggml Q8_0 and Q4_K tensors of --quant-mib MiB of F32 output:
            first read through -o as=F32 and burnstore cat --as F32 (GB/s of
            F32 out) vs the raw read of an F32 tensor of the same size from
            the same file (the mount's and the CLI's ceiling)
  view      -o view=safetensors: mount time and daemon peak (VmHWM, -f) of
            100,000 tensors vs a plain mount; reading the whole view of a
            --convert-mib MiB checkpoint vs the first read of its tensors
            through a plain mount, and vs burnstore convert to a file + reading
            it; the first 4 KiB of a remote view after the mount (through the
            proxy, +20 ms a request: round trips, and nginx's logged requests)

--quick shrinks every size (CI runs it: it checks that every section works,
not its timings), takes one run of each and prints only the table at the end,
without target verdicts (it checks none). Peers that are not installed are
reported as skipped.

Nothing system-wide happens unless --system is given (as root): then the
"after drop_caches" rows drop the whole machine's page cache, and the sshfs
section starts a temporary sshd on 127.0.0.1 (its own config and keys in the
scratch directory, stopped at the end). Without --system those rows are
skipped, with a line saying so.
"""
import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support"))
from cbor_fixture import cbor_encode  # noqa: E402

ROWS = []  # (section, name, value, unit, baseline, ratio, target, ok)


def log(*a):
    print(*a, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def timed(cmd, **kw):
    t = time.perf_counter()
    run(cmd, **kw)
    return time.perf_counter() - t


def med(xs):
    return statistics.median(xs)


def have(tool):
    return shutil.which(tool) is not None


def mounted(mnt):
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == mnt for line in f)


def wait_mounted(mnt, proc=None, timeout=600):
    end = time.time() + timeout
    while not mounted(mnt):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("mount of %s failed: %s" % (mnt, proc.stderr.read() if proc.stderr else ""))
        if time.time() > end:
            raise RuntimeError("mount of %s timed out" % mnt)
        time.sleep(0.002)


def force_unmount(mnt):
    for args in (["fusermount3", "-u", mnt], ["fusermount3", "-uz", mnt]):
        if mounted(mnt):
            subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


QUIET = False  # --quick: rows only in the final table, no verdicts


def row(section, name, value, unit, baseline=None, ratio=None, target=None, ok=None):
    if QUIET:
        target = ok = None
    ROWS.append((section, name, value, unit, baseline, ratio, target, ok))
    if QUIET:
        return
    b = "" if baseline is None else "  base %8.3f" % baseline
    r = "" if ratio is None else "  ratio %6.2f" % ratio
    t = "" if target is None else "  target %s %s" % (target, "met" if ok else "MISSED")
    log("  %-46s %10.3f %-5s%s%s%s" % (name, value, unit, b, r, t))


# ---- inputs ------------------------------------------------------------

def st_header(entries):
    """entries: [(key, dtype, shape, nbytes)] in data order."""
    parts, off = [], 0
    for k, dt, shape, n in entries:
        parts.append('"%s":{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}'
                     % (k, dt, ",".join(map(str, shape)), off, off + n))
        off += n
    h = ("{" + ",".join(parts) + "}").encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h, off


def write_st_tensors(path, tensors, chunk):
    """tensors: [(key, nbytes)] of U8 data, filled with chunk repeated."""
    head, total = st_header([(k, "U8", [n], n) for k, n in tensors])
    with open(path, "wb") as f:
        f.write(head)
        left = total
        while left:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
    return len(head)


def write_bpk(path, tensors):
    """A Burnpack (shared docs burnpack-format.md): tensors = [(key, dtype
    (a name or a CBOR-able map), shape, bytes)], data in that order."""
    meta, off = {}, 0
    for k, dt, shape, b in tensors:
        meta[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
    m = cbor_encode({"tensors": meta})
    pad = -(10 + len(m)) % 256
    with open(path, "wb") as f:
        f.write(b"NRUB" + struct.pack("<HI", 1, len(m)) + m + b"\0" * pad)
        for _, _, _, b in tensors:
            f.write(b)


def write_many(path, keys):
    """A SafeTensors file of len(keys) 4-byte tensors (sparse data)."""
    head, total = st_header([(k, "F32", [1], 4) for k in keys])
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + total)


def flat_keys(n):
    return ["t%d" % i for i in range(n)]


def llm_keys(n):
    """Mixture-of-experts nesting: ~1.09 directories per tensor."""
    keys, i = [], 0
    while len(keys) < n:
        for j in range(12):
            keys.append("model.layers.%d.mlp.experts.%d.w%d.weight" % (i // 64, i % 64, j))
        i += 1
    return keys[:n]


def native_tree(root, keys):
    for k in keys:
        parts = k.split(".")
        d = os.path.join(root, *parts[:-1])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, parts[-1]), "wb") as f:
            f.write(b"\0\0\0\0")


# ---- mounts -----------------------------------------------------------------

class BS:
    """A burnstore mount (daemonized, or -f to read the daemon's VmHWM)."""

    def __init__(self, binary, src, mnt, opts=None, foreground=False):
        self.cmd = [binary] + (["-f"] if foreground else []) + [src, mnt] + (["-o", opts] if opts else [])
        self.bin, self.mnt, self.fg = binary, mnt, foreground
        self.proc = None

    def __enter__(self):
        os.makedirs(self.mnt, exist_ok=True)
        t = time.perf_counter()
        if self.fg:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            wait_mounted(self.mnt, self.proc)
        else:
            run(self.cmd)
        self.mount_time = time.perf_counter() - t
        return self

    def hwm_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmHWM"):
                    return int(line.split()[1])

    def unmount(self):
        if mounted(self.mnt):
            t = time.perf_counter()
            run([self.bin, "-u", self.mnt])
            self.unmount_time = time.perf_counter() - t
        if self.proc:
            self.proc.wait(timeout=600)

    def __exit__(self, *exc):
        try:
            self.unmount()
        finally:
            force_unmount(self.mnt)
        return False


class Peer:
    """A FUSE peer: cmd mounts on mnt (daemonizing)."""

    def __init__(self, cmd, mnt):
        self.cmd, self.mnt = cmd, mnt

    def __enter__(self):
        os.makedirs(self.mnt, exist_ok=True)
        t = time.perf_counter()
        run(self.cmd)
        wait_mounted(self.mnt, timeout=60)
        self.mount_time = time.perf_counter() - t
        return self

    def __exit__(self, *exc):
        force_unmount(self.mnt)
        return False


def dd_read(path, skip=0, count=None, bs="1M"):
    cmd = ["dd", "if=" + path, "of=/dev/null", "bs=" + bs]
    if skip or count is not None:
        cmd.append("iflag=skip_bytes,count_bytes")
        cmd += ["skip=%d" % skip] + (["count=%d" % count] if count is not None else [])
    return timed(cmd)


TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """A process's CPU time so far (utime + stime, all its threads), in s."""
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TCK


def first_4k(path):
    with open(path, "rb") as f:
        return len(f.read(4096))


# ---- sections ---------------------------------------------------------------

def sec_read(a, d):
    log("read: a %d MiB tensor (backing files in the page cache)" % a.size_mib)
    size = a.size_mib << 20
    chunk = os.urandom(1 << 20)
    st = os.path.join(d, "big.safetensors")
    off = write_st_tensors(st, [("big", size)], chunk)
    raw = os.path.join(d, "raw")
    os.makedirs(raw, exist_ok=True)
    run(["dd", "if=" + st, "of=" + os.path.join(raw, "big"), "bs=1M", "iflag=skip_bytes,count_bytes",
         "skip=%d" % off, "count=%d" % size])
    run(["cat", st])
    base = med([dd_read(st, off, size) for _ in range(a.runs)])
    row("read", "native dd of the same bytes", base, "s")
    mnt = os.path.join(d, "m")
    res = {}

    def bs_reads(label, src, opts=None, path="big"):
        firsts, agains, t4k = [], [], []
        for _ in range(a.runs):
            t = time.perf_counter()
            with BS(a.bin, src, mnt, opts):
                first_4k(os.path.join(mnt, path))
                t4k.append(time.perf_counter() - t)
            with BS(a.bin, src, mnt, opts):
                firsts.append(dd_read(os.path.join(mnt, path)))
                agains.append(med([dd_read(os.path.join(mnt, path)) for _ in range(2)]))
        res[label] = (med(firsts), med(agains), med(t4k))
        return res[label]

    f, g, t4 = bs_reads("st", st)
    row("read", "burnstore first read (SafeTensors)", f, "s", base, base / f)
    row("read", "burnstore repeated read", g, "s", base, base / g, ">= 0.55", base / g >= 0.55)
    row("read", "burnstore time to first 4 KiB (mount+read)", t4, "s")
    f, g, _ = bs_reads("dio", st, "direct_io")
    row("read", "burnstore -o direct_io first read", f, "s", base, base / f, ">= 0.3", base / f >= 0.3)
    row("read", "burnstore -o direct_io repeated read", g, "s", base, base / g)

    peers = {}
    if have("mksquashfs") and have("squashfuse_ll"):
        sq = os.path.join(d, "big.sqfs")
        run(["mksquashfs", raw, sq, "-noI", "-noD", "-noF", "-noX", "-quiet", "-no-progress"])
        run(["cat", sq])
        fs_, gs, t4s = [], [], []
        for _ in range(a.runs):
            t = time.perf_counter()
            with Peer(["squashfuse_ll", sq, mnt], mnt):
                first_4k(os.path.join(mnt, "big"))
                t4s.append(time.perf_counter() - t)
            with Peer(["squashfuse_ll", sq, mnt], mnt):
                fs_.append(dd_read(os.path.join(mnt, "big")))
                gs.append(dd_read(os.path.join(mnt, "big")))
        peers["squashfuse_ll"] = med(fs_)
        row("read", "squashfuse_ll first read (uncompressed)", med(fs_), "s", base, base / med(fs_))
        row("read", "squashfuse_ll repeated read", med(gs), "s", base, base / med(gs))
        row("read", "squashfuse_ll time to first 4 KiB", med(t4s), "s")
    else:
        log("  squashfuse_ll / mksquashfs: skipped (not installed)")
    pth = os.path.join(d, "big.pth")
    try:
        subprocess.run(["/usr/bin/python3", "-c",
                        "import torch,sys; t=torch.frombuffer(bytearray(open(sys.argv[1],'rb').read()),dtype=torch.uint8);"
                        "torch.save({'big': t}, sys.argv[2])", os.path.join(raw, "big"), pth],
                       check=True, stderr=subprocess.PIPE)
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        log("  .pth: skipped (torch: %s)" % e)
        pth = None
    if pth:
        run(["cat", pth])
        f, g, t4 = bs_reads("pth", pth)
        row("read", "burnstore first read (.pth)", f, "s", res["st"][0], res["st"][0] / f,
            "~ SafeTensors", f <= res["st"][0] * 1.25)
        row("read", "burnstore repeated read (.pth)", g, "s", base, base / g)
        if have("fuse-zip"):
            member = subprocess.run(["/usr/bin/python3", "-c",
                                     "import zipfile,sys; print([n for n in zipfile.ZipFile(sys.argv[1]).namelist() if '/data/' in n][0])",
                                     pth], check=True, capture_output=True, text=True).stdout.strip()
            fz, gz, t4z = [], [], []
            for _ in range(a.runs):
                t = time.perf_counter()
                with Peer(["fuse-zip", "-r", pth, mnt], mnt):
                    first_4k(os.path.join(mnt, member))
                    t4z.append(time.perf_counter() - t)
                with Peer(["fuse-zip", "-r", pth, mnt], mnt):
                    fz.append(dd_read(os.path.join(mnt, member)))
                    gz.append(dd_read(os.path.join(mnt, member)))
            peers["fuse-zip"] = med(fz)
            row("read", "fuse-zip -r first read (.pth member)", med(fz), "s", base, base / med(fz))
            row("read", "fuse-zip -r repeated read", med(gz), "s", base, base / med(gz))
            row("read", "fuse-zip time to first 4 KiB", med(t4z), "s")
        else:
            log("  fuse-zip: skipped (not installed)")
    if peers:
        best = min(peers.values())
        f = res["st"][0]
        row("read", "burnstore first read vs the faster peer", f, "s", best, best / f,
            ">= 1.0", f <= best * 1.05)
    return st, off, size


def sec_readers(a, d):
    log("readers: 8 tensors of %d MiB, one reader vs 8 concurrent readers (first reads)" % (a.size_mib // 8))
    n = max(1, a.size_mib // 8) << 20
    src = os.path.join(d, "eight.safetensors")
    write_st_tensors(src, [("t%d" % i, n) for i in range(8)], os.urandom(1 << 20))
    run(["cat", src])
    mnt = os.path.join(d, "m")
    one, eight = [], []
    for _ in range(a.runs):
        with BS(a.bin, src, mnt):
            t = time.perf_counter()
            for i in range(8):
                run(["dd", "if=" + os.path.join(mnt, "t%d" % i), "of=/dev/null", "bs=1M"])
            one.append(time.perf_counter() - t)
        with BS(a.bin, src, mnt):
            t = time.perf_counter()
            ps = [subprocess.Popen(["dd", "if=" + os.path.join(mnt, "t%d" % i), "of=/dev/null", "bs=1M"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(8)]
            for p in ps:
                p.wait()
            eight.append(time.perf_counter() - t)
    o, e = med(one), med(eight)
    row("readers", "one reader, 8 tensors in turn", o, "s")
    row("readers", "8 concurrent readers", e, "s", o, o / e, ">= 1.5", o / e >= 1.5)


def sec_sshfs(a, d, st, off, size):
    log("sshfs: the checkpoint on sshfs to 127.0.0.1 (local sshd)")
    if not (have("sshfs") and os.path.exists("/usr/sbin/sshd") and have("ssh-keygen")):
        log("  skipped (sshfs or openssh-server not installed)")
        return
    if not a.system or os.geteuid() != 0:
        log("  skipped (starts a local sshd: needs --system, as root)")
        return
    sd = os.path.join(d, "ssh")
    os.makedirs(sd, mode=0o700)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(sd, "host")])
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(sd, "user")])
    shutil.copy(os.path.join(sd, "user.pub"), os.path.join(sd, "authorized_keys"))
    port = 20000 + os.getpid() % 20000
    cfg = os.path.join(sd, "sshd_config")
    with open(cfg, "w") as f:
        f.write("Port %d\nListenAddress 127.0.0.1\nHostKey %s\nAuthorizedKeysFile %s\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nStrictModes no\nUsePAM no\nPidFile %s\nSubsystem sftp internal-sftp\n"
                % (port, os.path.join(sd, "host"), os.path.join(sd, "authorized_keys"), os.path.join(sd, "pid")))
    os.makedirs("/run/sshd", exist_ok=True)
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    net = os.path.join(d, "net")
    mnt = os.path.join(d, "m")
    try:
        time.sleep(0.5)
        os.makedirs(net, exist_ok=True)
        opts = ("port=%d,IdentityFile=%s,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,ro"
                % (port, os.path.join(sd, "user")))
        for i in range(50):
            r = subprocess.run(["sshfs", "127.0.0.1:" + d, net, "-o", opts], capture_output=True, text=True)
            if r.returncode == 0:
                break
            time.sleep(0.2)
        else:
            log("  skipped (sshfs failed: %s)" % r.stderr.strip())
            return
        remote = os.path.join(net, os.path.basename(st))
        cat_t, bs_t = [], []
        for _ in range(a.runs):
            # Each run: a fresh sshfs view (its own cache is per mount).
            cat_t.append(dd_read(remote, off, size))
            force_unmount(net)
            run(["sshfs", "127.0.0.1:" + d, net, "-o", opts])
            with BS(a.bin, remote, mnt):
                bs_t.append(dd_read(os.path.join(mnt, "big")))
            force_unmount(net)
            run(["sshfs", "127.0.0.1:" + d, net, "-o", opts])
        c, b = med(cat_t), med(bs_t)
        row("sshfs", "dd of the tensor's bytes through sshfs", c, "s")
        row("sshfs", "burnstore on sshfs, first read", b, "s", c, c / b)
    finally:
        force_unmount(mnt)
        force_unmount(net)
        sshd.send_signal(signal.SIGTERM)
        sshd.wait(timeout=30)


def find_time(root):
    t = time.perf_counter()
    out = subprocess.run(["find", root, "-type", "f"], check=True, capture_output=True).stdout
    return time.perf_counter() - t, out.count(b"\n")


def sec_list(a, d):
    n, nls = a.tensors, a.ls_tensors
    mnt = os.path.join(d, "m")
    can_drop = a.system and os.geteuid() == 0
    if not can_drop:
        log("  (the after-drop_caches rows need --system, as root: skipped)")
    for shape, keys in (("flat", flat_keys(n)), ("LLM-shaped", llm_keys(n))):
        log("list: %d tensors, %s" % (n, shape))
        src = os.path.join(d, "list-%s.safetensors" % shape[:3])
        write_many(src, keys)
        tree = os.path.join(d, "tree-%s" % shape[:3])
        native_tree(tree, keys)
        find_time(tree)
        warm = med([find_time(tree)[0] for _ in range(a.runs)])
        row("list", "%s: native find (warm)" % shape, warm, "s")
        firsts, seconds, hwm, mts = [], [], [], []
        for _ in range(a.runs):
            run(["cat", src])
            t = time.perf_counter()
            with BS(a.bin, src, mnt, foreground=True) as m:
                f1, cnt = find_time(mnt)
                firsts.append(time.perf_counter() - t)
                mts.append(m.mount_time)
                seconds.append(find_time(mnt)[0])
                hwm.append(m.hwm_kb())
                if cnt != len(keys):
                    raise RuntimeError("find listed %d of %d" % (cnt, len(keys)))
        lim = 8 if shape == "flat" else 10
        row("list", "%s: mount" % shape, med(mts), "s")
        row("list", "%s: mount + first find" % shape, med(firsts), "s", warm, med(firsts) / warm,
            "<= %dx" % lim, med(firsts) / warm <= lim)
        row("list", "%s: second find" % shape, med(seconds), "s", warm, med(seconds) / warm,
            "<= 1.0x", med(seconds) / warm <= 1.0)
        peak = max(hwm) * 1024
        budget = memory_budget(n)
        row("memory", "%s %d tensors: peak (VmHWM, -f)" % (shape, n), peak / 2**20, "MiB",
            budget / 2**20, peak / budget, "<= 16 MiB + 150 B/t (%.1f MiB)" % (budget / 2**20), peak <= budget)
        if can_drop:
            drop_caches()
            cold = find_time(tree)[0]
            drop_caches()
            t = time.perf_counter()
            with BS(a.bin, src, mnt):
                find_time(mnt)
                cold_bs = time.perf_counter() - t
            row("list", "%s: native find after drop_caches" % shape, cold, "s")
            row("list", "%s: mount + find after drop_caches" % shape, cold_bs, "s", cold, cold_bs / cold)
        shutil.rmtree(tree)
        os.unlink(src)

    log("list: ls -lR of %d tensors" % nls)
    keys = ["layers.%d.%s" % (i // 10, "w%d" % (i % 10)) for i in range(nls)]
    src = os.path.join(d, "ls.safetensors")
    write_many(src, keys)
    tree = os.path.join(d, "tree-ls")
    native_tree(tree, keys)

    def lslr(root):
        t = time.perf_counter()
        subprocess.run(["ls", "-lR", root], check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t
    lslr(tree)
    nat = med([lslr(tree) for _ in range(a.runs)])
    got = []
    for _ in range(a.runs):
        with BS(a.bin, src, mnt):
            got.append(lslr(mnt))
    row("list", "native ls -lR (warm)", nat, "s")
    row("list", "burnstore ls -lR (first)", med(got), "s", nat, med(got) / nat, "<= 4x", med(got) / nat <= 4)
    shutil.rmtree(tree)


def memory_budget(n):
    """Issue 34: a daemon's peak memory at n tensors, the base (~9 MiB of
    code and libraries, FUSE's buffers) and 150 bytes a tensor (its catalog
    entry, key and shape, its tree node, share of the hash table)."""
    return 16 * 2**20 + 150 * n


def sec_million(a, d):
    n = a.million
    log("memory: %d tensors (grouped by 1000)" % n)
    src = os.path.join(d, "million.safetensors")
    write_many(src, ["b%d.t%d" % (i // 1000, i % 1000) for i in range(n)])
    run(["cat", src])
    mnt = os.path.join(d, "m")
    mts, hwm = [], []
    for _ in range(max(1, min(a.runs, 3))):
        with BS(a.bin, src, mnt, foreground=True) as m:
            mts.append(m.mount_time)
            hwm.append(m.hwm_kb())
    budget = memory_budget(n)
    peak = max(hwm) * 1024
    row("memory", "%d tensors: mount time" % n, med(mts), "s", None, None, "<= 2 s", med(mts) <= 2)
    row("memory", "%d tensors: peak (VmHWM, -f)" % n, peak / 2**20, "MiB", budget / 2**20, peak / budget,
        "<= 16 MiB + 150 B/t (%.1f MiB)" % (budget / 2**20), peak <= budget)
    os.unlink(src)


def sec_write(a, d):
    size = a.size_mib << 20
    log("write: %d MiB" % a.size_mib)
    mnt = os.path.join(d, "m")
    native = os.path.join(d, "native.bin")
    for bs in ("32k", "1M"):
        count = size // (32 << 10 if bs == "32k" else 1 << 20)
        nat, got = [], []
        for i in range(a.runs):
            if os.path.exists(native):
                os.unlink(native)
            nat.append(timed(["dd", "if=/dev/zero", "of=" + native, "bs=" + bs, "count=%d" % count]))
            out = os.path.join(d, "w.safetensors")
            with BS(a.bin, out, mnt):
                got.append(timed(["dd", "if=/dev/zero", "of=" + os.path.join(mnt, "t"), "bs=" + bs,
                                  "count=%d" % count]))
            os.unlink(out)
        n_, g = med(nat), med(got)
        want = 0.35 if bs == "32k" else 0.6  # issue 34
        row("write", "dd bs=%s into a writable mount" % bs, g, "s", n_, n_ / g, ">= %g" % want, n_ / g >= want)
    # rsync in + burnstore -u vs cp + sync vs rsync + sync.
    srcdir = os.path.join(d, "wsrc")
    os.makedirs(srcdir, exist_ok=True)
    payload = os.path.join(srcdir, "t")
    with open(payload, "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(a.size_mib):
            f.write(chunk)
    run(["cat", payload])
    cp_t, rs_t, bs_t = [], [], []
    for i in range(a.runs):
        dst = os.path.join(d, "wdst")
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(dst)
        t = time.perf_counter()
        run(["cp", payload, dst])
        run(["sync"])
        cp_t.append(time.perf_counter() - t)
        shutil.rmtree(dst)
        os.makedirs(dst)
        t = time.perf_counter()
        run(["rsync", "-a", srcdir + "/", dst + "/"])
        run(["sync"])
        rs_t.append(time.perf_counter() - t)
        shutil.rmtree(dst)
        out = os.path.join(d, "r.safetensors")
        t = time.perf_counter()
        with BS(a.bin, out, mnt) as m:
            run(["rsync", "-a", srcdir + "/", mnt + "/"])
            m.unmount()
        bs_t.append(time.perf_counter() - t)
        os.unlink(out)
    c, r, b = med(cp_t), med(rs_t), med(bs_t)
    row("write", "cp + sync", c, "s")
    row("write", "native rsync + sync", r, "s")
    row("write", "mount + rsync in + burnstore -u", b, "s", r, b / r, "<= 1.3x", b / r <= 1.3)
    row("write", "  the same vs cp + sync", b, "s", c, b / c)


def timed_rss(cmd):
    """Seconds and peak RSS (KiB) of cmd."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError("%s: %s" % (cmd, p.stderr.read().decode()[-500:]))
    return time.perf_counter() - t, ru.ru_maxrss


def sec_convert(a, d):
    size = a.convert_mib << 20
    log("convert: %d MiB .safetensors -> .pth" % a.convert_mib)
    chunk = os.urandom(1 << 20)
    src = os.path.join(d, "c.safetensors")
    small = os.path.join(d, "c-small.safetensors")
    write_st_tensors(src, [("layers.%d.w" % i, size // 64) for i in range(64)], chunk)
    write_st_tensors(small, [("layers.%d.w" % i, size // 512) for i in range(64)], chunk)
    run(["cat", src])
    out = os.path.join(d, "c.pth")
    cp_t, cv_t, rss = [], [], []
    for i in range(a.runs):
        for f in (out, out + ".cp"):
            if os.path.exists(f):
                os.unlink(f)
        run(["sync"])
        t = time.perf_counter()
        run(["cp", src, out + ".cp"])
        run(["sync"])
        cp_t.append(time.perf_counter() - t)
        os.unlink(out + ".cp")
        run(["sync"])
        t = time.perf_counter()
        _, kb = timed_rss([a.bin, "convert", "-q", src, out])
        run(["sync"])
        cv_t.append(time.perf_counter() - t)
        rss.append(kb)
    _, small_kb = timed_rss([a.bin, "convert", "-q", small, os.path.join(d, "c-small.pth")])
    os.unlink(os.path.join(d, "c-small.pth"))
    c, v = med(cp_t), med(cv_t)
    row("convert", "cp + sync", c, "s")
    row("convert", "burnstore convert to .pth + sync", v, "s", c, v / c, "<= 1.2x", v / c <= 1.2)
    row("convert", "  peak RSS of the convert", med(rss) / 1024, "MiB")
    row("convert", "  the same at 1/8 of the size", small_kb / 1024, "MiB", med(rss) / 1024,
        small_kb / med(rss), "size-independent", med(rss) <= small_kb * 1.5)


def sec_quants(a, d):
    """ggml blocks decoded to F32 (issue 22): Q8_0 and Q4_K tensors of
    --quant-mib MiB of F32 output each, read through -o as=F32 (first reads,
    a fresh mount each) and with burnstore cat --as F32, against the raw
    read of an F32 tensor of the same size from the same file and mount."""
    import numpy as np
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support"))
    import gguf_fixture as G
    out_bytes = a.quant_mib << 20
    n = out_bytes // 4
    log("quants: Q8_0 and Q4_K tensors of %d MiB as F32, vs an F32 tensor of the same size" % a.quant_mib)
    rng = np.random.default_rng(22)
    q8 = rng.integers(0, 256, (n // 32, 34), dtype=np.uint8)
    q8[:, 0:2] = np.frombuffer(np.float16(0.0625).tobytes(), np.uint8)  # a normal fp16 scale
    q4k = rng.integers(0, 256, (n // 256, 144), dtype=np.uint8)
    q4k[:, 0:4] = np.frombuffer(np.array([0.01, 0.002], "<f2").tobytes(), np.uint8)
    f32 = rng.standard_normal(n, dtype=np.float32)
    src = os.path.join(d, "q.gguf")
    rows_ = n // 4096
    G.write(src, [("general.architecture", G.VSTRING, "bench")],
            [("f32", G.TYPE_ID["F32"], [rows_, 4096], f32.tobytes()),
             ("q8_0", G.TYPE_ID["Q8_0"], [rows_, 4096], q8.tobytes()),
             ("q4_k", G.TYPE_ID["Q4_K"], [rows_, 4096], q4k.tobytes())])
    del q8, q4k, f32
    run(["cat", src])
    mnt = os.path.join(d, "m")

    tck = TCK

    def first_read(name):
        """GB/s of the first read (wall clock), and per CPU-second of the
        daemon (the one-core figure: on a shared machine the wall clock also
        measures the other loads)."""
        ts, cs = [], []
        for _ in range(a.runs):
            with BS(a.bin, src, mnt, "as=F32", foreground=True) as m:
                c = cpu_s(m.proc.pid)
                ts.append(dd_read(os.path.join(mnt, name)))
                cs.append(cpu_s(m.proc.pid) - c)
        return out_bytes / med(ts) / 1e9, out_bytes / max(med(cs), 1.0 / tck) / 1e9

    raw, rawc = first_read("f32")
    row("quants", "raw first read of the F32 tensor (mount)", raw, "GB/s")
    row("quants", "  the same per daemon CPU-second", rawc, "GB/s")
    for t in ("Q8_0", "Q4_K"):
        v, vc = first_read(t.lower())
        row("quants", "%s as=F32 first read (F32 out)" % t, v, "GB/s", raw, v / raw)
        row("quants", "  the same per daemon CPU-second (one core)", vc, "GB/s", rawc, vc / rawc, ">= 1 GB/s",
            vc >= 1.0)
    # the decoder without FUSE: the CLI reads the stored blocks and writes F32
    # to /dev/null; wall clock, and per CPU-second of the process (user + sys)
    def cat(key, opts=()):
        ts, cs = [], []
        for _ in range(a.runs):
            t = time.perf_counter()
            p = subprocess.Popen([a.bin, "cat"] + list(opts) + [src, key], stdout=subprocess.DEVNULL)
            _, status, ru = os.wait4(p.pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise RuntimeError("burnstore cat %s failed" % key)
            ts.append(time.perf_counter() - t)
            cs.append(ru.ru_utime + ru.ru_stime)
        return out_bytes / med(ts) / 1e9, out_bytes / max(med(cs), 1e-3) / 1e9

    rawc, rawcc = cat("f32")
    row("quants", "burnstore cat of the F32 tensor", rawc, "GB/s")
    row("quants", "  the same per CPU-second", rawcc, "GB/s")
    for t in ("Q8_0", "Q4_K"):
        v, vc = cat(t.lower(), ("--as", "F32"))
        row("quants", "burnstore cat --as F32 %s (F32 out)" % t, v, "GB/s", rawc, v / rawc)
        row("quants", "  the same per CPU-second (one core)", vc, "GB/s", rawcc, vc / rawcc, ">= 1 GB/s", vc >= 1.0)


def sec_decoded(a, d):
    """-o as=F32: a first read of a BF16 and an F16 tensor decoded to F32 vs
    a first read of an F32 tensor of the same output size, raw, through the
    same kind of mount (a fresh mount each time: nothing in the FUSE page
    cache); output bytes per second, so the ratio is raw time / decoded time.
    Also convert --as F16 of the BF16 tensor vs convert of the F32 one."""
    size = a.size_mib << 20
    log("decoded: %d MiB of F32 output from BF16, F16 and F32 (raw) tensors" % a.size_mib)
    src = os.path.join(d, "dec.safetensors")
    n = size // 4
    head, _ = st_header([("raw", "F32", [n], size), ("bf", "BF16", [n], size // 2), ("h", "F16", [n], size // 2),
                         ("f4", "F4", [n], size // 8)])
    # finite random values: random 16-bit patterns less the NaN/inf exponents
    rnd = bytearray(os.urandom(1 << 20))
    for i in range(1, len(rnd), 2):
        rnd[i] &= 0x3f
    with open(src, "wb") as f:
        f.write(head)
        for _ in range(2 * size // len(rnd)):
            f.write(rnd)
        f.write(os.urandom(size // 8))  # F4: every byte is two values
    run(["cat", src])
    mnt = os.path.join(d, "m")
    times = {"raw": [], "bf": [], "h": [], "f4": []}
    for _ in range(a.runs):
        for k in times:
            with BS(a.bin, src, mnt, "as=F32"):
                times[k].append(dd_read(os.path.join(mnt, k)))
    raw = med(times["raw"])
    row("decoded", "first read of an F32 tensor (raw)", size / raw / 1e6, "MB/s")
    for k, name in (("bf", "BF16"), ("h", "F16")):
        t = med(times[k])
        row("decoded", "first read of %s as F32 (output bytes)" % name, size / t / 1e6, "MB/s",
            size / raw / 1e6, raw / t, ">= 0.8", raw / t >= 0.8)
    t = med(times["f4"])
    row("decoded", "first read of F4 as F32 (output bytes; 1/8 the stored bytes)", size / t / 1e6, "MB/s",
        size / raw / 1e6, raw / t)
    # -o as=F16: the F32 tensor shown narrowed to F16 (half the output bytes), and the BF16 one
    nar = {"raw": [], "bf": []}
    for _ in range(a.runs):
        for k in nar:
            with BS(a.bin, src, mnt, "as=F16"):
                nar[k].append(dd_read(os.path.join(mnt, k)))
    for k, name in (("raw", "F32"), ("bf", "BF16")):
        t = med(nar[k])
        row("decoded", "first read of %s as F16 via as=F16 (output bytes)" % name, size / 2 / t / 1e6, "MB/s",
            size / raw / 1e6, (size / 2 / t) / (size / raw))
    out = os.path.join(d, "dec-out.safetensors")
    conv = {"F32 (no --as)": [], "BF16 --as F16": []}
    for _ in range(a.runs):
        conv["F32 (no --as)"].append(timed([a.bin, "convert", "-q", "-o", "include=^raw$", src, out]))
        conv["BF16 --as F16"].append(timed([a.bin, "convert", "-q", "--as", "F16", "-o", "include=^bf$", src, out]))
    os.unlink(out)
    base = med(conv["F32 (no --as)"])
    row("decoded", "convert of the F32 tensor (no --as)", base, "s")
    t = med(conv["BF16 --as F16"])
    row("decoded", "convert --as F16 of the BF16 tensor (half the bytes)", t, "s", base, t / base)
    os.unlink(src)
    sec_decoded_qfloat(a, d)


def sec_decoded_qfloat(a, d):
    """Burn QFloat as=F32 (Q8S a byte a value, blocks of 32 along the rows,
    F32 scales): a first read through a fresh -f mount vs the raw read of an
    F32 tensor of the same output size from the same Burnpack (wall and per
    daemon CPU-second); the daemon's peak memory (VmHWM) after a decoded
    read of the QFloat tensor vs after one of a tensor 1/8 its size."""
    import numpy as np
    size = a.size_mib << 20
    n = size // 4
    log("decoded: a QFloat (Q8S, blocks of 32) tensor of %d MiB of F32 output vs an F32 tensor" % a.size_mib)
    rng = np.random.default_rng(22)
    scheme = {"QFloat": {"value": "Q8S", "store": "Native", "mode": "Symmetric", "tensor": None,
                         "block": {"size": {"storage": [32, 1, 1, 1, 1], "len": 1}, "dtype": "F32"}}}

    def qf(elems):
        v = rng.integers(-127, 128, elems, dtype=np.int8).tobytes()
        return v + (rng.random(elems // 32, dtype=np.float32) * 0.01).astype("<f4").tobytes()
    src = os.path.join(d, "qf.bpk")
    write_bpk(src, [("raw", "F32", [n // 4096, 4096], rng.standard_normal(n, dtype=np.float32).tobytes()),
                    ("qf", scheme, [n // 4096, 4096], qf(n)),
                    ("qs", scheme, [n // 8 // 4096, 4096], qf(n // 8))])
    run(["cat", src])
    mnt = os.path.join(d, "m")
    tck = TCK

    def first_read(name):
        ts, cs, hw = [], [], []
        for _ in range(a.runs):
            with BS(a.bin, src, mnt, "as=F32", foreground=True) as m:
                c = cpu_s(m.proc.pid)
                ts.append(dd_read(os.path.join(mnt, name)))
                cs.append(cpu_s(m.proc.pid) - c)
                hw.append(m.hwm_kb())
        return med(ts), max(med(cs), 1.0 / tck), max(hw)
    raw, rawc, _ = first_read("raw")
    q, qc, q_hwm = first_read("qf")
    _, _, s_hwm = first_read("qs")
    row("decoded", "QFloat: first read of an F32 tensor (raw, Burnpack)", size / raw / 1e6, "MB/s")
    row("decoded", "QFloat Q8S as F32, first read (output bytes)", size / q / 1e6, "MB/s", size / raw / 1e6, raw / q)
    row("decoded", "  the same per daemon CPU-second", size / qc / 1e6, "MB/s", size / rawc / 1e6, rawc / qc)
    row("decoded", "peak daemon memory, decoded read of %d MiB of QFloat (vs 1/8 of it)" % a.size_mib, q_hwm / 1024.0,
        "MiB", s_hwm / 1024.0, q_hwm / s_hwm, "unchanged by size (< 1.5; a buffer of the tensor: 8)", q_hwm / s_hwm < 1.5)
    os.unlink(src)


def sec_journal(a, d):
    """What the staging journal costs (issue 18): the same writes into a mount
    with it (the default) and with -o nojournal; ratio = with / without."""
    size = a.journal_mib << 20
    mnt = os.path.join(d, "m")
    log("journal: dd of %d MiB, rsync -aX of %d tensors" % (a.journal_mib, a.journal_files))
    for bs in ("1M", "32k"):
        count = size // (32 << 10 if bs == "32k" else 1 << 20)
        t = {"": [], "nojournal": []}
        for i in range(a.runs):
            for opts in ("", "nojournal"):
                out = os.path.join(d, "j.safetensors")
                with BS(a.bin, out, mnt, opts or None):
                    t[opts].append(timed(["dd", "if=/dev/zero", "of=" + os.path.join(mnt, "t"), "bs=" + bs,
                                          "count=%d" % count]))
                os.unlink(out)
        w, n = med(t[""]), med(t["nojournal"])
        row("journal", "dd bs=%s of %d MiB, journal / -o nojournal" % (bs, a.journal_mib), w, "s", n, w / n)
    # A many-tensor model: one file per tensor, dtype and shape as xattrs.
    srcdir = os.path.join(d, "jsrc")
    os.makedirs(srcdir, exist_ok=True)
    blob = os.urandom(64 << 10)
    for i in range(a.journal_files):
        p = os.path.join(srcdir, "layers.%d.w" % i)
        with open(p, "wb") as f:
            f.write(blob)
        os.setxattr(p, "user.burnstore.dtype", b"F32")
        os.setxattr(p, "user.burnstore.shape", b"[128, 128]")
    t = {"": [], "nojournal": []}
    tu = {"": [], "nojournal": []}
    for i in range(a.runs):
        for opts in ("", "nojournal"):
            out = os.path.join(d, "j.safetensors")
            t0 = time.perf_counter()
            with BS(a.bin, out, mnt, opts or None) as m:
                t[opts].append(timed(["rsync", "-aX", srcdir + "/", mnt + "/"]))
                m.unmount()
            tu[opts].append(time.perf_counter() - t0)
            os.unlink(out)
    w, n = med(t[""]), med(t["nojournal"])
    row("journal", "rsync -aX of %d tensors (64 KiB), journal / -o nojournal" % a.journal_files, w, "s", n, w / n)
    w, n = med(tu[""]), med(tu["nojournal"])
    row("journal", "  the same, mount + rsync + burnstore -u", w, "s", n, w / n)


def sec_remote(a, d):
    log("remote: a %d MiB tensor on nginx on 127.0.0.1 (files in the page cache)" % a.size_mib)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support"))
    from httpfault import FaultProxy, Nginx
    if not os.path.exists("/usr/sbin/nginx") and not have("nginx"):
        log("  skipped (nginx-light not installed)")
        return
    size = a.size_mib << 20
    lat = 0.02
    mnt = os.path.join(d, "m")
    with Nginx(d, extra="autoindex on;") as ng:  # (rclone's http backend lists directories)
        st = ng.path("big.safetensors")
        off = write_st_tensors(st, [("big", size)], os.urandom(1 << 20))
        run(["cat", st])
        url = ng.url("big.safetensors")

        ccpu = []

        def curl(u):
            """curl's wall time; its CPU time (user + sys) in ccpu."""
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = timed(["curl", "-sf", "-o", "/dev/null", "-r", "%d-%d" % (off, off + size - 1), u])
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            ccpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
            return t

        cpu = {}

        def bs_read(u, src=None):
            """The read's wall time; its daemon's CPU time in cpu[source]."""
            with BS(a.bin, src or u, mnt, foreground=True) as m:
                c0 = cpu_s(m.proc.pid)
                t = dd_read(os.path.join(mnt, "big"))
                cpu.setdefault(src or u, []).append(cpu_s(m.proc.pid) - c0)
                return t

        c = med([curl(url) for _ in range(a.runs)])
        b = med([bs_read(url) for _ in range(a.runs)])
        loc = med([bs_read(None, st) for _ in range(a.runs)])
        row("remote", "curl of the tensor's byte range", c, "s")
        row("remote", "burnstore mount of the local file (FUSE's ceiling)", loc, "s", c, c / loc)
        row("remote", "burnstore mount of the URL, first read", b, "s", c, c / b, ">= 0.9", c / b >= 0.9)
        # what the URL's bytes cost the daemon over a spliced local read of
        # the same bytes: libcurl's receive and the cache block, and a reply
        # written from memory (writev) instead of spliced from a file
        cl, cu = med(cpu[st]), med(cpu[url])
        row("remote", "daemon CPU for the read, local file (spliced)", cl, "s")
        row("remote", "daemon CPU for the read, URL", cu, "s", cl, cu / max(cl, 1.0 / TCK))
        # The same bytes' CPU seconds a GiB against curl's (its receive into
        # /dev/null: one copy), curl and the mount in turn so that both see
        # the same load, at least 7 of each. curl's CPU is the noisy side,
        # and bimodal on shared cores (0.24-0.28 s a GiB, or twice that):
        # softirq work (loopback TCP's, other traffic's) is charged to the
        # task it interrupts, and how many bytes each wake-up finds follows
        # the scheduling. Noise only adds CPU time: the target is on each
        # side's quietest run (the least disturbed); the medians and each
        # side's spread are shown too.
        del ccpu[:]
        cpu[url] = []
        reps = max(a.runs, 7)
        for _ in range(reps):
            curl(url)
            bs_read(url)
        gib = size / (1 << 30)
        cc = [x / gib for x in ccpu]
        cu = [x / gib for x in cpu[url]]
        if not QUIET:
            log("  curl CPU a GiB, %d runs: %s" % (reps, " ".join("%.3f" % x for x in cc)))
            log("  daemon CPU a GiB, %d runs: %s" % (reps, " ".join("%.3f" % x for x in cu)))
        tick = 1.0 / TCK / gib
        lo = min(cu) / max(min(cc), tick)
        row("remote", "curl CPU a GiB, quietest of %d (median %.3f, max %.3f)" % (reps, med(cc), max(cc)),
            min(cc), "s")
        row("remote", "daemon CPU a GiB, URL, quietest of %d (median %.3f, max %.3f), against curl's"
            % (reps, med(cu), max(cu)), min(cu), "s", min(cc), lo, "<= 2.5", lo <= 2.5)
        row("remote", "  the same, median against median", med(cu), "s", med(cc), med(cu) / max(med(cc), tick))
        with FaultProxy(ng.port, latency=lat) as px:
            purl = px.url("big.safetensors")
            c = med([curl(purl) for _ in range(a.runs)])
            b = med([bs_read(purl) for _ in range(a.runs)])
            row("remote", "curl through the proxy (+20 ms a request)", c, "s")
            row("remote", "burnstore through the proxy, first read", b, "s", c, c / b, ">= 0.8", c / b >= 0.8)
            # time to the first byte of a tensor of a mounted model (a round
            # trip is the added latency: loopback's own is ~0.1 ms)
            ttfb = []
            for _ in range(a.runs):
                with BS(a.bin, purl, mnt):
                    t = time.perf_counter()
                    first_4k(os.path.join(mnt, "big"))
                    ttfb.append(time.perf_counter() - t)
            t = med(ttfb)
            row("remote", "first 4 KiB of a mounted tensor (+20 ms)", t, "s", lat, t / lat,
                "<= 1.5 round trips", t / lat <= 1.5)
        # a shaped link: every connection capped at 40 MB/s and 20 ms added
        # to each request (an object store's cap per connection), against
        # aria2c -x16 -s16 (16 connections, 16 ranges) of the same file
        if have("aria2c"):
            with FaultProxy(ng.port, latency=lat, rate=40 << 20) as px:
                purl = px.url("big.safetensors")
                out = os.path.join(d, "aria")

                def aria(u):
                    shutil.rmtree(out, ignore_errors=True)
                    t = timed(["aria2c", "-x16", "-s16", "-k1M", "--file-allocation=none", "-q",
                               "--allow-overwrite=true", "-d", out, "-o", "big", u])
                    shutil.rmtree(out, ignore_errors=True)
                    return t * size / os.path.getsize(st)  # (its file holds the header too)
                a16 = med([aria(purl) for _ in range(a.runs)])
                b = med([bs_read(purl) for _ in range(a.runs)])
            row("remote", "aria2c -x16 -s16, 40 MB/s a connection, +20 ms a request", a16, "s")
            row("remote", "burnstore through the same link, first read", b, "s", a16, a16 / b, ">= 0.9",
                a16 / b >= 0.9)
        else:
            log("  aria2c: skipped (aria2 not installed)")
        if have("rclone"):
            net = os.path.join(d, "net")
            os.makedirs(net, exist_ok=True)
            ts = []
            for _ in range(a.runs):
                rc = subprocess.Popen(["rclone", "mount", ":http:", net, "--http-url", ng.url(""),
                                       "--vfs-cache-mode", "off", "--read-only"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    wait_mounted(net, rc, timeout=30)
                    ts.append(bs_read(None, os.path.join(net, "big.safetensors")))
                finally:
                    force_unmount(net)
                    rc.terminate()
                    rc.wait(timeout=30)
            r = med(ts)
            b = med([bs_read(url) for _ in range(a.runs)])
            row("remote", "burnstore on rclone mount of the server", r, "s")
            row("remote", "burnstore mount of the URL (same run)", b, "s", r, r / b, ">= 1.5", r / b >= 1.5)
        else:
            log("  rclone: skipped (rclone not installed)")
        os.unlink(st)
        # mount of a file of many tensors: requests and bytes (nginx's log)
        keys = flat_keys(a.tensors)
        many = ng.path("many.safetensors")
        write_many(many, keys)
        hlen = st_header([(k, "F32", [1], 4) for k in keys])[0].__len__()
        ng.requests()
        with BS(a.bin, ng.url("many.safetensors"), mnt):
            pass
        reqs = [r for r in ng.requests() if "many.safetensors" in r[0]]
        n, sent = len(reqs), sum(r[2] for r in reqs)
        row("remote", "requests to mount %d tensors" % a.tensors, n, "", None, None, "<= 3", n <= 3)
        row("remote", "bytes sent to mount them, over the header", sent - hlen, "B", None, None,
            "<= 64 KiB", sent - hlen <= 64 << 10)
        # a 4-shard index through the proxy: mount time in round trips
        shards = {}
        for i in range(4):
            name = "model-%05d-of-00004.safetensors" % (i + 1)
            ks = ["s%d.t%d" % (i, j) for j in range(500)]  # (the round trips, not parsing, dominate)
            write_many(ng.path(name), ks)
            shards.update({k: name for k in ks})
        with open(ng.path("model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": shards}, f)
        # (the same proxy without latency: the difference is the round trips
        # in series, whatever the daemon's own start costs)
        mt = {}
        for l in (0.0, lat):
            with FaultProxy(ng.port, latency=l) as px:
                ts = []
                for _ in range(a.runs):
                    with BS(a.bin, px.url("model.safetensors.index.json"), mnt) as m:
                        ts.append(m.mount_time)
                mt[l] = med(ts)
        rt = (mt[lat] - mt[0.0]) / lat
        row("remote", "mount of a 4-shard index, no latency", mt[0.0], "s")
        row("remote", "the same +20 ms a request: round trips in series", rt, "", None, None,
            "< 4 (shards in parallel)", rt < 4)


def read_whole(path):
    """Read a file in 1 MiB reads (in this process: no tool started per file)."""
    buf = bytearray(1 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def sec_view(a, d):
    """-o view=safetensors (issue 33): a one-file view against a plain mount
    and against what a user does without it (convert to a file, then read)."""
    n = a.tensors
    log("view: mount of %d tensors with view=safetensors vs a plain mount" % n)
    mnt = os.path.join(d, "m")
    src = os.path.join(d, "view-many.safetensors")
    write_many(src, flat_keys(n))
    run(["cat", src])
    got = {}
    for _ in range(a.runs):
        for opts in (None, "view=safetensors"):
            with BS(a.bin, src, mnt, opts=opts, foreground=True) as m:
                got.setdefault(opts, []).append((m.mount_time, m.hwm_kb()))
                if opts:  # the whole header made: its first 4 KiB read
                    first_4k(os.path.join(mnt, "view-many.safetensors"))
    pt, vt = med([x[0] for x in got[None]]), med([x[0] for x in got["view=safetensors"]])
    pm, vm = max(x[1] for x in got[None]), max(x[1] for x in got["view=safetensors"])
    row("view", "%d tensors: plain mount" % n, pt, "s")
    row("view", "%d tensors: view=safetensors mount" % n, vt, "s", pt, vt / pt, "<= 1.5x", vt / pt <= 1.5)
    row("view", "%d tensors: plain mount peak (VmHWM, -f)" % n, pm / 1024, "MiB")
    row("view", "%d tensors: view=safetensors peak (VmHWM, -f)" % n, vm / 1024, "MiB", pm / 1024, vm / pm,
        "<= 1.5x", vm / pm <= 1.5)
    os.unlink(src)

    size = a.convert_mib << 20
    log("view: reading the whole view of a %d MiB checkpoint (64 tensors; backing file in the page cache)"
        % a.convert_mib)
    src = os.path.join(d, "view-big.safetensors")
    write_st_tensors(src, [("layers.%02d.w" % i, size // 64) for i in range(64)], os.urandom(1 << 20))
    run(["cat", src])
    out = os.path.join(d, "view-out.safetensors")
    plain, view, conv = [], [], []
    for _ in range(a.runs):
        with BS(a.bin, src, mnt):
            t = time.perf_counter()
            for i in range(64):  # every tensor's first read
                read_whole(os.path.join(mnt, "layers", "%02d" % i, "w"))
            plain.append(time.perf_counter() - t)
        with BS(a.bin, src, mnt, opts="view=safetensors"):
            t = time.perf_counter()
            read_whole(os.path.join(mnt, "view-big.safetensors"))
            view.append(time.perf_counter() - t)
        if os.path.exists(out):
            os.unlink(out)
        t = time.perf_counter()
        run([a.bin, "convert", "-q", src, out])
        read_whole(out)
        conv.append(time.perf_counter() - t)
        os.unlink(out)
    p, v, c = med(plain), med(view), med(conv)
    row("view", "first read of every tensor, plain mount", p, "s")
    row("view", "whole view=safetensors read (same bytes + header)", v, "s", p, p / v, ">= 0.9x", p / v >= 0.9)
    row("view", "burnstore convert to a file + read it", c, "s")
    row("view", "  view read, times faster than convert + read", c / v, "x", None, None, ">= 3x", c / v >= 3)
    os.unlink(src)

    log("view: the first 4 KiB of a remote view after the mount")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support"))
    from httpfault import FaultProxy, Nginx
    if not os.path.exists("/usr/sbin/nginx") and not have("nginx"):
        log("  skipped (nginx-light not installed)")
        return
    lat = 0.02
    with Nginx(d) as ng:
        st = ng.path("model.safetensors")
        write_st_tensors(st, [("layers.%02d.w" % i, size // 64) for i in range(64)], os.urandom(1 << 20))
        reqs, times = [], []
        with FaultProxy(ng.port, latency=lat) as px:
            for _ in range(a.runs):
                with BS(a.bin, px.url("model.safetensors"), mnt, opts="view=safetensors"):
                    before = len(open(ng.log).readlines())
                    t = time.perf_counter()
                    first_4k(os.path.join(mnt, "model.safetensors"))
                    times.append(time.perf_counter() - t)
                    reqs.append(len(open(ng.log).readlines()) - before)
        t = med(times)
        row("view", "remote view: first 4 KiB after the mount (+20 ms)", t, "s", lat, t / lat,
            "<= 2 round trips", t / lat <= 2)
        row("view", "  requests nginx logged for it", med(reqs), "", None, None, "<= 2", med(reqs) <= 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one run: checks that it works")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../build/burnstore"))
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--size-mib", type=int, default=None)
    ap.add_argument("--convert-mib", type=int, default=None)
    ap.add_argument("--quant-mib", type=int, default=None, help="quants: MiB of F32 output per tensor")
    ap.add_argument("--only", default=None,
                    help="comma-separated sections: read,readers,sshfs,list,million,write,convert,decoded,remote,journal,quants,view")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--system", action="store_true",
                    help="allow system-wide actions (root): drop the page cache, start a local sshd")
    a = ap.parse_args()
    global QUIET
    QUIET = a.quick
    a.bin = os.path.abspath(a.bin)
    q = a.quick
    a.runs = a.runs or (1 if q else 3)
    a.size_mib = a.size_mib or (8 if q else 512)
    a.convert_mib = a.convert_mib or (8 if q else 1024)
    a.quant_mib = a.quant_mib or (8 if q else 256)
    a.tensors = 2000 if q else 100000
    a.ls_tensors = 500 if q else 20000
    a.million = 20000 if q else 1000000
    a.journal_mib = 8 if q else 256
    a.journal_files = 100 if q else 2000
    only = set(a.only.split(",")) if a.only else {"read", "readers", "sshfs", "list", "million", "write",
                                                         "convert", "decoded", "remote", "journal", "quants", "view"}
    d = tempfile.mkdtemp(prefix="bs-bench-", dir=a.dir)
    t0 = time.time()
    if a.system:
        log("--system: this run drops the page cache of the whole machine (the after-drop_caches rows)")
        log("          and starts a temporary sshd on 127.0.0.1 (stopped at the end)")
    try:
        st = off = size = None
        if "read" in only or "sshfs" in only:
            st, off, size = sec_read(a, d)
        if "readers" in only:
            sec_readers(a, d)
        if "sshfs" in only:
            sec_sshfs(a, d, st, off, size)
        if "list" in only:
            sec_list(a, d)
        if "million" in only:
            sec_million(a, d)
        if "write" in only:
            sec_write(a, d)
        if "convert" in only:
            sec_convert(a, d)
        if "decoded" in only:
            sec_decoded(a, d)
        if "remote" in only:
            sec_remote(a, d)
        if "journal" in only:
            sec_journal(a, d)
        if "quants" in only:
            sec_quants(a, d)
        if "view" in only:
            sec_view(a, d)
    finally:
        force_unmount(os.path.join(d, "m"))
        force_unmount(os.path.join(d, "net"))
        shutil.rmtree(d, ignore_errors=True)
    log("\n| section | figure | value | baseline | ratio | target |")
    log("|---|---|---|---|---|---|")
    for s, name, v, u, b, r, t, ok in ROWS:
        log("| %s | %s | %.3f %s | %s | %s | %s |" % (
            s, name.strip(), v, u, "" if b is None else "%.3f" % b, "" if r is None else "%.2f" % r,
            "" if t is None else "%s: %s" % (t, "met" if ok else "**missed**")))
    log("(%s; %d run(s) each, medians; %.0f s)" % ("quick" if q else "full", a.runs, time.time() - t0))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([dict(zip(("section", "name", "value", "unit", "baseline", "ratio", "target", "ok"), r))
                       for r in ROWS], f, indent=1)
    if q and not ROWS:
        sys.exit(1)


if __name__ == "__main__":
    main()
