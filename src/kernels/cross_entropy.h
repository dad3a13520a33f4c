// Fused softmax cross-entropy for the LM head, forward and backward.
//
// Shapes and dtypes:
//   logits   [N, V]  f32 or bf16, contiguous (bf16 is storage only, math is f32)
//   targets  [N]     i32; a target equal to `ignore_index` (default -100, as in PyTorch)
//                    contributes neither loss nor gradient; any other target must be in
//                    [0, V), else hyperion::Error names the row and the value
//   row_loss [N]     f32, optional (pass an empty TensorView to skip): per-row loss
//                    logsumexp(logits[n]) - logits[n, target[n]], 0 for ignored rows
//   dlogits  [N, V]  same dtype as logits; may be the logits buffer itself (in place),
//                    which is the intended use: no probability copy is ever kept
//
// Loss is the mean over the non-ignored rows (0 when every row is ignored). The
// gradient is dlogits = (softmax(logits) - onehot(target)) * dloss / count, with zero
// rows for ignored targets. Each row is streamed twice: an online max + sum-exp pass,
// then a gradient pass. Rows run in parallel; the result does not depend on the thread
// count (per-row values are reduced in row order).
//
// softcap > 0 (Gemma 2's final_logit_softcapping): the loss is over the capped logits
// cap * tanh(logits / cap), and dlogits is the gradient w.r.t. the logits before the cap.
//
// Logits are expected finite; -inf entries (masked vocabulary) have probability 0, a
// target whose logit is -inf has infinite loss, NaN logits give a NaN loss.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace hyperion {

inline constexpr int32_t kIgnoreIndex = -100;

struct CrossEntropyResult {
  double loss = 0;    // mean loss over the non-ignored rows
  int64_t count = 0;  // number of non-ignored rows
};

// Forward only (evaluation).
CrossEntropyResult cross_entropy_forward(const TensorView& logits, const TensorView& targets,
                                         const TensorView& row_loss = TensorView(),
                                         int32_t ignore_index = kIgnoreIndex,
                                         float softcap = 0.0f);

// Forward and backward in one call. `dloss` is the gradient of the final loss with
// respect to the returned mean loss (1 for a plain mean-loss objective).
CrossEntropyResult cross_entropy_fused(const TensorView& logits, const TensorView& targets,
                                       const TensorView& dlogits, float dloss = 1.0f,
                                       const TensorView& row_loss = TensorView(),
                                       int32_t ignore_index = kIgnoreIndex, float softcap = 0.0f);

namespace ref {
// Scalar references in double (no SIMD), for tests and benchmarks. `dlogits` may be an
// empty TensorView to compute the loss only.
CrossEntropyResult cross_entropy(const TensorView& logits, const TensorView& targets,
                                 const TensorView& dlogits, float dloss = 1.0f,
                                 const TensorView& row_loss = TensorView(),
                                 int32_t ignore_index = kIgnoreIndex, float softcap = 0.0f);
}  // namespace ref

}  // namespace hyperion
