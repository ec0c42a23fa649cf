#!/bin/bash
# libburnstore as installed, seen only through pkg-config:
#     bash tests/package/check_library.sh BURNSTORE_BIN            # the system's
#     bash tests/package/check_library.sh BURNSTORE_BIN BUILD_DIR  # a DESTDIR copy
# Checks that pkg-config --modversion is CMake's project() version, that the
# one header installed is include/burnstore.h (no internal header) and the
# library exports exactly the functions it declares and the symbols file
# lists (check_exports.sh), that the docs' three examples, compiled with
# `pkg-config --cflags --libs burnstore`, run as documented against that
# library (check_examples.py), and that the Python module installed beside
# it opens a checkpoint through it. With BUILD_DIR, `cmake --install BUILD_DIR` goes to a
# temporary DESTDIR first and pkg-config (--define-prefix) and the loader
# look there. Used by tests/package/test_package.sh (the installed .deb) and
# by the ctest lib/installed (BUILD_DIR: the build under test).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=$1
build=${2:-}
fix=$here/tests/fixtures/burn
BPK=$fix/examples/mnist-inference-web/model.bpk

fail() {
  echo "check_library: FAIL: $*" >&2
  exit 1
}
tmp=$(mktemp -d /tmp/bs-library-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

pc=(pkg-config)
if [ -n "$build" ]; then
  DESTDIR=$tmp/root cmake --install "$build" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install $build"; }
  pcfile=$(find "$tmp/root" -name burnstore.pc)
  [ -n "$pcfile" ] || fail "cmake --install installed no burnstore.pc"
  export PKG_CONFIG_PATH=$(dirname "$pcfile")
  pc=(pkg-config --define-prefix)
  export LD_LIBRARY_PATH=$("${pc[@]}" --variable=libdir burnstore)
fi

version=$(sed -n 's/^project(burnstore VERSION \([0-9.]*\).*/\1/p' "$here/CMakeLists.txt")
[ "$("${pc[@]}" --modversion burnstore)" = "$version" ] ||
  fail "pkg-config --modversion burnstore: '$("${pc[@]}" --modversion burnstore)', CMakeLists.txt says $version"
echo "ok: pkg-config --modversion burnstore = $version"

# ---- the header and the exports: exactly the API ----------------------------
lib=$("${pc[@]}" --variable=libdir burnstore)/libburnstore.so
inc=$("${pc[@]}" --variable=includedir burnstore)
[ -f "$inc/burnstore.h" ] || fail "no $inc/burnstore.h"
[ ! -e "$inc/burnstore" ] || fail "internal headers installed: $(ls "$inc/burnstore" | head -3)"
bash "$here/tests/package/check_exports.sh" "$lib" "$inc/burnstore.h" "$here/packaging/libburnstore.symbols"
cmp -s "$inc/burnstore.h" "$here/include/burnstore.h" || fail "$inc/burnstore.h is not include/burnstore.h"

# ---- the docs' examples against the installed library, through pkg-config --
/usr/bin/python3 "$here/tests/package/check_examples.py" --bin "$bin" --pkg-config \
  ${build:+--define-prefix} || fail "the docs' examples (above)"

# ---- the Python module as installed, on that library ----------------------
py=$(find "${build:+$tmp/root}/usr" -path '*/dist-packages/burnstore/__init__.py' 2>/dev/null | head -1)
if [ -n "$build" ] || [ -n "$py" ]; then
  [ -n "$py" ] || fail "the Python module is not installed"
  got=$(cd "$tmp" && PYTHONPATH=$(dirname "$(dirname "$py")") /usr/bin/python3 -c '
import sys, burnstore
print(burnstore.__file__, burnstore.version(), len(burnstore.open(sys.argv[1])))' "$BPK") ||
    fail "import burnstore from $py"
  [ "$got" = "$py $version 18" ] || fail "the installed module: '$got', expected '$py $version 18'"
  echo "ok: the installed Python module ($py) opens a checkpoint through $lib"
fi
