// Grouped GEMM for dropless mixture-of-experts layers (MaxText's gmm / tgmm): the rows
// of the token matrix are sorted by expert, group g owning `sizes[g]` consecutive rows
// (groups may be empty), and each group multiplies its own expert's weight matrix.
//
//   grouped_gemm            C_g  = A_g W_g^T (+ beta C_g)   forward      A [M, K], W [G, N, K]
//   grouped_gemm_input_grad dA_g = dC_g W_g (+ beta dA_g)   gmm with transposed weights
//   grouped_gemm_weight_grad dW_g += dC_g^T A_g             tgmm (empty groups: dW_g unchanged)
//
// W holds G experts' [out, in] matrices back to back, as Hugging Face Mixtral stores each
// expert's w1/w2/w3. dtypes: A, W, dC f32 (C f32) or bf16 (C f32 or bf16); dW is f32.
// Every group runs as oneDNN GEMMs over chunks of its rows (so group sizes need no padding
// and no tile masks for correctness: the tile straddling a group boundary of a TPU kernel
// is the GEMM's own edge handling). For speed the MoE dispatch still pads each group to a
// multiple of a small row alignment, which keeps the set of GEMM shapes small and cached.
#pragma once

#include <cstdint>
#include <span>

#include "tensor/tensor.h"

namespace hyperion {

// Rows of one GEMM call: larger groups are processed in chunks of this many rows (see
// grouped_gemm.cc), so the set of GEMM shapes stays small when sizes vary per call.
inline constexpr int64_t kGroupChunkRows = 512;
// Groups whose GEMM is smaller (in FLOPs) run side by side, one per thread; larger ones
// use every thread.
inline constexpr double kThreadedGroupFlops = 1e9;
// Changes that threshold (process-wide; tests use it to run both schedules on small
// shapes). Returns the previous value.
double set_threaded_group_flops(double flops);

void grouped_gemm(const TensorView& a, const TensorView& w, std::span<const int64_t> sizes,
                  const TensorView& c, float beta = 0.0f);
void grouped_gemm_input_grad(const TensorView& dc, const TensorView& w,
                             std::span<const int64_t> sizes, const TensorView& da,
                             float beta = 0.0f);
void grouped_gemm_weight_grad(const TensorView& a, const TensorView& dc,
                              std::span<const int64_t> sizes, const TensorView& dw);

namespace ref {
// Per-row loops in double (each row looks up its group), same contracts.
void grouped_gemm(const TensorView& a, const TensorView& w, std::span<const int64_t> sizes,
                  const TensorView& c, float beta = 0.0f);
void grouped_gemm_input_grad(const TensorView& dc, const TensorView& w,
                             std::span<const int64_t> sizes, const TensorView& da,
                             float beta = 0.0f);
void grouped_gemm_weight_grad(const TensorView& a, const TensorView& dc,
                              std::span<const int64_t> sizes, const TensorView& dw);
}  // namespace ref

}  // namespace hyperion
