#!/usr/bin/env bash
# Training, decode and serving beside busy neighbours: each measured with 0 and 1
# processes spinning on a core (`yes > /dev/null`), and with twice as many threads as
# cores, with the thread governor (base/thread_governor.h) on and off
# (HYPERION_ADAPT_THREADS=0). Prints one JSON line per run:
#   {"workload", "neighbour", "neighbours", "threads", "adapt", "value", "unit", "slowdown"}
# and the slowdown of each neighbour run against the quiet run of the same setting.
# Fair, for N threads on N cores beside k spinning processes, is (N + k) / N (1.5x for
# one neighbour on two cores).
#
#   bench/busy_neighbour.sh [CHECKPOINT]
# CHECKPOINT: a language-model checkpoint for the serving run (default: trains the tiny
# preset for 20 steps into a temporary directory). Environment: HYPERION (binary, default
# build/release/hyperion); NEIGHBOUR=io makes the neighbour a heavier one, a process that
# holds 3 GB and writes and reads back a 2 GB file without end (each write fsynced), and
# measures training and decode at batch 1 only (WORKLOADS overrides the list).
set -euo pipefail
BIN=$(realpath "${HYPERION:-build/release/hyperion}")
CORES=$(nproc)
work=$(mktemp -d)
neighbours=()
cleanup() {
  for p in "${neighbours[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "${server:-}" ] && kill "$server" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
KIND=${NEIGHBOUR:-spin}
io_neighbour() {  # 3 GB resident, a 2 GB file written (fsynced) and read back, again and again
  exec python3 - "$work/neighbour.bin" <<'PY'
import os, sys
held = bytearray(3 << 30)
for i in range(0, len(held), 4096): held[i] = 1  # resident, not just reserved
block = os.urandom(16 << 20)
while True:
    with open(sys.argv[1], "wb") as f:
        for _ in range(128): f.write(block)
        f.flush(); os.fsync(f.fileno())
    with open(sys.argv[1], "rb") as f:
        while f.read(16 << 20): pass
PY
}
start_neighbours() {
  neighbours=()
  for _ in $(seq "$1"); do
    if [ "$KIND" = io ]; then (io_neighbour) & neighbours+=($!); sleep 5
    else (exec yes >/dev/null) & neighbours+=($!); fi
  done
  sleep 0.5
}
stop_neighbours() {
  for p in "${neighbours[@]}"; do kill "$p" 2>/dev/null || true; done
  neighbours=()
}
json_value() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }

CKPT=${1:-}
if [ -z "$CKPT" ]; then
  "$BIN" train tiny steps=20 base_output_directory="$work" run_name=ckpt sample_count=0 \
    eval_batches=1 >/dev/null 2>&1
  CKPT="$work/ckpt"
fi

measure() {  # measure WORKLOAD THREADS ADAPT: one figure on stdout
  local w=$1 t=$2 a=$3
  case "$w" in
    train)
      HYPERION_ADAPT_THREADS=$a "$BIN" --threads "$t" train tiny steps=25 \
        base_output_directory="$work/runs" run_name="r$RANDOM$RANDOM" sample_count=0 \
        eval_batches=1 --json 2>/dev/null | json_value tokens_per_s ;;
    decode1|decode16)
      local b=${w#decode}
      HYPERION_ADAPT_THREADS=$a "$BIN" --threads "$t" bench decode llama-25m --random-weights \
        --batch "$b" --steps $((b == 1 ? 800 : 300)) --context-min 64 max_seq_len=1200 \
        allow_long_context=true --json 2>/dev/null | json_value tokens_per_s ;;
    serve)
      local port=$((20000 + RANDOM % 20000))
      HYPERION_ADAPT_THREADS=$a "$BIN" --threads "$t" serve "$CKPT" --port "$port" \
        >"$work/serve.log" 2>&1 &
      server=$!
      for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 0.2
      done
      "$BIN" bench serve --url "http://127.0.0.1:$port" --vocab-size 2000 --num-prompts 48 \
        --max-concurrency 8 --min-input-len 32 --max-input-len 64 --min-output-len 32 \
        --max-output-len 32 --json 2>/dev/null | json_value output_tokens_per_s
      kill "$server"; wait "$server" 2>/dev/null || true; server="" ;;
  esac
}

declare -A quiet
default_workloads="train decode1 decode16 serve"
[ "$KIND" = io ] && default_workloads="train decode1"
for w in ${WORKLOADS:-$default_workloads}; do
  for t in "$CORES" $((2 * CORES)); do
    for a in 1 0; do
      for n in 0 1; do
        start_neighbours "$n"
        v=$(measure "$w" "$t" "$a")
        stop_neighbours
        key="$w $t $a"
        [ "$n" = 0 ] && quiet[$key]=$v
        slow=$(python3 -c "print(round(float('${quiet[$key]}') / float('$v'), 2))")
        echo "{\"workload\": \"$w\", \"neighbour\": \"$KIND\", \"neighbours\": $n, \"threads\": $t, \"adapt\": $a," \
             "\"value\": $v, \"unit\": \"tokens/s\", \"slowdown\": $slow}"
      done
    done
  done
done
