// Fused AdamW step with PyTorch torch.optim.AdamW semantics (decoupled weight decay,
// amsgrad=False, maximize=False). Per element, with g = grad * grad_scale:
//
//   p -= lr * weight_decay * p
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// Shapes: params, m, v [n] f32 (master weights and moments; any shape, all equal,
// contiguous); grads the same shape, f32 or bf16. One pass over memory.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace hyperion {

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  int64_t step = 1;         // 1-based step number t, for the bias corrections
  float grad_scale = 1.0f;  // grads are multiplied by this first (clipping, loss scaling)
};

// Updates params, m and v in place. If params_bf16 is a non-empty view (data != nullptr)
// it must have the shape of params and dtype bf16, and receives the updated params
// rounded to bf16 in the same pass (bf16 compute weights beside f32 master weights).
void adamw_step(const TensorView& params, const TensorView& grads, const TensorView& m,
                const TensorView& v, const AdamWParams& hp,
                const TensorView& params_bf16 = TensorView());

namespace ref {
// Scalar reference (double math per element, results stored as f32/bf16).
void adamw_step(const TensorView& params, const TensorView& grads, const TensorView& m,
                const TensorView& v, const AdamWParams& hp,
                const TensorView& params_bf16 = TensorView());
}  // namespace ref

}  // namespace hyperion
