#!/bin/bash
# The Debian packages, end to end, as root on Debian 12 (tests/run.sh runs it
# as its last stage, after undoing its release install; runnable alone):
#     bash tests/package/test_package.sh [BUILD_DIR]    # default: build-deb/
# Builds burnstore, libburnstoreX.Y (X.Y: the SOVERSION), libburnstore-dev and
# python3-burnstore (packaging/build-deb.sh) and checks their names, versions (= CMake's
# project() and packaging/changelog), fields, dependencies and contents;
# lintian must report no error and no warning (the kept ones are overridden
# in the packages, each with its reason: packaging/lintian.md). Then, with
# apt-get:
#   - the library and -dev over a stand-in of the one package of before the
#     split: they take its files over, apt removes it;
#   - the library package alone: in the ld.so cache (its ldconfig trigger),
#     no header nor unversioned .so, and a program linked against it runs;
#   - plus -dev: the docs' examples through pkg-config (check_library.sh:
#     the one header, the exports = the symbols file, the three examples run),
#     the installed examples the same;
#   - plus burnstore: its version, man pages, and a mount through the
#     installed mount.burnstore (mount -t burnstore, under a deadline, always
#     unmounted);
#   - plus python3-burnstore: tests/e2e/test_python.py against the installed
#     module and library (torch.load, mounts, nginx), byte-compiled by its
#     postinst and cleaned by its prerm.
# apt-get remove must leave none of the packages' files behind, and purge
# forgets them. They are purged at exit also on failure.
# Refuses to run when one of the packages or an unpackaged
# /sbin/mount.burnstore (a `cmake --install`) is there: installing would
# overwrite it and removing would delete it.
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
known() { # dpkg knows package $1 (installed, or removed but not purged)
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -v "not-installed" >/dev/null
}
[ "$(id -u)" -eq 0 ] || fail "must run as root (installs packages)"
[ -e /dev/fuse ] || fail "/dev/fuse is missing (the test mounts)"
command -v lintian >/dev/null || fail "lintian is not installed (bash .ci/install-deps)"
version=$(sed -n 's/^project(burnstore VERSION \([0-9.]*\).*/\1/p' "$here/CMakeLists.txt")
[ -n "$version" ] || fail "no version in CMakeLists.txt's project()"
# SOVERSION is MAJOR.MINOR (CMakeLists.txt); Debian names the package after it.
lib=libburnstore${version%.*}
pkgs=(burnstore "$lib" libburnstore-dev python3-burnstore)
for p in "${pkgs[@]}"; do
  ! known "$p" || fail "dpkg knows a $p package already (apt-get purge ${pkgs[*]} first)"
done
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
    local p mine=()
    for p in "${pkgs[@]}"; do known "$p" && mine+=("$p"); done
    if [ ${#mine[@]} -gt 0 ]; then
      timeout 300 apt-get purge -y -q "${mine[@]}" >/dev/null 2>&1 || echo "test_package: apt-get purge ${mine[*]} failed" >&2
    fi
  fi
  rm -rf "$tmp"
  [ $rc -eq 0 ] && echo "test_package: all checks passed" || echo "test_package: FAILED" >&2
}
trap cleanup EXIT

# ---- build: names, fields, dependencies, contents -------------------------
mapfile -t debs < <(bash "$here/packaging/build-deb.sh" "$dir" | grep '\.deb$')
arch=$(dpkg --print-architecture)
# The Debian version: the changelog's latest entry, whose upstream part must
# be project()'s (a version bump without a changelog entry fails here).
debver=$(sed -n '1s/^burnstore (\([^)]*\)).*/\1/p' "$here/packaging/changelog")
[ "${debver%-*}" = "$version" ] || fail "packaging/changelog's latest entry is '$debver', project() says $version"
declare -A deb
for p in "${pkgs[@]}"; do
  a=$arch
  [ "$p" = python3-burnstore ] && a=all
  deb[$p]=$dir/${p}_${debver}_${a}.deb
  [ -f "${deb[$p]}" ] || fail "no ${deb[$p]} (built: ${debs[*]})"
  [ "$(dpkg-deb -f "${deb[$p]}" Package)" = "$p" ] || fail "${deb[$p]}'s Package is not $p"
  [ "$(dpkg-deb -f "${deb[$p]}" Version)" = "$debver" ] || fail "$p's version is not $debver"
  dpkg-deb -c "${deb[$p]}" | awk '{print $6}' | sed 's:^\.::; s:/$::' >"$tmp/$p.paths"
done
[ ${#debs[@]} -eq 4 ] || fail "build-deb.sh built ${#debs[@]} packages, not 4: ${debs[*]}"
field_is() { # PACKAGE FIELD VALUE
  [ "$(dpkg-deb -f "${deb[$1]}" "$2")" = "$3" ] || fail "$1's $2 is '$(dpkg-deb -f "${deb[$1]}" "$2")', not '$3'"
}
field_is burnstore Section utils
field_is "$lib" Section libs
field_is libburnstore-dev Section libdevel
field_is "$lib" Multi-Arch same
field_is python3-burnstore Section python
field_is python3-burnstore Architecture all
has_deps() { # PACKAGE DEP... (each "name" or "name (op version)")
  local p=$1 d depends
  shift
  depends=$(dpkg-deb -f "${deb[$p]}" Depends)
  for d in "$@"; do
    grep -qE "(^|, )${d//[()]/.}( |,|$)" <<<"$depends" || fail "$p's Depends does not declare $d: $depends"
  done
}
has_deps burnstore fuse3 libfuse3-3 libcbor0.8 libpcre2-8-0 libjansson4 zlib1g libcurl4
has_deps "$lib" libcbor0.8 libpcre2-8-0 libjansson4 zlib1g libcurl4
has_deps libburnstore-dev "$lib (= $debver)"
has_deps python3-burnstore "python3:any" python3-numpy "$lib (>= $debver)"
for p in burnstore "$lib"; do
  field_is "$p" Recommends ca-certificates
done
for p in "$lib" libburnstore-dev; do
  field_is "$p" Breaks "burnstore (<< 0.1.0-1)"
  field_is "$p" Replaces "burnstore (<< 0.1.0-1)"
done
# Each file in its package: the runtime library only in $lib, the
# development files only in -dev, no library in burnstore.
multi=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
so=/usr/lib/$multi/libburnstore.so
contains() { grep -qxF "$2" "$tmp/$1.paths" || fail "$1 does not contain $2"; }
lacks() { ! grep -qE "$2" "$tmp/$1.paths" || fail "$1 contains $(grep -E "$2" "$tmp/$1.paths" | head -1)"; }
contains "$lib" "$so.$version"
contains "$lib" "$so.${version%.*}"
lacks "$lib" "^$so\$|^/usr/include|\\.pc\$|/bin/|/sbin/"
contains libburnstore-dev "$so"
contains libburnstore-dev /usr/include/burnstore.h
lacks libburnstore-dev "^/usr/include/burnstore/"
contains libburnstore-dev "/usr/lib/$multi/pkgconfig/burnstore.pc"
contains libburnstore-dev /usr/share/doc/libburnstore-dev/library.md
for ex in list_tensors read_f32 convert; do
  contains libburnstore-dev "/usr/share/doc/libburnstore-dev/examples/$ex.c"
done
lacks libburnstore-dev "^$so\\.|/bin/|/sbin/"
contains python3-burnstore /usr/lib/python3/dist-packages/burnstore/__init__.py
lacks python3-burnstore "libburnstore\\.so|/bin/|/sbin/|^/usr/include|__pycache__|\\.pyc\$"
dpkg-deb -I "${deb[python3-burnstore]}" postinst | grep -q "py3compile -p python3-burnstore" ||
  fail "python3-burnstore's postinst does not byte-compile it"
dpkg-deb -I "${deb[python3-burnstore]}" prerm | grep -q "py3clean -p python3-burnstore" ||
  fail "python3-burnstore's prerm does not clean its byte-code"
contains burnstore /usr/bin/burnstore
contains burnstore /sbin/mount.burnstore
contains burnstore /usr/share/man/man1/burnstore.1.gz
contains burnstore /usr/share/man/man8/mount.burnstore.8.gz
lacks burnstore "libburnstore|^/usr/include|dist-packages"
for p in "${pkgs[@]}"; do
  contains "$p" "/usr/share/doc/$p/copyright"
  contains "$p" "/usr/share/doc/$p/changelog.Debian.gz"
done
dpkg-deb -I "${deb[$lib]}" triggers | grep -qx 'activate-noawait ldconfig' || fail "$lib does not activate the ldconfig trigger"
dpkg-deb -I "${deb[$lib]}" shlibs | grep -qx "libburnstore ${version%.*} $lib (>= $debver)" ||
  fail "$lib's shlibs: $(dpkg-deb -I "${deb[$lib]}" shlibs)"
dpkg-deb -I "${deb[$lib]}" symbols | head -1 | grep -qx "libburnstore.so.${version%.*} $lib #MINVER#" ||
  fail "$lib's symbols file: $(dpkg-deb -I "${deb[$lib]}" symbols | head -2)"
# (the symbols file is packaging/libburnstore.symbols: dpkg-gensymbols -c4
# checked it against the library when it was built)
cmp -s <(dpkg-deb -I "${deb[$lib]}" symbols) "$here/packaging/libburnstore.symbols" ||
  fail "$lib's symbols file is not packaging/libburnstore.symbols"
echo "ok: ${pkgs[*]} $debver: names, sections, Depends, contents, shlibs, symbols, ldconfig trigger"

# lintian: no error, no warning. What is kept is overridden in the package
# with its reason (packaging/lintian.md); an override lintian no longer
# needs (unused-override) fails too, so the kept list stays true.
lintian -I --pedantic "${deb[@]}" 2>&1 | grep -v '^running with root privileges' >"$tmp/lintian" || true
grep -E '^[EWX]: |unused-override|mismatched-override' "$tmp/lintian" && fail "lintian (above)"
grep -E '^[IP]: ' "$tmp/lintian" | sed 's/^/test_package: note: lintian: /' || true
echo "ok: lintian --pedantic: no error, no warning"

# The directories the packages have that exist before they are installed:
# the only ones allowed to be there after they are removed.
declare -A before
while read -r p; do
  [ -n "$p" ] && [ -d "$p" ] && before[$p]=1
done < <(cat "$tmp"/*.paths)

install_pkgs() { # apt-get install these package files
  timeout 300 apt-get install -y -q --no-install-recommends "$@" >"$tmp/apt.log" 2>&1 ||
    { cat "$tmp/apt.log"; fail "apt-get install $*"; }
}

# ---- over the one package of before the split -----------------------------
# burnstore 0.1.0 held the library and the development files; a stand-in of
# it with those paths (the files' contents do not matter to dpkg) is
# installed, then the library and -dev packages over it: they must take the
# files over (Replaces) and apt must remove the old burnstore (Breaks), not
# fail on files that belong to another package.
installed=1
old=$tmp/old
mkdir -p "$old/DEBIAN" "$old/usr/include/burnstore" "$old/usr/lib/$multi/pkgconfig"
printf 'Package: burnstore\nVersion: 0.1.0\nArchitecture: %s\nMaintainer: test_package <root@localhost>\nDescription: stand-in of the package before the split\n' \
  "$arch" >"$old/DEBIAN/control"
for f in "$so.$version" /usr/include/burnstore.h "/usr/lib/$multi/pkgconfig/burnstore.pc"; do
  echo "stand-in of burnstore 0.1.0" >"$old$f"
done
ln -s "libburnstore.so.$version" "$old$so.${version%.*}"
ln -s "libburnstore.so.${version%.*}" "$old$so"
dpkg-deb --root-owner-group -b "$old" "$tmp/burnstore_0.1.0_old.deb" >/dev/null
install_pkgs "$tmp/burnstore_0.1.0_old.deb"
install_pkgs "${deb[$lib]}" "${deb[libburnstore-dev]}"
! known burnstore || fail "apt left the burnstore of before the split: $(dpkg-query -W -f='${Version} ${Status}' burnstore)"
for f in "$so.$version" /usr/include/burnstore.h; do
  [ "$(dpkg -S "$f" | cut -d: -f1)" != burnstore ] || fail "$f still belongs to burnstore"
  ! cmp -s "$f" "$old/usr/include/burnstore.h" || fail "$f is the old package's"
done
timeout 300 apt-get purge -y -q "$lib" libburnstore-dev >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log"; fail "apt-get purge"; }
echo "ok: $lib and libburnstore-dev install over the burnstore $version of before the split, which apt removes"

# ---- the library package alone --------------------------------------------
install_pkgs "${deb[$lib]}"
known burnstore && fail "installing $lib installed burnstore"
known libburnstore-dev && fail "installing $lib installed libburnstore-dev"
# (The cache may name it /lib/...: /lib is /usr/lib on a merged /usr.)
cached=$(ldconfig -p | awk -v n="libburnstore.so.${version%.*}" '$1 == n {print $NF}')
[ -n "$cached" ] && [ "$(realpath "$cached")" = "$(realpath "$so.${version%.*}")" ] ||
  fail "$so.${version%.*} is not in the ld.so cache (the ldconfig trigger): '$cached'"
[ ! -e "$so" ] && [ ! -e /usr/include/burnstore.h ] || fail "$lib installed a development file"
# A program linked against the installed library (the headers of the source
# tree: -dev is not there), run against it.
cc -std=c11 -Wall -Werror -I"$here/include" -I"$dir/include" "$here/docs/examples/list_tensors.c" \
  "$so.${version%.*}" -o "$tmp/linked"
loaded=$(ldd "$tmp/linked" | awk '$1 ~ /^libburnstore\.so/ {print $3}')
[ -n "$loaded" ] && [ "$(realpath "$loaded")" = "$(realpath "$so.${version%.*}")" ] ||
  fail "the program does not load $so.${version%.*}: $(ldd "$tmp/linked")"
"$tmp/linked" "$BPK" >"$tmp/ls.linked"
"$dir/burnstore" ls "$BPK" | cmp -s - "$tmp/ls.linked" || fail "the program linked against $lib lists other tensors than burnstore ls"
echo "ok: $lib alone: ld.so cache, no development files, a program linked against it runs"

# ---- plus -dev: pkg-config, the headers, the docs' example ----------------
install_pkgs "${deb[libburnstore-dev]}"
known burnstore && fail "installing libburnstore-dev installed burnstore"
bash "$here/tests/package/check_library.sh" "$dir/burnstore"
for ex in list_tensors read_f32 convert; do
  cmp /usr/share/doc/libburnstore-dev/examples/$ex.c "$here/docs/examples/$ex.c" ||
    fail "the installed example is not docs/examples/$ex.c"
done

# ---- plus burnstore: the binary, man pages, mount -t burnstore -------------
install_pkgs "${deb[burnstore]}"
cat /dev/null >"$tmp/files"
for p in burnstore "$lib" libburnstore-dev; do dpkg -L "$p" >>"$tmp/files"; done
echo "ok: installed burnstore $lib libburnstore-dev ($(wc -l <"$tmp/files") paths)"
[ "$(command -v burnstore)" = /usr/bin/burnstore ] || fail "burnstore on PATH is $(command -v burnstore)"
/usr/bin/burnstore --version | grep -F "burnstore $version " >/dev/null || fail "burnstore --version: $(/usr/bin/burnstore --version)"
for m in /usr/share/man/man1/burnstore.1.gz /usr/share/man/man8/mount.burnstore.8.gz; do
  gzip -dc "$m" | head -1 | grep -q '^\.TH ' || fail "$m is not a gzipped man page"
done
echo "ok: burnstore --version says $version; man pages"

[ -x /sbin/mount.burnstore ] || fail "/sbin/mount.burnstore is not installed"
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

# ---- plus python3-burnstore: the module on the installed library -----------
install_pkgs "${deb[python3-burnstore]}"
ls /usr/lib/python3/dist-packages/burnstore/__pycache__/__init__.cpython-*.pyc >/dev/null 2>&1 ||
  fail "python3-burnstore's postinst did not byte-compile it"
dpkg -L python3-burnstore >>"$tmp/files"
# (from /tmp: the clone's python/ must not shadow the installed module)
(cd "$tmp" && timeout 900 env -u BURNSTORE_LIB -u PYTHONPATH BS_EXPECT_INSTALLED=1 \
  BURNSTORE_BIN=/usr/bin/burnstore BS_SOURCE_DIR="$here" BS_FIXTURES_DIR="$here/tests/fixtures" \
  /usr/bin/python3 "$here/tests/e2e/test_python.py") >"$tmp/python.log" 2>&1 ||
  { cat "$tmp/python.log"; fail "tests/e2e/test_python.py against the installed packages"; }
grep -q "burnstore $version from /usr/lib/python3/dist-packages/burnstore/__init__.py" "$tmp/python.log" ||
  fail "test_python.py did not use the installed module: $(grep 'burnstore .* from' "$tmp/python.log")"
echo "ok: python3-burnstore: test_python.py against the installed module and library"

# ---- remove: nothing of the packages' is left ------------------------------
timeout 300 apt-get remove -y -q "${pkgs[@]}" >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log"; fail "apt-get remove ${pkgs[*]}"; }
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
# (this SONAME's: another libburnstore, a /usr/local install of another version, is not ours)
[ -z "$(ldconfig -p | awk -v n="libburnstore.so.${version%.*}" '$1 == n')" ] ||
  fail "libburnstore.so.${version%.*} is still in the ld.so cache"
# (apt forgets a removed package that has no conffiles: purge what dpkg knows.)
mine=()
for p in "${pkgs[@]}"; do known "$p" && mine+=("$p"); done
if [ ${#mine[@]} -gt 0 ]; then
  timeout 300 apt-get purge -y -q "${mine[@]}" >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log"; fail "apt-get purge ${mine[*]}"; }
fi
installed=0
for p in "${pkgs[@]}"; do
  ! known "$p" || fail "dpkg still knows $p after purge: $(dpkg-query -W -f='${Status}' "$p")"
done
echo "ok: apt-get remove left none of the packages' $(wc -l <"$tmp/files") paths; purged"
