#!/usr/bin/env python3
"""Training throughput of hyperion vs PyTorch on the same Llama model, data and batch.

The model is configs/llama-25m.yml (dim 512, 8 layers, 8 heads, ffn 1408, vocab 8192,
sequence 512, batch 8, AdamW lr 1e-3 cosine, grad clipping 1.0) trained on the bundled
corpus (data/corpus/fortunes.txt) tokenized to vocab 8192. For float32 and bfloat16 it runs

  torch     a plain Llama written below (HF LlamaForCausalLM semantics: RMSNorm, rotate-half
            RoPE, causal softmax attention, SwiGLU), float32 parameters, bf16 through
            torch.autocast("cpu", dtype=torch.bfloat16); torch.optim.AdamW with the same
            hyperparameters and weight-decay groups; torch.set_num_threads(threads);
            each dtype in a fresh worker process;
  hyperion  `hyperion --threads T train configs/llama-25m.yml steps=W+N dtype=...` on the
            same prepared dataset, tokens/s read back from its metrics.jsonl;

and times only the steady-state steps (forward + backward + optimizer step; the first
W = 2 steps of each side are warm-up and excluded). Prints tokens/s of both, the ratio
hyperion / torch and hyperion's MFU. Differences in method, stated so the numbers are read
correctly: hyperion uses the preset's remat_policy (minimal: norms and SwiGLU recomputed in
the backward); torch keeps every activation (no checkpointing) and, being 1.13, has no
fused attention; its f32 matmuls go to Debian's BLAS (OpenBLAS), bf16 ones to oneDNN.

Run with Debian's python (the one with torch), from anywhere:
    /usr/bin/python3 bench/compare_torch.py [--steps N] [--threads T] [--json]
The whole run (both dtypes, 2 + 10 steps each) takes about 4-5 minutes on an idle 2-core
machine (peak measurement, dataset preparation on first use, four training runs). The
machine must be otherwise idle: other processes on the cores distort both sides (an
OpenMP step waits for its slowest thread). The script measures the CPU time others used
and the hypervisor stole during each run, reports it, and warns when it is not negligible;
even on an idle VM, runs differ by 10-20%, so compare ratios over a few runs.

MFU uses a `hyperion bench peak` measurement taken first (best of three runs; the f32 FMA
peak for f32, the best bf16 unit, AMX where present, for bf16), passed to the training
runs as peak_tflops so they share a stable denominator. The training runs skip hyperion's
end-of-run held-out evaluation (they see a copy of the dataset whose val.bin is empty):
only steps are timed, and that evaluation would add a minute of untimed work.
"""

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "llama-25m.yml")
CORPUS = os.path.join(REPO, "data", "corpus", "fortunes.txt")

# configs/llama-25m.yml, used when PyYAML is missing (the file wins when it is readable).
DEFAULT_CONFIG = {
    "vocab_size": 8192, "base_emb_dim": 512, "base_num_decoder_layers": 8,
    "base_num_query_heads": 8, "base_num_kv_heads": 8, "head_dim": 0, "base_mlp_dim": 1408,
    "max_target_length": 512, "per_device_batch_size": 8, "learning_rate": 1e-3,
    "warmup_steps_fraction": 0.05, "cosine_learning_rate_final_fraction": 0.1, "adam_b1": 0.9,
    "adam_b2": 0.95, "adam_eps": 1e-8, "adam_weight_decay": 0.1,
    "gradient_clipping_threshold": 1.0, "normalization_layer_epsilon": 1e-5,
    "rope_max_timescale": 10000.0,
}


def load_config():
    cfg = dict(DEFAULT_CONFIG)
    try:
        import yaml

        with open(CONFIG) as f:
            cfg.update({k: v for k, v in yaml.safe_load(f).items() if k in cfg})
    except ImportError:
        pass
    return cfg


def read_shard(path):
    import numpy as np

    with open(path, "rb") as f:
        head = f.read(32)
    if head[:8] != b"HYPTOKS1":
        raise SystemExit(f"{path}: not a hyperion token shard (bad magic)")
    _version, token_bytes, count, _vocab, _ = struct.unpack_from("<IIQII", head, 8)
    dt = {2: "<u2", 4: "<u4"}[token_bytes]
    return np.fromfile(path, dtype=dt, count=count, offset=32).astype(np.int64)


# ---------------------------------------------------------------- torch side (worker)


def torch_worker(args):
    """Trains warmup + steps steps in this process and prints one JSON line of timings."""
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = load_config()
    D, L = cfg["base_emb_dim"], cfg["base_num_decoder_layers"]
    H, KV = cfg["base_num_query_heads"], cfg["base_num_kv_heads"]
    HD = cfg["head_dim"] or D // H
    F_, V = cfg["base_mlp_dim"], cfg["vocab_size"]
    T, B = cfg["max_target_length"], cfg["per_device_batch_size"]
    eps = cfg["normalization_layer_epsilon"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(D))

        def forward(self, x):
            x = x.float()
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight

    def rotate_half(x):
        return torch.cat((-x[..., HD // 2 :], x[..., : HD // 2]), dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm()
            self.q_proj = nn.Linear(D, H * HD, bias=False)
            self.k_proj = nn.Linear(D, KV * HD, bias=False)
            self.v_proj = nn.Linear(D, KV * HD, bias=False)
            self.o_proj = nn.Linear(H * HD, D, bias=False)
            self.post_attention_layernorm = RMSNorm()
            self.gate_proj = nn.Linear(D, F_, bias=False)
            self.up_proj = nn.Linear(D, F_, bias=False)
            self.down_proj = nn.Linear(F_, D, bias=False)

        def forward(self, x, cos, sin, mask):
            b, t, _ = x.shape
            h = self.input_layernorm(x)
            q = self.q_proj(h).view(b, t, H, HD).transpose(1, 2)
            k = self.k_proj(h).view(b, t, KV, HD).transpose(1, 2)
            v = self.v_proj(h).view(b, t, KV, HD).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if KV != H:
                k = k.repeat_interleave(H // KV, dim=1)
                v = v.repeat_interleave(H // KV, dim=1)
            s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(HD)) + mask
            a = torch.softmax(s.float(), dim=-1).to(v.dtype) @ v
            x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, H * HD))
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, D)
            self.layers = nn.ModuleList(Block() for _ in range(L))
            self.norm = RMSNorm()
            self.lm_head = nn.Linear(D, V, bias=False)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)
            inv = 1.0 / (cfg["rope_max_timescale"] ** (torch.arange(0, HD, 2).float() / HD))
            f = torch.outer(torch.arange(T).float(), inv)
            emb = torch.cat((f, f), dim=-1)
            self.register_buffer("cos", emb.cos()[None, None], persistent=False)
            self.register_buffer("sin", emb.sin()[None, None], persistent=False)
            self.register_buffer("mask", torch.full((T, T), float("-inf")).triu(1), persistent=False)

        def forward(self, ids, targets):
            x = self.embed_tokens(ids)
            for layer in self.layers:
                x = layer(x, self.cos, self.sin, self.mask)
            logits = self.lm_head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    model = Llama()
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed_tokens" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["adam_weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg["learning_rate"], betas=(cfg["adam_b1"], cfg["adam_b2"]), eps=cfg["adam_eps"])
    total = args.warmup + args.steps
    warm = int(cfg["warmup_steps_fraction"] * total + 0.5)
    final = cfg["cosine_learning_rate_final_fraction"]

    def lr_factor(step):  # hyperion's schedule: linear warmup, cosine to final * peak
        if step < warm:
            return (step + 1) / warm
        p = (step - warm) / max(1, total - warm)
        return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * min(p, 1.0)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)

    tokens = read_shard(os.path.join(args.dataset, "train.bin"))
    nseq = (len(tokens) - 1) // T
    order = np.random.RandomState(0).permutation(nseq)
    bf16 = args.torch_worker == "bf16"
    times, losses = [], []
    for step in range(total):
        idx = order[(np.arange(B) + step * B) % nseq]
        seqs = np.stack([tokens[i * T : i * T + T + 1] for i in idx])
        inputs = torch.from_numpy(seqs[:, :-1].copy())
        targets = torch.from_numpy(seqs[:, 1:].copy())
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["gradient_clipping_threshold"])
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
        if args.verbose:
            print(f"  torch {args.torch_worker} step {step + 1}: loss {losses[-1]:.4f} "
                  f"{times[-1]:.2f} s", file=sys.stderr, flush=True)
    print(json.dumps({"step_s": times, "loss": losses, "tokens_per_step": B * T,
                      "torch": torch.__version__}))


def run_torch(args, dtype):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", dtype,
           "--dataset", args.dataset, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", str(args.threads)] + (["--verbose"] if args.verbose else [])
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"torch worker ({dtype}) failed with status {r.returncode}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    timed = res["step_s"][args.warmup :]
    res["tokens_per_s"] = res["tokens_per_step"] * len(timed) / sum(timed)
    return res


# ---------------------------------------------------------------- hyperion side


def measure_peak(args):
    """Best of three `hyperion bench peak` runs per field: a single short measurement can
    come out far too low when another process holds a core (the calibration then mistakes
    scheduling delay for work), and a peak is by definition the best rate seen."""
    best = {}
    for _ in range(3):
        r = subprocess.run([args.hyperion, "--threads", str(args.threads), "bench", "peak", "--json"],
                           stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise SystemExit("hyperion bench peak failed")
        j = json.loads(r.stdout)
        if j["bf16_gflops"] > best.get("bf16_gflops", 0):
            best["bf16_gflops"], best["bf16_isa"] = j["bf16_gflops"], j["bf16_isa"]
        best["f32_gflops"] = max(best.get("f32_gflops", 0), j["f32_gflops"])
    return best


def train_only_dataset(dataset, workdir):
    """The dataset with an empty val.bin: hyperion then skips its final held-out eval."""
    d = os.path.join(workdir, "train-only")
    os.makedirs(d, exist_ok=True)
    for f in ("train.bin", "tokenizer.model", "meta.json"):  # meta.json: a complete dataset
        if not os.path.exists(os.path.join(d, f)):
            os.symlink(os.path.join(dataset, f), os.path.join(d, f))
    with open(os.path.join(dataset, "train.bin"), "rb") as f:
        head = bytearray(f.read(32))
    struct.pack_into("<Q", head, 16, 0)  # token_count = 0
    with open(os.path.join(d, "val.bin"), "wb") as f:
        f.write(head)
    return d


def run_hyperion(args, dtype, workdir, peak_gflops):
    name = f"compare-{dtype}"
    data = train_only_dataset(args.dataset, workdir)
    cmd = [args.hyperion, "--threads", str(args.threads), "train", CONFIG,
           f"steps={args.warmup + args.steps}", f"dtype={dtype}", f"dataset_path={data}",
           f"peak_tflops={peak_gflops / 1e3}",
           f"base_output_directory={workdir}", f"run_name={name}", "enable_checkpointing=false",
           "sample_count=0", "eval_interval=0", "eval_batches=1", "log_period=1"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if args.verbose or r.returncode != 0:
        sys.stderr.write(r.stderr)
    if r.returncode != 0:
        raise SystemExit(f"hyperion train ({dtype}) failed with status {r.returncode}: {' '.join(cmd)}")
    with open(os.path.join(workdir, name, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    timed = rows[args.warmup :]
    if not timed:
        raise SystemExit(f"hyperion ({dtype}): no steps after the {args.warmup} warm-up steps")
    tokens_per_step = rows[0]["tokens_per_s"] * rows[0]["step_s"]
    tps = tokens_per_step * len(timed) / sum(r["step_s"] for r in timed)
    # mfu / tokens_per_s is the same every step (FLOPs per token / peak): apply it to the
    # aggregate rate so MFU and tokens/s describe the same average.
    mfu = tps * sum(r["mfu"] / r["tokens_per_s"] for r in timed) / len(timed)
    return {"tokens_per_s": tps, "mfu": mfu, "step_s": [r["step_s"] for r in rows],
            "loss": [r["loss"] for r in rows]}


class Interference:
    """CPU time other processes used (busy time in /proc/stat minus this script's and its
    children's) and time the hypervisor stole, as percentages of the machine over a phase:
    the timings are only meaningful when both are near zero."""

    def __init__(self):
        self.start = self.sample()

    @staticmethod
    def sample():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        hz = os.sysconf("SC_CLK_TCK")
        user, nice, system, _idle, _iowait, irq, softirq, steal = v
        ours = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            ru = resource.getrusage(who)
            ours += ru.ru_utime + ru.ru_stime
        return time.monotonic(), (user + nice + system + irq + softirq) / hz, steal / hz, ours

    def result(self):
        end = self.sample()
        if self.start is None or end is None:
            return {}
        capacity = (end[0] - self.start[0]) * (os.cpu_count() or 1)
        others = max(0.0, (end[1] - self.start[1]) - (end[3] - self.start[3]))
        return {"other_cpu_percent": round(100 * others / capacity, 1),
                "steal_percent": round(100 * (end[2] - self.start[2]) / capacity, 1)}


def prepared(d):
    return all(os.path.isfile(os.path.join(d, f))
               for f in ("train.bin", "val.bin", "tokenizer.model", "meta.json"))


def machine_info(threads):
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, {threads} threads, {platform.system()} {platform.release()}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both (default 2)")
    ap.add_argument("--dtypes", default="f32,bf16", help="comma list of f32, bf16")
    ap.add_argument("--hyperion", default=os.path.join(REPO, "build", "release", "hyperion"))
    ap.add_argument("--dataset", help="prepared dataset dir (default: runs/datasets/fortunes-v8192 "
                    "if present, else prepared from data/corpus/fortunes.txt into a temp dir)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--verbose", action="store_true", help="per-step progress on stderr")
    ap.add_argument("--torch-worker", choices=["f32", "bf16"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    dtypes = [d for d in args.dtypes.split(",") if d]
    if any(d not in ("f32", "bf16") for d in dtypes):
        ap.error("--dtypes: expected a comma list of f32 and bf16")
    if importlib.util.find_spec("torch") is None:  # checked before any work starts
        raise SystemExit(f"torch is not importable by {sys.executable}; run with /usr/bin/python3")
    args.hyperion = os.path.abspath(args.hyperion)
    if not os.access(args.hyperion, os.X_OK):
        raise SystemExit(f"{args.hyperion}: no hyperion binary (build with cmake --build --preset release)")

    workdir = tempfile.mkdtemp(prefix="hyperion_compare_torch_")
    try:
        if not args.dataset:
            cached = os.path.join(REPO, "runs", "datasets", "fortunes-v8192")
            args.dataset = cached if prepared(cached) else os.path.join(workdir, "fortunes-v8192")
        if not prepared(args.dataset):
            log(args, f"preparing {CORPUS} -> {args.dataset} (vocab 8192)")
            r = subprocess.run([args.hyperion, "--threads", str(args.threads), "data", "prepare",
                                "--input", CORPUS, "--output", args.dataset, "--vocab-size", "8192"],
                               stdout=subprocess.PIPE, text=True)
            if r.returncode != 0:
                raise SystemExit("hyperion data prepare failed")
        args.dataset = os.path.abspath(args.dataset)

        log(args, "measuring the peak (hyperion bench peak)")
        peak = measure_peak(args)
        out, noise = {}, {}
        for d in dtypes:
            hyp_dtype = {"f32": "float32", "bf16": "bfloat16"}[d]
            log(args, f"{d}: torch, {args.warmup} + {args.steps} steps")
            probe = Interference()
            t = run_torch(args, d)
            noise[f"{d}_torch"] = probe.result()
            log(args, f"{d}: torch {t['tokens_per_s']:.0f} tokens/s; hyperion, "
                      f"{args.warmup} + {args.steps} steps")
            peak_gflops = peak["f32_gflops"] if d == "f32" else peak["bf16_gflops"]
            probe = Interference()
            h = run_hyperion(args, hyp_dtype, workdir, peak_gflops)
            noise[f"{d}_hyperion"] = probe.result()
            log(args, f"{d}: hyperion {h['tokens_per_s']:.0f} tokens/s")
            out[d] = {
                "torch_tokens_per_s": round(t["tokens_per_s"], 1),
                "hyperion_tokens_per_s": round(h["tokens_per_s"], 1),
                "ratio": round(h["tokens_per_s"] / t["tokens_per_s"], 3),
                "hyperion_mfu": round(h["mfu"], 4),
                "peak_gflops": round(peak_gflops, 1),
                "torch_first_loss": round(t["loss"][0], 4),
                "hyperion_first_loss": round(h["loss"][0], 4),
                "torch_step_s": [round(x, 3) for x in t["step_s"]],
                "hyperion_step_s": [round(x, 3) for x in h["step_s"]],
            }
        out["steps"] = args.steps
        out["warmup_steps"] = args.warmup
        out["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        out["machine"] = machine_info(args.threads)
        out["bf16_peak_isa"] = peak.get("bf16_isa")
        out["interference"] = noise
        out["torch_version"] = t["torch"] if dtypes else None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    for d in dtypes:
        if out[d]["hyperion_mfu"] > 1.0:
            print(f"warning: {d} MFU above 100%: the peak measurement ({out[d]['peak_gflops']} "
                  "GFLOP/s) was disturbed by other load; rerun on an idle machine", file=sys.stderr)
    for phase, n in noise.items():
        if n and (n["other_cpu_percent"] > 5 or n["steal_percent"] > 2):
            print(f"warning: during {phase.replace('_', ' ')} other processes used "
                  f"{n['other_cpu_percent']}% of the CPUs and the hypervisor stole "
                  f"{n['steal_percent']}%: the timing is disturbed, rerun when idle", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"llama-25m, batch 8 x 512 tokens, {args.steps} timed steps after {args.warmup} "
          f"warm-up, {out['machine']}, torch {out['torch_version']}")
    print(f"{'dtype':<6}{'torch tok/s':>14}{'hyperion tok/s':>17}{'ratio':>9}{'hyperion MFU':>15}")
    for d in dtypes:
        r = out[d]
        print(f"{d:<6}{r['torch_tokens_per_s']:>14.0f}{r['hyperion_tokens_per_s']:>17.0f}"
              f"{r['ratio']:>8.2f}x{100 * r['hyperion_mfu']:>14.1f}%")
    print("MFU against " + ", ".join(f"{d} peak {out[d]['peak_gflops']:.0f} GFLOP/s" for d in dtypes)
          + "; other processes / hypervisor steal during the runs: "
          + ", ".join(f"{k.replace('_', ' ')} {v.get('other_cpu_percent', '?')}% / "
                      f"{v.get('steal_percent', '?')}%" for k, v in noise.items()))
    return 0


def log(args, msg):
    if not args.json or args.verbose:
        print(msg, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
