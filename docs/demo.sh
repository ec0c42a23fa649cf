#!/bin/bash
# Sets up burnstore on a fresh Debian 12 machine and mounts a demo checkpoint:
#     bash docs/demo.sh        # as root, or: sudo bash docs/demo.sh
# Installs the dependencies, builds, installs (burnstore, mount.burnstore,
# man pages), then mounts tests/fixtures/complex_nested.pt (a real PyTorch
# checkpoint from the Burn repository) read-only at /mnt/burnstore-demo.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash .ci/install-deps
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBURNSTORE_SANITIZE=OFF >/dev/null
cmake --build build -j"$(nproc)"
cmake --install build >/dev/null
mnt=/mnt/burnstore-demo
mkdir -p "$mnt"
if grep -q " $mnt fuse" /proc/self/mounts; then
  burnstore -u "$mnt" || fusermount3 -uz "$mnt"
fi
ckpt="$here/tests/fixtures/complex_nested.pt"
mount -t burnstore "$ckpt" "$mnt"
echo
echo "Mounted $ckpt at $mnt (read-only). Try:"
echo "  ls -R $mnt | head -30"
echo "  getfattr -d $mnt/fc1/weight"
echo "  /usr/bin/python3 -c \"import numpy as np; print(np.fromfile('$mnt/fc1/weight', np.float32).reshape(12, 120)[:2, :4])\""
echo "  burnstore -u $mnt        # unmount"
echo
ls "$mnt"
getfattr -d "$mnt/fc1/weight"
