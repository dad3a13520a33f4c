// SwiGLU activation of a gated MLP (Llama):
//
//   h = silu(g) * u,  silu(g) = g * sigmoid(g)
//   dg = dh * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))),  du = dh * silu(g)
//
// Shapes: g, u, h, dh, dg, du all [N, F] (any shape works: the op is elementwise; all
// must have the same shape), f32 or bf16, one dtype for all, contiguous. Math is f32
// inside; bf16 outputs are rounded once. sigmoid is evaluated from exp(-|g|), so large
// |g| saturates cleanly (no inf/inf).
#pragma once

#include "tensor/tensor.h"

namespace hyperion {

// h may alias g or u.
void swiglu_forward(const TensorView& g, const TensorView& u, const TensorView& h);

// dg and du may alias any of dh, g, u (every element is read before it is written),
// e.g. the gradients can overwrite the saved activations.
void swiglu_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                     const TensorView& dg, const TensorView& du);

namespace ref {
// Scalar references (double math).
void swiglu_forward(const TensorView& g, const TensorView& u, const TensorView& h);
void swiglu_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                     const TensorView& dg, const TensorView& du);
}  // namespace ref

}  // namespace hyperion
