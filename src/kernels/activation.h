// Pointwise activations of the diffusion models (UNet, VAE, CLIP), forward and backward,
// and the GEGLU of a diffusion transformer block's feed-forward:
//
//   silu(x)       = x * sigmoid(x)                        (ResNet blocks, time embedding)
//   gelu(x)       = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))   (exact GELU: OpenCLIP, GEGLU)
//   quick_gelu(x) = x * sigmoid(1.702 x)                  (OpenAI CLIP's text encoder)
//   geglu: x [R, 2F] = [value | gate] per row (diffusers' GEGLU splits its projection in
//          two halves), h [R, F] = value * gelu(gate)
//
// Backward: dx = dy * act'(x) (silu' = s (1 + x (1 - s)), gelu' = Phi(x) + x phi(x),
// quick_gelu' = s + 1.702 x s (1 - s)); geglu: dvalue = dh * gelu(gate),
// dgate = dh * value * gelu'(gate), written into dx [R, 2F].
//
// All f32 contiguous; y may alias x, dx may alias dy. erf is evaluated with a rational
// approximation of absolute error < 2e-7 (Abramowitz-Stegun 7.1.26 style), sigmoid
// from exp(-|x|) (no overflow for any x).
#pragma once

#include <cstdint>
#include <string>

namespace hyperion {

enum class Activation : uint8_t { kSilu, kGelu, kQuickGelu };
// Hugging Face's spelling ("silu" or "swish", "gelu", "quick_gelu"); parse returns false
// for anything else.
const char* activation_name(Activation a);
bool parse_activation(const std::string& name, Activation* out);

void activation_forward(Activation a, const float* x, float* y, int64_t n);
void activation_backward(Activation a, const float* dy, const float* x, float* dx, int64_t n);

void geglu_rows_forward(const float* x, int64_t rows, int64_t f, float* h);
void geglu_rows_backward(const float* dh, const float* x, int64_t rows, int64_t f, float* dx);

namespace ref {
void activation_forward(Activation a, const float* x, float* y, int64_t n);
void activation_backward(Activation a, const float* dy, const float* x, float* dx, int64_t n);
void geglu_rows_forward(const float* x, int64_t rows, int64_t f, float* h);
void geglu_rows_backward(const float* dh, const float* x, int64_t rows, int64_t f, float* dx);
}  // namespace ref

}  // namespace hyperion
