#!/usr/bin/env bash
# Builds the libFuzzer fuzzers (preset `fuzz`: clang 14, every source instrumented, ASan +
# UBSan) and runs each for a bounded time on its seed corpus (fuzz/corpus/<name>/, read
# only; new inputs go to build/fuzz/corpus-<name>/).
#
# Usage: scripts/fuzz.sh [SECONDS_EACH] [NAME ...]   (default 20 s; every fuzzer in fuzz/)
# A crash, a sanitizer report, a leak or a timeout stops that fuzzer: its input is saved
# as build/fuzz/<name>-crash-* and the script exits 1 after the others have run.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
shift || true
cmake --preset fuzz >/dev/null
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in fuzz/*_fuzz.cc; do n=$(basename "$f" _fuzz.cc); names+=("$n"); done
fi
# Only the fuzzers and the library they link: the tests, benchmarks and CLI are built and
# sanitized by the other presets, and would double this build's time.
targets=()
for name in "${names[@]}"; do targets+=(--target "hyperion_fuzz_$name"); done
cmake --build --preset fuzz -j "$(nproc)" "${targets[@]}"
status=0
for name in "${names[@]}"; do
  bin=build/fuzz/hyperion_fuzz_$name
  work=build/fuzz/corpus-$name
  mkdir -p "$work"
  log=build/fuzz/$name.log
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="build/fuzz/$name-" "$work" "fuzz/corpus/$name" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "fuzz $name: ${runs:-?} inputs in ${seconds} s, no failure"
  else
    echo "fuzz $name: FAILED (log $log):"
    grep -E "ERROR|SUMMARY|Test unit written|==[0-9]+==|terminate|what\(\)" "$log" | head -20 || true
    status=1
  fi
done
exit $status
