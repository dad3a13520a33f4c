#!/usr/bin/env bash
# The decode step on one NVIDIA GPU in one command (docs/GPU.md, "Serving"): the serving
# device tests, `bench decode` of the llama-1b shape (random weights, bf16, 128-token
# prompts) at batch 1, 32 and 64 with CUDA graphs and at batch 1 and 32 without, int8 KV,
# int8 weights, cuBLASLt in place of the decode GEMV kernel,
# a per-op device-time profile of the step without graphs (HYPERION_CUDA_OP_TIMES), and
# the PyTorch peer (bench/torch_gpu_decode.py, torch.compile) in the same run. Run from
# a checkout (the tests read it), with the binaries built elsewhere and their shared
# libraries on LD_LIBRARY_PATH. Writes at most 8 files to OUT_DIR.
#
#   bench/gpu_decode_check.sh BIN_DIR OUT_DIR
# Environment: SKIP_TESTS=1, SKIP_TORCH=1, SKIP_PROFILE=1 leave those out; BATCHES
# (default "1 32 64"); STEPS (default 64); VARIANTS, batch-1 runs beside the default ones
# (default "nographs1 nographs32 int8kv int8w cublas1").
set -uo pipefail
BIN=${1:?usage: bench/gpu_decode_check.sh BIN_DIR OUT_DIR}
DEST=${2:?usage: bench/gpu_decode_check.sh BIN_DIR OUT_DIR}
STEPS=${STEPS:-64}
BATCHES=${BATCHES:-1 32 64}
VARIANTS=${VARIANTS:-nographs1 nographs32 int8kv int8w cublas1}
mkdir -p "$DEST"
H=$BIN/hyperion
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv
  "$H" info
} > "$DEST/env.txt" 2>&1
head -3 "$DEST/env.txt" | tail -1

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 240 "$BIN/hyperion_tests" \
    --gtest_filter='*PagedStepParity*:DeviceEngine.*:*BackendParity.Paged*:*BackendParity.GemmAtDecodeRows*:*BackendParity.LinearMany*:*BackendParity.LinearInt8*:*BackendParity.ArgmaxRows*:*DeviceModel.*' \
    > "$DEST/tests.log" 2>&1
  echo "device tests: exit $?"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error" "$DEST/tests.log" | head -20
fi

decode() {  # batch, extra keys...
  local b=$1
  shift
  timeout 150 "$H" bench decode configs/llama-1b.yml --random-weights hardware=gpu \
    --batch "$b" --context-min 128 --steps "$STEPS" --warmup 8 max_seq_len=512 "$@" --json \
    2>> "$DEST/decode.err" | tail -1 | tee -a "$DEST/decode.jsonl"
}
for b in $BATCHES; do decode "$b"; done
for v in $VARIANTS; do
  case $v in
    nographs1) decode 1 cuda_graphs=false ;;
    nographs32) decode 32 cuda_graphs=false ;;
    int8kv) decode 1 kv_dtype=int8 ;;
    int8w) decode 1 quantize_weights=int8 ;;
    cublas1) HYPERION_CUDA_GEMV=0 decode 1 ;;  # cuBLASLt for the decode matmuls too
  esac
done

if [ "${SKIP_PROFILE:-0}" != 1 ]; then
  for b in 1 32; do
    HYPERION_CUDA_OP_TIMES="$DEST/ops-b$b.txt" timeout 150 "$H" bench decode \
      configs/llama-1b.yml --random-weights hardware=gpu --batch "$b" --context-min 128 \
      --steps 32 --warmup 4 max_seq_len=512 cuda_graphs=false --json > /dev/null \
      2>> "$DEST/decode.err"
    echo "profile batch $b:"
    head -12 "$DEST/ops-b$b.txt"
  done
fi

if [ "${SKIP_TORCH:-0}" != 1 ]; then
  for b in 1 32; do
    timeout 200 python3 bench/torch_gpu_decode.py --config configs/llama-1b.yml --batch "$b" \
      --prompt 128 --steps "$STEPS" --warmup 8 --mode compile --json 2>> "$DEST/torch.err" \
      | tail -1 | tee -a "$DEST/torch.jsonl"
  done
fi
