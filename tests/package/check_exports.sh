#!/bin/bash
# The library's ABI is exactly its documented API:
#     bash tests/package/check_exports.sh LIB HEADER SYMBOLS
# LIB (libburnstore.so), HEADER (burnstore.h) and SYMBOLS (the Debian symbols
# file, packaging/libburnstore.symbols) must name the same functions: what
# `objdump -T` shows LIB defining (functions and data), what HEADER declares
# with BURNSTORE_API (every function it declares must be), and the symbols
# SYMBOLS lists. A leaked internal symbol, an API function not exported or
# not documented, or a symbols file not updated fails, with the difference.
# Run by the ctest lib/exports on the build's library and by
# check_library.sh on the installed one.
set -euo pipefail
lib=$1 header=$2 symbols=$3
fail() {
  echo "check_exports: FAIL: $*" >&2
  exit 1
}
tmp=$(mktemp -d /tmp/bs-exports-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
[ -e "$lib" ] || fail "$lib is missing"

# Defined dynamic symbols (a sanitizer build's library also defines the
# runtime's interceptor hooks: names starting with __, left out).
objdump -T "$lib" | awk '/ D[FO] / && !/\*UND\*/ {print $NF}' | grep -v '^__' | sort -u >"$tmp/exported"
[ -s "$tmp/exported" ] || fail "$lib exports nothing"

# Declarations: the preprocessed header split at ';', typedefs left out;
# each declares one function (the first identifier before a '(').
cc -E -P -x c "$header" | tr '\n' ' ' | tr ';' '\n' | grep -v '^ *typedef' |
  grep -oE '^.*\bburnstore_[a-z0-9_]+ *\(' >"$tmp/decls" || true
sed -E 's/.*\b(burnstore_[a-z0-9_]+) *\($/\1/' "$tmp/decls" | sort -u >"$tmp/declared"
grep -v 'visibility *( *"default" *)' "$tmp/decls" >"$tmp/unmarked" || true
if [ -s "$tmp/unmarked" ]; then
  cat "$tmp/unmarked"
  fail "$header declares functions without BURNSTORE_API (above)"
fi
[ -s "$tmp/declared" ] || fail "$header declares nothing"

sed -nE 's/^ ([^@ ]+)@.*/\1/p' "$symbols" | sort -u >"$tmp/listed"
head -1 "$symbols" | grep -qE '^libburnstore\.so\.[0-9]+\.[0-9]+ libburnstore[0-9]+\.[0-9]+ #MINVER#$' ||
  fail "$symbols: first line '$(head -1 "$symbols")'"

for pair in "declared:exported" "listed:exported"; do
  a=${pair%:*} b=${pair#*:}
  if ! diff "$tmp/$a" "$tmp/$b" >"$tmp/diff"; then
    cat "$tmp/diff"
    fail "$a ($([ "$a" = declared ] && echo "$header" || echo "$symbols")) and $b ($lib) differ (< $a only, > $b only)"
  fi
done
echo "ok: $lib exports the $(wc -l <"$tmp/exported") functions $header declares and $symbols lists, nothing else"
