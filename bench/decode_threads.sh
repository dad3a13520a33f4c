#!/usr/bin/env bash
# Decode scaling with threads: `hyperion bench decode` at 1, 2, 4, ... threads up to
# MAX_THREADS (default: this machine's cores; set it above them to see oversubscription),
# for each batch in BATCHES (default "1 32") and weight format in WEIGHTS (default
# "none int8"). Prints one JSON object per run (the bench decode --json keys plus
# "threads") and, per series, whether tokens/s ever fell as threads were added.
#
#   bench/decode_threads.sh CHECKPOINT
# Environment: HYPERION (binary, default build/release/hyperion), MAX_THREADS, BATCHES,
# WEIGHTS, STEPS (timed steps, default 40), CONTEXT ("min max", default "16 200").
set -euo pipefail

CKPT=${1:?usage: bench/decode_threads.sh CHECKPOINT}
BIN=${HYPERION:-build/release/hyperion}
MAX=${MAX_THREADS:-$(nproc)}
STEPS=${STEPS:-40}
read -r CMIN CMAX <<<"${CONTEXT:-16 200}"

threads_list() {
  local t=1
  while [ "$t" -lt "$MAX" ]; do
    echo "$t"
    t=$((t * 2))
  done
  echo "$MAX"
}

for w in ${WEIGHTS:-none int8}; do
  for b in ${BATCHES:-1 32}; do
    prev=0
    fell=""
    for t in $(threads_list); do
      out=$("$BIN" --threads "$t" bench decode "$CKPT" --batch "$b" --context-min "$CMIN" \
        --context-max "$CMAX" --steps "$STEPS" max_seq_len=$((CMAX + STEPS + 8)) allow_long_context=true \
        quantize_weights="$w" --json)
      tps=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["tokens_per_s"])' "$out")
      /usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); j["threads"]=int(sys.argv[2]); print(json.dumps(j))' "$out" "$t"
      if /usr/bin/python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < 0.95*float(sys.argv[2]) else 1)' "$tps" "$prev"; then
        fell="$fell $t"
      fi
      prev=$tps
    done
    if [ -n "$fell" ]; then
      echo "decode_threads: weights=$w batch=$b: tokens/s fell by more than 5% at threads:$fell" >&2
    else
      echo "decode_threads: weights=$w batch=$b: tokens/s never fell as threads were added" >&2
    fi
  done
done
