// LayerNorm rows with Highway: per row, a sum, a sum of squared deviations and one
// affine pass forward; two sums and one pass backward. Rows are independent, so threads
// take blocks of rows; the weight gradients are summed per block and then over blocks in
// order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/layer_norm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include <cmath>

#include "kernels/layer_norm.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

float RowSum(DF d, const float* x, size_t n, float shift, bool squared) {
  const size_t L = hn::Lanes(d);
  VF a = hn::Zero(d);
  const VF m = hn::Set(d, shift);
  size_t i = 0;
  for (; i + L <= n; i += L) {
    const VF v = hn::Sub(hn::LoadU(d, x + i), m);
    a = squared ? hn::MulAdd(v, v, a) : hn::Add(a, v);
  }
  float s = hn::GetLane(hn::SumOfLanes(d, a));
  for (; i < n; ++i) {
    const float v = x[i] - shift;
    s += squared ? v * v : v;
  }
  return s;
}

void ForwardRows(const float* x, int64_t rows, int64_t cols, const float* gamma,
                 const float* beta, float eps, float* y, float* mean, float* rstd) {
  const DF d;
  const size_t L = hn::Lanes(d), C = size_t(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * C;
    float* yr = y + size_t(r) * C;
    const float m = RowSum(d, xr, C, 0.0f, false) / float(C);
    const float var = RowSum(d, xr, C, m, true) / float(C);
    const float rs = 1.0f / std::sqrt(var + eps);
    if (mean != nullptr) mean[r] = m;
    if (rstd != nullptr) rstd[r] = rs;
    const VF vm = hn::Set(d, m), vr = hn::Set(d, rs);
    size_t c = 0;
    for (; c + L <= C; c += L) {
      const VF xhat = hn::Mul(hn::Sub(hn::LoadU(d, xr + c), vm), vr);
      hn::StoreU(hn::MulAdd(xhat, hn::LoadU(d, gamma + c), hn::LoadU(d, beta + c)), d, yr + c);
    }
    for (; c < C; ++c) yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
  }
}

// dx for the rows, and the rows' dgamma / dbeta sums added into pg / pb.
void BackwardRows(const float* dy, const float* x, int64_t rows, int64_t cols,
                  const float* gamma, const float* mean, const float* rstd, float* dx, float* pg,
                  float* pb) {
  const DF d;
  const size_t L = hn::Lanes(d), C = size_t(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + size_t(r) * C;
    const float* xr = x + size_t(r) * C;
    float* dxr = dx + size_t(r) * C;
    const VF vm = hn::Set(d, mean[r]), vr = hn::Set(d, rstd[r]);
    VF s1 = hn::Zero(d), s2 = hn::Zero(d);
    size_t c = 0;
    for (; c + L <= C; c += L) {
      const VF g = hn::LoadU(d, dyr + c);
      const VF xhat = hn::Mul(hn::Sub(hn::LoadU(d, xr + c), vm), vr);
      const VF gdy = hn::Mul(g, hn::LoadU(d, gamma + c));
      s1 = hn::Add(s1, gdy);
      s2 = hn::MulAdd(gdy, xhat, s2);
      hn::StoreU(hn::MulAdd(g, xhat, hn::LoadU(d, pg + c)), d, pg + c);
      hn::StoreU(hn::Add(g, hn::LoadU(d, pb + c)), d, pb + c);
    }
    float sum1 = hn::GetLane(hn::SumOfLanes(d, s1)), sum2 = hn::GetLane(hn::SumOfLanes(d, s2));
    for (size_t t = c; t < C; ++t) {
      const float xhat = (xr[t] - mean[r]) * rstd[r];
      const float gdy = dyr[t] * gamma[t];
      sum1 += gdy;
      sum2 += gdy * xhat;
      pg[t] += dyr[t] * xhat;
      pb[t] += dyr[t];
    }
    const float m1 = sum1 / float(C), m2 = sum2 / float(C);
    const VF vm1 = hn::Set(d, m1), vm2 = hn::Set(d, m2);
    for (c = 0; c + L <= C; c += L) {
      const VF xhat = hn::Mul(hn::Sub(hn::LoadU(d, xr + c), vm), vr);
      const VF gdy = hn::Mul(hn::LoadU(d, dyr + c), hn::LoadU(d, gamma + c));
      hn::StoreU(hn::Mul(vr, hn::NegMulAdd(xhat, vm2, hn::Sub(gdy, vm1))), d, dxr + c);
    }
    for (; c < C; ++c) {
      const float xhat = (xr[c] - mean[r]) * rstd[r];
      dxr[c] = rstd[r] * (dyr[c] * gamma[c] - m1 - xhat * m2);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(ForwardRows);
HWY_EXPORT(BackwardRows);

namespace {

constexpr int64_t kRowBlock = 32;

void check_shape(const char* op, int64_t rows, int64_t cols) {
  HYP_CHECK(rows >= 0 && cols > 0, "{}: {} rows of {} columns (columns must be positive)", op,
            rows, cols);
}

}  // namespace

void layer_norm_forward(const float* x, int64_t rows, int64_t cols, const float* gamma,
                        const float* beta, float eps, float* y, float* mean, float* rstd) {
  check_shape("layer_norm_forward", rows, cols);
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  parallel_for_dynamic(blocks, [&](int64_t b) {
    const int64_t r0 = b * kRowBlock, n = std::min(kRowBlock, rows - r0);
    HWY_DYNAMIC_DISPATCH(ForwardRows)(x + r0 * cols, n, cols, gamma, beta, eps, y + r0 * cols,
                                      mean != nullptr ? mean + r0 : nullptr,
                                      rstd != nullptr ? rstd + r0 : nullptr);
  });
}

void layer_norm_backward(const float* dy, const float* x, int64_t rows, int64_t cols,
                         const float* gamma, const float* mean, const float* rstd, float* dx,
                         float* dgamma, float* dbeta) {
  check_shape("layer_norm_backward", rows, cols);
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<float> partial(size_t(blocks * 2 * cols), 0.0f);
  parallel_for_dynamic(blocks, [&](int64_t b) {
    const int64_t r0 = b * kRowBlock, n = std::min(kRowBlock, rows - r0);
    float* pg = partial.data() + b * 2 * cols;
    HWY_DYNAMIC_DISPATCH(BackwardRows)(dy + r0 * cols, x + r0 * cols, n, cols, gamma, mean + r0,
                                       rstd + r0, dx + r0 * cols, pg, pg + cols);
  });
  for (int64_t c = 0; c < cols; ++c) {
    double g = 0.0, bsum = 0.0;
    for (int64_t b = 0; b < blocks; ++b) {
      g += partial[size_t(b * 2 * cols + c)];
      bsum += partial[size_t(b * 2 * cols + cols + c)];
    }
    if (dgamma) dgamma[c] += float(g);
    if (dbeta) dbeta[c] += float(bsum);
  }
}

namespace ref {

void layer_norm_forward(const float* x, int64_t rows, int64_t cols, const float* gamma,
                        const float* beta, float eps, float* y, float* mean, float* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    double m = 0.0, v = 0.0;
    for (int64_t c = 0; c < cols; ++c) m += xr[c];
    m /= double(cols);
    for (int64_t c = 0; c < cols; ++c) v += (xr[c] - m) * (xr[c] - m);
    const double rs = 1.0 / std::sqrt(v / double(cols) + double(eps));
    if (mean != nullptr) mean[r] = float(m);
    if (rstd != nullptr) rstd[r] = float(rs);
    for (int64_t c = 0; c < cols; ++c)
      y[r * cols + c] = float((xr[c] - m) * rs * gamma[c] + beta[c]);
  }
}

void layer_norm_backward(const float* dy, const float* x, int64_t rows, int64_t cols,
                         const float* gamma, const float* mean, const float* rstd, float* dx,
                         float* dgamma, float* dbeta) {
  std::vector<double> dg(size_t(cols), 0.0), db(size_t(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double m1 = 0.0, m2 = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[r * cols + c] - double(mean[r])) * rstd[r];
      const double g = dy[r * cols + c];
      m1 += g * gamma[c];
      m2 += g * gamma[c] * xhat;
      dg[size_t(c)] += g * xhat;
      db[size_t(c)] += g;
    }
    m1 /= double(cols);
    m2 /= double(cols);
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[r * cols + c] - double(mean[r])) * rstd[r];
      dx[r * cols + c] = float(rstd[r] * (double(dy[r * cols + c]) * gamma[c] - m1 - xhat * m2));
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    if (dgamma) dgamma[c] += float(dg[size_t(c)]);
    if (dbeta) dbeta[c] += float(db[size_t(c)]);
  }
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
