// Nearest-neighbour upsampling by an integer factor on channels-last activations (the
// Upsample2D of a UNet's and a VAE decoder's up blocks: F.interpolate(scale_factor=2,
// mode="nearest")), forward and backward:
//
//   y[n, y, x, c] = x[n, y / s, x / s, c]            x [N, H, W, C] -> y [N, sH, sW, C]
//   dx[n, h, w, c] = sum_{i,j < s} dy[n, h s + i, w s + j, c]
//
// f32 contiguous. The backward pass sums each group of s*s in a fixed order.
//
// The sized form (a UNet on latents whose sides are not a multiple of its downsampling:
// F.interpolate(size=(out_h, out_w), mode="nearest"), up to any size not below the input:
//
//   y[n, i, j, c] = x[n, floor(i in_h / out_h), floor(j in_w / out_w), c]
//
// and its backward, each input summing the outputs that copied it, in output order.
#pragma once

#include <cstdint>

namespace hyperion {

void upsample_nearest_forward(const float* x, int64_t batch, int64_t height, int64_t width,
                              int64_t channels, int64_t factor, float* y);
// dx is overwritten.
void upsample_nearest_backward(const float* dy, int64_t batch, int64_t height, int64_t width,
                               int64_t channels, int64_t factor, float* dx);

void upsample_nearest_to_forward(const float* x, int64_t batch, int64_t in_h, int64_t in_w, int64_t channels,
                                 int64_t out_h, int64_t out_w, float* y);
// dx [batch, in_h, in_w, channels] is overwritten.
void upsample_nearest_to_backward(const float* dy, int64_t batch, int64_t in_h, int64_t in_w, int64_t channels,
                                  int64_t out_h, int64_t out_w, float* dx);

namespace ref {
void upsample_nearest_to_forward(const float* x, int64_t batch, int64_t in_h, int64_t in_w, int64_t channels,
                                 int64_t out_h, int64_t out_w, float* y);
void upsample_nearest_to_backward(const float* dy, int64_t batch, int64_t in_h, int64_t in_w, int64_t channels,
                                  int64_t out_h, int64_t out_w, float* dx);
void upsample_nearest_forward(const float* x, int64_t batch, int64_t height, int64_t width,
                              int64_t channels, int64_t factor, float* y);
void upsample_nearest_backward(const float* dy, int64_t batch, int64_t height, int64_t width,
                               int64_t channels, int64_t factor, float* dx);
}  // namespace ref

}  // namespace hyperion
