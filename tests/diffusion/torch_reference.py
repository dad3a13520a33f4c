#!/usr/bin/env python3
"""hyperion's diffusion components against an independent float64 PyTorch reference.

Run by CTest as
    /usr/bin/python3 tests/diffusion/torch_reference.py --hyperion build/release/hyperion
Exit status 0 means pass; prints "SKIP" and exits 0 when torch is not importable.

The reference below is written from the published architectures (diffusers'
UNet2DConditionModel with its ResnetBlock2D, Transformer2DModel / BasicTransformerBlock
with GEGLU, Downsample2D / Upsample2D and SDXL's text_time embedding; AutoencoderKL's
Encoder / Decoder with the mid-block attention and the asymmetric downsampling pad;
transformers' CLIPTextModel(WithProjection) with causal attention, quick_gelu or gelu
and pooling at the end token), in float64 with torch.nn.functional only. For tiny random
configs shaped like SD 1.x (1x1-convolution projections, one head count), SD 2.x (linear
projections, heads per block) and SDXL (transformer depth per block, pooled text and
time ids) UNets, a VAE, and CLIP text encoders with and without projection, it:
  1. writes each as a diffusers component folder (config.json + safetensors, the UNet's
     weights as two shards with an index, SD 1.x-style 1x1 convolution weights as
     [O, I, 1, 1]);
  2. runs `hyperion diffusion forward` on random inputs;
  3. requires every output within 1e-5 of the reference's largest magnitude (hyperion
     computes in f32: the error is f32 rounding through the layers);
  4. for the UNets and the VAE, the backward passes: every parameter's gradient of sum(R * output) for
     a random R (autograd in float64 here) within 5e-5 of that tensor's largest value.
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIP: torch is not importable")
    sys.exit(0)

torch.set_default_dtype(torch.float64)
TOLERANCE = 1e-5
GRAD_TOLERANCE = 5e-5


# ---------------------------------------------------------------- safetensors I/O

def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        if t.dtype == torch.float64:
            t = t.float()
        dtype = {torch.float32: "F32", torch.int32: "I32"}[t.dtype]
        b = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = bytearray(data[8 + n + a:8 + n + b])
        t = torch.frombuffer(raw, dtype=torch.float32).reshape(info["shape"]) if raw else torch.zeros(info["shape"])
        out[name] = t.double()
    return out


# ---------------------------------------------------------------- parameters

class Params:
    """Random parameters by name: weights ~ N(0, 1/fan_in), norm gains ~ 1 + N(0, 0.1^2),
    biases ~ N(0, 0.1^2)."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.p = {}

    def randn(self, *shape):
        return torch.randn(*shape, generator=self.g)

    def weight(self, name, *shape):
        fan_in = 1
        for d in shape[1:]:
            fan_in *= d
        self.p[name] = self.randn(*shape) / math.sqrt(fan_in)
        return self.p[name]

    def bias(self, name, n):
        self.p[name] = 0.1 * self.randn(n)
        return self.p[name]

    def gain(self, name, n):
        self.p[name] = 1.0 + 0.1 * self.randn(n)
        return self.p[name]


def linear(P, name, x, inp, out, bias=True):
    w = P.p.get(name + ".weight")
    if w is None:
        w = P.weight(name + ".weight", out, inp)
        if bias:
            P.bias(name + ".bias", out)
    return F.linear(x, w, P.p.get(name + ".bias") if bias else None)


def conv(P, name, x, inp, out, k, stride=1, padding=None):
    if name + ".weight" not in P.p:
        P.weight(name + ".weight", out, inp, k, k)
        P.bias(name + ".bias", out)
    return F.conv2d(x, P.p[name + ".weight"], P.p[name + ".bias"], stride=stride,
                    padding=k // 2 if padding is None else padding)


def group_norm(P, name, x, groups, eps):
    c = x.shape[1]
    if name + ".weight" not in P.p:
        P.gain(name + ".weight", c)
        P.bias(name + ".bias", c)
    return F.group_norm(x, groups, P.p[name + ".weight"], P.p[name + ".bias"], eps)


def layer_norm(P, name, x, eps):
    c = x.shape[-1]
    if name + ".weight" not in P.p:
        P.gain(name + ".weight", c)
        P.bias(name + ".bias", c)
    return F.layer_norm(x, (c,), P.p[name + ".weight"], P.p[name + ".bias"], eps)


def attention(P, names, x, ctx, heads, qkv_bias, causal=False):
    """x [n, t, d], ctx [n, s, e]; names: (q, k, v, out)."""
    d = x.shape[-1]
    q = linear(P, names[0], x, d, d, qkv_bias)
    k = linear(P, names[1], ctx, ctx.shape[-1], d, qkv_bias)
    v = linear(P, names[2], ctx, ctx.shape[-1], d, qkv_bias)
    n, t, s = x.shape[0], x.shape[1], ctx.shape[1]
    hd = d // heads
    q = q.view(n, t, heads, hd).transpose(1, 2)
    k = k.view(n, s, heads, hd).transpose(1, 2)
    v = v.view(n, s, heads, hd).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if causal:
        scores = scores.masked_fill(torch.triu(torch.ones(t, s, dtype=torch.bool), 1), float("-inf"))
    o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, t, d)
    return linear(P, names[3], o, d, d, True)


def timestep_embedding(t, dim, flip, shift, max_period=10000.0):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half) / (half - shift))
    e = t[:, None] * freqs[None, :]
    e = torch.cat([torch.sin(e), torch.cos(e)], -1)
    if flip:
        e = torch.cat([e[:, half:], e[:, :half]], -1)
    if dim % 2:
        e = F.pad(e, (0, 1))
    return e


# ---------------------------------------------------------------- UNet2DConditionModel

def resnet(P, name, x, temb, out, groups, eps):
    inp = x.shape[1]
    h = conv(P, name + ".conv1", F.silu(group_norm(P, name + ".norm1", x, groups, eps)), inp, out, 3)
    if temb is not None:
        h = h + linear(P, name + ".time_emb_proj", F.silu(temb), temb.shape[-1], out)[:, :, None, None]
    h = conv(P, name + ".conv2", F.silu(group_norm(P, name + ".norm2", h, groups, eps)), out, out, 3)
    if inp != out:
        x = conv(P, name + ".conv_shortcut", x, inp, out, 1)
    return x + h


def transformer2d(P, name, x, ctx, heads, layers, groups, linear_proj):
    n, c, hh, ww = x.shape
    residual = x
    h = group_norm(P, name + ".norm", x, groups, 1e-6)
    if linear_proj:
        h = h.permute(0, 2, 3, 1).reshape(n, hh * ww, c)
        h = linear(P, name + ".proj_in", h, c, c)
    else:
        h = conv(P, name + ".proj_in", h, c, c, 1)
        h = h.permute(0, 2, 3, 1).reshape(n, hh * ww, c)
    for l in range(layers):
        b = f"{name}.transformer_blocks.{l}"
        a = layer_norm(P, b + ".norm1", h, 1e-5)
        h = h + attention(P, [b + ".attn1.to_q", b + ".attn1.to_k", b + ".attn1.to_v", b + ".attn1.to_out.0"],
                          a, a, heads, False)
        a = layer_norm(P, b + ".norm2", h, 1e-5)
        h = h + attention(P, [b + ".attn2.to_q", b + ".attn2.to_k", b + ".attn2.to_v", b + ".attn2.to_out.0"],
                          a, ctx, heads, False)
        a = layer_norm(P, b + ".norm3", h, 1e-5)
        value, gate = linear(P, b + ".ff.net.0.proj", a, c, 8 * c).chunk(2, dim=-1)
        h = h + linear(P, b + ".ff.net.2", value * F.gelu(gate), 4 * c, c)
    if linear_proj:
        h = linear(P, name + ".proj_out", h, c, c)
        h = h.reshape(n, hh, ww, c).permute(0, 3, 1, 2)
    else:
        h = h.reshape(n, hh, ww, c).permute(0, 3, 1, 2)
        h = conv(P, name + ".proj_out", h, c, c, 1)
    return h + residual


def unet_forward(P, cfg, sample, t, ctx, text_embeds=None, time_ids=None):
    ch = cfg["block_out_channels"]
    nb = len(ch)
    heads = cfg["attention_head_dim"]
    heads = heads if isinstance(heads, list) else [heads] * nb
    tl = cfg.get("transformer_layers_per_block", 1)
    tl = tl if isinstance(tl, list) else [tl] * nb
    g, eps, lin = cfg["norm_num_groups"], cfg.get("norm_eps", 1e-5), cfg.get("use_linear_projection", False)
    lpb = cfg["layers_per_block"]
    temb = timestep_embedding(t, ch[0], True, 0)
    temb = linear(P, "time_embedding.linear_2", F.silu(linear(P, "time_embedding.linear_1", temb, ch[0], 4 * ch[0])),
                  4 * ch[0], 4 * ch[0])
    if cfg.get("addition_embed_type") == "text_time":
        td = cfg["addition_time_embed_dim"]
        te = timestep_embedding(time_ids.flatten(), td, True, 0).reshape(time_ids.shape[0], -1)
        a = torch.cat([text_embeds, te], -1)
        temb = temb + linear(P, "add_embedding.linear_2",
                             F.silu(linear(P, "add_embedding.linear_1", a, a.shape[-1], 4 * ch[0])), 4 * ch[0], 4 * ch[0])
    h = conv(P, "conv_in", sample, sample.shape[1], ch[0], 3)
    skips = [h]
    for i, kind in enumerate(cfg["down_block_types"]):
        for j in range(lpb):
            h = resnet(P, f"down_blocks.{i}.resnets.{j}", h, temb, ch[i], g, eps)
            if kind.startswith("CrossAttn"):
                h = transformer2d(P, f"down_blocks.{i}.attentions.{j}", h, ctx, heads[i], tl[i], g, lin)
            skips.append(h)
        if i + 1 < nb:
            h = conv(P, f"down_blocks.{i}.downsamplers.0.conv", h, ch[i], ch[i], 3, stride=2, padding=1)
            skips.append(h)
    h = resnet(P, "mid_block.resnets.0", h, temb, ch[-1], g, eps)
    h = transformer2d(P, "mid_block.attentions.0", h, ctx, heads[-1], tl[-1], g, lin)
    h = resnet(P, "mid_block.resnets.1", h, temb, ch[-1], g, eps)
    for i, kind in enumerate(cfg["up_block_types"]):
        r = nb - 1 - i
        for j in range(lpb + 1):
            h = torch.cat([h, skips.pop()], 1)
            h = resnet(P, f"up_blocks.{i}.resnets.{j}", h, temb, ch[r], g, eps)
            if kind.startswith("CrossAttn"):
                h = transformer2d(P, f"up_blocks.{i}.attentions.{j}", h, ctx, heads[r], tl[r], g, lin)
        if i + 1 < nb:
            # diffusers passes upsample_size (the next skip's size) when a latent side is
            # not a multiple of 2**(levels - 1); otherwise that size is twice h's anyway.
            h = F.interpolate(h, size=tuple(skips[-1].shape[2:]), mode="nearest")
            h = conv(P, f"up_blocks.{i}.upsamplers.0.conv", h, ch[r], ch[r], 3)
    h = F.silu(group_norm(P, "conv_norm_out", h, g, eps))
    return conv(P, "conv_out", h, ch[0], cfg["out_channels"], 3)


# ---------------------------------------------------------------- AutoencoderKL

def vae_mid(P, name, h, g):
    c = h.shape[1]
    h = resnet(P, name + ".resnets.0", h, None, c, g, 1e-6)
    n, _, hh, ww = h.shape
    a = group_norm(P, name + ".attentions.0.group_norm", h, g, 1e-6).permute(0, 2, 3, 1).reshape(n, hh * ww, c)
    p = name + ".attentions.0"
    a = attention(P, [p + ".to_q", p + ".to_k", p + ".to_v", p + ".to_out.0"], a, a, 1, True)
    h = h + a.reshape(n, hh, ww, c).permute(0, 3, 1, 2)
    return resnet(P, name + ".resnets.1", h, None, c, g, 1e-6)


def vae_encode(P, cfg, x):
    ch, g, lpb = cfg["block_out_channels"], cfg["norm_num_groups"], cfg["layers_per_block"]
    h = conv(P, "encoder.conv_in", x, x.shape[1], ch[0], 3)
    for i in range(len(ch)):
        for j in range(lpb):
            h = resnet(P, f"encoder.down_blocks.{i}.resnets.{j}", h, None, ch[i], g, 1e-6)
        if i + 1 < len(ch):
            h = conv(P, f"encoder.down_blocks.{i}.downsamplers.0.conv", F.pad(h, (0, 1, 0, 1)), ch[i], ch[i], 3,
                     stride=2, padding=0)
    h = vae_mid(P, "encoder.mid_block", h, g)
    h = conv(P, "encoder.conv_out", F.silu(group_norm(P, "encoder.conv_norm_out", h, g, 1e-6)), ch[-1],
             2 * cfg["latent_channels"], 3)
    return conv(P, "quant_conv", h, 2 * cfg["latent_channels"], 2 * cfg["latent_channels"], 1)


def vae_decode(P, cfg, z):
    ch, g, lpb, L = cfg["block_out_channels"], cfg["norm_num_groups"], cfg["layers_per_block"], cfg["latent_channels"]
    h = conv(P, "post_quant_conv", z, L, L, 1)
    h = conv(P, "decoder.conv_in", h, L, ch[-1], 3)
    h = vae_mid(P, "decoder.mid_block", h, g)
    for i in range(len(ch)):
        out = ch[len(ch) - 1 - i]
        for j in range(lpb + 1):
            h = resnet(P, f"decoder.up_blocks.{i}.resnets.{j}", h, None, out, g, 1e-6)
        if i + 1 < len(ch):
            h = conv(P, f"decoder.up_blocks.{i}.upsamplers.0.conv", F.interpolate(h, scale_factor=2.0, mode="nearest"),
                     out, out, 3)
    h = F.silu(group_norm(P, "decoder.conv_norm_out", h, g, 1e-6))
    return conv(P, "decoder.conv_out", h, ch[0], cfg["out_channels"], 3)


# ---------------------------------------------------------------- CLIP text model

def clip_forward(P, cfg, ids):
    d, V, T = cfg["hidden_size"], cfg["vocab_size"], ids.shape[1]
    if "text_model.embeddings.token_embedding.weight" not in P.p:
        P.p["text_model.embeddings.token_embedding.weight"] = P.randn(V, d)
        P.p["text_model.embeddings.position_embedding.weight"] = 0.1 * P.randn(cfg["max_position_embeddings"], d)
    h = P.p["text_model.embeddings.token_embedding.weight"][ids.long()] + \
        P.p["text_model.embeddings.position_embedding.weight"][:T]
    act = {"quick_gelu": lambda x: x * torch.sigmoid(1.702 * x), "gelu": F.gelu}[cfg["hidden_act"]]
    hidden = [h]
    for l in range(cfg["num_hidden_layers"]):
        b = f"text_model.encoder.layers.{l}"
        a = layer_norm(P, b + ".layer_norm1", h, cfg["layer_norm_eps"])
        h = h + attention(P, [b + ".self_attn.q_proj", b + ".self_attn.k_proj", b + ".self_attn.v_proj",
                              b + ".self_attn.out_proj"], a, a, cfg["num_attention_heads"], True, causal=True)
        a = layer_norm(P, b + ".layer_norm2", h, cfg["layer_norm_eps"])
        h = h + linear(P, b + ".mlp.fc2", act(linear(P, b + ".mlp.fc1", a, d, cfg["intermediate_size"])),
                       cfg["intermediate_size"], d)
        hidden.append(h)
    last = layer_norm(P, "text_model.final_layer_norm", h, cfg["layer_norm_eps"])
    eos = cfg["eos_token_id"]
    at = [(row == eos).nonzero()[0].item() for row in ids]
    pooled = last[torch.arange(ids.shape[0]), torch.tensor(at)]
    out = {"last_hidden_state": last, "penultimate_hidden_state": hidden[-2], "pooled_output": pooled}
    if cfg["architectures"][0] == "CLIPTextModelWithProjection":
        if "text_projection.weight" not in P.p:
            P.weight("text_projection.weight", cfg["projection_dim"], d)
        out["text_embeds"] = F.linear(pooled, P.p["text_projection.weight"])
    return out


# ---------------------------------------------------------------- the checks

def run(hyperion, args):
    subprocess.run([hyperion, "--threads", "2", "diffusion", "forward"] + args, check=True,
                   stdout=subprocess.DEVNULL)


def compare(case, got, want):
    worst = 0.0
    for name, ref in want.items():
        out = got[name]
        assert list(out.shape) == list(ref.shape), f"{case}: {name} shape {list(out.shape)} vs {list(ref.shape)}"
        err = (out - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
        worst = max(worst, err)
        print(f"  {case:28s} {name:26s} max |err| / max |ref| = {err:.2e}")
    return worst <= TOLERANCE


def compare_grads(case, got, want):
    """Every parameter's gradient, each tensor's error relative to its own largest value
    (or to a thousandth of the largest gradient of all, for tensors of tiny gradients)."""
    scale = max(v.abs().max().item() for v in want.values())
    worst, worst_name = 0.0, ""
    for name, ref in want.items():
        assert name in got, f"{case}: hyperion wrote no {name}"
        out = got[name].reshape(ref.shape)
        err = (out - ref).abs().max().item() / max(ref.abs().max().item(), 1e-3 * scale)
        if err > worst:
            worst, worst_name = err, name
    print(f"  {case:28s} {len(want)} parameter gradients, worst {worst:.2e} ({worst_name})")
    return worst <= GRAD_TOLERANCE


def write_component(folder, cfg, params, weights_name, shards=1, conv1x1=()):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    tensors = {}
    for name, t in params.items():
        # SD 1.x stores the transformers' proj_in / proj_out as 1x1 convolutions.
        tensors[name] = t[:, :, None, None] if any(name.endswith(s) for s in conv1x1) and t.dim() == 2 else t
    names = sorted(tensors)
    if shards == 1:
        write_safetensors(os.path.join(folder, weights_name), tensors)
        return
    weight_map = {}
    stem = weights_name[:-len(".safetensors")]
    for s in range(shards):
        file = f"{stem}-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        write_safetensors(os.path.join(folder, file), part)
        weight_map.update({n: file for n in part})
    with open(os.path.join(folder, weights_name + ".index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


UNETS = {
    "unet_sd1": dict(block_out_channels=[32, 64], layers_per_block=1, attention_head_dim=2,
                     down_block_types=["CrossAttnDownBlock2D", "DownBlock2D"],
                     up_block_types=["UpBlock2D", "CrossAttnUpBlock2D"], cross_attention_dim=24,
                     use_linear_projection=False),
    "unet_sd2": dict(block_out_channels=[32, 64, 64], layers_per_block=2, attention_head_dim=[2, 4, 4],
                     down_block_types=["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
                     up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
                     cross_attention_dim=16, use_linear_projection=True),
    "unet_sdxl": dict(block_out_channels=[32, 64], layers_per_block=1, attention_head_dim=[2, 4],
                      transformer_layers_per_block=[1, 2], down_block_types=["DownBlock2D", "CrossAttnDownBlock2D"],
                      up_block_types=["CrossAttnUpBlock2D", "UpBlock2D"], cross_attention_dim=20,
                      use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
                      projection_class_embeddings_input_dim=12 + 6 * 8),
}
# An SD 2.x-shaped UNet on 9 x 7 latents: 9 -> 5 -> 3 and 7 -> 4 -> 2 down, and each map
# upsampled back to its skip's size (not twice its own).
UNETS["unet_sd2_odd"] = UNETS["unet_sd2"]
SIZES = {"unet_sd2_odd": (9, 7)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hyperion", required=True)
    args = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as work:
        g = torch.Generator().manual_seed(0)
        for case, extra in UNETS.items():
            cfg = dict(_class_name="UNet2DConditionModel", in_channels=4, out_channels=4, sample_size=8,
                       norm_num_groups=8, norm_eps=1e-5, flip_sin_to_cos=True, freq_shift=0, **extra)
            P = Params(len(case) * 31 + ord(case[-1]))
            n, (hgt, wid) = 2, SIZES.get(case, (8, 8))
            sample = torch.randn(n, 4, hgt, wid, generator=g)
            t = torch.tensor([999.0, 14.5])
            ctx = torch.randn(n, 5, cfg["cross_attention_dim"], generator=g)
            inputs = {"sample": sample, "timesteps": t, "encoder_hidden_states": ctx}
            kw = {}
            if cfg.get("addition_embed_type") == "text_time":
                kw = dict(text_embeds=torch.randn(n, 12, generator=g),
                          time_ids=torch.tensor([[16.0, 16.0, 0.0, 0.0, 16.0, 16.0], [24.0, 16.0, 4.0, 0.0, 16.0, 16.0]]))
                inputs.update(kw)
            want = unet_forward(P, cfg, sample, t, ctx, **kw)
            # The backward pass: gradients of sum(R * output) for every parameter.
            for v in P.p.values():
                v.requires_grad_(True)
            want = unet_forward(P, cfg, sample, t, ctx, **kw)
            R = torch.randn(want.shape, generator=g)
            (want * R).sum().backward()
            inputs["grad_sample"] = R
            grads = {"grad." + k: v.grad for k, v in P.p.items()}
            want = want.detach()
            folder = os.path.join(work, case)
            write_component(folder, cfg, P.p, "diffusion_pytorch_model.safetensors", shards=2,
                            conv1x1=() if cfg["use_linear_projection"] else (".proj_in.weight", ".proj_out.weight"))
            write_safetensors(os.path.join(work, case + "_in.safetensors"), inputs)
            run(args.hyperion, ["--component", "unet", "--dir", folder, "--inputs", os.path.join(work, case + "_in.safetensors"),
                                "--output", os.path.join(work, case + "_out.safetensors")])
            got = read_safetensors(os.path.join(work, case + "_out.safetensors"))
            ok &= compare(case, got, {"sample": want})
            ok &= compare_grads(case, got, grads)

        cfg = dict(_class_name="AutoencoderKL", in_channels=3, out_channels=3, latent_channels=4,
                   block_out_channels=[16, 32], layers_per_block=1, norm_num_groups=8, sample_size=16,
                   scaling_factor=0.18215, down_block_types=["DownEncoderBlock2D"] * 2,
                   up_block_types=["UpDecoderBlock2D"] * 2)
        P = Params(7)
        images = torch.rand(2, 3, 16, 16, generator=g) * 2 - 1
        latents = torch.randn(2, 4, 6, 6, generator=g)
        want = {"moments": vae_encode(P, cfg, images), "decoded": vae_decode(P, cfg, latents)}
        # Both backward passes at once: gradients of sum(R1 * moments) + sum(R2 * decoded).
        for v in P.p.values():
            v.requires_grad_(True)
        latents.requires_grad_(True)
        m, d = vae_encode(P, cfg, images), vae_decode(P, cfg, latents)
        r1, r2 = torch.randn(m.shape, generator=g), torch.randn(d.shape, generator=g)
        ((m * r1).sum() + (d * r2).sum()).backward()
        grads = {"grad." + k: v.grad for k, v in P.p.items()}
        grads["grad_latents"] = latents.grad
        latents = latents.detach()
        folder = os.path.join(work, "vae")
        write_component(folder, cfg, P.p, "diffusion_pytorch_model.safetensors")
        write_safetensors(os.path.join(work, "vae_in.safetensors"),
                          {"images": images, "latents": latents, "grad_moments": r1, "grad_decoded": r2})
        run(args.hyperion, ["--component", "vae", "--dir", folder, "--inputs", os.path.join(work, "vae_in.safetensors"),
                            "--output", os.path.join(work, "vae_out.safetensors")])
        got = read_safetensors(os.path.join(work, "vae_out.safetensors"))
        ok &= compare("vae", got, want)
        ok &= compare_grads("vae", got, grads)

        for case, act, arch in [("clip_text", "quick_gelu", "CLIPTextModel"),
                                ("clip_text_projection", "gelu", "CLIPTextModelWithProjection")]:
            cfg = dict(architectures=[arch], model_type="clip_text_model", vocab_size=100, hidden_size=32,
                       intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=16,
                       hidden_act=act, layer_norm_eps=1e-5, projection_dim=24, eos_token_id=99)
            P = Params(11)
            ids = torch.randint(0, 98, (2, 16), generator=g, dtype=torch.int32)
            ids[0, 5:] = 99  # end token then padding with it (SD 1.x)
            ids[1, 9] = 99   # end token then other padding (OpenCLIP's "!")
            ids[1, 10:] = 0
            want = clip_forward(P, cfg, ids)
            P.p["text_model.embeddings.position_ids"] = torch.arange(16, dtype=torch.int32)[None, :]
            folder = os.path.join(work, case)
            write_component(folder, cfg, P.p, "model.safetensors")
            write_safetensors(os.path.join(work, case + "_in.safetensors"), {"input_ids": ids})
            run(args.hyperion, ["--component", "text_encoder", "--dir", folder,
                                "--inputs", os.path.join(work, case + "_in.safetensors"),
                                "--output", os.path.join(work, case + "_out.safetensors")])
            ok &= compare(case, read_safetensors(os.path.join(work, case + "_out.safetensors")), want)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
