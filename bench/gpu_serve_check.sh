#!/usr/bin/env bash
# Serving on one NVIDIA GPU in one command (docs/GPU.md, "Serving"): the device tests, a
# trained checkpoint's greedy tokens on the GPU against the CPU, `bench decode` of a
# llama-1b shape (random weights) at batch 1, 32 and 64, the PyTorch peer
# (bench/torch_gpu_decode.py) in the same run, and HTTP serving of a llama-1b checkpoint
# written by transformers. Run from a checkout (the tests read the corpus from it), with
# the binaries built elsewhere and their shared libraries on LD_LIBRARY_PATH.
#
#   bench/gpu_serve_check.sh BIN_DIR CHECKPOINT OUT_DIR
# CHECKPOINT: a trained checkpoint (the tiny preset's) whose tokenizer the llama-1b
# server borrows. Environment: SKIP_TORCH=1, SKIP_TESTS=1, SKIP_HTTP=1 leave those out.
set -uo pipefail
BIN=${1:?usage: bench/gpu_serve_check.sh BIN_DIR CHECKPOINT OUT_DIR}
CKPT=${2:?usage: bench/gpu_serve_check.sh BIN_DIR CHECKPOINT OUT_DIR}
DEST=${3:?usage: bench/gpu_serve_check.sh BIN_DIR CHECKPOINT OUT_DIR}
mkdir -p "$DEST"
H=$BIN/hyperion
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv
  "$H" info
} > "$DEST/env.txt" 2>&1

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 300 "$BIN/hyperion_tests" \
    --gtest_filter='DeviceEngine.*:*BackendParity*:*DeviceModel*:DeviceTraining*:CudaBackend*' \
    > "$DEST/tests.log" 2>&1
  echo "device tests: exit $?"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) " "$DEST/tests.log"
fi

# Greedy tokens of the trained checkpoint, GPU against CPU, bf16 and f32, three prompts.
for dt in bfloat16 float32; do
  for p in "Once upon a time" "The" "A wise man once said"; do
    for hw in cpu gpu; do
      timeout 60 "$H" generate --checkpoint "$CKPT" --prompt "$p" --temperature 0 \
        --max-tokens 96 --ignore-eos --dtype "$dt" --hardware "$hw" --json \
        > "$DEST/generate-$hw.json" 2>> "$DEST/generate.err"
    done
    python3 - "$DEST" "$dt" "$p" <<'EOF2'
import json, sys
d = sys.argv[1]
c, g = (json.load(open(f"{d}/generate-{h}.json"))["tokens"] for h in ("cpu", "gpu"))
same = next((i for i, (a, b) in enumerate(zip(c, g)) if a != b), min(len(c), len(g)))
print(f"greedy {sys.argv[2]} '{sys.argv[3]}', gpu vs cpu: {same} of {len(c)} tokens equal "
      "before the first difference")
EOF2
  done
done

# The decode step of a llama-1b shape: batch 1, 32 and 64, bf16 weights and KV.
for b in 1 32 64; do
  timeout 120 "$H" bench decode configs/llama-1b.yml --random-weights hardware=gpu \
    --batch "$b" --context-min 128 --steps 64 --warmup 8 max_seq_len=512 --json \
    2>> "$DEST/decode.err" | tail -1 | tee -a "$DEST/decode.jsonl"
done
timeout 120 "$H" bench decode configs/llama-1b.yml --random-weights hardware=gpu --batch 1 \
  --context-min 128 --steps 64 --warmup 8 max_seq_len=512 kv_dtype=int8 --json \
  2>> "$DEST/decode.err" | tail -1 | tee -a "$DEST/decode.jsonl"

if [ "${SKIP_TORCH:-0}" != 1 ]; then
  for b in 1 32; do
    timeout 240 python3 bench/torch_gpu_decode.py --config configs/llama-1b.yml --batch "$b" \
      --prompt 128 --steps 64 --warmup 8 --mode compile --json 2>> "$DEST/torch.err" \
      | tail -1 | tee -a "$DEST/torch.jsonl"
  done
fi

[ "${SKIP_HTTP:-0}" = 1 ] && exit 0
# A llama-1b checkpoint as Hugging Face writes it (random weights, bf16), with the trained
# checkpoint's tokenizer (so its vocabulary: 2048), served over HTTP: 1 and 64 concurrent
# requests, beside `bench decode` of the same checkpoint at batch 1 and 64.
M=/tmp/llama-1b-hf
timeout 120 python3 - "$M" <<'EOF' >> "$DEST/http.log" 2>&1
import sys, torch, transformers
cfg = transformers.LlamaConfig(vocab_size=2048, hidden_size=2048, num_hidden_layers=16,
    num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192,
    max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
with torch.device("cuda"):
    m = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
m.save_pretrained(sys.argv[1])
print("written", sys.argv[1])
EOF
cp "$CKPT"/tokenizer.model "$M"/ 2>/dev/null
for b in 1 64; do
  timeout 120 "$H" bench decode "$M" hardware=gpu --batch "$b" --context-min 128 --steps 64 \
    --warmup 8 max_seq_len=512 --json 2>> "$DEST/http.log" | tail -1 | tee -a "$DEST/http.jsonl"
done
"$H" serve "$M" hardware=gpu --port 8391 max_seq_len=1024 max_concurrent_decodes=64 \
  > "$DEST/server.log" 2>&1 &
server=$!
for _ in $(seq 90); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8391/v1/models')" \
    2> /dev/null && break
  sleep 1
done
for c in 1 64; do
  n=$((c == 1 ? 8 : 128))
  timeout 180 "$H" bench serve --url http://127.0.0.1:8391 --vocab-size 2048 --num-prompts "$n" \
    --max-concurrency "$c" --min-input-len 128 --max-input-len 128 --min-output-len 128 \
    --max-output-len 128 --json 2>> "$DEST/http.log" | tr -d '\n' | tee -a "$DEST/http.jsonl"
  echo | tee -a "$DEST/http.jsonl"
done
kill -TERM "$server"
wait "$server"
echo "server: exit $?"
