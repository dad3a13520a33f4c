// Token embedding: row gather (forward) and scatter-add (backward).
//
// Shapes and dtypes (all contiguous):
//   table  [V, H]  f32 or bf16
//   ids    [N]     i32, each in [0, V) (else hyperion::Error names the position and id)
//   out    [N, H]  f32 or bf16 (normally the table dtype, or f32 for a bf16 table)
//   dout   [N, H]  f32 or bf16
//   dtable [V, H]  f32 (master-precision gradient)
#pragma once

#include "tensor/tensor.h"

namespace hyperion {

// out[n, :] = table[ids[n], :] * scale. A scale other than 1 (Gemma's sqrt(hidden))
// needs an f32 out: the product is rounded once, in f32.
void embedding_forward(const TensorView& table, const TensorView& ids, const TensorView& out,
                       float scale = 1.0f);

// dtable[ids[n], :] += scale * dout[n, :] for n = 0..N-1. Accumulates into dtable (zero it
// first for a fresh gradient). Repeated ids are summed in ascending n for every
// element, so the result is bitwise identical for any thread count: threads split the
// H dimension, never the ids.
void embedding_backward(const TensorView& ids, const TensorView& dout, const TensorView& dtable,
                        float scale = 1.0f);

namespace ref {
// Scalar references (plain loops), same contracts as above.
void embedding_forward(const TensorView& table, const TensorView& ids, const TensorView& out,
                       float scale = 1.0f);
void embedding_backward(const TensorView& ids, const TensorView& dout, const TensorView& dtable,
                        float scale = 1.0f);
}  // namespace ref

}  // namespace hyperion
