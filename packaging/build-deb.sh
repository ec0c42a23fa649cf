#!/bin/bash
# Builds the Debian package burnstore_VERSION_ARCH.deb (Debian 12):
#     bash packaging/build-deb.sh [BUILD_DIR]      # default: build-deb/ in the clone
# A release build without tests under the prefix /usr, packed by CPack's DEB
# generator (needs dpkg-dev for dpkg-shlibdeps; bash .ci/install-deps has it).
# Prints the path of the .deb on its last line. Install it with
#     sudo apt-get install ./build-deb/burnstore_*.deb
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$here/build-deb}
cmake -S "$here" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBURNSTORE_SANITIZE=OFF \
  -DBURNSTORE_FUSE=ON -DBURNSTORE_TESTS=OFF -DCMAKE_INSTALL_PREFIX=/usr >&2
cmake --build "$dir" -j"$(nproc)" >&2
rm -f "$dir"/burnstore_*.deb
(cd "$dir" && cpack -G DEB >&2)
deb=$(ls "$dir"/burnstore_*.deb)
echo "$deb"
