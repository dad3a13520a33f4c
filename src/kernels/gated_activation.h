// The activation of a gated MLP, h = act(g) * u, in its two forms:
//
// SwiGLU (Llama, Mixtral):  act(g) = silu(g) = g * sigmoid(g)
//   dg = dh * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))),  du = dh * silu(g)
// GeGLU with the tanh approximation of GELU (Gemma, Hugging Face "gelu_pytorch_tanh"):
//   act(g) = 0.5 g (1 + tanh(z)) = g * sigmoid(2z),  z = sqrt(2/pi) (g + 0.044715 g^3)
//   dg = dh * u * (s + 2 g s (1 - s) z'),  z' = sqrt(2/pi) (1 + 3 * 0.044715 g^2),
//   du = dh * g * s,  s = sigmoid(2z)
//
// Shapes: g, u, h, dh, dg, du all [N, F] (any shape works: the op is elementwise; all
// must have the same shape), f32 or bf16, one dtype for all, contiguous. Math is f32
// inside; bf16 outputs are rounded once. sigmoid is evaluated from exp(-|g|), so large
// |g| saturates cleanly (no inf/inf).
#pragma once

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace hyperion {

enum class GatedActivation : uint8_t { kSilu, kGeluTanh };
// Hugging Face's hidden_act spelling ("silu", "gelu_pytorch_tanh") and back; parse
// returns false for anything else.
const char* gated_activation_name(GatedActivation a);
bool parse_gated_activation(const std::string& name, GatedActivation* out);

// h may alias g or u.
void swiglu_forward(const TensorView& g, const TensorView& u, const TensorView& h);

// dg and du may alias any of dh, g, u (every element is read before it is written),
// e.g. the gradients can overwrite the saved activations.
void swiglu_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                     const TensorView& dg, const TensorView& du);

// GeGLU (GELU-tanh), same contracts as SwiGLU.
void geglu_forward(const TensorView& g, const TensorView& u, const TensorView& h);
void geglu_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                    const TensorView& dg, const TensorView& du);

// Either, by kind: what a decoder's MLP calls.
void gated_forward(GatedActivation act, const TensorView& g, const TensorView& u,
                   const TensorView& h);
void gated_backward(GatedActivation act, const TensorView& dh, const TensorView& g,
                    const TensorView& u, const TensorView& dg, const TensorView& du);

namespace ref {
// Scalar references (double math).
void geglu_forward(const TensorView& g, const TensorView& u, const TensorView& h);
void geglu_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                    const TensorView& dg, const TensorView& du);
void swiglu_forward(const TensorView& g, const TensorView& u, const TensorView& h);
void swiglu_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                     const TensorView& dg, const TensorView& du);
}  // namespace ref

}  // namespace hyperion
