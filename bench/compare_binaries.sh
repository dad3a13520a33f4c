#!/usr/bin/env bash
# Two builds side by side in one run: training tokens/s (tiny, llama-25m), `bench decode`
# at batch 1 and 32, and `bench serve` at 1 and 32 concurrent requests. Cases alternate
# between the binaries (ROUNDS rounds), so drift in the machine hits both alike; the
# JSON lines printed are one per (round, binary, case).
#
#   bench/compare_binaries.sh BEFORE_BINARY AFTER_BINARY [ROUNDS]
#
# The decode and serve cases run on a llama-25m checkpoint made by AFTER_BINARY (1 step:
# the weights do not change the cost). Environment: PORT (8124), THREADS (2).
set -euo pipefail
BEFORE=${1:?usage: bench/compare_binaries.sh BEFORE AFTER [ROUNDS]}
AFTER=${2:?usage: bench/compare_binaries.sh BEFORE AFTER [ROUNDS]}
ROUNDS=${3:-2}
PORT=${PORT:-8124}
THREADS=${THREADS:-2}
URL="http://127.0.0.1:${PORT}"
WORK=$(mktemp -d /tmp/hyperion-compare.XXXXXX)
server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT

"$AFTER" train configs/llama-25m.yml steps=1 eval_interval=0 sample_count=0 peak_tflops=1 \
  base_output_directory="$WORK" run_name=ckpt --quiet >/dev/null 2>&1
CKPT="$WORK/ckpt/checkpoints/1"

emit() {  # emit ROUND BINARY_NAME CASE VALUE
  printf '{"round": %s, "binary": "%s", "case": "%s", "value": %s}\n' "$1" "$2" "$3" "$4"
}
json_get() { /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

for round in $(seq 1 "$ROUNDS"); do
  for which in before after; do
    bin=$BEFORE
    [ "$which" = after ] && bin=$AFTER
    v=$("$bin" --threads "$THREADS" train tiny steps=30 eval_interval=0 sample_count=0 \
         checkpoint_period=0 enable_checkpointing=false peak_tflops=1 base_output_directory="$WORK/t" \
         --quiet --json 2>/dev/null | json_get '["tokens_per_s"]')
    emit "$round" "$which" "train tiny tokens/s" "$v"
    v=$("$bin" --threads "$THREADS" train configs/llama-25m.yml steps=6 eval_interval=0 \
         sample_count=0 enable_checkpointing=false peak_tflops=1 base_output_directory="$WORK/t" \
         --quiet --json 2>/dev/null | json_get '["tokens_per_s"]')
    emit "$round" "$which" "train llama-25m tokens/s" "$v"
    v=$("$bin" --threads "$THREADS" bench decode "$CKPT" --batch 1 --context-min 16 --steps 40 \
         --json | json_get '["tokens_per_s"]')
    emit "$round" "$which" "bench decode batch 1 tokens/s" "$v"
    v=$("$bin" --threads "$THREADS" bench decode "$CKPT" --batch 32 --context-min 64 \
         --context-max 512 --steps 20 max_seq_len=2048 allow_long_context=true --json | json_get '["tokens_per_s"]')
    emit "$round" "$which" "bench decode batch 32 tokens/s" "$v"
    "$bin" --threads "$THREADS" serve "$CKPT" --port "$PORT" max_concurrent_decodes=64 \
      max_seq_len=1024 allow_long_context=true >"$WORK/serve-$which.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 600); do
      curl -sf "$URL/health" >/dev/null 2>&1 && break
      sleep 0.1
    done
    for c in 1 32; do
      n=$((c * 2))
      [ "$n" -lt 8 ] && n=8
      v=$("$AFTER" bench serve --url "$URL" --tokenizer "$CKPT" --json --num-prompts "$n" \
           --max-concurrency "$c" --min-input-len 64 --max-input-len 512 --min-output-len 128 \
           --max-output-len 128 --seed 1 | json_get '["output_tokens_per_s"]')
      emit "$round" "$which" "bench serve $c concurrent output tokens/s" "$v"
    done
    stop_server
  done
done
echo "compare_binaries: work files in $WORK" >&2
