// RMSNorm with Llama / Hugging Face LlamaRMSNorm semantics:
//
//   rstd[n]  = 1 / sqrt(mean_j(x[n, j]^2) + eps)
//   y[n, j]  = x[n, j] * rstd[n] * (weight[j] + weight_offset)
//
// weight_offset is 0 for Llama and 1 for Gemma, whose GemmaRMSNorm scales by (1 + w)
// with w initialised to zero; the weight gradient is the same either way.
//
// Shapes: x, y, dy, dx [N, H] (f32 or bf16, all the same dtype, contiguous); weight and
// dweight [H] f32; rstd [N] f32. Math is f32 inside; bf16 outputs are rounded once (RNE)
// at the end, whereas Hugging Face rounds the normalised value to bf16 before
// multiplying by a bf16 weight, so bf16 results can differ from it by one bf16 ulp.
#pragma once

#include "tensor/tensor.h"

namespace hyperion {

// Writes y and rstd (rstd is saved for the backward pass). y may alias x. y may also be
// bf16 for an f32 x: the f32 residual stream normalised straight into a bf16 matmul input.
void rmsnorm_forward(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
                     const TensorView& rstd, float weight_offset = 0.0f);

// Given dy, x, weight and the rstd of the forward pass, writes dx and ACCUMULATES the
// weight gradient into dweight (dweight += sum_n dy * x * rstd), so gradient
// accumulation over micro-batches needs no extra buffer. The sum over rows uses a
// fixed row grouping that depends only on the shape, so dweight is bitwise identical for
// any thread count. dx may alias dy. With accumulate_dx, dx += the input gradient
// instead (the residual branch's gradient joining the residual stream's; no aliasing).
void rmsnorm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                      const TensorView& rstd, const TensorView& dx, const TensorView& dweight,
                      bool accumulate_dx = false, float weight_offset = 0.0f);

namespace ref {
// Scalar references (double math), same contracts as above.
void rmsnorm_forward(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
                     const TensorView& rstd, float weight_offset = 0.0f);
void rmsnorm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                      const TensorView& rstd, const TensorView& dx, const TensorView& dweight,
                      bool accumulate_dx = false, float weight_offset = 0.0f);
}  // namespace ref

}  // namespace hyperion
