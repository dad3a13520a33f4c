// Softmax over the last dimension, forward and backward.
//
// Shapes: x, y, dy, dx are contiguous tensors of any rank >= 1 with the same shape
// [..., V]; the leading dimensions are flattened into rows, softmax runs along V.
// Dtypes: each argument independently f32 or bf16 (bf16 is storage only: all math is
// f32, bf16 outputs are rounded to nearest even once).
//
// Numerics: the row max is subtracted before exponentiating, so any finite input
// (e.g. 1e4) is safe. -inf entries get probability 0; a row that is entirely -inf
// produces all zeros (a "fully masked" row) rather than NaN. NaN or +inf inputs
// propagate NaN into their row.
#pragma once

#include "tensor/tensor.h"

namespace hyperion {

// y = softmax(x) along the last dimension. y may alias x when the dtypes match.
void softmax_forward(const TensorView& x, const TensorView& y);

// dx = y * (dy - sum(dy * y)) along the last dimension, y being the forward output.
// dx may alias dy or y when the dtypes match.
void softmax_backward(const TensorView& y, const TensorView& dy, const TensorView& dx);

namespace ref {
// Scalar references (double accumulation, no SIMD), for tests and benchmarks. Same
// shapes, dtypes and conventions as the functions above.
void softmax_forward(const TensorView& x, const TensorView& y);
void softmax_backward(const TensorView& y, const TensorView& dy, const TensorView& dx);
}  // namespace ref

}  // namespace hyperion
