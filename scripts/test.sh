#!/usr/bin/env bash
# Sets up, builds and runs every test through CTest: the release build (warnings are
# errors) and the AddressSanitizer + UBSan build. Usage: scripts/test.sh [release|asan|all]
set -euo pipefail
cd "$(dirname "$0")/.."
which="${1:-all}"
scripts/setup.sh
jobs=$(nproc)
run() {
  cmake --preset "$1" >/dev/null
  cmake --build --preset "$1" -j "$jobs"
  ctest --preset "$1" -j "$jobs"
}
case "$which" in
  release) run ci ;;
  asan) run ci-asan ;;
  all) run ci; run ci-asan ;;
  *) echo "usage: scripts/test.sh [release|asan|all]" >&2; exit 2 ;;
esac
