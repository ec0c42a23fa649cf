#!/bin/bash
# The whole test suite: installs dependencies (Debian 12, as root), builds,
# installs (the mount helper goes to /sbin), and runs every unit and
# end-to-end test with ctest, then again under ASan + UBSan.
#     sudo bash tests/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash .ci/install-deps
if [ ! -e /dev/fuse ]; then
  echo "tests/run.sh: /dev/fuse is missing: the end-to-end tests really mount" >&2
  exit 1
fi
jobs=$(nproc)
werror=OFF
[ "${CI:-}" = "true" ] && werror=ON

echo "== release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBURNSTORE_SANITIZE=OFF -DBURNSTORE_WERROR=$werror >/dev/null
cmake --build build -j"$jobs"
cmake --install build >/dev/null
ctest --test-dir build --output-on-failure -j1 --timeout 900

echo "== sanitizer build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DBURNSTORE_SANITIZE=ON -DBURNSTORE_WERROR=$werror >/dev/null
cmake --build build-asan -j"$jobs"
# Reports also go to files, so that a daemon's (whose stderr is /dev/null
# once it forks away) are seen too.
logs=$(mktemp -d /tmp/bs-sanitizer-XXXXXX)
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:log_path=$logs/asan \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan \
  ctest --test-dir build-asan --output-on-failure -j1 --timeout 900
if compgen -G "$logs/*" >/dev/null; then
  echo "== sanitizer reports:" >&2
  cat "$logs"/* >&2
  exit 1
fi
rm -rf "$logs"
echo "== all tests passed"
