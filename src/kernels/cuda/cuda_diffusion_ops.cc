// The CUDA backend's diffusion layers (kernels/backend.h): the checks every backend shares
// (kernels/diffusion_op_checks.h), then the kernels of diffusion_ops.cu and, for the
// convolution, cuBLASLt GEMMs over column matrices built in chunks of output rows (at
// most 256 MiB each, so a VAE's 512 x 512 layers need no gigabyte scratch).
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/diffusion_op_checks.h"

namespace hyperion::cuda {
namespace {

// HYPERION_CUDA_CONV_CHUNK_BYTES overrides it (the parity test sets it small on a GPU, so
// that its small convolutions take the chunked path too).
int64_t column_budget_bytes() {
  static const int64_t budget = [] {
    const char* v = std::getenv("HYPERION_CUDA_CONV_CHUNK_BYTES");
    const long long n = v != nullptr ? std::atoll(v) : 0;
    return n > 0 ? static_cast<int64_t>(n) : int64_t{256} << 20;
  }();
  return budget;
}

ConvGeometry geometry_of(const Conv2dShape& s) {
  return ConvGeometry{s.batch,   s.height, s.width,        s.in_channels,   s.out_channels,
                      s.kernel,  s.stride, s.padding,      s.out_height(),  s.out_width()};
}

bool pointwise(const Conv2dShape& s) {
  return s.kernel == 1 && s.stride == 1 && s.padding == 0;
}

// Output rows per column-matrix chunk: as many as fit the budget, at least one.
int64_t chunk_rows(int64_t rows, int64_t row_bytes) {
  const int64_t fit = column_budget_bytes() / std::max<int64_t>(row_bytes, 1);
  return std::clamp<int64_t>(fit, 1, std::max<int64_t>(rows, 1));
}

}  // namespace

void CudaBackend::conv2d_forward(const Conv2dShape& s, const TensorView& x, const TensorView& w,
                                 const TensorView& bias, const TensorView& y) {
  const char* op = "conv2d_forward";
  check(op, {&x, &w, &bias, &y});
  check_conv2d_forward_views(s, x, w, bias, y);
  const ConvGeometry g = geometry_of(s);
  const Elem ct = elem_of(op, "x", x);
  const DType cd = x.dtype;
  const size_t esize = dtype_size(cd);
  const int64_t kki = g.k * g.k * g.ci, rows = g.n * g.oh * g.ow;
  // The weights as rows of the GEMM's dtype (f32 1x1 weights already are).
  const void* wr = w.data;
  if (!pointwise(s) || cd != DType::kF32) {
    wr = conv_w_.get(static_cast<size_t>(g.co * kki) * esize);
    cuda::conv_weight_to_rows(stream_, g, w.as<float>(), const_cast<void*>(wr), ct);
  }
  auto multiply = [&](const void* a, int64_t r0, int64_t count) {
    GemmArgs args = contiguous_gemm_args(Trans::kN, Trans::kT, count, g.co, kki, a, cd, wr, cd,
                                         y.as<float>() + r0 * g.co, DType::kF32);
    args.bias = bias.as<float>();
    gemm(args);
  };
  if (pointwise(s)) {
    multiply(x.data, 0, rows);
  } else {
    const int64_t chunk = chunk_rows(rows, kki * static_cast<int64_t>(esize));
    void* col = conv_col_.get(static_cast<size_t>(chunk * kki) * esize);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t count = std::min(chunk, rows - r0);
      cuda::conv_im2col(stream_, g, x.data, ct, r0, count, col, ct);
      multiply(col, r0, count);
    }
  }
  launched(op);
}

void CudaBackend::conv2d_backward(const Conv2dShape& s, const TensorView& dy, const TensorView& x,
                                  const TensorView& w, const TensorView& dx, const TensorView& dw,
                                  const TensorView& dbias) {
  const char* op = "conv2d_backward";
  check(op, {&dy, &x, &w, &dx, &dw, &dbias});
  check_conv2d_backward_views(s, dy, x, w, dx, dw, dbias);
  const ConvGeometry g = geometry_of(s);
  const Elem ct = elem_of(op, "x", x);
  const DType cd = x.dtype;
  const size_t esize = dtype_size(cd);
  const int64_t kki = g.k * g.k * g.ci, rows = g.n * g.oh * g.ow;
  if (dbias.data != nullptr) {
    auto* scratch = static_cast<float*>(scratch_.get(
        static_cast<size_t>(cuda::column_sums_scratch_floats(rows, g.co)) * sizeof(float)));
    cuda::column_sums_add(stream_, dy.data, ct, rows, g.co, scratch, dbias.as<float>());
  }
  if (dx.data == nullptr && dw.data == nullptr) {
    launched(op);
    return;
  }
  const void* wr = w.data;
  if (dx.data != nullptr && (!pointwise(s) || cd != DType::kF32)) {
    wr = conv_w_.get(static_cast<size_t>(g.co * kki) * esize);
    cuda::conv_weight_to_rows(stream_, g, w.as<float>(), const_cast<void*>(wr), ct);
  }
  if (pointwise(s)) {
    // dx [rows, Ci] = dy [rows, Co] W [Co, Ci]; dW [Co, Ci] += dy^T x.
    if (dx.data != nullptr)
      gemm(contiguous_gemm_args(Trans::kN, Trans::kN, rows, g.ci, g.co, dy.data, cd, wr, cd,
                                dx.data, DType::kF32));
    if (dw.data != nullptr)
      gemm(contiguous_gemm_args(Trans::kT, Trans::kN, g.co, g.ci, rows, dy.data, cd, x.data, cd,
                                dw.data, DType::kF32, 1.0f));
    launched(op);
    return;
  }
  const int64_t row_bytes =
      kki * (static_cast<int64_t>(esize) + (dx.data != nullptr ? int64_t{4} : int64_t{0}));
  const int64_t chunk = chunk_rows(rows, row_bytes);
  void* col = dw.data != nullptr ? conv_col_.get(static_cast<size_t>(chunk * kki) * esize) : nullptr;
  auto* dcol = dx.data != nullptr
                   ? static_cast<float*>(conv_dcol_.get(static_cast<size_t>(chunk * kki) * 4))
                   : nullptr;
  auto* dwr = dw.data != nullptr
                  ? static_cast<float*>(conv_dw_.get(static_cast<size_t>(g.co * kki) * 4))
                  : nullptr;
  if (dx.data != nullptr) check_cuda(cudaMemsetAsync(dx.data, 0, dx.nbytes(), stream_), op);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t count = std::min(chunk, rows - r0);
    const void* dy_rows = static_cast<const char*>(dy.data) + static_cast<size_t>(r0 * g.co) * esize;
    if (dx.data != nullptr) {
      gemm(contiguous_gemm_args(Trans::kN, Trans::kN, count, kki, g.co, dy_rows, cd, wr, cd, dcol,
                                DType::kF32));
      cuda::conv_col2im_add(stream_, g, dcol, r0, count, dx.as<float>());
    }
    if (dw.data != nullptr) {
      cuda::conv_im2col(stream_, g, x.data, ct, r0, count, col, ct);
      gemm(contiguous_gemm_args(Trans::kT, Trans::kN, g.co, kki, count, dy_rows, cd, col, cd, dwr,
                                DType::kF32, r0 > 0 ? 1.0f : 0.0f));
    }
  }
  if (dw.data != nullptr) cuda::conv_weight_rows_add(stream_, g, dwr, dw.as<float>());
  launched(op);
}

void CudaBackend::group_norm_forward(const GroupNormShape& s, const TensorView& x,
                                     const TensorView& gamma, const TensorView& beta, float eps,
                                     const TensorView& y, const TensorView& mean,
                                     const TensorView& rstd) {
  const char* op = "group_norm_forward";
  check(op, {&x, &gamma, &beta, &y, &mean, &rstd});
  check_group_norm_forward_views(s, x, gamma, beta, y, mean, rstd);
  cuda::group_norm_forward(stream_, x.as<float>(), gamma.as<float>(), beta.as<float>(), eps,
                           s.batch, s.pixels, s.channels, s.groups, y.as<float>(),
                           mean.as<float>(), rstd.as<float>());
  launched(op);
}

void CudaBackend::group_norm_backward(const GroupNormShape& s, const TensorView& dy,
                                      const TensorView& x, const TensorView& gamma,
                                      const TensorView& mean, const TensorView& rstd,
                                      const TensorView& dx, const TensorView& dgamma,
                                      const TensorView& dbeta) {
  const char* op = "group_norm_backward";
  check(op, {&dy, &x, &gamma, &mean, &rstd, &dx, &dgamma, &dbeta});
  check_group_norm_backward_views(s, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  auto* scratch = static_cast<float*>(scratch_.get(
      static_cast<size_t>(cuda::column_sums_scratch_floats(s.batch * s.pixels, s.channels)) *
      sizeof(float)));
  cuda::group_norm_backward(stream_, dy.as<float>(), x.as<float>(), gamma.as<float>(),
                            mean.as<float>(), rstd.as<float>(), s.batch, s.pixels, s.channels,
                            s.groups, dx.as<float>(), dgamma.as<float>(), dbeta.as<float>(),
                            scratch);
  launched(op);
}

void CudaBackend::layer_norm_forward(const TensorView& x, const TensorView& gamma,
                                     const TensorView& beta, float eps, const TensorView& y,
                                     const TensorView& mean, const TensorView& rstd) {
  const char* op = "layer_norm_forward";
  check(op, {&x, &gamma, &beta, &y, &mean, &rstd});
  const RowsCols rc = check_layer_norm_forward_views(x, gamma, beta, y, mean, rstd);
  cuda::layer_norm_forward(stream_, x.as<float>(), gamma.as<float>(), beta.as<float>(), eps,
                           rc.rows, rc.cols, y.as<float>(), mean.as<float>(), rstd.as<float>());
  launched(op);
}

void CudaBackend::layer_norm_backward(const TensorView& dy, const TensorView& x,
                                      const TensorView& gamma, const TensorView& mean,
                                      const TensorView& rstd, const TensorView& dx,
                                      const TensorView& dgamma, const TensorView& dbeta) {
  const char* op = "layer_norm_backward";
  check(op, {&dy, &x, &gamma, &mean, &rstd, &dx, &dgamma, &dbeta});
  const RowsCols rc = check_layer_norm_backward_views(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  auto* scratch = static_cast<float*>(scratch_.get(
      static_cast<size_t>(cuda::column_sums_scratch_floats(rc.rows, rc.cols)) * sizeof(float)));
  cuda::layer_norm_backward(stream_, dy.as<float>(), x.as<float>(), gamma.as<float>(),
                            mean.as<float>(), rstd.as<float>(), rc.rows, rc.cols, dx.as<float>(),
                            dgamma.as<float>(), dbeta.as<float>(), scratch);
  launched(op);
}

void CudaBackend::upsample_nearest_forward(const TensorView& x, const TensorView& y) {
  const char* op = "upsample_nearest_forward";
  check(op, {&x, &y});
  check_upsample_views(op, x, y);
  cuda::upsample_nearest_forward(stream_, x.as<float>(), x.shape[0], x.shape[1], x.shape[2],
                                 x.shape[3], y.shape[1], y.shape[2], y.as<float>());
  launched(op);
}

void CudaBackend::upsample_nearest_backward(const TensorView& dy, const TensorView& dx) {
  const char* op = "upsample_nearest_backward";
  check(op, {&dy, &dx});
  check_upsample_views(op, dx, dy);
  cuda::upsample_nearest_backward(stream_, dy.as<float>(), dx.shape[0], dx.shape[1], dx.shape[2],
                                  dx.shape[3], dy.shape[1], dy.shape[2], dx.as<float>());
  launched(op);
}

void CudaBackend::timestep_embedding(const TensorView& t, const TimestepEmbeddingParams& p,
                                     const TensorView& out) {
  const char* op = "timestep_embedding";
  check(op, {&t, &out});
  check_timestep_embedding_views(t, p, out);
  cuda::timestep_embedding(stream_, t.as<float>(), t.numel(), p.dim, p.flip_sin_to_cos,
                           p.freq_shift, p.scale, p.max_period, out.as<float>());
  launched(op);
}

void CudaBackend::activation_forward(Activation a, const TensorView& x, const TensorView& y) {
  const char* op = "activation_forward";
  check(op, {&x, &y});
  check_activation_views(op, x, y);
  cuda::activation_forward(stream_, static_cast<int>(a), x.as<float>(), y.as<float>(), x.numel());
  launched(op);
}

void CudaBackend::activation_backward(Activation a, const TensorView& dy, const TensorView& x,
                                      const TensorView& dx) {
  const char* op = "activation_backward";
  check(op, {&dy, &x, &dx});
  check_activation_views(op, x, dy);
  check_activation_views(op, x, dx);
  cuda::activation_backward(stream_, static_cast<int>(a), dy.as<float>(), x.as<float>(),
                            dx.as<float>(), x.numel());
  launched(op);
}

void CudaBackend::geglu_forward(const TensorView& x, const TensorView& h) {
  const char* op = "geglu_forward";
  check(op, {&x, &h});
  const RowsCols rc = check_geglu_views(op, x, h);
  cuda::geglu_forward(stream_, x.as<float>(), rc.rows, rc.cols, h.as<float>());
  launched(op);
}

void CudaBackend::geglu_backward(const TensorView& dh, const TensorView& x, const TensorView& dx) {
  const char* op = "geglu_backward";
  check(op, {&dh, &x, &dx});
  const RowsCols rc = check_geglu_views(op, x, dh);
  check_geglu_views(op, dx, dh);
  cuda::geglu_backward(stream_, dh.as<float>(), x.as<float>(), rc.rows, rc.cols, dx.as<float>());
  launched(op);
}

}  // namespace hyperion::cuda
