#!/bin/bash
# The whole test suite, on Debian 12, as root (or with sudo):
#     bash tests/run.sh
# What it does to the machine (also printed when it starts):
#   - installs the Debian packages it lacks (.ci/install-deps; kept);
#   - builds in build/, build-core/, build-asan/, build-tsan/ inside the clone;
#   - installs the release build (burnstore into /usr/local, mount.burnstore into
#     /sbin: the `mount -t burnstore` tests use them) and removes those files again
#     after the sanitizer stages (or when it exits);
#   - then builds the Debian packages in build-deb/, installs them with apt-get,
#     mounts through them, removes and purges them (tests/package/test_package.sh);
#   - mounts only under /tmp (every mount under a deadline, always unmounted), and
#     keeps lock and status files in /run/burnstore while a test's mount lives.
#     The run fails if the suite leaves anything behind that was not there
#     before it: a runtime file no live daemon holds, a staging directory, a
#     burnstore mount or a process of this clone's burnstore.
# It never drops the page cache or starts a network service (the benchmark does
# those only with --system, which the suite does not pass).
# Stages: formatting (clang-format-14), release build + every unit, real-mount
# end-to-end and fuzz-corpus-replay test, the quick benchmark (works, timings not
# checked), a core-only build without FUSE, the suite under ASan + UBSan, under
# ThreadSanitizer, and the Debian package. Each stage prints one line; its
# output goes to a log file, printed in full only when the stage fails. Any
# failure or sanitizer report fails the run; the exit status is 0 only when all
# of it passed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
jobs=$(nproc)
werror=OFF
[ "${CI:-}" = "true" ] && werror=ON
t0=$SECONDS
logs=$(mktemp -d /tmp/burnstore-test-logs-XXXXXX)
installed=""
# Undo the release install: the files it wrote, and nothing else.
release_uninstall() {
  if [ -n "$installed" ] && [ -f "$installed" ]; then
    xargs -r -d '\n' rm -f -- <"$installed"
    rm -f "$installed"
  fi
  installed=""
}
finish() {
  local rc=$?
  release_uninstall
  if [ $rc -eq 0 ]; then
    rm -rf "$logs"
  else
    echo "tests/run.sh: FAILED (exit $rc); the logs are in $logs" >&2
  fi
}
trap finish EXIT

echo "tests/run.sh: installs missing Debian packages; builds in $here/build*;" \
  "installs burnstore into /usr/local and /sbin for the run (removed before the last stage);" \
  "last, installs the .deb it builds, then removes and purges it;" \
  "mounts only under /tmp; lock/status files in /run/burnstore only while a mount lives"

# stage NAME CMD...: runs CMD with its output in a log file; one line if it
# passes, the whole log if it fails (and the run stops).
n=0
passed=0
stage() {
  local name=$1
  shift
  n=$((n + 1))
  local log start rc=0
  local slug=${name//[^A-Za-z0-9.+-]/-}
  log=$logs/$(printf '%02d' $n)-$slug.log
  start=$SECONDS
  "$@" >"$log" 2>&1 </dev/null || rc=$?
  if [ $rc -ne 0 ]; then
    echo "== $name: FAILED (exit $rc, $((SECONDS - start)) s); its log ($log):"
    cat "$log"
    exit $rc
  fi
  # ctest's summary ("100% tests passed, 0 tests failed out of 53") is the one
  # detail worth a line when all passed.
  local summary
  summary=$(grep -E '^[0-9]+% tests passed' "$log" | tail -1 || true)
  if [[ $summary =~ out\ of\ ([0-9]+) ]]; then
    passed=$((passed + BASH_REMATCH[1]))
  fi
  echo "== $name: ok ($((SECONDS - start)) s)${summary:+; $summary}"
}

# Runs ctest in build dir $1 (more ctest arguments after it) with sanitizer
# reports going to a fresh directory; fails when ctest fails or any report
# was written.
ctest_with_reports() {
  local dir=$1
  shift
  local rep rc=0
  rep=$(mktemp -d /tmp/bs-sanitizer-XXXXXX)
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:log_path=$rep/asan \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$rep/ubsan \
  TSAN_OPTIONS=halt_on_error=0:second_deadlock_stack=1:log_path=$rep/tsan \
    ctest --test-dir "$dir" --output-on-failure -j1 --timeout 900 "$@" || rc=$?
  if compgen -G "$rep/*" >/dev/null; then
    echo "== sanitizer reports ($dir):"
    cat "$rep"/*
    rc=1
  fi
  rm -rf "$rep"
  return $rc
}

format_check() {
  if git -c safe.directory='*' rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -c safe.directory='*' ls-files -z '*.c' '*.h' | xargs -0 -r clang-format-14 --dry-run -Werror
  else
    find src include tests -name '*.[ch]' -print0 | xargs -0 -r clang-format-14 --dry-run -Werror
  fi
}

build() { # build DIR CMAKE-ARGS...
  local dir=$1
  shift
  cmake -S . -B "$dir" -DBURNSTORE_WERROR=$werror -DBURNSTORE_TESTS=ON "$@"
  cmake --build "$dir" -j"$jobs"
}

release_install() {
  cmake --install build
  installed=$here/build/install_manifest.txt
}

core_only() {
  # The core, its headers, the tools and the API must not include FUSE; the build below
  # does not even look for fuse3, so a FUSE include there fails to compile.
  if grep -rnE '#[[:space:]]*include[[:space:]]*[<"]fuse' include src/core src/formats src/policy src/tools src/main src/api; then
    echo "tests/run.sh: the core or a tool includes a FUSE header"
    return 1
  fi
  # The library's layers call downward only (docs/architecture.md): the core
  # knows no format, the formats know no policy, and no layer calls the mount or the CLI.
  if grep -nE '#[[:space:]]*include[[:space:]]*"(formats/|policy/)' src/core/* ||
    grep -nE '#[[:space:]]*include[[:space:]]*"policy/' src/formats/* ||
    grep -nE '#[[:space:]]*include[[:space:]]*"(fs|cli|mount)\.h"' src/core/* src/formats/* src/policy/*; then
    echo "tests/run.sh: an include above runs against the library's layers"
    return 1
  fi
  # include/ holds the one public header; the internal ones are beside their code.
  if [ "$(ls include)" != burnstore.h ]; then
    echo "tests/run.sh: include/ holds more than burnstore.h: $(ls include)"
    return 1
  fi
  # Format rules live in src/formats (the format and writer tables): the core
  # names no format, and the mount and the CLI call no format's private
  # function (they open through bs_checkpoint_open, write through the
  # writers table).
  if grep -rniE 'safetensors|gguf|burnpack|pytorch|\.pth|\.bpk|cbor' src/core/; then
    echo "tests/run.sh: src/core names a format (move the rule to src/formats)"
    return 1
  fi
  if grep -nE '#[[:space:]]*include[[:space:]]*"(formats/[a-z_]+\.h|[a-z_]*(gguf|pth|pickle|zip|burnpack|safetensors)[a-z_]*\.h)"' \
    src/fuse/* src/tools/* src/main/* src/api/* | grep -vE '"formats/(formats|writers)\.h"' ||
    grep -nE '\bbs_(bpk|st|gguf|pth|pickle|zip)_[a-z_]+\(' src/fuse/* src/tools/* src/main/* src/api/*; then
    echo "tests/run.sh: the mount, the CLI or the API calls a format's private function"
    return 1
  fi
  build build-core -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBURNSTORE_SANITIZE=OFF \
    -DBURNSTORE_FUSE=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
  if grep -q '^FUSE3_' build-core/CMakeCache.txt || grep -q 'include/fuse3' build-core/compile_commands.json; then
    echo "tests/run.sh: the core-only build looked for fuse3 or compiles with its headers"
    return 1
  fi
  local ls_out
  ls_out=$(build-core/burnstore ls tests/fixtures/burn/examples/mnist-inference-web/model.bpk)
  if [ "$(grep -c F32 <<<"$ls_out")" -ne 18 ]; then
    echo "tests/run.sh: core-only burnstore ls does not list the 18 F32 tensors of model.bpk:"
    echo "$ls_out"
    return 1
  fi
}

# What a run must not leave behind (one line each): runtime files of daemons
# that are gone (a status or target lock nobody holds, a log or progress file
# without its status file), staging directories under /tmp and /var/tmp,
# burnstore mounts, and processes of this clone's (or the installed) burnstore.
leftovers() {
  local f e p
  for f in /run/burnstore/*; do
    [ -e "$f" ] || continue
    case $f in
      *.status | *.target) flock -n "$f" true 2>/dev/null && echo "runtime file $f" ;;
      *.log | *.status.progress) [ -e "${f%%.*}.status" ] || echo "runtime file $f" ;;
      *) echo "runtime file $f" ;;
    esac
  done
  find /tmp /var/tmp -maxdepth 3 -type d \( -name '.*.staging-??????' -o -name 'burnstore-??????' \) \
    -printf 'staging directory %p\n' 2>/dev/null || true
  awk '$3 == "fuse.burnstore" { print "mount " $2 }' /proc/mounts || true
  for p in /proc/[0-9]*; do
    e=$(readlink "$p/exe" 2>/dev/null) || continue
    case $e in
      "$here"/build*/burnstore | /usr/local/bin/burnstore | /usr/bin/burnstore) echo "process ${p#/proc/} $e" ;;
    esac
  done
  return 0
}
leftovers_check() {
  leftovers | sort >"$logs/leftovers.after"
  local new
  new=$(comm -13 "$logs/leftovers.before" "$logs/leftovers.after")
  if [ -n "$new" ]; then
    echo "tests/run.sh: the suite left behind:"
    echo "$new"
    return 1
  fi
  echo "nothing left behind ($(wc -l <"$logs/leftovers.after") entries, all there before the run)"
}

stage "packages (.ci/install-deps)" bash .ci/install-deps
if [ ! -e /dev/fuse ]; then
  echo "tests/run.sh: /dev/fuse is missing: the end-to-end tests really mount" >&2
  exit 1
fi
stage "format check (clang-format-14)" format_check
stage "release build" build build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBURNSTORE_SANITIZE=OFF
stage "release install (undone at exit)" release_install
leftovers | sort >"$logs/leftovers.before"
stage "release tests" ctest --test-dir build --output-on-failure -j1 --timeout 900
stage "benchmark, quick mode (works; timings not checked)" \
  timeout 300 /usr/bin/python3 tests/bench/bench.py --quick --bin build/burnstore
stage "core-only build (no FUSE)" core_only
stage "core-only tests" ctest --test-dir build-core --output-on-failure -j1 --timeout 900
stage "ASan + UBSan build" build build-asan -DCMAKE_BUILD_TYPE=Debug -DBURNSTORE_SANITIZE=ON
stage "ASan + UBSan tests" ctest_with_reports build-asan
stage "ThreadSanitizer build" build build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBURNSTORE_SANITIZE=thread
# Criterion cannot run under TSan, so its executables link an uninstrumented
# core here (tests/CMakeLists.txt); the daemon (and its CLI) and the fuzz replays
# they and the script tests start are instrumented.
stage "ThreadSanitizer tests" ctest_with_reports build-tsan
# The package installs /sbin/mount.burnstore too: the release install (which
# the tests above use) goes first, and the package test refuses to run over
# any unpackaged helper.
stage "release install undone" release_uninstall
stage "Debian packages (build, lintian, apt-get install, library, mount -t burnstore, remove)" \
  bash tests/package/test_package.sh "$here/build-deb"
stage "nothing left behind (/run/burnstore, staging, mounts, processes)" leftovers_check
echo "== all tests passed ($((SECONDS - t0)) s)"
echo "ctest: $passed passed, 0 failed"
