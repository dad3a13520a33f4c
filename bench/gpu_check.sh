#!/usr/bin/env bash
# The GPU session in one command, for a machine with one NVIDIA GPU (docs/GPU.md, "On a
# GPU machine"): the device tests, the diffusion pipelines and an SD 1.5 UNet step on the
# GPU, then training throughput of llama-110m and llama-1b on the GPU, then PyTorch (eager and torch.compile) on the same shapes in the same run.
# Run from a checkout (the tests read the corpus and configs from it), with the binaries
# built elsewhere and their shared libraries on LD_LIBRARY_PATH.
#
#   bench/gpu_check.sh BIN_DIR OUT_DIR
# BIN_DIR holds hyperion and hyperion_tests; logs and torch.jsonl go to OUT_DIR. The
# hyperion runs print their steps; tokens/s are the median of steps 2-12.
# Environment: SKIP_TORCH=1 leaves PyTorch out; STEPS (default 12).
set -uo pipefail
BIN=${1:?usage: bench/gpu_check.sh BIN_DIR OUT_DIR}
DEST=${2:?usage: bench/gpu_check.sh BIN_DIR OUT_DIR}
STEPS=${STEPS:-12}
mkdir -p "$DEST"
H=$BIN/hyperion
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv
  "$H" info
} > "$DEST/env.txt" 2>&1

timeout 300 "$BIN/hyperion_tests" \
  --gtest_filter='*BackendParity*:*DeviceModel*:DeviceTraining*:CudaBackend*' > "$DEST/tests.log" 2>&1
echo "device tests: exit $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) " "$DEST/tests.log"
# The diffusion layers, then again with a 1 KiB column budget so that the convolutions
# run the chunked path (each chunk a few output rows).
timeout 120 "$BIN/hyperion_tests" --gtest_filter='*DiffusionOps*' > "$DEST/diffusion_ops.log" 2>&1
echo "diffusion ops: exit $?"
HYPERION_CUDA_CONV_CHUNK_BYTES=1024 timeout 120 "$BIN/hyperion_tests" \
  --gtest_filter='*DiffusionOps*Conv2d*' >> "$DEST/diffusion_ops.log" 2>&1
echo "diffusion ops, chunked convolutions: exit $?"
# The diffusion pipelines on the device against the host's images, then one SD 1.5-shaped
# UNet step (512 x 512, batch 2) and a whole 20-step image on the GPU, f32 and bf16.
timeout 180 "$BIN/hyperion_tests" --gtest_filter='DevicePipeline.*' > "$DEST/diffusion_device.log" 2>&1
echo "diffusion pipelines on the device: exit $?"
for dtype in float32 bfloat16; do
  timeout 120 "$H" bench diffusion --model sd15 --hardware gpu --iterations 5 --dtype "$dtype" --json \
    >> "$DEST/diffusion_bench.log" 2>>"$DEST/diffusion_bench.err"
  echo "sd15 UNet step on the GPU ($dtype): exit $?"
  timeout 120 "$H" bench diffusion --model sd15 --hardware gpu --image --steps 20 --dtype "$dtype" --json \
    >> "$DEST/diffusion_bench.log" 2>>"$DEST/diffusion_bench.err"
  echo "sd15 image on the GPU ($dtype): exit $?"
done

common=(hardware=gpu eval_interval=0 eval_batches=1 sample_count=0 peak_tflops=989
  enable_checkpointing=false base_output_directory=/tmp/gpu_check "steps=$STEPS" log_period=1)
timeout 120 "$H" train configs/llama-110m.yml "${common[@]}" per_device_batch_size=32 \
  gradient_accumulation_steps=1 run_name=llama-110m > "$DEST/llama-110m.log" 2>&1
echo "llama-110m: exit $?"
timeout 180 "$H" train configs/llama-1b.yml "${common[@]}" run_name=llama-1b > "$DEST/llama-1b.log" 2>&1
echo "llama-1b: exit $?"
for run in llama-110m llama-1b; do
  python3 - "$DEST/$run.log" "$run" <<'EOF'
import re, statistics, sys
steps = [(int(m.group(1)), float(m.group(2))) for m in
         re.finditer(r"step +(\d+) .* ([\d.]+) tok/s", open(sys.argv[1]).read())]
tps = [t for s, t in steps if s >= 2]
print(f"hyperion {sys.argv[2]}: {statistics.median(tps):,.0f} tokens/s" if tps else
      f"hyperion {sys.argv[2]}: no steps (see the log)")
EOF
done

[ "${SKIP_TORCH:-0}" = 1 ] && exit 0
for mode in eager compile; do
  timeout 200 python3 bench/torch_gpu_train.py --config configs/llama-110m.yml --batch 32 \
    --seq 1024 --mode "$mode" --json 2>>"$DEST/torch.err" | tail -1 | tee -a "$DEST/torch.jsonl"
  timeout 200 python3 bench/torch_gpu_train.py --config configs/llama-1b.yml --batch 8 \
    --seq 2048 --mode "$mode" --json 2>>"$DEST/torch.err" | tail -1 | tee -a "$DEST/torch.jsonl"
done
