#!/bin/bash
# Builds the Debian packages (Debian 12):
#     bash packaging/build-deb.sh [BUILD_DIR]      # default: build-deb/ in the clone
#   burnstore_VERSION-REV_ARCH.deb          the binary, mount helper, man pages
#   libburnstore0.2_VERSION-REV_ARCH.deb    the shared library (named after its SONAME)
#   libburnstore-dev_VERSION-REV_ARCH.deb   burnstore.h, pkg-config file, guide, examples
#   python3-burnstore_VERSION-REV_all.deb   the Python module (ctypes)
# A release build without tests under the prefix /usr with Debian's hardening
# flags (dpkg-buildflags), packed by CPack's DEB generator, one package per
# install component (packaging/debian.cmake; needs dpkg-dev: bash
# .ci/install-deps has it). Prints the paths of the four .deb files, one a
# line, last. Install them with
#     sudo apt-get install ./build-deb/*.deb
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$here/build-deb}
# All of Debian's hardening (+all adds bindnow to the default relro, PIE,
# fortify and stack protector). CMake reads CFLAGS and LDFLAGS but not
# CPPFLAGS (-D_FORTIFY_SOURCE=2): that goes with the CFLAGS.
export DEB_BUILD_MAINT_OPTIONS=hardening=+all
cflags="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS)"
ldflags=$(dpkg-buildflags --get LDFLAGS)
cmake -S "$here" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBURNSTORE_SANITIZE=OFF \
  -DBURNSTORE_FUSE=ON -DBURNSTORE_TESTS=OFF -DBURNSTORE_DEBIAN=ON -DCMAKE_INSTALL_PREFIX=/usr \
  "-DCMAKE_C_FLAGS=$cflags" "-DCMAKE_EXE_LINKER_FLAGS=$ldflags" \
  "-DCMAKE_SHARED_LINKER_FLAGS=$ldflags" "-DCMAKE_STRIP=$here/packaging/strip.sh" >&2
cmake --build "$dir" -j"$(nproc)" >&2
rm -f "$dir"/*.deb
(cd "$dir" && cpack -G DEB >&2)
# CPack (3.25) gives a package with a shared library in /usr/lib a postinst
# and a postrm that run ldconfig; Debian packages activate the ldconfig
# trigger instead (lintian: maintscript-calls-ldconfig). Repacked with the
# trigger and without the two scripts, which do nothing else, and with the
# field CPack cannot write, Multi-Arch: same (the library is in the
# multiarch directory, its other files are the same bytes on every
# architecture: libburnstore0.2:amd64 and :i386 install side by side).
lib=$(ls "$dir"/libburnstore[0-9]*_*.deb)
[ "$(echo "$lib" | wc -l)" -eq 1 ] || { echo "build-deb: not one library package: $lib" >&2; exit 1; }
root=$dir/lib-repack
rm -rf "$root"
dpkg-deb -R "$lib" "$root"
for s in postinst postrm; do
  grep -vE '^(#!/bin/sh|set -e|if \[ "\$1" = "(configure|remove)" \]; then|'$'\t''ldconfig|fi|)$' \
    "$root/DEBIAN/$s" && { echo "build-deb: CPack's $s does more than ldconfig (above)" >&2; exit 1; }
  rm "$root/DEBIAN/$s"
done
install -m 644 "$here/packaging/triggers" "$root/DEBIAN/triggers"
! grep -q '^Multi-Arch:' "$root/DEBIAN/control" || { echo "build-deb: CPack wrote a Multi-Arch field" >&2; exit 1; }
sed -i '/^Architecture:/a Multi-Arch: same' "$root/DEBIAN/control"
dpkg-deb --root-owner-group -Zxz -b "$root" "$lib" >&2
rm -rf "$root"
ls "$dir"/*.deb
