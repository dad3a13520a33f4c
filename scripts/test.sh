#!/usr/bin/env bash
# Sets up, builds and runs every test: the release build (warnings are errors) with the
# dependency check and the whole CTest suite; the AddressSanitizer + UBSan build (all but
# the tests labelled `long`, which the release suite runs); the ThreadSanitizer build over
# the threaded parts; the libFuzzer fuzzers for a bounded time; clang-tidy.
#
# Usage: scripts/test.sh [all|release|asan|tsan|fuzz|lint]   (default all)
# Builds go through ccache (installed by setup), so an unchanged file compiles once.
set -euo pipefail
cd "$(dirname "$0")/.."
which="${1:-all}"
case "$which" in
  all|release|asan|tsan|fuzz|lint) ;;
  *) echo "usage: scripts/test.sh [all|release|asan|tsan|fuzz|lint]" >&2; exit 2 ;;
esac
scripts/setup.sh --tests
command -v ccache >/dev/null && ccache --max-size=10G >/dev/null
# The tests write under one fresh temporary directory, removed when this script ends: a
# test that leaks a directory, or is killed mid-run, leaves nothing behind in /tmp.
tmp_root=$(mktemp -d "${TMPDIR:-/tmp}/hyperion-tests.XXXXXX")
chmod 1777 "$tmp_root"  # as /tmp: helpers run as other users (Slurm, Prometheus) write there too
trap 'rm -rf "$tmp_root"' EXIT
export TMPDIR=$tmp_root TEST_TMPDIR=$tmp_root
jobs=$(nproc)
stage() {  # stage NAME COMMAND...: runs and times one stage
  local name=$1 t0
  shift
  t0=$(date +%s)
  echo "== test.sh: $name"
  "$@"
  echo "== test.sh: $name passed in $(( $(date +%s) - t0 )) s"
}
build() {
  cmake --preset "$1" >/dev/null
  cmake --build --preset "$1" -j "$jobs"
}
release() {
  build ci
  scripts/check-deps.sh build/ci
  ctest --preset ci -j "$jobs"
}
# Each build's system files are checked too: the sanitizer and fuzz builds read their own
# (clang's OpenMP and tools, the sanitizer runtimes).
asan() { build ci-asan && scripts/check-deps.sh build/ci-asan && ctest --preset ci-asan -j "$jobs"; }
tsan() { build ci-tsan && scripts/check-deps.sh build/ci-tsan && ctest --preset ci-tsan -j "$jobs"; }
fuzz() { scripts/fuzz.sh 20 && scripts/check-deps.sh build/fuzz; }
lint() {
  [ -f build/ci/compile_commands.json ] || build ci
  scripts/lint.sh build/ci
}
t_all=$(date +%s)
case "$which" in
  all) stage release release; stage asan asan; stage tsan tsan; stage fuzz fuzz; stage lint lint ;;
  *) stage "$which" "$which" ;;
esac
echo "== test.sh: $which passed in $(( $(date +%s) - t_all )) s"
