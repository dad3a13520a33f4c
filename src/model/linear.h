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
  GemmArgs g;
  g.trans_a = Trans::kN;
  g.trans_b = Trans::kT;
  g.m = n;
  g.n = w.shape[0];
  g.k = w.shape[1];
  g.a = x;
  g.a_dtype = xd;
  g.lda = g.k;
  g.b = w.data;
  g.b_dtype = w.dtype;
  g.ldb = g.k;
  g.c = y;
  g.c_dtype = yd;
  g.ldc = g.n;
  g.beta = beta;
  gemm(g);
}

// dx[n, in] = dy[n, out] W + beta * dx (input gradient of a Linear layer).
inline void backward_input(const void* dy, DType dyd, const TensorView& w, void* dx, DType dxd,
                           int64_t n, float beta = 0.0f) {
  GemmArgs g;
  g.trans_a = Trans::kN;
  g.trans_b = Trans::kN;
  g.m = n;
  g.n = w.shape[1];
  g.k = w.shape[0];
  g.a = dy;
  g.a_dtype = dyd;
  g.lda = g.k;
  g.b = w.data;
  g.b_dtype = w.dtype;
  g.ldb = g.n;
  g.c = dx;
  g.c_dtype = dxd;
  g.ldc = g.n;
  g.beta = beta;
  gemm(g);
}

// dW[out, in] += dy[n, out]^T x[n, in] (weight gradient, accumulated in f32).
inline void backward_weight(const void* dy, const void* x, DType d, const TensorView& dw,
                            int64_t n) {
  GemmArgs g;
  g.trans_a = Trans::kT;
  g.trans_b = Trans::kN;
  g.m = dw.shape[0];
  g.n = dw.shape[1];
  g.k = n;
  g.a = dy;
  g.a_dtype = d;
  g.lda = g.m;
  g.b = x;
  g.b_dtype = d;
  g.ldb = g.n;
  g.c = dw.data;
  g.c_dtype = DType::kF32;
  g.ldc = g.n;
  g.beta = 1.0f;
  gemm(g);
}

}  // namespace hyperion::linear
