#!/usr/bin/env bash
# Same-session before/after of two hyperion binaries (e.g. main's and a branch's):
# training tokens/s (the tiny preset, median of steps 6..20 of 20) and decode tokens/s
# (`bench decode`, batch 1 over a context growing from 64, and batch 16 over contexts of
# 16..200), alternating the binaries for 5 rounds so drift hits both alike.
#   bench/before_after.sh BEFORE_BIN AFTER_BIN CHECKPOINT [OUT.jsonl]
# Prints (and appends to OUT) one JSON line per binary and round.
set -euo pipefail
before=$1 after=$2 ckpt=$3 out=${4:-/tmp/ba.jsonl}
: > "$out"
for round in 1 2 3 4 5; do
  for which in before after; do
    bin=${!which}
    rm -rf /tmp/ba-run
    "$bin" train steps=20 base_output_directory=/tmp/ba-run run_name=r sample_count=0 \
      eval_interval=0 enable_checkpointing=false > /dev/null 2>&1
    tps=$(python3 -c "
import json,statistics
m=[json.loads(l) for l in open('/tmp/ba-run/r/metrics.jsonl')][5:]
print(statistics.median(x['tokens_per_s'] for x in m))")
    d1=$("$bin" bench decode "$ckpt" --batch 1 --context-min 64 --steps 1500 --warmup 50 max_seq_len=2048 allow_long_context=true --json | python3 -c "import json,sys; print(json.load(sys.stdin)['tokens_per_s'])")
    d16=$("$bin" bench decode "$ckpt" --batch 16 --context-min 16 --context-max 200 --steps 300 --warmup 20 max_seq_len=1024 allow_long_context=true --json | python3 -c "import json,sys; print(json.load(sys.stdin)['tokens_per_s'])")
    echo "{\"round\": $round, \"binary\": \"$which\", \"train_tokens_per_s\": $tps, \"decode_b1_tokens_per_s\": $d1, \"decode_b16_tokens_per_s\": $d16}" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for key in ["train_tokens_per_s", "decode_b1_tokens_per_s", "decode_b16_tokens_per_s"]:
    b = [r[key] for r in rows if r["binary"] == "before"]
    a = [r[key] for r in rows if r["binary"] == "after"]
    print(f"{key}: before {[round(x) for x in b]} after {[round(x) for x in a]} "
          f"after/before of the medians {statistics.median(a) / statistics.median(b):.3f}")
PY
