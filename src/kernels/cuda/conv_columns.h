// The index arithmetic of the CUDA convolution's column matrix (diffusion_ops.cu), in plain
// C++ that compiles for the device and the host alike, so that a CPU test
// (tests/kernels/conv_columns_test.cc) runs the same chunked im2col / col2im algorithm
// against the reference convolution on machines without a GPU.
//
// Output row r = (n OH + oy) OW + ox; column c = (ky K + kx) Ci + i; the entry (r, c)
// reads x[n, oy s - p + ky, ox s - p + kx, i], or 0 in the padding. A chunk is the output
// rows [r0, r0 + rows) (any split: whole images, bands of one image, or parts of rows).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define HYP_HOST_DEVICE __host__ __device__
#else
#define HYP_HOST_DEVICE
#endif

namespace hyperion::cuda {

struct ConvGeometry {
  int64_t n, h, w, ci, co, k, stride, pad, oh, ow;
  HYP_HOST_DEVICE int64_t columns() const { return k * k * ci; }
};

// The x element (flat NHWC index) column entry (r, c) reads, or -1 in the padding.
HYP_HOST_DEVICE inline int64_t im2col_source(const ConvGeometry& g, int64_t r, int64_t c) {
  const int64_t i = c % g.ci, kx = (c / g.ci) % g.k, ky = c / (g.ci * g.k);
  const int64_t ox = r % g.ow, oy = (r / g.ow) % g.oh, n = r / (g.ow * g.oh);
  const int64_t iy = oy * g.stride - g.pad + ky, ix = ox * g.stride - g.pad + kx;
  if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) return -1;
  return ((n * g.h + iy) * g.w + ix) * g.ci + i;
}

// The sum over the chunk's column gradient dcol [rows, K K Ci] of the entries that read
// x element (n, iy, ix, i), in (ky, kx) order.
HYP_HOST_DEVICE inline float col2im_sum(const ConvGeometry& g, const float* dcol, int64_t r0,
                                        int64_t rows, int64_t n, int64_t iy, int64_t ix,
                                        int64_t i) {
  float acc = 0.0f;
  for (int64_t ky = 0; ky < g.k; ++ky) {
    const int64_t oyn = iy + g.pad - ky;
    if (oyn < 0 || oyn % g.stride != 0 || oyn / g.stride >= g.oh) continue;
    for (int64_t kx = 0; kx < g.k; ++kx) {
      const int64_t oxn = ix + g.pad - kx;
      if (oxn < 0 || oxn % g.stride != 0 || oxn / g.stride >= g.ow) continue;
      const int64_t r = (n * g.oh + oyn / g.stride) * g.ow + oxn / g.stride;
      if (r < r0 || r >= r0 + rows) continue;
      acc += dcol[(r - r0) * g.columns() + (ky * g.k + kx) * g.ci + i];
    }
  }
  return acc;
}

// The inputs a chunk's outputs read: images [n0, n0 + images) and, within each, input rows
// [iy0, iy0 + iys) (every row when the chunk spans images; the band a chunk of one image
// reads otherwise). iys <= 0: none.
struct ChunkInputs {
  int64_t n0, images, iy0, iys;
};
HYP_HOST_DEVICE inline ChunkInputs chunk_inputs(const ConvGeometry& g, int64_t r0, int64_t rows) {
  const int64_t per_image = g.oh * g.ow;
  const int64_t n0 = r0 / per_image, n1 = (r0 + rows - 1) / per_image;
  int64_t iy0 = 0, iy1 = g.h;
  if (n0 == n1) {
    const int64_t oy0 = (r0 % per_image) / g.ow, oy1 = ((r0 + rows - 1) % per_image) / g.ow;
    iy0 = oy0 * g.stride - g.pad;
    iy1 = oy1 * g.stride - g.pad + g.k;
    iy0 = iy0 < 0 ? 0 : iy0;
    iy1 = iy1 > g.h ? g.h : iy1;
  }
  return ChunkInputs{n0, n1 - n0 + 1, iy0, iy1 - iy0};
}

// The weights as rows of the column order: wr[o, (ky K + kx) Ci + i] = w[o, i, ky, kx],
// e indexing wr; returns the index into w (OIHW).
HYP_HOST_DEVICE inline int64_t weight_row_source(const ConvGeometry& g, int64_t e) {
  const int64_t kk = g.k * g.k, kki = g.columns();
  const int64_t o = e / kki, c = e % kki;
  return (o * g.ci + c % g.ci) * kk + c / g.ci;
}

}  // namespace hyperion::cuda
