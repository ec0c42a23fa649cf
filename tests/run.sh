#!/bin/bash
# The whole test suite, on Debian 12, as root (or with sudo):
#     bash tests/run.sh
# 1. installs the dependencies (.ci/install-deps);
# 2. checks the formatting of every tracked C file (clang-format-14);
# 3. release build, installs it (the mount helper goes to /sbin), runs every
#    unit, end-to-end and fuzz-corpus-replay test with ctest;
# 4. core-only build (-DBURNSTORE_FUSE=OFF: no FUSE headers at all): the core,
#    the CLI (burnstore ls ...), the unit tests and the fuzz replays;
# 5. the suite again under ASan + UBSan;
# 6. the suite again under ThreadSanitizer.
# Sanitizer reports also go to files (a daemon's stderr is /dev/null once it
# forks away): any report fails the run. The exit status is 0 only when all
# of it passed.
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
t0=$SECONDS
step() { echo "== $* ($((SECONDS - t0)) s)"; }

# Runs ctest in build dir $1 (more ctest arguments after it) with sanitizer
# reports going to a fresh directory; fails when ctest fails or any report
# was written.
ctest_with_reports() {
  local dir=$1
  shift
  local logs rc=0
  logs=$(mktemp -d /tmp/bs-sanitizer-XXXXXX)
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:log_path=$logs/asan \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan \
  TSAN_OPTIONS=halt_on_error=0:second_deadlock_stack=1:log_path=$logs/tsan \
    ctest --test-dir "$dir" --output-on-failure -j1 --timeout 900 "$@" || rc=$?
  if compgen -G "$logs/*" >/dev/null; then
    echo "== sanitizer reports ($dir):" >&2
    cat "$logs"/* >&2
    rc=1
  fi
  rm -rf "$logs"
  return $rc
}

step "format check (clang-format-14 --dry-run -Werror)"
if git -c safe.directory='*' rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -c safe.directory='*' ls-files -z '*.c' '*.h' | xargs -0 -r clang-format-14 --dry-run -Werror
else
  find src include tests -name '*.[ch]' -print0 | xargs -0 -r clang-format-14 --dry-run -Werror
fi

step "release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBURNSTORE_SANITIZE=OFF \
  -DBURNSTORE_WERROR=$werror >/dev/null
cmake --build build -j"$jobs"
cmake --install build >/dev/null
ctest --test-dir build --output-on-failure -j1 --timeout 900

step "benchmark, quick mode (checks that every section works; timings are not checked)"
timeout 300 /usr/bin/python3 tests/bench/bench.py --quick --bin build/burnstore

step "core-only build (BURNSTORE_FUSE=OFF: no FUSE headers)"
# The core, its headers and the tools must not include FUSE; the build below
# does not even look for fuse3, so a FUSE include there fails to compile.
if grep -rnE '#[[:space:]]*include[[:space:]]*[<"]fuse' include src/core src/formats src/tools; then
  echo "tests/run.sh: the core or a tool includes a FUSE header" >&2
  exit 1
fi
cmake -S . -B build-core -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBURNSTORE_SANITIZE=OFF \
  -DBURNSTORE_FUSE=OFF -DBURNSTORE_WERROR=$werror -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
cmake --build build-core -j"$jobs"
if grep -q '^FUSE3_' build-core/CMakeCache.txt || grep -q 'include/fuse3' build-core/compile_commands.json; then
  echo "tests/run.sh: the core-only build looked for fuse3 or compiles with its headers" >&2
  exit 1
fi
ls_out=$(build-core/burnstore ls tests/fixtures/burn/examples/mnist-inference-web/model.bpk)
if [ "$(grep -c F32 <<<"$ls_out")" -ne 18 ]; then
  echo "tests/run.sh: core-only burnstore ls does not list the 18 F32 tensors of model.bpk:" >&2
  echo "$ls_out" >&2
  exit 1
fi
ctest --test-dir build-core --output-on-failure -j1 --timeout 900

step "sanitizer build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DBURNSTORE_SANITIZE=ON \
  -DBURNSTORE_WERROR=$werror >/dev/null
cmake --build build-asan -j"$jobs"
ctest_with_reports build-asan

step "ThreadSanitizer build"
# Criterion cannot run under TSan, so its executables link an uninstrumented
# core here (tests/CMakeLists.txt); the daemon (and its CLI) and the fuzz replays
# they and the script tests start are instrumented.
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBURNSTORE_SANITIZE=thread \
  -DBURNSTORE_WERROR=$werror >/dev/null
cmake --build build-tsan -j"$jobs"
ctest_with_reports build-tsan

step "all tests passed"
