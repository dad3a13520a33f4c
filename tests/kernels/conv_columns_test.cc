// The CUDA convolution's chunked column algorithm (kernels/cuda/conv_columns.h, run by
// diffusion_ops.cu on a GPU) emulated on the host with the same index functions: im2col
// per chunk of output rows, the GEMMs as plain loops, the gathering col2im over the
// chunk's input band, and the weights laid out as rows and back. Every chunking (one row
// at a time, parts of output rows, bands of one image, several whole images) must give
// the reference convolution's y, dx and dw: the band arithmetic and the chunk boundaries
// are what a GPU run alone would otherwise test.
#include "kernels/cuda/conv_columns.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/conv2d.h"

namespace hyperion {
namespace {

using cuda::ConvGeometry;
using namespace testing_util;

struct Emulated {
  std::vector<float> y, dx, dw;
};

Emulated run_chunked(const Conv2dShape& s, const std::vector<float>& x, const std::vector<float>& w,
                     const std::vector<float>& dy, int64_t chunk) {
  const ConvGeometry g{s.batch,  s.height, s.width,   s.in_channels,  s.out_channels,
                       s.kernel, s.stride, s.padding, s.out_height(), s.out_width()};
  const int64_t kki = g.columns(), rows = g.n * g.oh * g.ow;
  std::vector<float> wr(static_cast<size_t>(g.co * kki));
  for (int64_t e = 0; e < g.co * kki; ++e) wr[size_t(e)] = w[size_t(cuda::weight_row_source(g, e))];
  Emulated out{std::vector<float>(size_t(rows * g.co)), std::vector<float>(x.size(), 0.0f),
               std::vector<float>(w.size(), 0.0f)};
  std::vector<float> dwr(size_t(g.co * kki), 0.0f);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t count = std::min(chunk, rows - r0);
    std::vector<float> col(static_cast<size_t>(count * kki)), dcol(size_t(count * kki), 0.0f);
    for (int64_t r = 0; r < count; ++r)
      for (int64_t c = 0; c < kki; ++c) {
        const int64_t src = cuda::im2col_source(g, r0 + r, c);
        col[size_t(r * kki + c)] = src < 0 ? 0.0f : x[size_t(src)];
      }
    for (int64_t r = 0; r < count; ++r)
      for (int64_t o = 0; o < g.co; ++o) {
        double acc = 0;
        for (int64_t c = 0; c < kki; ++c) acc += double(col[size_t(r * kki + c)]) * wr[size_t(o * kki + c)];
        out.y[size_t((r0 + r) * g.co + o)] = float(acc);
        const float d = dy[size_t((r0 + r) * g.co + o)];
        for (int64_t c = 0; c < kki; ++c) {
          dcol[size_t(r * kki + c)] += d * wr[size_t(o * kki + c)];
          dwr[size_t(o * kki + c)] += d * col[size_t(r * kki + c)];
        }
      }
    const cuda::ChunkInputs in = cuda::chunk_inputs(g, r0, count);
    for (int64_t n = in.n0; n < in.n0 + in.images; ++n)
      for (int64_t iy = in.iy0; iy < in.iy0 + in.iys; ++iy)
        for (int64_t ix = 0; ix < g.w; ++ix)
          for (int64_t i = 0; i < g.ci; ++i)
            out.dx[size_t(((n * g.h + iy) * g.w + ix) * g.ci + i)] +=
                cuda::col2im_sum(g, dcol.data(), r0, count, n, iy, ix, i);
  }
  for (int64_t e = 0; e < g.co * kki; ++e) out.dw[size_t(cuda::weight_row_source(g, e))] += dwr[size_t(e)];
  return out;
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want,
                     const std::string& what) {
  double scale = 1e-6;
  for (float v : want) scale = std::max(scale, double(std::fabs(v)));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * scale) << what << " at " << i;
}

TEST(ConvColumns, EveryChunkingGivesTheReferenceConvolution) {
  std::mt19937 rng(21);
  const Conv2dShape shapes[] = {
      {2, 7, 5, 3, 4, 3, 1, 1},  // padded 3x3
      {2, 9, 8, 2, 3, 3, 2, 1},  // stride 2: a Downsample2D
      {1, 6, 7, 2, 2, 3, 1, 0},  // no padding
      {2, 4, 3, 3, 2, 1, 1, 0},  // 1x1
  };
  for (const Conv2dShape& s : shapes) {
    const std::vector<float> x = randn(size_t(s.x_numel()), rng), w = randn(size_t(s.w_numel()), rng),
                             dy = randn(size_t(s.y_numel()), rng);
    std::vector<float> y(static_cast<size_t>(s.y_numel())), dx(static_cast<size_t>(s.x_numel())), dw(size_t(s.w_numel()), 0.0f);
    ref::conv2d_forward(s, x.data(), w.data(), nullptr, y.data());
    ref::conv2d_backward(s, dy.data(), x.data(), w.data(), dx.data(), dw.data(), nullptr);
    const int64_t ow = s.out_width(), image = s.out_height() * ow, rows = s.batch * image;
    for (const int64_t chunk : {int64_t{1}, int64_t{2}, ow - 1, ow, 2 * ow + 1, image, image + 3, rows}) {
      if (chunk < 1) continue;
      const std::string what = "shape " + std::to_string(s.height) + "x" + std::to_string(s.width) +
                               " s" + std::to_string(s.stride) + " p" + std::to_string(s.padding) +
                               ", chunks of " + std::to_string(chunk) + " rows";
      const Emulated e = run_chunked(s, x, w, dy, chunk);
      expect_near_all(e.y, y, what + ": y");
      expect_near_all(e.dx, dx, what + ": dx");
      expect_near_all(e.dw, dw, what + ": dw");
    }
  }
}

}  // namespace
}  // namespace hyperion
