#!/usr/bin/env bash
# The split decode attention's shape on one NVIDIA GPU (src/kernels/cuda/paged_decode.cu):
# `bench decode` of the llama-1b shape at batch 1 and 32 under each setting of
#   HYPERION_DECODE_SPLITS_PER_SM  blocks per multiprocessor the splits aim at
#   HYPERION_DECODE_MIN_SPLIT      fewest positions per split
#   HYPERION_DECODE_MERGE          kernel (a second kernel merges) | last (the last split)
# One line per run: the setting, the batch, the step in ms. Run as bench/gpu_decode_check.sh
# is run (from a checkout, binaries elsewhere).
#
#   bench/gpu_decode_tuning.sh BIN_DIR OUT_FILE ["SPLITS_PER_SM MIN_SPLIT MERGE" ...]
set -uo pipefail
BIN=${1:?usage: bench/gpu_decode_tuning.sh BIN_DIR OUT_FILE [SETTING...]}
OUT_FILE=${2:?usage: bench/gpu_decode_tuning.sh BIN_DIR OUT_FILE [SETTING...]}
shift 2
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=("2 32 kernel" "4 16 kernel" "2 32 last" "4 16 last")
for setting in "${settings[@]}"; do
  read -r per_sm min_split merge <<< "$setting"
  for b in ${BATCHES:-1 32}; do
    HYPERION_DECODE_SPLITS_PER_SM=$per_sm HYPERION_DECODE_MIN_SPLIT=$min_split \
      HYPERION_DECODE_MERGE=$merge timeout 100 "$BIN/hyperion" bench decode \
      configs/llama-1b.yml --random-weights hardware=gpu --batch "$b" --context-min 128 \
      --steps "${STEPS:-48}" --warmup 8 max_seq_len=512 --json 2> /dev/null | tail -1 |
      python3 -c "import json, sys; j = json.load(sys.stdin); print('$setting', j['batch'], round(j['step_ms'], 4), round(j['fraction_of_bound'], 4))" |
      tee -a "$OUT_FILE"
  done
done
