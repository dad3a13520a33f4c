#!/usr/bin/env bash
# The serving figures of docs/PERFORMANCE.md: starts `hyperion serve` on CHECKPOINT with
# each engine setting, load-tests it with `hyperion bench serve`, and prints one JSON
# object per case (the bench serve --json keys plus "case" and "server").
#
#   bench/serve_bench.sh CHECKPOINT [concurrency|kv|single|scaling|all]
#
# concurrency: output tokens/s at 1, 8, 32 and 64 concurrent requests (inputs 64..512
#              tokens, 256 output tokens each, ragged attention), with bf16 and with
#              int8 KV (CONC_KV="bfloat16 int8").
# kv:          64 concurrent requests with contexts up to 2048 (inputs 64..1792, 256
#              out): int8 KV + ragged attention against bf16 KV + padded attention.
# single:      one request at a time, 16-token prompts, 256 output tokens: decode
#              tokens/s (1 / TPOT) to compare with the weight-streaming bound.
# scaling:     1 and 32 concurrent requests (8 and 64 requests, inputs 16..200 tokens,
#              128 output tokens), bf16 and int8 weights, automatic slots: TPOT against
#              `bench decode` and the 32 / 1 ratio. With URL_UNDER_TEST set, the same two
#              loads run against that server instead (e.g. llama-server on the same
#              model as GGUF), nothing is started.
# Environment: HYPERION (the binary, default build/release/hyperion), PORT (8123),
# THREADS (engine threads, default 2), SCALING_KEYS (more serve keys for the scaling
# servers, e.g. "kv_dtype=int8").
set -euo pipefail

CKPT=${1:?usage: bench/serve_bench.sh CHECKPOINT [concurrency|kv|single|scaling|all]}
SUITE=${2:-all}
BIN=${HYPERION:-build/release/hyperion}
PORT=${PORT:-8123}
THREADS=${THREADS:-2}
URL="http://127.0.0.1:${PORT}"
LOG_DIR=$(mktemp -d /tmp/hyperion-serve-bench.XXXXXX)

server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT

# start_server NAME key=value ...
start_server() {
  local name=$1
  shift
  "$BIN" --threads "$THREADS" serve "$CKPT" --port "$PORT" "$@" >"$LOG_DIR/$name.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 600); do
    if curl -sf "$URL/health" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "serve_bench: server '$name' exited:" >&2
      cat "$LOG_DIR/$name.log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "serve_bench: server '$name' did not become healthy" >&2
  exit 1
}

# run_case CASE SERVER_DESCRIPTION bench-serve-args...
run_case() {
  local name=$1 server=$2
  shift 2
  "$BIN" bench serve --url "$URL" --tokenizer "$CKPT" --json "$@" >"$LOG_DIR/$name.json"
  /usr/bin/python3 - "$LOG_DIR/$name.json" "$name" "$server" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
j = {"case": sys.argv[2], "server": sys.argv[3], **j}
print(json.dumps(j))
EOF
}

if [ "$SUITE" = concurrency ] || [ "$SUITE" = all ]; then
  for kv in ${CONC_KV:-bfloat16 int8}; do
    start_server "conc_$kv" max_concurrent_decodes=64 max_seq_len=1024 allow_long_context=true kv_dtype="$kv"
    for c in 1 8 32 64; do
      n=$((c * 2))
      [ "$n" -lt 8 ] && n=8
      run_case "concurrency_${c}_$kv" "$kv KV, ragged, 64 slots" --num-prompts "$n" \
        --max-concurrency "$c" --min-input-len 64 --max-input-len 512 --min-output-len 256 \
        --max-output-len 256 --seed 1
    done
    stop_server
  done
fi

if [ "$SUITE" = kv ] || [ "$SUITE" = all ]; then
  args=(--num-prompts 64 --max-concurrency 64 --min-input-len 64 --max-input-len 1792
        --min-output-len 256 --max-output-len 256 --seed 2)
  start_server int8_ragged max_concurrent_decodes=64 max_seq_len=2048 allow_long_context=true kv_dtype=int8 attention=ragged
  run_case kv_int8_ragged "int8 KV, ragged, 64 slots" "${args[@]}"
  stop_server
  start_server bf16_padded max_concurrent_decodes=64 max_seq_len=2048 kv_dtype=bfloat16 attention=padded
  run_case kv_bf16_padded "bf16 KV, padded, 64 slots" "${args[@]}"
  stop_server
  start_server bf16_ragged max_concurrent_decodes=64 max_seq_len=2048 kv_dtype=bfloat16 attention=ragged
  run_case kv_bf16_ragged "bf16 KV, ragged, 64 slots" "${args[@]}"
  stop_server
fi

if [ "$SUITE" = single ] || [ "$SUITE" = all ]; then
  for w in none int8; do
    start_server "single_$w" max_concurrent_decodes=1 quantize_weights=$w
    run_case "single_weights_$w" "1 slot, weights $w" --num-prompts 4 --max-concurrency 1 \
      --min-input-len 16 --max-input-len 16 --min-output-len 256 --max-output-len 256 --seed 3
    grep -o "weights read per token [^)]*" "$LOG_DIR/single_$w.log" >&2 || true
    stop_server
  done
fi
if [ "$SUITE" = scaling ] || [ "$SUITE" = all ]; then
  scaling_loads() {
    local tag=$1 server=$2
    for c in 1 32; do
      local n=8
      [ "$c" -gt 1 ] && n=$((c * 2))
      run_case "scaling_${c}_$tag" "$server" --num-prompts "$n" --max-concurrency "$c" \
        --min-input-len 16 --max-input-len 200 --min-output-len 128 --max-output-len 128 --seed 1
    done
  }
  if [ -n "${URL_UNDER_TEST:-}" ]; then
    URL=$URL_UNDER_TEST
    scaling_loads external "$URL_UNDER_TEST"
  else
    for w in none int8; do
      # shellcheck disable=SC2086  # SCALING_KEYS is a list of key=value words
      start_server "scaling_$w" max_seq_len=1024 quantize_weights=$w ${SCALING_KEYS:-}
      scaling_loads "$w" "weights $w, automatic slots"
      stop_server
    done
  fi
fi
echo "serve_bench: logs in $LOG_DIR" >&2
