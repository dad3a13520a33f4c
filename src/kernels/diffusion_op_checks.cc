#include "kernels/diffusion_op_checks.h"

#include "base/error.h"

namespace hyperion {
namespace {

bool empty(const TensorView& v) {
  return v.data == nullptr;
}

// v holds `numel` elements of `dtype` (or is empty when `optional`).
void expect(const char* op, const char* what, const TensorView& v, DType dtype, int64_t numel,
            bool optional = false) {
  if (optional && empty(v)) return;
  HYP_CHECK(!empty(v), "{}: {} is required", op, what);
  HYP_CHECK(v.dtype == dtype && v.numel() == numel, "{}: {} is {}, expected {} elements of {}", op,
            what, v.str(), numel, dtype_name(dtype));
}

void expect_float(const char* op, const char* what, const TensorView& v) {
  HYP_CHECK(v.dtype == DType::kF32 || v.dtype == DType::kBF16,
            "{}: {} must be f32 or bf16, got {}", op, what, v.str());
}

}  // namespace

void check_conv2d_forward_views(const Conv2dShape& s, const TensorView& x, const TensorView& w,
                                const TensorView& bias, const TensorView& y) {
  const char* op = "conv2d_forward";
  check_conv2d_shape(s);
  expect_float(op, "x", x);
  expect(op, "x", x, x.dtype, s.x_numel());
  expect(op, "w", w, DType::kF32, s.w_numel());
  expect(op, "bias", bias, DType::kF32, s.out_channels, true);
  expect(op, "y", y, DType::kF32, s.y_numel());
}

void check_conv2d_backward_views(const Conv2dShape& s, const TensorView& dy, const TensorView& x,
                                 const TensorView& w, const TensorView& dx, const TensorView& dw,
                                 const TensorView& dbias) {
  const char* op = "conv2d_backward";
  check_conv2d_shape(s);
  expect_float(op, "x", x);
  expect(op, "x", x, x.dtype, s.x_numel());
  expect(op, "dy (of x's dtype)", dy, x.dtype, s.y_numel());
  expect(op, "w", w, DType::kF32, s.w_numel());
  expect(op, "dx", dx, DType::kF32, s.x_numel(), true);
  expect(op, "dw", dw, DType::kF32, s.w_numel(), true);
  expect(op, "dbias", dbias, DType::kF32, s.out_channels, true);
}

void check_group_norm_forward_views(const GroupNormShape& s, const TensorView& x,
                                    const TensorView& gamma, const TensorView& beta,
                                    const TensorView& y, const TensorView& mean,
                                    const TensorView& rstd) {
  const char* op = "group_norm_forward";
  check_group_norm_shape(s);
  const int64_t n = s.batch * s.pixels * s.channels, stats = s.batch * s.groups;
  expect(op, "x", x, DType::kF32, n);
  expect(op, "gamma", gamma, DType::kF32, s.channels);
  expect(op, "beta", beta, DType::kF32, s.channels);
  expect(op, "y", y, DType::kF32, n);
  expect(op, "mean", mean, DType::kF32, stats);
  expect(op, "rstd", rstd, DType::kF32, stats);
}

void check_group_norm_backward_views(const GroupNormShape& s, const TensorView& dy,
                                     const TensorView& x, const TensorView& gamma,
                                     const TensorView& mean, const TensorView& rstd,
                                     const TensorView& dx, const TensorView& dgamma,
                                     const TensorView& dbeta) {
  const char* op = "group_norm_backward";
  check_group_norm_shape(s);
  const int64_t n = s.batch * s.pixels * s.channels, stats = s.batch * s.groups;
  expect(op, "dy", dy, DType::kF32, n);
  expect(op, "x", x, DType::kF32, n);
  expect(op, "gamma", gamma, DType::kF32, s.channels);
  expect(op, "mean", mean, DType::kF32, stats);
  expect(op, "rstd", rstd, DType::kF32, stats);
  expect(op, "dx", dx, DType::kF32, n);
  expect(op, "dgamma", dgamma, DType::kF32, s.channels);
  expect(op, "dbeta", dbeta, DType::kF32, s.channels);
}

namespace {
RowsCols layer_norm_rows(const char* op, const TensorView& x) {
  HYP_CHECK(!empty(x) && x.rank() >= 1 && x.shape.dim(-1) >= 1, "{}: x {} must be [rows, C]", op,
            x.str());
  expect(op, "x", x, DType::kF32, x.numel());
  return RowsCols{x.numel() / x.shape.dim(-1), x.shape.dim(-1)};
}
}  // namespace

RowsCols check_layer_norm_forward_views(const TensorView& x, const TensorView& gamma,
                                        const TensorView& beta, const TensorView& y,
                                        const TensorView& mean, const TensorView& rstd) {
  const char* op = "layer_norm_forward";
  const RowsCols rc = layer_norm_rows(op, x);
  expect(op, "gamma", gamma, DType::kF32, rc.cols);
  expect(op, "beta", beta, DType::kF32, rc.cols);
  expect(op, "y", y, DType::kF32, x.numel());
  expect(op, "mean", mean, DType::kF32, rc.rows, true);
  expect(op, "rstd", rstd, DType::kF32, rc.rows, true);
  HYP_CHECK(empty(mean) == empty(rstd), "{}: mean and rstd are given together or not at all", op);
  return rc;
}

RowsCols check_layer_norm_backward_views(const TensorView& dy, const TensorView& x,
                                         const TensorView& gamma, const TensorView& mean,
                                         const TensorView& rstd, const TensorView& dx,
                                         const TensorView& dgamma, const TensorView& dbeta) {
  const char* op = "layer_norm_backward";
  const RowsCols rc = layer_norm_rows(op, x);
  expect(op, "dy", dy, DType::kF32, x.numel());
  expect(op, "gamma", gamma, DType::kF32, rc.cols);
  expect(op, "mean", mean, DType::kF32, rc.rows);
  expect(op, "rstd", rstd, DType::kF32, rc.rows);
  expect(op, "dx", dx, DType::kF32, x.numel());
  expect(op, "dgamma", dgamma, DType::kF32, rc.cols, true);
  expect(op, "dbeta", dbeta, DType::kF32, rc.cols, true);
  return rc;
}

void check_upsample_views(const char* op, const TensorView& small, const TensorView& big) {
  HYP_CHECK(small.rank() == 4 && big.rank() == 4 && small.shape[0] == big.shape[0] &&
                small.shape[3] == big.shape[3] && big.shape[1] >= small.shape[1] &&
                big.shape[2] >= small.shape[2] && small.shape[1] >= 1 && small.shape[2] >= 1,
            "{}: {} and {} must be [N, H, W, C] and [N, OH >= H, OW >= W, C]", op, small.str(),
            big.str());
  expect(op, "the input", small, DType::kF32, small.numel());
  expect(op, "the output", big, DType::kF32, big.numel());
}

void check_timestep_embedding_views(const TensorView& t, const TimestepEmbeddingParams& p,
                                    const TensorView& out) {
  const char* op = "timestep_embedding";
  check_timestep_embedding_params(p);
  expect(op, "t", t, DType::kF32, t.numel());
  expect(op, "out", out, DType::kF32, t.numel() * p.dim);
}

void check_activation_views(const char* op, const TensorView& a, const TensorView& b) {
  expect(op, "the input", a, DType::kF32, a.numel());
  expect(op, "the output", b, DType::kF32, a.numel());
}

void check_copy_2d(size_t src_pitch, size_t dst_pitch, size_t row_bytes) {
  HYP_CHECK(row_bytes <= src_pitch && row_bytes <= dst_pitch,
            "copy_2d: rows of {} bytes are wider than the pitches (source {}, destination {})",
            row_bytes, src_pitch, dst_pitch);
}

RowsCols check_geglu_views(const char* op, const TensorView& x, const TensorView& h) {
  HYP_CHECK(!empty(x) && !empty(h) && x.rank() >= 1 && h.rank() >= 1 && x.shape.dim(-1) >= 2 &&
                x.shape.dim(-1) % 2 == 0 && h.shape.dim(-1) * 2 == x.shape.dim(-1) &&
                x.numel() == 2 * h.numel(),
            "{}: x {} and h {} must be [rows, 2F] and [rows, F]", op, x.str(), h.str());
  expect(op, "x", x, DType::kF32, x.numel());
  expect(op, "h", h, DType::kF32, h.numel());
  return RowsCols{h.numel() / h.shape.dim(-1), h.shape.dim(-1)};
}

}  // namespace hyperion
