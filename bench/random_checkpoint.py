#!/usr/bin/env python3
"""Writes a Hugging Face checkpoint directory of a Llama-family shape with random weights
(normal(0, 0.02) matrices, unit norms), in bf16, for benchmarks that need the same weights
in hyperion and in a peer (llama.cpp via `hyperion convert --to gguf`).

  python3 bench/random_checkpoint.py --out /tmp/l1b --tokenizer DIR [--shape llama3.2-1b]

DIR holds the tokenizer (tokenizer.json + tokenizer_config.json), copied beside the
weights. Only torch is needed (the safetensors file is written directly).
"""
import argparse
import json
import os
import shutil
import struct

import torch

SHAPES = {
    # Llama 3.2 1B (tied embeddings, Llama 3.1 RoPE scaling as its config.json has it).
    "llama3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                        tie_word_embeddings=True, rope_theta=500000.0, max_position_embeddings=131072,
                        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                        bos_token_id=128000, eos_token_id=128001),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = dict(SHAPES[args.shape], model_type="llama", architectures=["LlamaForCausalLM"],
               rms_norm_eps=1e-5, hidden_act="silu", torch_dtype="bfloat16")
    d, f, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = d // h
    g = torch.Generator().manual_seed(args.seed)
    tensors = [("model.embed_tokens.weight", (cfg["vocab_size"], d))]
    for i in range(L):
        p = f"model.layers.{i}."
        tensors += [(p + "input_layernorm.weight", (d,)), (p + "self_attn.q_proj.weight", (h * hd, d)),
                    (p + "self_attn.k_proj.weight", (kv * hd, d)), (p + "self_attn.v_proj.weight", (kv * hd, d)),
                    (p + "self_attn.o_proj.weight", (d, h * hd)), (p + "post_attention_layernorm.weight", (d,)),
                    (p + "mlp.gate_proj.weight", (f, d)), (p + "mlp.up_proj.weight", (f, d)),
                    (p + "mlp.down_proj.weight", (d, f))]
    tensors.append(("model.norm.weight", (d,)))
    if not cfg["tie_word_embeddings"]:
        tensors.append(("lm_head.weight", (cfg["vocab_size"], d)))
    os.makedirs(args.out, exist_ok=True)
    header, offset = {}, 0
    for name, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    header["__metadata__"] = {"format": "pt"}
    hjson = json.dumps(header).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    path = os.path.join(args.out, "model.safetensors")
    with open(path + ".tmp", "wb") as out:
        out.write(struct.pack("<Q", len(hjson)))
        out.write(hjson)
        for name, shape in tensors:
            if len(shape) == 1:
                t = torch.ones(shape, dtype=torch.bfloat16)
            else:
                t = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
            out.write(t.view(torch.int16).numpy().tobytes())
    os.replace(path + ".tmp", path)
    with open(os.path.join(args.out, "config.json"), "w") as out:
        json.dump(cfg, out, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(args.tokenizer, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(args.out, name))
    print(f"wrote {args.out} ({offset / 2**30:.2f} GiB of bf16 weights)")


if __name__ == "__main__":
    main()
