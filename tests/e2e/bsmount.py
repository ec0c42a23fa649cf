"""Shared pieces of the end-to-end tests: mounting under a deadline with an
unmount that always runs, and independent readers of the formats (written
here from the specs, sharing no code with burnstore) to compare against."""
import contextlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("BURNSTORE_BIN", "burnstore")
SOURCE_DIR = os.environ.get("BS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))
FIX = os.path.join(os.environ.get("BS_FIXTURES_DIR", os.path.join(SOURCE_DIR, "tests/fixtures")), "burn")
DEADLINE = 60  # seconds for any one mount, unmount or command

FAILURES = []



# Memory ceilings asserted by the tests are for the daemon and tools as
# shipped; ThreadSanitizer's shadow memory roughly doubles a process's RSS.
SANITIZE = os.environ.get("BS_SANITIZE", "OFF")


def mem_limit_kb(kb):
    return kb * 2 if SANITIZE == "thread" else kb


def check(cond, what):
    """Record a failed expectation (the test goes on, and fails at the end)."""
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)
    return cond


def finish(name):
    if FAILURES:
        print("%s: %d expectation(s) failed" % (name, len(FAILURES)))
        sys.exit(1)
    print("%s: all expectations met" % name)



def run_tests(name, tests, tag):
    """Run each test(tmp) in one scratch directory, going on past failures
    (each is recorded), force-unmount whatever is left there, and exit
    through finish()."""
    with tmpdir(tag) as tmp:
        for t in tests:
            print("--", t.__name__, flush=True)
            try:
                t(tmp)
            except Exception as e:  # keep going: report every failure
                check(False, "%s raised %r" % (t.__name__, e))
        unmount_all_under(tmp)
    finish(name)

def strace(*args):
    """The command prefix `strace -f -qq ARGS...`. LeakSanitizer cannot run in
    a traced process (it ptraces itself, and aborts): under strace an ASan
    build's leak check is off (the other tests run it)."""
    opts = os.environ.get("ASAN_OPTIONS", "")
    return (["env", "ASAN_OPTIONS=%s%sdetect_leaks=0" % (opts, ":" if opts else ""), "strace", "-f", "-qq"]
            + list(args))


def run(cmd, timeout=DEADLINE, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def mountpoints():
    """Every mountpoint of /proc/self/mounts, unescaped (\\ooo)."""
    unesc = lambda f: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), f)
    with open("/proc/self/mounts") as f:
        return {unesc(line.split()[1]) for line in f}


def is_mounted(path, resolved=False):
    """Whether path is a mountpoint; resolved: it is the mount table's own
    name (no realpath, which would stat a mount's root: a hung daemon
    never answers)."""
    return (path if resolved else os.path.realpath(path)) in mountpoints()


def fnv1a(s):
    """FNV-1a 64 of a str's UTF-8 bytes, as hex (bs_fnv1a_str)."""
    h = 1469598103934665603
    for c in s.encode():
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def run_path(key, suffix):
    """RUN/<FNV-1a 64 of key><suffix>: a runtime file of root's (the status,
    log, progress and target files: bs_run_path), RUN $BURNSTORE_RUN_DIR or
    /run/burnstore."""
    return "%s/%s%s" % (os.environ.get("BURNSTORE_RUN_DIR") or "/run/burnstore", fnv1a(key), suffix)


def daemon_pids(mnt):
    """PIDs of the burnstore processes whose command line names mnt."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            argv = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"burnstore" and mnt.encode() in argv:
            out.append(int(p))
    return out


def daemon_pid(mnt):
    """The first burnstore process whose command line names mnt, or None."""
    pids = daemon_pids(mnt)
    return pids[0] if pids else None


def wait_gone(pid, timeout=60):
    """Until every thread of pid has exited. A zombie group leader is not
    enough: its other threads (TSan's background thread, say) may still hold
    the fd table, and with it the staging directory's lock."""
    end = time.time() + timeout
    while pid and time.time() < end:
        try:
            states = [open("/proc/%d/task/%s/stat" % (pid, t)).read().rsplit(")", 1)[1].split()[0]
                      for t in os.listdir("/proc/%d/task" % pid)]
        except OSError:
            if not os.path.exists("/proc/%d" % pid):
                return  # gone
            continue  # a thread went while we looked: look again
        if all(st in ("Z", "X") for st in states):
            return
        time.sleep(0.002)


def kill_daemon(mnt):
    """kill -9 the daemon serving mnt, wait until it is gone (its fds
    closed), and take its dead mount away."""
    pid = daemon_pid(os.path.realpath(mnt))
    check(pid is not None, "daemon of %s found" % mnt)
    if pid:
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
    force_unmount(mnt)


def unmount_all_under(d):
    """Force-unmount every mount at or below d, deepest first (a test may
    mount on a nested path)."""
    d = os.path.realpath(d)
    mps = mountpoints()
    for mp in sorted((m for m in mps if m == d or m.startswith(d + "/")), key=len, reverse=True):
        force_unmount(mp, resolved=True)


def force_unmount(mnt, resolved=False):
    for args in (["fusermount3", "-u", mnt], ["fusermount3", "-uz", mnt]):
        if not is_mounted(mnt, resolved):
            return
        try:
            subprocess.run(args, capture_output=True, timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            pass


@contextlib.contextmanager
def immutable(path):
    """path made immutable (chattr +i) for the block and mutable again after
    it, also on failure; yields False, having said why, where the file
    system has no such flag (tmpfs)."""
    r = run(["chattr", "+i", path])
    if r.returncode != 0:
        print("   (chattr +i %s: %s: skipped)" % (path, r.stderr.strip()), flush=True)
        yield False
        return
    try:
        yield True
    finally:
        run(["chattr", "-i", path])


@contextlib.contextmanager
def tmpdir(tag="e2e"):
    d = tempfile.mkdtemp(prefix="bs-%s-" % tag)
    try:
        yield d
    finally:
        unmount_all_under(d)
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def small_tmpfs(path, size):
    """A tmpfs of `size` ("64k") mounted at path (created) for the block, then
    unmounted; yields whether the mount worked (a failure is a failed check)."""
    os.makedirs(path, exist_ok=True)
    r = run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", path])
    ok = check(r.returncode == 0, "mount a small tmpfs: %s" % r.stderr)
    try:
        yield ok
    finally:
        if ok:
            run(["umount", path])
            if is_mounted(path):
                run(["umount", "-l", path])


class MountPath(str):
    """The mountpoint (a str) that can also unmount its mount."""

    def unmount(self):
        return self.mount.unmount()


class Mount:
    """burnstore SOURCE MNT [-o OPTS]; unmount with `burnstore -u` (checked)."""

    def __init__(self, source, mnt, opts=None, extra=()):
        self.source, self.mnt, self.opts, self.extra = source, mnt, opts, list(extra)
        self.unmount_result = None
        self.unmount_timeout = 600  # (burnstore -u waits for the write-back)

    def __enter__(self):
        os.makedirs(self.mnt, exist_ok=True)
        cmd = [BIN, self.source, self.mnt] + (["-o", self.opts] if self.opts else []) + self.extra
        r = run(cmd)
        if r.returncode != 0:
            force_unmount(self.mnt)
            raise RuntimeError("mount failed (%d): %s" % (r.returncode, r.stderr.strip()))
        if not is_mounted(self.mnt):
            raise RuntimeError("burnstore returned 0 but %s is not mounted" % self.mnt)
        p = MountPath(self.mnt)
        p.mount = self
        return p

    def unmount(self):
        if self.unmount_result is None and is_mounted(self.mnt):
            self.unmount_result = run([BIN, "-u", self.mnt], timeout=self.unmount_timeout)
        return self.unmount_result

    def __exit__(self, *exc):
        try:
            self.unmount()
        except subprocess.TimeoutExpired:
            FAILURES.append("burnstore -u %s timed out" % self.mnt)
        finally:
            force_unmount(self.mnt)
        return False


def vmhwm_kb(pid):
    """A process's peak resident memory (VmHWM), in kB."""
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


@contextlib.contextmanager
def foreground_mount(source, mnt, opts=None, env=None, flag="-f", stderr=subprocess.PIPE):
    """burnstore SOURCE MNT -f [-o OPTS] as a child (for its /proc entry):
    yields the Popen once mounted; always unmounts and reaps it (its
    returncode and stderr stay readable afterwards). flag="-d": libfuse's
    request log too (give it a file as stderr)."""
    os.makedirs(mnt, exist_ok=True)
    p = subprocess.Popen([BIN, source, mnt, flag] + (["-o", opts] if opts else []), stdout=subprocess.DEVNULL,
                         stderr=stderr, env=env)
    try:
        end = time.time() + DEADLINE
        while not is_mounted(mnt) and time.time() < end and p.poll() is None:
            time.sleep(0.05)
        check(is_mounted(mnt), "mounted in -f mode")
        yield p
    finally:
        force_unmount(mnt)
        try:
            p.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def xattrs(path):
    return {n: os.getxattr(path, n).decode() for n in os.listxattr(path)}


def tensor_files(root):
    """Every regular file under root: relative path -> absolute path."""
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = p
    return out


def key_to_relpath(key):
    """The path burnstore shows for a key (docs/user-guide.md, "Names and escaping")."""
    def esc(seg):
        if seg == "":
            return "%"
        if seg == ".":
            return "%2E"
        if seg == "..":
            return "%2E%2E"
        return seg.replace("%", "%25").replace("/", "%2F")
    return "/".join(esc(s) for s in key.split("."))


# ---- independent readers ---------------------------------------------------

def cbor_decode(b, i=0, depth=0):
    """A minimal CBOR decoder (definite and indefinite lengths, tags skipped)."""
    if depth > 200:
        raise ValueError("too deep")
    ib = b[i]
    major, info = ib >> 5, ib & 31
    i += 1

    def arg(info, i):
        if info < 24:
            return info, i
        n = {24: 1, 25: 2, 26: 4, 27: 8}[info]
        return int.from_bytes(b[i:i + n], "big"), i + n

    if major == 7:
        if info == 20:
            return False, i
        if info == 21:
            return True, i
        if info == 22:
            return None, i
        if info == 25:
            import numpy
            return float(numpy.frombuffer(b[i:i + 2], ">f2")[0]), i + 2
        if info == 26:
            return struct.unpack(">f", b[i:i + 4])[0], i + 4
        if info == 27:
            return struct.unpack(">d", b[i:i + 8])[0], i + 8
        raise ValueError("simple %d" % info)
    if info == 31 and major in (2, 3, 4, 5):
        items = []
        while b[i] != 0xFF:
            v, i = cbor_decode(b, i, depth + 1)
            items.append(v)
        i += 1
        if major == 2:
            return b"".join(items), i
        if major == 3:
            return "".join(items), i
        if major == 4:
            return items, i
        return dict(zip(items[::2], items[1::2])), i
    n, i = arg(info, i)
    if major == 0:
        return n, i
    if major == 1:
        return -1 - n, i
    if major == 2:
        return bytes(b[i:i + n]), i + n
    if major == 3:
        return b[i:i + n].decode(), i + n
    if major == 4:
        out = []
        for _ in range(n):
            v, i = cbor_decode(b, i, depth + 1)
            out.append(v)
        return out, i
    if major == 5:
        out = {}
        for _ in range(n):
            k, i = cbor_decode(b, i, depth + 1)
            v, i = cbor_decode(b, i, depth + 1)
            out[k] = v
        return out, i
    if major == 6:
        return cbor_decode(b, i, depth + 1)
    raise ValueError("major %d" % major)


BPK_DTYPES = {"F64": "F64", "F32": "F32", "Flex32": "FLEX32", "F16": "F16", "BF16": "BF16",
              "I64": "I64", "I32": "I32", "I16": "I16", "I8": "I8", "U64": "U64", "U32": "U32",
              "U16": "U16", "U8": "U8", "Bool": "BOOL"}


def read_bpk(path):
    """{key: (dtype, shape, bytes, param_id)}, metadata dict."""
    data = open(path, "rb").read()
    assert data[:4] == b"NRUB"
    m = struct.unpack("<I", data[6:10])[0]
    meta, _ = cbor_decode(data, 10)
    d = (10 + m + 255) // 256 * 256
    out = {}
    for k, desc in meta["tensors"].items():
        dt = desc["dtype"]
        if isinstance(dt, dict):
            (v, payload), = dt.items()
            dt = {"Native": "BOOL", "U8": "BOOL_U8", "U32": "BOOL_U32"}[payload] if v == "Bool" else "QFLOAT"
        else:
            dt = BPK_DTYPES[dt]
        s, e = desc["data_offsets"]
        out[k] = (dt, list(desc["shape"]), data[d + s:d + e], desc.get("param_id"))
    return out, meta.get("metadata", {})


def read_safetensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None) or {}
    out = {}
    for k, desc in header.items():
        s, e = desc["data_offsets"]
        out[k] = (desc["dtype"], desc["shape"], data[8 + n + s:8 + n + e], None)
    return out, meta


def write_safetensors(path, ts, pad=0):
    """A SafeTensors file of U8 tensors {key: bytes}, its header padded by pad spaces."""
    header, off, blob = {}, 0, []
    for k, raw in ts.items():
        header[k] = {"dtype": "U8", "shape": [len(raw)], "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob.append(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8 + pad)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blob))


def compare_tree(mnt, expected, meta, fmt, name):
    """Every expected tensor is a file with the right bytes and xattrs, and
    there are no other files; the root carries format and metadata."""
    files = tensor_files(mnt)
    want = {key_to_relpath(k): k for k in expected}
    check(set(files) == set(want), "%s: file set differs: extra %s missing %s" % (
        name, sorted(set(files) - set(want))[:5], sorted(set(want) - set(files))[:5]))
    for rel, key in want.items():
        if rel not in files:
            continue
        dt, shape, raw, pid = expected[key]
        p = files[rel]
        st = os.stat(p)
        check(st.st_size == len(raw), "%s: %s size %d != %d" % (name, rel, st.st_size, len(raw)))
        with open(p, "rb") as f:
            got = f.read()
        check(got == raw, "%s: %s bytes differ" % (name, rel))
        x = xattrs(p)
        check(x.get("user.burnstore.dtype") == dt, "%s: %s dtype %r != %r" % (name, rel, x.get("user.burnstore.dtype"), dt))
        check(json.loads(x.get("user.burnstore.shape", "null")) == list(shape),
              "%s: %s shape %r != %r" % (name, rel, x.get("user.burnstore.shape"), shape))
        check(x.get("user.burnstore.key") == key, "%s: %s key xattr %r" % (name, rel, x.get("user.burnstore.key")))
        if pid is not None:
            check(x.get("user.burnstore.param_id") == str(pid), "%s: %s param_id %r != %d" % (name, rel, x.get("user.burnstore.param_id"), pid))
        else:
            check("user.burnstore.param_id" not in x, "%s: %s has a param_id" % (name, rel))
        check(st.st_mode & 0o777 == 0o444, "%s: %s mode %o" % (name, rel, st.st_mode & 0o777))
    rx = xattrs(mnt)
    check(rx.get("user.burnstore.format") == fmt, "%s: root format %r" % (name, rx.get("user.burnstore.format")))
    for k, v in meta.items():
        check(rx.get("user.burnstore.meta." + k) == v, "%s: meta %s %r != %r" % (name, k, rx.get("user.burnstore.meta." + k), v))
