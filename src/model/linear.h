// The three matmuls of a Linear layer y = x W^T (W [out, in], as Hugging Face stores
// it) on raw activation buffers: forward, input gradient and weight gradient. Shared by
// the training model and the generator.
#pragma once

#include <cstdint>

#include "kernels/gemm.h"
#include "tensor/tensor.h"

namespace hyperion::linear {

// y[n, out] = x[n, in] W^T + beta * y, W [out, in] (a Linear layer).
inline void forward(const void* x, DType xd, const TensorView& w, void* y, DType yd, int64_t n,
                    float beta = 0.0f) {
  gemm_contiguous(Trans::kN, Trans::kT, n, w.shape[0], w.shape[1], x, xd, w.data, w.dtype, y, yd,
                  beta);
}

// dx[n, in] = dy[n, out] W + beta * dx (input gradient of a Linear layer).
inline void backward_input(const void* dy, DType dyd, const TensorView& w, void* dx, DType dxd,
                           int64_t n, float beta = 0.0f) {
  gemm_contiguous(Trans::kN, Trans::kN, n, w.shape[1], w.shape[0], dy, dyd, w.data, w.dtype, dx,
                  dxd, beta);
}

// dW[out, in] += dy[n, out]^T x[n, in] (weight gradient, accumulated in f32).
inline void backward_weight(const void* dy, const void* x, DType d, const TensorView& dw,
                            int64_t n) {
  gemm_contiguous(Trans::kT, Trans::kN, dw.shape[0], dw.shape[1], n, dy, d, x, d, dw.data,
                  DType::kF32, 1.0f);
}

}  // namespace hyperion::linear
