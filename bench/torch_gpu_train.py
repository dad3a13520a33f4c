#!/usr/bin/env python3
"""PyTorch training throughput on one CUDA GPU: the peer `hyperion train ... hardware=gpu`
is measured against, in the same run, on the same model shape and batch.

The model is a plain Llama (RMSNorm, rotate-half RoPE, grouped-query attention through
F.scaled_dot_product_attention with is_causal, SwiGLU, untied LM head), parameters in f32,
bf16 through torch.autocast, torch.optim.AdamW(fused=True). Tokens are random (throughput
only). Modes: eager, and torch.compile of the model. Steps W..W+N are timed with CUDA
events; the first W are warm-up (and compilation).

    python3 bench/torch_gpu_train.py --config configs/llama-110m.yml --batch 32 --seq 1024 \
        [--mode eager|compile] [--steps 10] [--warmup 3] [--peak-tflops 989] [--json]

Prints tokens/s and MFU with the FLOPs per token hyperion's trainer reports: 6 x the
parameters outside the embedding (the LM head included) + 6 x layers x seq x heads x
head_dim for causal attention (half of the full 12 x ...).
"""

import argparse
import json
import math
import time


def load_config(path, overrides):
    import yaml

    with open(path) as f:
        cfg = yaml.safe_load(f)
    cfg.update(overrides)
    return cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--set", action="append", default=[], help="key=value config override")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    over = {}
    for kv in args.set:
        k, v = kv.split("=", 1)
        over[k] = int(v) if v.isdigit() else v
    cfg = load_config(args.config, over)
    D, L = cfg["base_emb_dim"], cfg["base_num_decoder_layers"]
    H, KV = cfg["base_num_query_heads"], cfg.get("base_num_kv_heads", cfg["base_num_query_heads"])
    HD = cfg.get("head_dim", 0) or D // H
    FF, V = cfg["base_mlp_dim"], cfg["vocab_size"]
    T, B = args.seq, args.batch
    eps = 1e-5
    dev = "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(D))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * self.weight

    def rope(x, cos, sin):
        x1, x2 = x[..., : HD // 2], x[..., HD // 2 :]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1 = RMSNorm()
            self.qkv = nn.Linear(D, (H + 2 * KV) * HD, bias=False)
            self.o = nn.Linear(H * HD, D, bias=False)
            self.n2 = RMSNorm()
            self.gate_up = nn.Linear(D, 2 * FF, bias=False)
            self.down = nn.Linear(FF, D, bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).split([H * HD, KV * HD, KV * HD], dim=-1)
            q = rope(q.view(b, t, H, HD).transpose(1, 2), cos, sin)
            k = rope(k.view(b, t, KV, HD).transpose(1, 2), cos, sin)
            v = v.view(b, t, KV, HD).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=KV != H)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, H * HD))
            g, u = self.gate_up(self.n2(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(g) * u)

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.layers = nn.ModuleList(Block() for _ in range(L))
            self.norm = RMSNorm()
            self.head = nn.Linear(D, V, bias=False)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)
            inv = 1.0 / (10000.0 ** (torch.arange(0, HD, 2).float() / HD))
            f = torch.outer(torch.arange(T).float(), inv)
            e = torch.cat((f, f), dim=-1)
            self.register_buffer("cos", e.cos()[None, None], persistent=False)
            self.register_buffer("sin", e.sin()[None, None], persistent=False)

        def forward(self, ids, targets):
            x = self.emb(ids)
            for layer in self.layers:
                x = layer(x, self.cos, self.sin)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1))

    model = Llama().to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    n_emb = model.emb.weight.numel()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    step_fn = model if args.mode == "eager" else torch.compile(model)

    def step():
        ids = torch.randint(0, V, (B, T + 1), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(ids[:, :-1], ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.steps):
        loss = step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / args.steps
    tok_s = B * T / (ms / 1e3)
    # FLOPs per token as hyperion counts them: 6 x non-embedding params (the LM head is
    # counted) + causal attention 6 x L x T x D (half of the full 12 x L x T x D).
    flops_tok = 6 * (n_params - n_emb) + 6 * L * T * H * HD
    mfu = tok_s * flops_tok / (args.peak_tflops * 1e12)
    out = {"peer": "torch", "torch": torch.__version__, "mode": args.mode,
           "gpu": torch.cuda.get_device_name(0), "config": args.config, "batch": B, "seq": T,
           "params": n_params, "step_ms": round(ms, 3), "tokens_per_s": round(tok_s, 1),
           "flops_per_token": flops_tok, "mfu": round(mfu, 4), "warmup_s": round(warm_s, 1),
           "loss": round(float(loss), 4),
           "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"torch {args.mode}: {tok_s:,.0f} tokens/s, {ms:.1f} ms/step, MFU {100 * mfu:.1f}% "
              f"(of {args.peak_tflops} TFLOP/s), {out['max_memory_gib']} GiB")


if __name__ == "__main__":
    main()
