// Mixture-of-experts routing (Mixtral / MaxText): the router (softmax + top-k), its
// auxiliary losses (Switch load balance, ST-MoE z-loss), the dispatch plan that permutes
// (token, slot) pairs into the expert-sorted row buffer the grouped GEMM
// (kernels/grouped_gemm.h) works on, and the row gather / scatter-add / combine around it.
//
// Raw pointers on purpose: these are small integer/f32 bookkeeping arrays in the model's
// hot path. All arrays are row-major and contiguous:
//   logits, probs, dlogits, dprobs  [n, e] f32
//   experts                         [n, k] i32 (descending probability order)
//   weights, dweights               [n, k] f32 (combine weights)
//   token rows x, dsrc, out, dout   [n, d] (x, y, dy: f32 or bf16; dsrc, out, dout: f32)
//   permuted rows y, dy             [rows, d]
// A pair is one (token, slot) of the top-k choice, pair index = token * k + slot.
// Sizes and k are checked (hyperion::Error naming the op and the values); expert ids are
// checked where they index memory (router backward, load balance loss, dispatch plan).
// pair_row / row_token are trusted as produced by moe_dispatch_plan (the row ops do not
// know n or rows to check them against).
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace hyperion {

// ---- Router: softmax over all e logits, top-k by probability (ties -> lower expert
// index; the k chosen in descending probability order), combine weights = chosen probs /
// (normalize ? sum of the k chosen probs : 1). normalize=true equals a softmax over the
// chosen k logits (Mixtral's default). 1 <= k <= e. Parallel over tokens. Non-finite
// logits are not scanned for: NaN propagates into probs and weights (the experts are
// still k distinct valid ids).
void router_topk_forward(const float* logits, int64_t n, int64_t e, int64_t k, bool normalize,
                         float* probs, int32_t* experts, float* weights);
// Backward: dweights [n, k] (gradient w.r.t. the combine weights) plus an optional
// gradient w.r.t. probs, dprobs [n, e] (may be nullptr; from the load-balance loss)
// -> dlogits [n, e], OVERWRITTEN.
//   normalized:   dp[c_j] += (dw_j - sum_i dw_i w_i) / S,  S = sum_i p[c_i]
//   unnormalized: dp[c_j] += dw_j
//   dlogits = p * (dp - sum_e p_e dp_e)       (softmax backward)
void router_topk_backward(const float* probs, const int32_t* experts, const float* weights,
                          const float* dweights, const float* dprobs, int64_t n, int64_t e,
                          int64_t k, bool normalize, float* dlogits);

// ---- Auxiliary losses.
// Switch load-balance loss in MaxText's per-sequence form, over b sequences of t tokens
// (n = b * t rows, sequence s = rows [s*t, (s+1)*t)):
//   f[s][x] = (1/t) * #{(token, slot) of sequence s routed to expert x}   (sums to k)
//   P[s][x] = (1/t) * sum over tokens of s of probs[token][x]
//   loss = weight * e^2 * mean over (s, x) of f[s][x] * P[s][x]
// (uniform routing gives weight * k). Returns the loss (0 when b * t == 0). If
// dprobs != nullptr, ADDS dscale * dloss/dprobs to it (f treated as a constant, as in
// MaxText/Switch). Deterministic for any thread count.
float load_balance_loss(const float* probs, const int32_t* experts, int64_t b, int64_t t, int64_t e,
                        int64_t k, float weight, float* dprobs, float dscale);
// Router z-loss (ST-MoE): weight * mean over rows of logsumexp(logits_row)^2. Returns it
// (0 when n == 0); if dlogits != nullptr ADDS dscale * its gradient
// (2 * weight * lse * softmax / n). Deterministic for any thread count.
float router_z_loss(const float* logits, int64_t n, int64_t e, float weight, float* dlogits,
                    float dscale);

// ---- Dispatch plan: where each (token, slot) pair goes in the permuted row buffer.
struct MoeDispatch {
  int64_t rows = 0;                  // rows of the permuted buffer
  std::vector<int64_t> group_sizes;  // [e]; sum == rows; expert x owns the next group_sizes[x] rows
  std::vector<int32_t> pair_row;     // [n*k]: row of each pair, -1 when dropped
  std::vector<int32_t> row_token;    // [rows]: token held by each row, -1 for a padding row
  std::vector<int64_t> expert_load;  // [e]: pairs routed to each expert (before any drop)
  int64_t dropped = 0;               // pairs dropped (capped only)
};
// Capacity per expert per sequence of t tokens (MaxText): max(ceil(t*k/e) * cf, cf), as an
// integer (floor of that value). cf must be > 0.
int64_t moe_capacity(int64_t t, int64_t k, int64_t e, double capacity_factor);
// experts [b*t, k] from router_topk_forward.
// Dropless (capacity < 0): pairs sorted by expert, stably (token order, then slot order
//   within a token); nothing dropped. Each expert's group is padded with zero rows
//   (row_token -1) up to a multiple of row_align, so group_sizes[x] =
//   round_up(load[x], row_align) and rows = their sum (n*k when row_align is 1). The
//   padding keeps the grouped GEMM's shapes few (each shape is a compiled kernel) at a
//   cost of < row_align rows per expert; it never changes a result.
// Capped (capacity >= 0): per sequence, a running count per expert over the pairs in
//   pair index order; a pair whose count exceeds `capacity` is dropped (pair_row -1).
//   Every expert owns exactly b*capacity rows (fixed cost): expert x's rows start at
//   x*b*capacity, sequence s's c-th kept pair for x sits at row
//   x*b*capacity + s*capacity + c; unused rows are padding (row_token -1). group_sizes
//   all b*capacity.
// Reuses the vectors' storage across calls (resize, no shrink). O(n*k + e + rows) time,
// serial. rows and n must fit in int32 (the row/token ids are i32).
void moe_dispatch_plan(const int32_t* experts, int64_t b, int64_t t, int64_t k, int64_t e,
                       int64_t capacity, MoeDispatch* out, int64_t row_align = 1);
// Largest row count a dropless plan can have: n*k + e*(row_align - 1).
inline int64_t moe_dropless_max_rows(int64_t n, int64_t k, int64_t e, int64_t row_align) {
  return n * k + e * (row_align - 1);
}

// ---- Data movement (dtype dt of rows: f32 or bf16; d columns).
// dst[r] = src[row_token[r]], zeros for padding rows (-1). Parallel over rows.
void moe_gather_rows(const void* src, DType dt, const int32_t* row_token, int64_t rows, int64_t d,
                     void* dst);
// Backward of the gather: dsrc[token] += sum over its kept pairs j of drows[pair_row[token*k+j]]
// (dsrc f32 [n, d]; dropped pairs skipped; slot order). Parallel over tokens:
// deterministic, no atomics.
void moe_scatter_add_rows(const void* drows, DType dt, const int32_t* pair_row, int64_t n,
                          int64_t k, int64_t d, float* dsrc);
// Combine (unpermute + weighted sum in f32): out[token] += sum_j weights[token*k+j] *
// y[pair_row[token*k+j]] (dropped pairs contribute nothing: the residual passes through).
// out f32 [n, d]. The sum is formed in slot order, then added to out.
void moe_combine(const void* y, DType dt, const int32_t* pair_row, const float* weights, int64_t n,
                 int64_t k, int64_t d, float* out);
// Backward of the combine: dy[pair_row[p]] = weights[p] * dout[token(p)] (rounded to dt),
// every padding row (row_token -1) set to 0; dweights[p] = <dout[token], y[pair_row[p]]>
// computed in f32 (0 for a dropped pair). rows = number of rows of y / dy; row_token
// [rows] from the plan.
void moe_combine_backward(const float* dout, const void* y, DType dt, const int32_t* pair_row,
                          const int32_t* row_token, const float* weights, int64_t n, int64_t k,
                          int64_t d, int64_t rows, void* dy, float* dweights);

namespace ref {
// Scalar references (plain loops, double accumulation), same contracts as above. The
// router reference selects its top-k on its own (double) probabilities.
void router_topk_forward(const float* logits, int64_t n, int64_t e, int64_t k, bool normalize,
                         float* probs, int32_t* experts, float* weights);
void router_topk_backward(const float* probs, const int32_t* experts, const float* weights,
                          const float* dweights, const float* dprobs, int64_t n, int64_t e,
                          int64_t k, bool normalize, float* dlogits);
float load_balance_loss(const float* probs, const int32_t* experts, int64_t b, int64_t t, int64_t e,
                        int64_t k, float weight, float* dprobs, float dscale);
float router_z_loss(const float* logits, int64_t n, int64_t e, float weight, float* dlogits,
                    float dscale);
void moe_gather_rows(const void* src, DType dt, const int32_t* row_token, int64_t rows, int64_t d,
                     void* dst);
void moe_scatter_add_rows(const void* drows, DType dt, const int32_t* pair_row, int64_t n,
                          int64_t k, int64_t d, float* dsrc);
void moe_combine(const void* y, DType dt, const int32_t* pair_row, const float* weights, int64_t n,
                 int64_t k, int64_t d, float* out);
void moe_combine_backward(const float* dout, const void* y, DType dt, const int32_t* pair_row,
                          const int32_t* row_token, const float* weights, int64_t n, int64_t k,
                          int64_t d, int64_t rows, void* dy, float* dweights);
}  // namespace ref

}  // namespace hyperion
