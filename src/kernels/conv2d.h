// 2-D convolution, forward and backward, as the UNet and VAE of a latent diffusion model
// use it (PyTorch's nn.Conv2d with groups = 1, square stride, symmetric zero padding,
// no dilation):
//
//   y[n, oy, ox, o] = bias[o] + sum_{i, ky, kx} x[n, oy*s - p + ky, ox*s - p + kx, i] w[o, i, ky, kx]
//
// Layouts: activations are channels-last (NHWC: x [N, H, W, Cin], y [N, OH, OW, Cout]),
// the layout in which a UNet's transformer blocks see their tokens ([N, H*W, C]) without
// a transpose and in which oneDNN's direct convolutions run; weights are PyTorch's
// [Cout, Cin, KH, KW] (OIHW), as checkpoints store them, so loading needs no transpose.
// OH = (H + 2p - KH) / s + 1, likewise OW. All arrays f32, contiguous.
//
// Mixed precision (the _bf16 forms, what torch.autocast(dtype=bfloat16) does to a
// convolution): activations and output gradients in bf16, weights given f32 and rounded to
// bf16 by the same reorder that puts them in oneDNN's layout (no bf16 copy kept), f32
// accumulation, and y, dx, dw, dbias f32. Twice the f32 rate on AVX512-BF16 and AMX; on
// CPUs without bf16 dot products, the same numbers at the f32 rate (the f32 primitive on
// the widened values).
//
// The work is oneDNN's (convolution_forward / backward_data / backward_weights, primitives
// cached per shape, weights reordered into the layout oneDNN picks on each call); ref::
// is a plain loop in double.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace hyperion {

struct Conv2dShape {
  int64_t batch = 1, height = 1, width = 1;
  int64_t in_channels = 1, out_channels = 1;
  int64_t kernel = 1;  // square kernels: 1x1 and 3x3 in a UNet and a VAE
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t out_height() const { return (height + 2 * padding - kernel) / stride + 1; }
  int64_t out_width() const { return (width + 2 * padding - kernel) / stride + 1; }
  int64_t x_numel() const { return batch * height * width * in_channels; }
  int64_t y_numel() const { return batch * out_height() * out_width() * out_channels; }
  int64_t w_numel() const { return out_channels * in_channels * kernel * kernel; }
  // Multiply-adds of the forward pass (the backward pass does twice as many).
  double macs() const { return double(y_numel()) * double(in_channels * kernel * kernel); }
};

// Throws naming the field when the shape is not a valid convolution (non-positive sizes,
// a kernel larger than the padded input).
void check_conv2d_shape(const Conv2dShape& s);

// bias may be null.
void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* bias,
                    float* y);

// Given dy [N, OH, OW, Cout]: dx (overwritten; null to skip: the first layer needs no input
// gradient), and dw [Cout, Cin, KH, KW] and dbias [Cout] (null to skip), which are
// ACCUMULATED (dw += ...), as every weight gradient of the trainer is, so gradient
// accumulation over micro-batches needs no extra buffer.
void conv2d_backward(const Conv2dShape& s, const float* dy, const float* x, const float* w,
                     float* dx, float* dw, float* dbias);

// Mixed precision: x and dy bf16, everything else as above.
void conv2d_forward_bf16(const Conv2dShape& s, const bf16* x, const float* w, const float* bias,
                         float* y);
void conv2d_backward_bf16(const Conv2dShape& s, const bf16* dy, const bf16* x, const float* w,
                          float* dx, float* dw, float* dbias);

// The path of CPUs without bf16 dot products (public so tests cover it on any CPU).
void conv2d_forward_bf16_emulated(const Conv2dShape& s, const bf16* x, const float* w,
                                  const float* bias, float* y);
void conv2d_backward_bf16_emulated(const Conv2dShape& s, const bf16* dy, const bf16* x,
                                   const float* w, float* dx, float* dw, float* dbias);

namespace ref {
void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* bias,
                    float* y);
void conv2d_backward(const Conv2dShape& s, const float* dy, const float* x, const float* w,
                     float* dx, float* dw, float* dbias);
}  // namespace ref

}  // namespace hyperion
