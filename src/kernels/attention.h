// Memory-efficient (flash-attention-2 style) scaled dot-product attention with grouped
// query heads, forward and backward.
//
// Layout (token-major, exactly what the fused QKV projection produces; all contiguous):
//   q, out, dout, dq   [B, Tq, Hq, D]
//   k, v, dk, dv       [B, Tk, Hkv, D]      Hq % Hkv == 0; query head h reads kv head
//                                           h / (Hq / Hkv)
//   lse                [B, Hq, Tq] f32      natural-log log-sum-exp of each score row
// Dtypes: each activation tensor independently f32 or bf16 (bf16 is storage only: all
// math and every accumulation is f32, bf16 outputs are rounded to nearest even once).
//
// Semantics: S = scale * q k^T (scale defaults to 1/sqrt(D)), P = softmax(S) over keys,
// out = P v. Query i sits at absolute position Tk - Tq + i (Tq == Tk for training;
// Tq < Tk for chunked prefill against a cache), and with `causal` it sees the keys at
// positions <= its own. Causal attention needs Tq <= Tk, so every query sees key 0. A
// sliding window (`window` > 0, causal only; Mistral's and Gemma's local layers) narrows
// that to the `window` latest positions: query p sees keys (p - window, p]. A soft cap
// (`softcap` > 0, Gemma 2's attn_logit_softcapping) bounds the scaled scores smoothly:
// S = softcap * tanh(scale * q k^T / softcap).
//
// Work is tiled into 64-query x 64-key blocks with an online softmax, so memory beyond
// the inputs and outputs is O(T) per head (lse, and the row dot products rowsum(dO*O) in
// the backward) plus per-thread scratch, kept for reuse: tiles of a few 64 x D blocks, an
// f32 copy of the keys and values of the kv head being worked on (2 x Tk x D), and in the
// backward per-kv-head schedule its f32 dK/dV accumulators (2 x Tk x D, twice for GQA).
// No T x T matrix is ever stored.
//
// Both passes are deterministic: the result is bitwise identical for any thread count
// and either backward schedule (each output element is summed in one fixed order).
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace hyperion {

enum class AttentionBackwardSchedule : uint8_t {
  // The first of kPerKvHead, kPerHead, kSplit whose tasks keep the threads busy. All three
  // give bitwise identical results.
  kAuto,
  // One task per (batch, kv head): each block pair costs 5 tile products and one exp.
  kPerKvHead,
  // One task per (batch, query head), then a sum over the heads of each group: as cheap,
  // more parallel with few kv heads, but needs an f32 buffer [B, Hq, Tk, 2 x D].
  kPerHead,
  // dK/dV per (batch, kv head, key block) and dQ per (batch, q head, query block): the
  // most parallel, but S and dP are computed twice (7 products, two exps per pair).
  kSplit,
};

struct AttentionParams {
  bool causal = true;
  float scale = 0.0f;  // 0 means 1/sqrt(D); otherwise finite and > 0
  int64_t window = 0;  // > 0: sliding-window attention over that many positions (causal)
  float softcap = 0.0f;  // > 0: scores capped to (-softcap, softcap) by tanh; 0: off
  AttentionBackwardSchedule schedule = AttentionBackwardSchedule::kAuto;
  // Testing aid: use the portable scalar tiles even when AVX-512 is available.
  bool force_portable = false;
};

// Writes out and lse (saved for the backward pass).
void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& lse,
                       const AttentionParams& params = {});

// Given the forward inputs, its out and lse, and dout, OVERWRITES dq, dk and dv. dk and dv
// are summed over the query heads that share a kv head.
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& lse,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const AttentionParams& params = {});

// Number of (query, key) pairs a query attends to, summed over the Tq queries of one
// head: Tq * Tk, or the causal trapezoid (cut to the window when `window` > 0). FLOPs:
// forward 4 * D * pairs per head (S = q k^T and P v), backward 10 * D * pairs (five
// products).
int64_t attention_visible_pairs(int64_t tq, int64_t tk, bool causal, int64_t window = 0);

namespace ref {
// Naive scalar references for tests: explicit O(Tq x Tk) scores and softmax per row,
// double math. Same shapes, dtypes and contracts as above; the backward recomputes P
// from q and k (it does not trust out and lse, which are only shape-checked).
void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& lse,
                       const AttentionParams& params = {});
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& lse,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const AttentionParams& params = {});
}  // namespace ref

}  // namespace hyperion
