#!/usr/bin/env python3
"""PyTorch decode throughput on one CUDA GPU: the peer `hyperion bench decode ...
hardware=gpu` is measured against, in the same run, on the same model shape.

gpt-fast's recipe: a plain Llama (RMSNorm, rotate-half RoPE, grouped-query attention,
SwiGLU, untied LM head) in bf16 with a static KV cache [B, Hkv, max_len, hd] written in
place (index_copy_), attention through F.scaled_dot_product_attention over the whole cache
with a mask of the positions written so far, greedy argmax on the device. Modes: eager,
and torch.compile(mode="reduce-overhead") of the one-token step (CUDA graphs). Weights are
random (throughput only). The prompt is prefilled once, untimed; then W warm-up decode
steps (compilation), then N steps timed with CUDA events.

    python3 bench/torch_gpu_decode.py --config configs/llama-1b.yml --batch 1 \
        [--prompt 128] [--steps 100] [--warmup 10] [--mode eager|compile] [--json]

Prints tokens/s (batch x steps / seconds) and the step time.
"""

import argparse
import json


def load_config(path):
    import yaml

    with open(path) as f:
        return yaml.safe_load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--mode", choices=["eager", "compile"], default="compile")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    cfg = load_config(args.config)
    D, L = cfg["base_emb_dim"], cfg["base_num_decoder_layers"]
    H, KV = cfg["base_num_query_heads"], cfg.get("base_num_kv_heads", cfg["base_num_query_heads"])
    HD = cfg.get("head_dim", 0) or D // H
    FF, V = cfg["base_mlp_dim"], cfg["vocab_size"]
    theta = float(cfg.get("rope_max_timescale", 10000))
    B, P = args.batch, args.prompt
    max_len = P + args.warmup + args.steps + 1
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)

    inv = 1.0 / theta ** (torch.arange(0, HD, 2, device=dev, dtype=torch.float32) / HD)
    ang = torch.outer(torch.arange(max_len, device=dev, dtype=torch.float32), inv)
    cos, sin = torch.cos(ang).to(dt), torch.sin(ang).to(dt)

    def rope(x, pos):  # x [B, h, T, HD], pos [T]
        c, s = cos[pos][None, None], sin[pos][None, None]
        x1, x2 = x[..., : HD // 2], x[..., HD // 2 :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(D, eps=1e-5), nn.RMSNorm(D, eps=1e-5)
            self.wqkv = nn.Linear(D, (H + 2 * KV) * HD, bias=False)
            self.wo = nn.Linear(H * HD, D, bias=False)
            self.w13 = nn.Linear(D, 2 * FF, bias=False)
            self.w2 = nn.Linear(FF, D, bias=False)
            self.register_buffer("k", torch.zeros(B, KV, max_len, HD, dtype=dt))
            self.register_buffer("v", torch.zeros(B, KV, max_len, HD, dtype=dt))

        def forward(self, x, pos, mask):
            T = x.shape[1]
            q, k, v = self.wqkv(self.n1(x)).split([H * HD, KV * HD, KV * HD], dim=-1)
            q = rope(q.view(B, T, H, HD).transpose(1, 2), pos)
            k = rope(k.view(B, T, KV, HD).transpose(1, 2), pos)
            v = v.view(B, T, KV, HD).transpose(1, 2)
            self.k.index_copy_(2, pos, k)
            self.v.index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask,
                                               enable_gqa=True)
            x = x + self.wo(a.transpose(1, 2).reshape(B, T, H * HD))
            g, u = self.w13(self.n2(x)).chunk(2, dim=-1)
            return x + self.w2(F.silu(g) * u)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.layers = nn.ModuleList([Layer() for _ in range(L)])
            self.norm = nn.RMSNorm(D, eps=1e-5)
            self.head = nn.Linear(D, V, bias=False)

        def forward(self, ids, pos):  # ids [B, T], pos [T]
            mask = (torch.arange(max_len, device=dev)[None, :] <= pos[:, None])[None, None]
            x = self.emb(ids)
            for layer in self.layers:
                x = layer(x, pos, mask)
            return self.head(self.norm(x[:, -1:]))

    model = Model().to(dev, dt).eval()
    for p in model.parameters():
        nn.init.normal_(p, std=0.02)

    def step(ids, pos):
        return model(ids, pos).argmax(-1)

    decode = torch.compile(step, mode="reduce-overhead", fullgraph=True) \
        if args.mode == "compile" else step
    with torch.inference_mode():
        ids = torch.randint(3, V, (B, P), device=dev)
        nxt = step(ids, torch.arange(P, device=dev))
        pos = P
        for _ in range(args.warmup):
            nxt = decode(nxt, torch.tensor([pos], device=dev)).clone()
            pos += 1
        torch.cuda.synchronize()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(args.steps):
            nxt = decode(nxt, torch.tensor([pos], device=dev)).clone()
            pos += 1
        t1.record()
        torch.cuda.synchronize()
    secs = t0.elapsed_time(t1) / 1e3
    out = {
        "peer": "torch", "mode": args.mode, "config": args.config, "batch": B, "prompt": P,
        "steps": args.steps, "step_ms": secs * 1e3 / args.steps,
        "tokens_per_s": B * args.steps / secs, "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
    }
    print(json.dumps(out) if args.json else
          f"torch {args.mode}: batch {B}, {out['step_ms']:.3f} ms/step, "
          f"{out['tokens_per_s']:,.0f} tokens/s")


if __name__ == "__main__":
    main()
