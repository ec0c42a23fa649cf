#!/usr/bin/python3
"""burnstore benchmark (not a test): figures as ratios against a baseline
measured in the same run.

  read:  dd bs=1M of a 512 MiB tensor through the mount, against dd of the
         same byte range of the backing file; the backing file is in the
         page cache for both. Cold = first read through the mount, warm =
         again (the mount keeps the kernel's page cache).
  write: writing 512 MiB into a new mount and `burnstore -u` (write-back,
         fsync included), against cp of the same bytes plus sync.

usage: /usr/bin/python3 tests/bench/bench.py [--size-mib N] [--bin PATH] [--dir DIR]
"""
import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import tempfile
import time


def timed(cmd, **kw):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return time.perf_counter() - t


def dd_range(path, skip, count):
    return ["dd", "if=" + path, "of=/dev/null", "bs=1M", "iflag=skip_bytes,count_bytes",
            "skip=%d" % skip, "count=%d" % count]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "../../build/burnstore"))
    ap.add_argument("--dir", default=None)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    size = a.size_mib << 20
    d = tempfile.mkdtemp(prefix="bs-bench-", dir=a.dir)
    mnt = os.path.join(d, "m")
    os.makedirs(mnt)
    try:
        src = os.path.join(d, "big.safetensors")
        header = json.dumps({"__metadata__": {"format": "pt"},
                             "big": {"dtype": "F32", "shape": [size // 4], "data_offsets": [0, size]}}).encode()
        header += b" " * (-len(header) % 8)
        with open(src, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
            chunk = os.urandom(1 << 20)
            for _ in range(a.size_mib):
                f.write(chunk)
        off = 8 + len(header)
        subprocess.run(["cat", src], stdout=subprocess.DEVNULL, check=True)  # into the page cache
        base = [timed(dd_range(src, off, size)) for _ in range(a.runs)]
        subprocess.run([a.bin, src, mnt], check=True)
        try:
            cold = timed(["dd", "if=" + os.path.join(mnt, "big"), "of=/dev/null", "bs=1M"])
            warm = [timed(["dd", "if=" + os.path.join(mnt, "big"), "of=/dev/null", "bs=1M"]) for _ in range(a.runs)]
        finally:
            subprocess.run([a.bin, "-u", mnt], check=True)
        mb = size / 1e6
        b, w = statistics.median(base), statistics.median(warm)
        print("read %d MiB (median of %d):" % (a.size_mib, a.runs))
        print("  backing file, same range : %7.3f s  %7.0f MB/s" % (b, mb / b))
        print("  mount, first read (cold) : %7.3f s  %7.0f MB/s  ratio %.2fx the baseline time" % (cold, mb / cold, cold / b))
        print("  mount, again (warm)      : %7.3f s  %7.0f MB/s  ratio %.2fx" % (w, mb / w, w / b))

        # Write-back of the same bytes.
        plain = os.path.join(d, "plain.bin")
        t_cp = []
        for _ in range(3):
            if os.path.exists(plain):
                os.unlink(plain)
            t = time.perf_counter()
            subprocess.run(["dd", "if=" + src, "of=" + plain, "bs=1M", "iflag=skip_bytes,count_bytes",
                            "skip=%d" % off, "count=%d" % size], check=True, stderr=subprocess.DEVNULL)
            subprocess.run(["sync"], check=True)
            t_cp.append(time.perf_counter() - t)
        t_w, t_u = [], []
        for i in range(3):
            out = os.path.join(d, "out%d.bpk" % i)
            subprocess.run([a.bin, out, mnt], check=True)
            t_w.append(timed(["dd", "if=" + plain, "of=" + os.path.join(mnt, "big"), "bs=1M"]))
            t_u.append(timed([a.bin, "-u", mnt]))
            os.unlink(out)
        c, ww, uu = statistics.median(t_cp), statistics.median(t_w), statistics.median(t_u)
        print("write %d MiB (median of 3):" % a.size_mib)
        print("  cp + sync (baseline)     : %7.3f s" % c)
        print("  write into the mount     : %7.3f s" % ww)
        print("  burnstore -u (write-back): %7.3f s  ratio %.2fx the baseline" % (uu, uu / c))
        print("  write + write-back       : %7.3f s  ratio %.2fx" % (ww + uu, (ww + uu) / c))
    finally:
        subprocess.run(["fusermount3", "-uz", mnt], stderr=subprocess.DEVNULL)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
