#!/bin/bash
# Sets up burnstore on a fresh Debian 12 machine and mounts a demo checkpoint:
#     bash docs/demo.sh        # as root, or: sudo bash docs/demo.sh
# Installs the packages it needs to build and run (no network service), builds
# the burnstore binary only (no tests), installs it (burnstore into /usr/local/bin,
# mount.burnstore into /sbin, man pages), and mounts tests/fixtures/complex_nested.pt
# (a real PyTorch checkpoint from the Burn repository) read-only at
# /mnt/burnstore-demo, where it stays mounted until `burnstore -u /mnt/burnstore-demo`.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
log=$(mktemp /tmp/burnstore-demo-XXXXXX.log)
quiet() { # runs a step with its output in $log; shows it only if the step fails
  if ! "$@" >>"$log" 2>&1; then
    echo "demo: '$*' failed; its output:" >&2
    cat "$log" >&2
    exit 1
  fi
}
deps=$(bash .ci/install-deps --demo)
echo "1. packages: ${deps#install-deps: }${deps:-all it needs were already installed}"
quiet cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBURNSTORE_SANITIZE=OFF -DBURNSTORE_TESTS=OFF
quiet cmake --build build -j"$(nproc)" --target burnstore
quiet cmake --install build --component bin # not the library (not built)
echo "2. built and installed: $(command -v burnstore), /sbin/mount.burnstore, man burnstore"
mnt=/mnt/burnstore-demo
mkdir -p "$mnt"
if grep -q " $mnt fuse" /proc/self/mounts; then
  burnstore -u "$mnt" >/dev/null 2>&1 || fusermount3 -uz "$mnt"
fi
ckpt="$here/tests/fixtures/complex_nested.pt"
mount -t burnstore "$ckpt" "$mnt"
rm -f "$log"
echo "3. mounted $ckpt"
echo "   read-only at $mnt: $(find "$mnt" -type f | wc -l) tensors, for example:"
echo
(cd "$mnt" && find . -type f | sort | head -4 | sed 's|^\./|     |')
echo
echo "Try:"
echo "  getfattr -d $mnt/fc1/weight     # its dtype, shape and key"
echo "  burnstore ls tests/fixtures/complex_nested.pt  # the same checkpoint, no mount"
echo "  /usr/bin/python3 -c \"import numpy as np; print(np.fromfile('$mnt/fc1/weight', np.float32).reshape(12, 120)[:2, :4])\""
echo "Unmount with:"
echo "  burnstore -u $mnt"
