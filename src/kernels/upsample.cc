// Nearest upsampling: whole channel rows are copied (forward) or summed with the SIMD
// add_to (backward); threads take input rows.
#include "kernels/upsample.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "kernels/dense_ops.h"

namespace hyperion {
namespace {

void check(const char* op, int64_t batch, int64_t height, int64_t width, int64_t channels,
           int64_t factor) {
  HYP_CHECK(batch > 0 && height > 0 && width > 0 && channels > 0,
            "{}: size {}x{}x{}x{} must be positive", op, batch, height, width, channels);
  HYP_CHECK(factor >= 1 && factor <= 16, "{}: factor {} must be in [1, 16]", op, factor);
}

void check_to(const char* op, int64_t batch, int64_t in_h, int64_t in_w, int64_t channels, int64_t out_h,
              int64_t out_w) {
  HYP_CHECK(batch > 0 && in_h > 0 && in_w > 0 && channels > 0, "{}: size {}x{}x{}x{} must be positive", op, batch,
            in_h, in_w, channels);
  HYP_CHECK(out_h >= in_h && out_w >= in_w && out_h <= 16 * in_h && out_w <= 16 * in_w,
            "{}: output {}x{} must be 1 to 16 times the input {}x{}", op, out_h, out_w, in_h, in_w);
}

// The source index of output index i (integer floor(i in / out): PyTorch's float
// computation agrees wherever a UNet uses it, out being 2 in or 2 in - 1).
inline int64_t source(int64_t i, int64_t in, int64_t out) {
  return i * in / out;
}

}  // namespace

void upsample_nearest_to_forward(const float* x, int64_t batch, int64_t in_h, int64_t in_w, int64_t channels,
                                 int64_t out_h, int64_t out_w, float* y) {
  check_to("upsample_nearest_to_forward", batch, in_h, in_w, channels, out_h, out_w);
  if (out_h == 2 * in_h && out_w == 2 * in_w)
    return upsample_nearest_forward(x, batch, in_h, in_w, channels, 2, y);
  const int64_t C = channels;
  const size_t row_bytes = size_t(C) * sizeof(float);
  parallel_chunks(batch * out_h, std::max<int64_t>(1, 4096 / (out_w * C)), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const int64_t n = row / out_h, i = row % out_h;
      const float* src = x + (n * in_h + source(i, in_h, out_h)) * in_w * C;
      float* dst = y + row * out_w * C;
      for (int64_t j = 0; j < out_w; ++j) std::memcpy(dst + j * C, src + source(j, in_w, out_w) * C, row_bytes);
    }
  });
}

void upsample_nearest_to_backward(const float* dy, int64_t batch, int64_t in_h, int64_t in_w, int64_t channels,
                                  int64_t out_h, int64_t out_w, float* dx) {
  check_to("upsample_nearest_to_backward", batch, in_h, in_w, channels, out_h, out_w);
  if (out_h == 2 * in_h && out_w == 2 * in_w)
    return upsample_nearest_backward(dy, batch, in_h, in_w, channels, 2, dx);
  const int64_t C = channels;
  // Threads take input rows; each sums the output rows that copied it, in order.
  parallel_chunks(batch * in_h, std::max<int64_t>(1, 4096 / (in_w * C)), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const int64_t n = row / in_h, h = row % in_h;
      float* out = dx + row * in_w * C;
      std::fill(out, out + in_w * C, 0.0f);
      // Output rows i with floor(i in_h / out_h) == h: from ceil(h out_h / in_h).
      for (int64_t i = (h * out_h + in_h - 1) / in_h; i < out_h && source(i, in_h, out_h) == h; ++i) {
        const float* src = dy + (n * out_h + i) * out_w * C;
        for (int64_t j = 0; j < out_w; ++j) add_to(out + source(j, in_w, out_w) * C, src + j * C, C);
      }
    }
  });
}

void upsample_nearest_forward(const float* x, int64_t batch, int64_t height, int64_t width,
                              int64_t channels, int64_t factor, float* y) {
  check("upsample_nearest_forward", batch, height, width, channels, factor);
  const int64_t s = factor, ow = width * s, C = channels;
  const size_t row_bytes = size_t(C) * sizeof(float);
  parallel_chunks(batch * height, std::max<int64_t>(1, 4096 / (width * C)), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const int64_t n = row / height, h = row % height;
      const float* src = x + row * width * C;
      float* dst = y + (n * height * s + h * s) * ow * C;
      for (int64_t w = 0; w < width; ++w)
        for (int64_t j = 0; j < s; ++j) std::memcpy(dst + (w * s + j) * C, src + w * C, row_bytes);
      for (int64_t i = 1; i < s; ++i) std::memcpy(dst + i * ow * C, dst, size_t(ow) * row_bytes);
    }
  });
}

void upsample_nearest_backward(const float* dy, int64_t batch, int64_t height, int64_t width,
                               int64_t channels, int64_t factor, float* dx) {
  check("upsample_nearest_backward", batch, height, width, channels, factor);
  const int64_t s = factor, ow = width * s, C = channels;
  parallel_chunks(batch * height, std::max<int64_t>(1, 4096 / (width * C)), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const int64_t n = row / height, h = row % height;
      const float* src = dy + (n * height * s + h * s) * ow * C;
      float* dst = dx + row * width * C;
      for (int64_t w = 0; w < width; ++w) {
        float* out = dst + w * C;
        std::memcpy(out, src + w * s * C, size_t(C) * sizeof(float));
        for (int64_t i = 0; i < s; ++i)
          for (int64_t j = (i == 0 ? 1 : 0); j < s; ++j) add_to(out, src + (i * ow + w * s + j) * C, C);
      }
    }
  });
}

namespace ref {

void upsample_nearest_to_forward(const float* x, int64_t batch, int64_t in_h, int64_t in_w, int64_t channels,
                                 int64_t out_h, int64_t out_w, float* y) {
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t i = 0; i < out_h; ++i)
      for (int64_t j = 0; j < out_w; ++j)
        for (int64_t c = 0; c < channels; ++c)
          y[((n * out_h + i) * out_w + j) * channels + c] =
              x[((n * in_h + i * in_h / out_h) * in_w + j * in_w / out_w) * channels + c];
}

void upsample_nearest_to_backward(const float* dy, int64_t batch, int64_t in_h, int64_t in_w, int64_t channels,
                                  int64_t out_h, int64_t out_w, float* dx) {
  std::vector<double> acc(size_t(batch * in_h * in_w * channels), 0.0);
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t i = 0; i < out_h; ++i)
      for (int64_t j = 0; j < out_w; ++j)
        for (int64_t c = 0; c < channels; ++c)
          acc[size_t(((n * in_h + i * in_h / out_h) * in_w + j * in_w / out_w) * channels + c)] +=
              dy[((n * out_h + i) * out_w + j) * channels + c];
  for (size_t i = 0; i < acc.size(); ++i) dx[i] = float(acc[i]);
}

void upsample_nearest_forward(const float* x, int64_t batch, int64_t height, int64_t width,
                              int64_t channels, int64_t factor, float* y) {
  const int64_t s = factor, oh = height * s, ow = width * s;
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        for (int64_t c = 0; c < channels; ++c)
          y[((n * oh + i) * ow + j) * channels + c] =
              x[((n * height + i / s) * width + j / s) * channels + c];
}

void upsample_nearest_backward(const float* dy, int64_t batch, int64_t height, int64_t width,
                               int64_t channels, int64_t factor, float* dx) {
  const int64_t s = factor, oh = height * s, ow = width * s;
  std::vector<double> acc(size_t(batch * height * width * channels), 0.0);
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        for (int64_t c = 0; c < channels; ++c)
          acc[size_t(((n * height + i / s) * width + j / s) * channels + c)] +=
              dy[((n * oh + i) * ow + j) * channels + c];
  for (size_t i = 0; i < acc.size(); ++i) dx[i] = float(acc[i]);
}

}  // namespace ref
}  // namespace hyperion
