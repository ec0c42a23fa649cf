#!/bin/bash
# The Debian package, end to end, as root on Debian 12 (tests/run.sh runs it as
# its last stage, after undoing its release install; runnable alone):
#     bash tests/package/test_package.sh [BUILD_DIR]    # default: build-deb/
# Builds burnstore_VERSION_ARCH.deb (packaging/build-deb.sh), checks its name
# and declared dependencies, installs it with apt-get, then checks the binary's
# version, the man pages, the library through pkg-config (check_library.sh:
# exports, headers, the docs' example) and a mount through the installed
# mount.burnstore (mount -t burnstore, under a deadline, always unmounted).
# Then apt-get remove must leave none of the package's files behind, and purge
# forgets it. The package is purged at exit also on failure.
# Refuses to run when a burnstore package or an unpackaged /sbin/mount.burnstore
# (a `cmake --install`) is there: installing would overwrite it and removing
# would delete it.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$here/build-deb}
BPK=$here/tests/fixtures/burn/examples/mnist-inference-web/model.bpk
DEADLINE=60
export DEBIAN_FRONTEND=noninteractive

fail() {
  echo "test_package: FAIL: $*" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || fail "must run as root (installs a package)"
[ -e /dev/fuse ] || fail "/dev/fuse is missing (the test mounts)"
if dpkg-query -W -f='${Status}' burnstore 2>/dev/null | grep -v "not-installed" >/dev/null; then
  fail "dpkg knows a burnstore package already (apt-get purge burnstore first)"
fi
if [ -e /sbin/mount.burnstore ]; then
  fail "/sbin/mount.burnstore exists outside any package (a cmake --install?); remove it first"
fi

tmp=$(mktemp -d /tmp/bs-package-XXXXXX)
mnt=$tmp/mnt
mkdir "$mnt"
installed=0
cleanup() {
  local rc=$?
  if grep -qF " $mnt " /proc/mounts; then
    timeout $DEADLINE fusermount3 -u "$mnt" 2>/dev/null || timeout $DEADLINE fusermount3 -uz "$mnt" || true
  fi
  if [ $installed -eq 1 ]; then
    timeout 300 apt-get purge -y -q burnstore >/dev/null 2>&1 || echo "test_package: apt-get purge burnstore failed" >&2
  fi
  rm -rf "$tmp"
  [ $rc -eq 0 ] && echo "test_package: all checks passed" || echo "test_package: FAILED" >&2
}
trap cleanup EXIT

# ---- build --------------------------------------------------------------
version=$(sed -n 's/^project(burnstore VERSION \([0-9.]*\).*/\1/p' "$here/CMakeLists.txt")
[ -n "$version" ] || fail "no version in CMakeLists.txt's project()"
deb=$(bash "$here/packaging/build-deb.sh" "$dir" | tail -1)
arch=$(dpkg --print-architecture)
[ "$(basename "$deb")" = "burnstore_${version}_${arch}.deb" ] ||
  fail "package file $deb, expected burnstore_${version}_${arch}.deb"
[ "$(dpkg-deb -f "$deb" Version)" = "$version" ] || fail "package version is not $version"
depends=$(dpkg-deb -f "$deb" Depends)
for d in fuse3 libfuse3-3 libcbor0.8 libpcre2-8-0 libjansson4 zlib1g; do
  grep -qE "(^|, )$d( |,|$)" <<<"$depends" || fail "Depends does not declare $d: $depends"
done
echo "ok: $(basename "$deb"), Depends: $depends"

# The directories the package has that exist before it is installed: the
# only ones allowed to be there after it is removed.
declare -A before
while read -r p; do
  p=${p#.}
  [ -n "$p" ] && [ -d "$p" ] && before[$p]=1
done < <(dpkg-deb --fsys-tarfile "$deb" | tar -t | sed 's:/$::')

# ---- install --------------------------------------------------------------
installed=1
timeout 300 apt-get install -y -q --no-install-recommends "$deb" >"$tmp/apt.log" 2>&1 ||
  { cat "$tmp/apt.log"; fail "apt-get install $deb"; }
dpkg -L burnstore >"$tmp/files"
echo "ok: installed ($(wc -l <"$tmp/files") paths)"

[ "$(command -v burnstore)" = /usr/bin/burnstore ] || fail "burnstore on PATH is $(command -v burnstore)"
/usr/bin/burnstore --version | grep -F "burnstore $version " >/dev/null || fail "burnstore --version: $(/usr/bin/burnstore --version)"
grep -q '^/usr/share/man/man1/burnstore\.1' "$tmp/files" || fail "no burnstore(1) in the package"
grep -q '^/usr/share/man/man8/mount\.burnstore\.8' "$tmp/files" || fail "no mount.burnstore(8) in the package"
ldconfig -p | grep "libburnstore\.so\.[0-9]" >/dev/null || fail "libburnstore is not in the ld.so cache"
echo "ok: burnstore --version says $version; man pages; ld.so cache"

# ---- the library, the headers, pkg-config and the docs' example -----------
bash "$here/tests/package/check_library.sh" /usr/bin/burnstore

# ---- mount -t burnstore through the installed helper ----------------------
[ -x /sbin/mount.burnstore ] || fail "/sbin/mount.burnstore is not installed"
grep -q '^/sbin/mount\.burnstore$\|^/usr/sbin/mount\.burnstore$' "$tmp/files" || fail "the helper is not the package's"
timeout $DEADLINE env -u BURNSTORE_BIN mount -t burnstore "$BPK" "$mnt" || fail "mount -t burnstore $BPK"
grep -qF " $mnt fuse.burnstore " /proc/mounts || fail "$mnt is not a burnstore mount: $(grep -F " $mnt " /proc/mounts)"
daemon=""
for p in /proc/[0-9]*; do
  args=()
  mapfile -d '' -t args 2>/dev/null <"$p/cmdline" || continue
  if [ "${args[2]:-}" = "$mnt" ]; then # burnstore SOURCE MOUNTPOINT
    daemon=$(readlink "$p/exe" || true)
    break
  fi
done
[ "$daemon" = /usr/bin/burnstore ] || fail "the mount's daemon is '$daemon', not the package's /usr/bin/burnstore"
timeout $DEADLINE cmp "$mnt/fc3/bias" <(/usr/bin/burnstore cat "$BPK" fc3.bias) || fail "fc3/bias bytes through the mount"
[ "$(timeout $DEADLINE find "$mnt" -type f | wc -l)" -eq "$(/usr/bin/burnstore ls "$BPK" | wc -l)" ] || fail "the mount's file count"
timeout $DEADLINE umount "$mnt" || fail "umount $mnt"
! grep -qF " $mnt " /proc/mounts || fail "$mnt is still mounted after umount"
echo "ok: mount -t burnstore through the installed helper runs /usr/bin/burnstore; bytes match; umount"

# ---- remove: nothing of the package's is left -----------------------------
timeout 300 apt-get remove -y -q burnstore >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log"; fail "apt-get remove burnstore"; }
left=()
while read -r p; do
  if [ "$p" = /. ] || [ -n "${before[$p]:-}" ]; then
    continue # a directory that was there before (/usr, /sbin -> usr/sbin)
  fi
  if [ -e "$p" ] || [ -L "$p" ]; then
    left+=("$p")
  fi
done <"$tmp/files"
[ ${#left[@]} -eq 0 ] || fail "apt-get remove left ${left[*]}"
! ldconfig -p | grep "libburnstore\.so" >/dev/null || fail "libburnstore is still in the ld.so cache"
timeout 300 apt-get purge -y -q burnstore >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log"; fail "apt-get purge burnstore"; }
installed=0
if dpkg-query -W -f='${Status}' burnstore 2>/dev/null | grep -v "not-installed" >/dev/null; then
  fail "dpkg still knows burnstore after purge: $(dpkg-query -W -f='${Status}' burnstore)"
fi
echo "ok: apt-get remove left none of the package's $(wc -l <"$tmp/files") paths; purged"
