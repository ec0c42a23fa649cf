#!/bin/bash
# libburnstore as installed, seen only through pkg-config:
#     bash tests/package/check_library.sh BURNSTORE_BIN            # the system's
#     bash tests/package/check_library.sh BURNSTORE_BIN BUILD_DIR  # a DESTDIR copy
# Checks that pkg-config --modversion is CMake's project() version, that the
# library exports exactly the functions and data its installed headers
# declare (all bs_; no private helper), and that docs/examples/list_tensors.c,
# compiled with `pkg-config --cflags --libs burnstore` and run against that
# library, lists what `BURNSTORE_BIN ls` lists for three formats and reads a
# tensor's values. With BUILD_DIR, `cmake --install BUILD_DIR` goes to a
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

# ---- the exports: exactly the API of the installed headers ---------------
lib=$("${pc[@]}" --variable=libdir burnstore)/libburnstore.so
[ -e "$lib" ] || fail "$lib is missing"
objdump -T "$lib" | awk '/ D[FO] / && !/\*UND\*/ {print $NF}' | sort -u >"$tmp/exported"
inc=$("${pc[@]}" --variable=includedir burnstore)
[ -f "$inc/burnstore/formats.h" ] || fail "no headers in $inc/burnstore"
# Declared: names followed by ( or [ and extern data, with comments and
# `enum bs_x`/`struct bs_x` type names gone.
for h in "$inc"/burnstore/*.h; do echo "#include <burnstore/$(basename "$h")>"; done |
  cc -E -P "-I$inc" -x c - |
  sed -E 's/(enum|struct) bs_[a-z0-9_]+//g' |
  grep -oE '\bbs_[a-z0-9_]+ *[[(]|^extern .*\bbs_[a-z0-9_]+;' |
  grep -oE 'bs_[a-z0-9_]+' | sort -u >"$tmp/declared"
[ -s "$tmp/exported" ] || fail "$lib exports nothing"
if grep -v '^bs_' "$tmp/exported"; then
  fail "$lib exports symbols without the bs_ prefix (above)"
fi
if ! diff "$tmp/declared" "$tmp/exported" >"$tmp/symdiff"; then
  cat "$tmp/symdiff"
  fail "$lib's exports differ from its headers' declarations (< declared only, > exported only)"
fi
echo "ok: $lib exports the $(wc -l <"$tmp/exported") bs_ symbols its headers declare, nothing else"

# ---- the docs' example against the installed library ---------------------
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror "$here/docs/examples/list_tensors.c" \
  $("${pc[@]}" --cflags --libs burnstore) -o "$tmp/list_tensors"
loaded=$(ldd "$tmp/list_tensors" | awk '$1 ~ /^libburnstore\.so/ {print $3}')
[ -n "$loaded" ] && [ "$(realpath "$loaded")" = "$(realpath "$lib")" ] ||
  fail "the example does not load $lib: $(ldd "$tmp/list_tensors")"
for f in "$BPK" "$fix/examples/import-model-weights/weights/mnist.safetensors" \
  "$here/tests/fixtures/complex_nested.pt"; do
  "$tmp/list_tensors" "$f" >"$tmp/ls.example"
  "$bin" ls "$f" >"$tmp/ls.cli"
  [ -s "$tmp/ls.cli" ] || fail "$bin ls $f printed nothing"
  cmp -s "$tmp/ls.example" "$tmp/ls.cli" || {
    diff "$tmp/ls.example" "$tmp/ls.cli" || true
    fail "the example's listing of $f differs from burnstore ls"
  }
done
want=$("$bin" cat "$BPK" fc3.bias |
  python3 -c 'import struct,sys; print("fc3.bias: " + " ".join("%g" % v for v in struct.unpack("<8f", sys.stdin.buffer.read()[:32])))')
got=$("$tmp/list_tensors" "$BPK" fc3.bias)
[ "$got" = "$want" ] || fail "the example's values: '$got', expected '$want'"
if "$tmp/list_tensors" "$here/README.md" 2>"$tmp/err"; then
  fail "the example accepted README.md as a checkpoint"
fi
grep "README.md: .*unknown format" "$tmp/err" >/dev/null || fail "the example's error: $(cat "$tmp/err")"
echo "ok: the docs' example, built with pkg-config, lists what burnstore ls lists and reads fc3.bias"
