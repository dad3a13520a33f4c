// Logit soft-capping (Gemma 2's attention scores and final logits) and the residual add
// that a post-norm block ends with.
//
//   softcap_forward   x <- cap * tanh(x / cap), in place: a smooth bound to (-cap, cap)
//                     (f32 or bf16, contiguous; bf16 is rounded once)
//   softcap_scaled    x[i] <- post * tanh(pre * x[i]) over f32, and when dtanh is not null
//                     dtanh[i] = 1 - tanh(pre * x[i])^2, the derivative's factor (the
//                     attention tiles keep scores in their own units: pre and post fold
//                     the cap and the tiles' scale in). NaN inputs give NaN outputs and
//                     dtanh 0, so a masked lane can never poison a product.
//   residual_add      y (f32) += x (f32 or bf16), elementwise over the same shape
//
// The derivative of cap * tanh(z / cap) is 1 - tanh(z / cap)^2 = 1 - (y / cap)^2.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace hyperion {

void softcap_forward(const TensorView& x, float cap);
void softcap_scaled(float* x, int64_t n, float pre, float post, float* dtanh);
void residual_add(const TensorView& x, const TensorView& y);

namespace ref {
void softcap_forward(const TensorView& x, float cap);
void softcap_scaled(float* x, int64_t n, float pre, float post, float* dtanh);
void residual_add(const TensorView& x, const TensorView& y);
}  // namespace ref

}  // namespace hyperion
