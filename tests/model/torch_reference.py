#!/usr/bin/env python3
"""End-to-end check of hyperion against an independent PyTorch Llama and Gemma (float64).

Run by CTest as
    /usr/bin/python3 tests/model/torch_reference.py --hyperion build/release/hyperion
Exit status 0 means pass; prints "SKIP" and exits 0 when torch is not importable.

For tiny model shapes (GQA/untied/remat none; MQA/tied/head_dim != dim/heads/custom
rope_theta and rms_norm_eps/remat full; a Gemma, decoder_block=gemma, with
GemmaForCausalLM's (1 + w) norms, GELU-tanh MLP and sqrt(hidden) embedding scale; Llama
3.1's scaled RoPE with attention biases on q/k/v/o; a Qwen2 (q/k/v biases) with YaRN RoPE
over positions past its original context; a Qwen3 (per-head q/k RMSNorm) with linear
RoPE scaling) it:
  1. prepares a synthetic corpus with `hyperion data prepare` and trains 3 steps in f32
     on a small split that fits in one batch (so every step sees every sequence and the
     step is reproducible without knowing the loader's shuffle), checkpointing each step;
  2. loads each checkpoint's model.safetensors into the reference below, written from the
     Hugging Face LlamaForCausalLM definitions (embedding, RMSNorm, rotate-half RoPE,
     grouped-query attention via repeat_kv, SwiGLU MLP, final norm, lm_head or tied), with
     modeling_rope_utils' default/linear/llama3/yarn inverse frequencies and attention
     factor, and Qwen2's biases and Qwen3's q_norm/k_norm;
  3. training step: the loss and pre-clipping gradient norm hyperion logged at step k
     must match the reference's loss and autograd gradient at checkpoint k-1, and the
     AdamW update (torch.optim.AdamW semantics, clipping, no decay on norms/embeddings)
     applied to checkpoint k-1 must give checkpoint k's weights and moments;
  4. `hyperion eval --shard` (mean next-token loss over stride-seq_len windows) must match
     the reference on the held-out shard, for the trained weights and for a copy with
     sharpened weights (scaled projections, random norm gains) where attention patterns
     and logits are far from uniform, so an error anywhere shows in the loss;
  5. `hyperion generate --temperature 0` must produce exactly the reference's greedy
     tokens (prompt tokenized by `hyperion data prepare --tokenizer`, since the Python
     here has no sentencepiece module; checked against `eval --text`).
"""

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable by", sys.executable)
    sys.exit(0)
import numpy as np

torch.set_default_dtype(torch.float64)

# f32 hyperion vs f64 reference: relative agreement required on losses and norms.
REL_TOL = 1e-4
# AdamW update: |predicted - actual| per element, in units of the learning rate.
UPDATE_TOL = 1e-3
# bf16 compute (`eval --dtype bfloat16`) vs the f64 reference: the mean loss averages the
# rounding of 8-bit mantissas (observed 1e-5 to 1e-4 relative); a real error is far larger.
BF16_REL_TOL = 5e-3

FAILURES = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


# ---------------------------------------------------------------- files


def read_safetensors(path):
    """name -> numpy f32 array (copy), plus the metadata dict."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", f"{path}: {name} is {info['dtype']}, expected F32"
        a, b = info["data_offsets"]
        arr = np.frombuffer(data, dtype="<f4", count=(b - a) // 4, offset=8 + n + a)
        out[name] = arr.reshape(info["shape"]).copy()
    return out, meta


def write_safetensors(path, tensors, meta):
    header, blobs, off = {"__metadata__": meta}, [], 0
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def to_bf16_bits(arr):
    """float32 -> bfloat16 bits (round to nearest even), as uint16."""
    u = np.ascontiguousarray(arr, dtype="<f4").view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def from_bf16_bits(bits):
    return (bits.astype("<u4") << 16).view("<f4")


def write_hf_directory(path, config, weights, tokenizer, shards=2):
    """A model directory as the Hub lays it out: bf16 weights in `shards`
    model-0000k-of-0000n.safetensors files, model.safetensors.index.json, config.json,
    tokenizer.model. Returns the weights as the bf16 values hold them (float32)."""
    os.makedirs(path)
    names = list(weights)
    per = (len(names) + shards - 1) // shards
    weight_map, held, total = {}, {}, 0
    for i in range(shards):
        fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
        for name in names[i * per : (i + 1) * per]:
            bits = to_bf16_bits(weights[name])
            held[name] = from_bf16_bits(bits).reshape(weights[name].shape)
            b = bits.tobytes()
            header[name] = {"dtype": "BF16", "shape": list(weights[name].shape),
                            "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
            weight_map[name] = fn
        total += off
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(os.path.join(path, fn), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    cfg = dict(config, torch_dtype="bfloat16")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    shutil.copy(tokenizer, path)
    return held


def check_finetune(hyp, case, hf_dir, hf, weights, small, train_tokens, seq, batch, out, steps):
    """`train load_parameters_path=HF_DIR`: the losses of `steps` steps equal a float64
    reference that starts from the same (bf16) weights and runs its own AdamW."""
    hyp.run("train", f"dataset_path={small}", f"load_parameters_path={hf_dir}",
            f"max_target_length={seq}", f"per_device_batch_size={batch}", f"steps={steps}",
            "learning_rate=1e-3", "lr_schedule=constant", "warmup_steps_fraction=0",
            "dtype=float32", "sample_count=0", "peak_tflops=1", f"base_output_directory={out}",
            f"run_name={case}", "eval_interval=0", "checkpoint_period=0", "remat_policy=none")
    run_dir = os.path.join(out, case)
    metrics = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    ckpt = os.path.join(run_dir, "checkpoints", str(steps))
    cfg = json.load(open(os.path.join(ckpt, "trainer_state.json")))["config"]
    inputs, targets = training_batch(train_tokens, seq)
    params = {n: w.astype(np.float64) for n, w in weights.items()}
    m = {n + ".exp_avg": np.zeros_like(w) for n, w in params.items()}
    v = {n + ".exp_avg_sq": np.zeros_like(w) for n, w in params.items()}
    worst = 0.0
    for k in range(1, steps + 1):
        model = RefLlama(hf, params, requires_grad=True)
        loss, _ = model.loss(inputs, targets)
        loss.backward()
        grads = {n: t.grad.numpy() for n, t in model.w.items()}
        gnorm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        got = metrics[k - 1]
        # Relative to the loss, or to 1 once the small split is nearly memorised (a loss of
        # 0.01 carries f32's rounding of the logits, not a relative error of the model).
        err = abs(got["loss"] - float(loss)) / max(abs(float(loss)), 1.0)
        worst = max(worst, err)
        if k == 1 or k == steps:
            check(err < REL_TOL,
                  f"{case} fine-tune step {k}: loss hyperion {got['loss']:.8f} ref {float(loss):.8f}")
        params, mm, vv = adamw_reference(cfg, params, grads, m, v, got["lr"], k, gnorm)
        m = {n + ".exp_avg": a for n, a in mm.items()}
        v = {n + ".exp_avg_sq": a for n, a in vv.items()}
    check(worst < REL_TOL, f"{case} fine-tune: {steps} steps, worst loss diff {worst:.1e} "
                           "(relative to max(loss, 1))")
    # The result is a checkpoint of the same family that loads back.
    saved = json.load(open(os.path.join(ckpt, "config.json")))
    check(saved["model_type"] == hf["model_type"] and saved.get("rope_scaling") == hf.get("rope_scaling"),
          f"{case} fine-tune: checkpoint config.json model_type {saved['model_type']}")


def training_batch(train_tokens, seq):
    """The one batch every step trains on: all whole sequences of seq + 1 tokens."""
    S = (len(train_tokens) - 1) // seq
    seqs = np.stack([train_tokens[i * seq : i * seq + seq + 1] for i in range(S)])
    return torch.from_numpy(seqs[:, :-1]), torch.from_numpy(seqs[:, 1:])


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"HYPTOKS1", f"{path}: bad magic"
    _version, token_bytes, count, _vocab, _ = struct.unpack_from("<IIQII", data, 8)
    dt = {2: "<u2", 4: "<u4"}[token_bytes]
    return np.frombuffer(data, dtype=dt, count=count, offset=32).astype(np.int64)


# ---------------------------------------------------------------- reference model


class RefLlama:
    """LlamaForCausalLM forward in float64 from a checkpoint's config.json and weights."""

    def __init__(self, config, weights, requires_grad=False):
        self.c = config
        self.w = {
            k: torch.tensor(v, dtype=torch.float64, requires_grad=requires_grad) for k, v in weights.items()
        }

    def gemma(self):
        return self.c.get("model_type") in ("gemma", "gemma2", "gemma3_text")

    def rmsnorm(self, x, w):
        # GemmaRMSNorm (Gemma 1-3) scales by (1 + w); LlamaRMSNorm by w.
        scale = 1.0 + w if self.gemma() else w
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"]) * scale

    def sliding(self, layer):
        """Whether a layer attends through the sliding window (and how wide it is)."""
        c = self.c
        if c["model_type"] in ("mistral", "mixtral"):
            return c.get("sliding_window")
        if c["model_type"] in ("gemma2", "gemma3_text"):
            return c["sliding_window"] if c["layer_types"][layer] == "sliding_attention" else None
        return None

    def rope_tables(self, T, local=False):
        """cos, sin [T, hd] as modeling_rope_utils computes them (in float64 here); local:
        Gemma 3's sliding layers (rope_local_base_freq, unscaled)."""
        c = self.c
        hd, base = c["head_dim"], c["rope_theta"]
        rs = c.get("rope_scaling") or {}
        if local:
            base, rs = c["rope_local_base_freq"], {}
        kind = rs.get("rope_type", rs.get("type", "default"))
        inv_freq = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        attention_factor = 1.0
        if kind == "linear":
            inv_freq = inv_freq / rs["factor"]
        elif kind == "llama3":
            factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
            old = rs["original_max_position_embeddings"]
            wavelen = 2 * math.pi / inv_freq
            scaled = torch.where(wavelen > old / lo, inv_freq / factor, inv_freq)
            smooth = (old / wavelen - lo) / (hi - lo)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
            inv_freq = torch.where(medium, smoothed, scaled)
        elif kind == "yarn":
            factor, old = rs["factor"], rs["original_max_position_embeddings"]
            attention_factor = rs.get("attention_factor") or (0.1 * math.log(factor) + 1.0)
            fast, slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1
            corr = lambda rot: hd * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(base))
            low, high = math.floor(corr(fast)), math.ceil(corr(slow))
            low, high = max(low, 0), min(high, hd - 1)
            if low == high:
                high += 0.001
            ramp = ((torch.arange(hd // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
            extrapolation = 1 - ramp
            inv_freq = inv_freq / factor * (1 - extrapolation) + inv_freq * extrapolation
        else:
            assert kind == "default", kind
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * attention_factor, emb.sin() * attention_factor

    def head_rmsnorm(self, x, w):
        """Qwen3's and Gemma 3's q_norm / k_norm: RMSNorm over head_dim (Gemma's (1 + w))."""
        return self.rmsnorm(x, w)

    def proj(self, h, p, name):
        y = h @ self.w[p + name + ".weight"].T
        if p + name + ".bias" in self.w:
            y = y + self.w[p + name + ".bias"]
        return y

    @staticmethod
    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    def logits(self, ids):
        """ids: LongTensor [B, T] (positions 0..T-1) -> logits [B, T, V]."""
        c, w = self.c, self.w
        B, T = ids.shape
        H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        tables = {}
        for local in (False, True):
            if local and "rope_local_base_freq" not in c:
                continue
            cos, sin = self.rope_tables(T, local)
            tables[local] = (cos[None, None], sin[None, None])  # [1, 1, T, hd]
        causal = torch.full((T, T), float("-inf")).triu(1)
        # Gemma 2/3: scores scaled by query_pre_attn_scalar^-0.5 and (Gemma 2) soft-capped.
        scaling = c.get("query_pre_attn_scalar", hd) ** -0.5
        attn_cap = c.get("attn_logit_softcapping")
        post_norms = c["model_type"] in ("gemma2", "gemma3_text")
        x = w["model.embed_tokens.weight"][ids]
        if self.gemma():  # GemmaModel: inputs_embeds * sqrt(hidden_size)
            x = x * math.sqrt(c["hidden_size"])
        for l in range(c["num_hidden_layers"]):
            p = f"model.layers.{l}."
            h = self.rmsnorm(x, w[p + "input_layernorm.weight"])
            q = self.proj(h, p, "self_attn.q_proj").view(B, T, H, hd)
            k = self.proj(h, p, "self_attn.k_proj").view(B, T, KV, hd)
            if p + "self_attn.q_norm.weight" in w:  # Qwen3: per head, before RoPE
                q = self.head_rmsnorm(q, w[p + "self_attn.q_norm.weight"])
                k = self.head_rmsnorm(k, w[p + "self_attn.k_norm.weight"])
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = self.proj(h, p, "self_attn.v_proj").view(B, T, KV, hd).transpose(1, 2)
            window = self.sliding(l)
            cos, sin = tables[True] if window and True in tables else tables[False]
            q = q * cos + self.rotate_half(q) * sin
            k = k * cos + self.rotate_half(k) * sin
            k = k.repeat_interleave(H // KV, dim=1)  # repeat_kv
            v = v.repeat_interleave(H // KV, dim=1)
            # The sliding window: query i sees keys j with i - W < j <= i.
            mask = causal + torch.full((T, T), float("-inf")).tril(-window) if window else causal
            scores = q @ k.transpose(-1, -2) * scaling
            if attn_cap:
                scores = torch.tanh(scores / attn_cap) * attn_cap
            att = torch.softmax(scores + mask, dim=-1) @ v
            o = self.proj(att.transpose(1, 2).reshape(B, T, H * hd), p, "self_attn.o_proj")
            if post_norms:  # Gemma 2/3: the block's output normalised before the residual
                x = x + self.rmsnorm(o, w[p + "post_attention_layernorm.weight"])
                h = self.rmsnorm(x, w[p + "pre_feedforward_layernorm.weight"])
            else:
                x = x + o
                h = self.rmsnorm(x, w[p + "post_attention_layernorm.weight"])
            gate = h @ w[p + "mlp.gate_proj.weight"].T
            if self.gemma():  # hidden_activation gelu_pytorch_tanh
                g = torch.nn.functional.gelu(gate, approximate="tanh")
            else:
                g = torch.nn.functional.silu(gate)
            u = h @ w[p + "mlp.up_proj.weight"].T
            m = (g * u) @ w[p + "mlp.down_proj.weight"].T
            if post_norms:
                m = self.rmsnorm(m, w[p + "post_feedforward_layernorm.weight"])
            x = x + m
        x = self.rmsnorm(x, w["model.norm.weight"])
        head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
        logits = x @ head.T
        if c.get("final_logit_softcapping"):  # Gemma 2
            cap = c["final_logit_softcapping"]
            logits = torch.tanh(logits / cap) * cap
        return logits

    def loss(self, inputs, targets):
        """Mean cross entropy over targets != -1 (sum, count returned too)."""
        lg = self.logits(inputs)
        ce = torch.nn.functional.cross_entropy(
            lg.reshape(-1, lg.shape[-1]), targets.reshape(-1), ignore_index=-1, reduction="sum"
        )
        n = int((targets != -1).sum())
        return ce / n, n

    def stream_loss(self, tokens, seq):
        """hyperion eval's loss: windows of seq+1 tokens with stride seq, last one partial."""
        total = len(tokens)
        windows = (total - 1 + seq - 1) // seq
        inp = np.zeros((windows, seq), dtype=np.int64)
        tgt = np.full((windows, seq), -1, dtype=np.int64)
        for w in range(windows):
            chunk = tokens[w * seq : w * seq + seq + 1]
            inp[w, : len(chunk) - 1] = chunk[:-1]
            tgt[w, : len(chunk) - 1] = chunk[1:]
        with torch.no_grad():
            loss, n = self.loss(torch.from_numpy(inp), torch.from_numpy(tgt))
        return float(loss), n

    def greedy(self, prompt, n, eos):
        ids, out, margins = list(prompt), [], []
        with torch.no_grad():
            for _ in range(n):
                lg = self.logits(torch.tensor([ids]))[0, -1]
                top = torch.topk(lg, 2)
                tok = int(top.indices[0])
                out.append(tok)
                margins.append(float(top.values[0] - top.values[1]))
                if tok == eos or len(ids) + 1 > self.c["max_position_embeddings"]:
                    break
                ids.append(tok)
        return out, margins


# ---------------------------------------------------------------- hyperion runs


class Hyperion:
    def __init__(self, binary, threads):
        self.binary, self.threads = binary, threads

    def run(self, *args, cwd=None):
        cmd = [self.binary, "--threads", str(self.threads), *map(str, args)]
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}\n")
            raise SystemExit(1)
        return r.stdout

    def json(self, *args):
        return json.loads(self.run(*args, "--json"))


def make_corpus(path, docs, seed):
    """Sentences over a small invented lexicon (deterministic)."""
    rng = np.random.RandomState(seed)
    syl = ["ka", "lo", "mi", "ru", "te", "an", "or", "si", "ve", "du", "pa", "ne", "gi", "ho"]
    words = ["".join(rng.choice(syl, rng.randint(1, 4))) for _ in range(120)]
    words += ["the", "a", "of", "and", "to", "in", "is", "it"] * 6
    out = []
    for _ in range(docs):
        sents = []
        for _ in range(rng.randint(1, 4)):
            s = " ".join(rng.choice(words, rng.randint(3, 10)))
            sents.append(s[0].upper() + s[1:] + rng.choice([".", ".", "!", "?"]))
        out.append(" ".join(sents))
    with open(path, "w") as f:
        f.write("\n\n".join(out) + "\n")


def sharpen(weights, seed, norm_offset=0.0):
    """A copy far from the near-uniform early-training regime: every matrix gets random
    noise of a unit-gain scale (gain / sqrt(fan_in)), larger for q/k (peaked attention)
    and the head (peaked logits), and the norm gains (w + norm_offset) are randomised."""
    rng = np.random.RandomState(seed)
    gain = {"q_proj": 2.5, "k_proj": 2.5, "v_proj": 1.0, "o_proj": 1.0, "gate_proj": 1.5,
            "up_proj": 1.5, "down_proj": 1.0, "lm_head": 4.0, "embed_tokens": 4.0}
    out = {}
    for name, w in weights.items():
        if name.endswith("norm.weight"):
            out[name] = (w + norm_offset) * rng.uniform(0.5, 1.5, w.shape) - norm_offset
        elif name.endswith(".bias"):
            out[name] = w + rng.normal(0.0, 0.5, w.shape)
        else:
            g = next(s for key, s in gain.items() if key in name)
            out[name] = w + rng.normal(0.0, g / math.sqrt(w.shape[1]), w.shape)
        out[name] = out[name].astype(np.float32)
    return out


def adamw_reference(cfg, params, grads, m, v, lr, t, grad_norm):
    """One torch.optim.AdamW step as hyperion applies it (float64)."""
    b1, b2 = float(cfg["adam_b1"]), float(cfg["adam_b2"])
    eps, wd = float(cfg["adam_eps"]), float(cfg["adam_weight_decay"])
    clip = float(cfg["gradient_clipping_threshold"])
    exclude = cfg["weight_decay_exclude_norms_and_embeddings"] == "true"
    scale = clip / (grad_norm + 1e-6) if clip > 0 and grad_norm > clip else 1.0
    new_p, new_m, new_v = {}, {}, {}
    for name, p in params.items():
        p = p.astype(np.float64)
        g = grads[name] * scale
        is_matrix = not (name.endswith("norm.weight") or name.endswith(".bias")
                         or name == "model.embed_tokens.weight")
        decay = wd if (is_matrix or not exclude) else 0.0
        p = p - lr * decay * p
        mm = b1 * m[name + ".exp_avg"] + (1 - b1) * g
        vv = b2 * v[name + ".exp_avg_sq"] + (1 - b2) * g * g
        p = p - lr / (1 - b1**t) * mm / (np.sqrt(vv) / math.sqrt(1 - b2**t) + eps)
        new_p[name], new_m[name], new_v[name] = p, mm, vv
    return new_p, new_m, new_v


# ---------------------------------------------------------------- checks


def check_training(case, run_dir, train_tokens, seq):
    metrics = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    ckpt = lambda s: os.path.join(run_dir, "checkpoints", str(s))
    cfg = json.load(open(os.path.join(ckpt(1), "trainer_state.json")))["config"]
    hf = json.load(open(os.path.join(ckpt(1), "config.json")))
    inputs, targets = training_batch(train_tokens, seq)
    for k in range(2, len(metrics) + 1):
        w, _ = read_safetensors(os.path.join(ckpt(k - 1), "model.safetensors"))
        opt, _ = read_safetensors(os.path.join(ckpt(k - 1), "optimizer.safetensors"))
        model = RefLlama(hf, w, requires_grad=True)
        loss, _ = model.loss(inputs, targets)
        loss.backward()
        grads = {n: t.grad.numpy() for n, t in model.w.items()}
        gnorm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        m = metrics[k - 1]
        check(rel(m["loss"], float(loss)) < REL_TOL,
              f"{case} step {k}: loss hyperion {m['loss']:.8f} ref {float(loss):.8f} "
              f"(rel {rel(m['loss'], float(loss)):.1e})")
        check(rel(m["grad_norm"], gnorm) < REL_TOL,
              f"{case} step {k}: grad_norm hyperion {m['grad_norm']:.8f} ref {gnorm:.8f} "
              f"(rel {rel(m['grad_norm'], gnorm):.1e})")
        # The update itself, from the reference gradient and checkpoint k-1's moments.
        new_w, _ = read_safetensors(os.path.join(ckpt(k), "model.safetensors"))
        new_opt, meta = read_safetensors(os.path.join(ckpt(k), "optimizer.safetensors"))
        pp, pm, pv = adamw_reference(cfg, w, grads, opt, opt, m["lr"], k, gnorm)
        upd = max(float(np.abs(pp[n] - new_w[n]).max()) for n in w) / m["lr"]
        mom = max(float(np.abs(pm[n] - new_opt[n + ".exp_avg"]).max() / (np.abs(pm[n]).max() + 1e-30))
                  for n in w)
        sq = max(float(np.abs(pv[n] - new_opt[n + ".exp_avg_sq"]).max() / (np.abs(pv[n]).max() + 1e-30))
                 for n in w)
        check(upd < UPDATE_TOL and mom < REL_TOL and sq < REL_TOL,
              f"{case} step {k}: AdamW weights max err {upd:.1e} x lr, exp_avg {mom:.1e}, "
              f"exp_avg_sq {sq:.1e} (relative to each tensor's max)")
        check(meta.get("step") == str(k), f"{case} step {k}: optimizer.safetensors step {meta.get('step')}")


def check_eval(hyp, case, ckpt_dir, model, shard, seqs):
    tokens = read_shard(shard)
    for i, (seq, batch) in enumerate(seqs):
        want, n = model.stream_loss(tokens, seq)
        for dtype, tol in [("float32", REL_TOL), ("bfloat16", BF16_REL_TOL)][: 2 if i == 0 else 1]:
            got = hyp.json("eval", "--checkpoint", ckpt_dir, "--shard", shard, "--seq-len", seq,
                           "--batch", batch, "--dtype", dtype)
            check(got["tokens"] == n and rel(got["loss"], want) < tol,
                  f"{case}: eval {dtype} seq {seq} batch {batch}: loss hyperion {got['loss']:.8f} "
                  f"ref {want:.8f} (rel {rel(got['loss'], want):.1e}), tokens {got['tokens']} vs {n}")


def check_generate(hyp, case, ckpt_dir, model, prompt_text, prompt_ids, max_tokens):
    got = hyp.json("generate", "--checkpoint", ckpt_dir, "--prompt", prompt_text,
                   "--temperature", 0, "--max-tokens", max_tokens)
    eos = model.c["eos_token_id"]
    hyp_tokens = got["tokens"] + ([eos] if got["finish_reason"] == "stop" else [])
    want, margins = model.greedy(prompt_ids, max_tokens, eos)
    same = hyp_tokens == want
    note = ""
    if not same:
        i = next((j for j in range(min(len(want), len(hyp_tokens))) if want[j] != hyp_tokens[j]), None)
        if i is not None:
            note = f"; first difference at {i}, reference top-2 margin there {margins[i]:.2e}"
    check(same, f"{case}: greedy generate hyperion {hyp_tokens} ref {want}{note}")
    return want


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hyperion", required=True, help="path to the hyperion binary")
    ap.add_argument("--threads", type=int, default=2, help="hyperion worker threads")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    args = ap.parse_args()
    hyp = Hyperion(os.path.abspath(args.hyperion), args.threads)
    torch.set_num_threads(1)
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="hyperion_torch_ref_")
    try:
        # Corpus -> tokenizer + shards; a small split of the same tokenizer for training.
        make_corpus(os.path.join(tmp, "corpus.txt"), 300, seed=1)
        make_corpus(os.path.join(tmp, "small.txt"), 6, seed=2)
        ds, small = os.path.join(tmp, "ds"), os.path.join(tmp, "small")
        info = hyp.json("data", "prepare", "--input", os.path.join(tmp, "corpus.txt"),
                        "--output", ds, "--vocab-size", 384)
        vocab = info["vocab_size"]
        hyp.json("data", "prepare", "--input", os.path.join(tmp, "small.txt"), "--output", small,
                 "--tokenizer", os.path.join(ds, "tokenizer.model"), "--val-fraction", 0)
        # The prompt, tokenized the way `generate` does (BOS + encode), via a one-doc shard.
        prompt_text = "Kalo the mi"
        with open(os.path.join(tmp, "prompt.txt"), "w") as f:
            f.write(prompt_text + "\n")
        hyp.json("data", "prepare", "--input", os.path.join(tmp, "prompt.txt"), "--output",
                 os.path.join(tmp, "prompt"), "--tokenizer", os.path.join(ds, "tokenizer.model"),
                 "--val-fraction", 0)
        prompt_ids = [int(t) for t in read_shard(os.path.join(tmp, "prompt", "train.bin"))[:-1]]
        print(f"vocab {vocab}, prompt {prompt_text!r} -> {prompt_ids}")

        seq = 32
        train_tokens = read_shard(os.path.join(small, "train.bin"))
        batch = (len(train_tokens) - 1) // seq  # every sequence in every step
        assert batch >= 2, f"small split too short ({len(train_tokens)} tokens)"
        cases = {
            "gqa-untied": ["base_num_query_heads=4", "base_num_kv_heads=2", "base_mlp_dim=96",
                           "remat_policy=none"],
            "mqa-tied": ["base_num_query_heads=4", "base_num_kv_heads=1", "head_dim=24",
                         "base_mlp_dim=80", "logits_via_embedding=true", "rope_max_timescale=500",
                         "normalization_layer_epsilon=1e-6", "remat_policy=full"],
            # GemmaForCausalLM: (1 + w) norms, GELU-tanh, sqrt(hidden) embedding scale, tied.
            "gemma": ["decoder_block=gemma", "base_num_query_heads=4", "base_num_kv_heads=1",
                      "head_dim=24", "base_mlp_dim=80", "normalization_layer_epsilon=1e-6",
                      "remat_policy=minimal"],
            # Llama 3.1's scaled RoPE (head_dim 16, theta 500: the 8 frequencies fall in the
            # high, medium and low bands of an original context of 64), attention_bias on
            # q/k/v/o.
            "llama3-rope-bias": ["decoder_block=llama3", "base_num_query_heads=4",
                                 "base_num_kv_heads=2", "base_mlp_dim=96", "rope_max_timescale=500",
                                 "rope_type=llama3", "rope_factor=8", "rope_low_freq_factor=1",
                                 "rope_high_freq_factor=4", "original_max_position_embeddings=64",
                                 "attention_bias=true", "remat_policy=none"],
            # Qwen2: q/k/v biases; YaRN over positions past an original context of 16.
            "qwen2-yarn": ["decoder_block=qwen2", "base_num_query_heads=4", "base_num_kv_heads=2",
                           "base_mlp_dim=96", "rope_max_timescale=1000", "rope_type=yarn",
                           "rope_factor=4", "original_max_position_embeddings=16",
                           "remat_policy=minimal"],
            # Qwen3: per-head q/k RMSNorm before RoPE, head_dim != dim/heads, linear scaling.
            "qwen3-linear": ["decoder_block=qwen3", "base_num_query_heads=4",
                             "base_num_kv_heads=2", "head_dim=24", "base_mlp_dim=80",
                             "rope_type=linear", "rope_factor=2", "remat_policy=full"],
            # Mistral v0.1: a sliding window (5 positions, well inside the 32 trained and the
            # evaluated windows) on every layer; written as MistralForCausalLM.
            "mistral-window": ["decoder_block=mistral", "base_num_query_heads=4",
                               "base_num_kv_heads=2", "base_mlp_dim=96", "sliding_window_size=5",
                               "remat_policy=minimal"],
            # Gemma 2: pre and post norms, scores and logits soft-capped (caps small enough
            # that the sharpened copy bends them), query_pre_attn_scalar, layer 0 local
            # (a 5-token window), layer 1 global.
            "gemma2": ["decoder_block=gemma2", "base_num_query_heads=4", "base_num_kv_heads=2",
                       "head_dim=24", "base_mlp_dim=80", "normalization_layer_epsilon=1e-6",
                       "sliding_window_size=5", "attn_logits_soft_cap=3", "final_logits_soft_cap=5",
                       "query_pre_attn_scalar=16", "remat_policy=minimal"],
            # Gemma 3: Gemma 2's norms plus q/k norms, no caps, layer 0 local on its own
            # RoPE base (10), layer 1 global (1000).
            "gemma3": ["decoder_block=gemma3", "base_num_query_heads=4", "base_num_kv_heads=1",
                       "head_dim=24", "base_mlp_dim=80", "normalization_layer_epsilon=1e-6",
                       "sliding_window_size=5", "sliding_window_pattern=2",
                       "rope_max_timescale=1000", "local_rope_max_timescale=10",
                       "query_pre_attn_scalar=20", "remat_policy=full"],
        }
        only = [c for c in args.cases.split(",") if c]
        unknown = [c for c in only if c not in cases]
        if unknown:
            check(False, f"--cases: unknown {unknown} (known: {', '.join(cases)})")
        for case, extra in cases.items():
            if only and case not in only:
                continue
            out = os.path.join(tmp, "runs")
            hyp.run("train", f"dataset_path={small}", f"vocab_size={vocab}", "base_emb_dim=64",
                    "base_num_decoder_layers=2", f"max_target_length={seq}",
                    f"per_device_batch_size={batch}", "steps=3", "learning_rate=1e-2",
                    "warmup_steps_fraction=0", "dtype=float32", "sample_count=0", "peak_tflops=1",
                    f"base_output_directory={out}", f"run_name={case}", "eval_interval=0",
                    "checkpoint_period=1", "max_num_checkpoints_to_keep=5", *extra)
            run_dir = os.path.join(out, case)
            check_training(case, run_dir, train_tokens, seq)

            final = os.path.join(run_dir, "checkpoints", "3")
            hf = json.load(open(os.path.join(final, "config.json")))
            weights, meta = read_safetensors(os.path.join(final, "model.safetensors"))
            model = RefLlama(hf, weights)
            val = os.path.join(ds, "val.bin")
            check_eval(hyp, case, final, model, val, [(seq, 4), (13, 3)])
            check_generate(hyp, case, final, model, prompt_text, prompt_ids, 8)

            # Sharpened copy: peaked attention and logits make every component matter.
            sharp_dir = os.path.join(tmp, case + "-sharp")
            os.makedirs(sharp_dir)
            for f in ("config.json", "tokenizer.model"):
                shutil.copy(os.path.join(final, f), sharp_dir)
            sharp = sharpen(weights, seed=3,
                            norm_offset=1.0 if hf["model_type"].startswith("gemma") else 0.0)
            write_safetensors(os.path.join(sharp_dir, "model.safetensors"), sharp, meta)
            model = RefLlama(hf, sharp)
            check_eval(hyp, case + " sharpened", sharp_dir, model, val, [(seq, 4), (7, 5)])
            check_generate(hyp, case + " sharpened", sharp_dir, model, prompt_text, prompt_ids, 12)

            if case in ("llama3-rope-bias", "qwen3-linear", "gemma2", "gemma3"):
                # The sharpened weights as a Hub directory: sharded bf16 + index.json. eval
                # and generate read it as they read a checkpoint; training starts from it.
                hf_dir = os.path.join(tmp, case + "-hf")
                held = write_hf_directory(hf_dir, hf, sharp, os.path.join(final, "tokenizer.model"))
                model = RefLlama(hf, held)
                check_eval(hyp, case + " hf-bf16-sharded", hf_dir, model, val, [(seq, 4)])
                check_generate(hyp, case + " hf-bf16-sharded", hf_dir, model, prompt_text,
                               prompt_ids, 8)
                check_finetune(hyp, case + "-finetune", hf_dir, hf, held, small, train_tokens,
                               seq, batch, out, 20)

        # The prompt route: `eval --text` (tokenize_file) must see the same ids as the shard.
        a = hyp.json("eval", "--checkpoint", final, "--text", os.path.join(tmp, "prompt.txt"))
        b = hyp.json("eval", "--checkpoint", final, "--shard", os.path.join(tmp, "prompt", "train.bin"))
        check(a["loss"] == b["loss"] and a["tokens"] == b["tokens"],
              f"prompt tokenization: eval --text loss {a['loss']} vs --shard {b['loss']}")
    finally:
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(FAILURES)} failure(s), {time.time() - t0:.1f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
