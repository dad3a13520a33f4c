#!/usr/bin/env python3
"""PyTorch (CPU) timing of one Stable Diffusion-shaped UNet call, the peer of
`hyperion bench diffusion` in the same run (docs/PERFORMANCE.md).

    /usr/bin/python3 bench/torch_sd_unet.py --model sd15 --threads 2 [--iterations 2] [--dtype bfloat16] [--json]

float32 by default; --dtype bfloat16 runs the call under torch.autocast("cpu",
dtype=torch.bfloat16), the peer of `bench diffusion --dtype bfloat16` (convolutions and
linear layers in bf16, f32 weights).

The model is tests/diffusion/torch_reference.py's functional UNet (torch.nn.functional
convolutions, group/layer norms, linear layers and softmax attention, the same layers
diffusers' UNet2DConditionModel calls) with random weights, under torch.no_grad.
torch's scaled_dot_product_attention replaces the explicit softmax when available (what
diffusers' AttnProcessor2_0 uses).
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "diffusion"))
import torch_reference as ref  # noqa: E402

PRESETS = {
    "sd15": dict(block_out_channels=[320, 640, 1280, 1280], attention_head_dim=8, cross_attention_dim=768,
                 layers_per_block=2, use_linear_projection=False, sample_size=64,
                 down_block_types=["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
                 up_block_types=["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3),
    "sd21": dict(block_out_channels=[320, 640, 1280, 1280], attention_head_dim=[5, 10, 20, 20],
                 cross_attention_dim=1024, layers_per_block=2, use_linear_projection=True, sample_size=96,
                 down_block_types=["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
                 up_block_types=["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3),
}


def sdpa_attention(P, names, x, ctx, heads, qkv_bias, causal=False):
    d = x.shape[-1]
    q = ref.linear(P, names[0], x, d, d, qkv_bias)
    k = ref.linear(P, names[1], ctx, ctx.shape[-1], d, qkv_bias)
    v = ref.linear(P, names[2], ctx, ctx.shape[-1], d, qkv_bias)
    n, t, s = x.shape[0], x.shape[1], ctx.shape[1]
    hd = d // heads
    q = q.view(n, t, heads, hd).transpose(1, 2)
    k = k.view(n, s, heads, hd).transpose(1, 2)
    v = v.view(n, s, heads, hd).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return ref.linear(P, names[3], o.transpose(1, 2).reshape(n, t, d), d, d, True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="sd15", choices=sorted(PRESETS))
    ap.add_argument("--size", type=int, default=0)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_default_dtype(torch.float32)
    if hasattr(F, "scaled_dot_product_attention"):
        ref.attention = sdpa_attention
    if a.dtype == "bfloat16":
        # Norms in f32, as autocast means them to be (this torch's CPU autocast leaves
        # group_norm / layer_norm to fail on a bf16 input with f32 weights).
        gn, ln = ref.group_norm, ref.layer_norm
        ref.group_norm = lambda P, name, x, groups, eps: gn(P, name, x.float(), groups, eps)
        ref.layer_norm = lambda P, name, x, eps: ln(P, name, x.float(), eps)
    cfg = dict(in_channels=4, out_channels=4, norm_num_groups=32, norm_eps=1e-5, **PRESETS[a.model])
    size = a.size or cfg["sample_size"] * 8
    latent = size // 8
    P = ref.Params(1)
    P.g = torch.Generator().manual_seed(1)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(a.batch, 4, latent, latent, generator=g)
    ctx = torch.randn(a.batch, 77, cfg["cross_attention_dim"], generator=g)
    t = torch.full((a.batch,), 500.0)
    times = []
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bfloat16")
    with torch.no_grad(), autocast:
        ref.unet_forward(P, cfg, x, t, ctx)  # creates the weights; warm-up
        for _ in range(a.iterations):
            t0 = time.perf_counter()
            ref.unet_forward(P, cfg, x, t, ctx)
            times.append(time.perf_counter() - t0)
    times.sort()
    result = {"model": a.model, "size": size, "batch": a.batch, "threads": a.threads, "torch": torch.__version__,
              "dtype": a.dtype, "best_seconds": times[0], "median_seconds": times[len(times) // 2],
              "sdpa": hasattr(F, "scaled_dot_product_attention")}
    if a.json:
        print(json.dumps(result))
    else:
        print(f"torch {torch.__version__} {a.model} UNet {size}x{size} batch {a.batch}, {a.dtype}, {a.threads} threads: "
              f"best {times[0]:.3f} s, median {times[len(times) // 2]:.3f} s")


if __name__ == "__main__":
    main()
