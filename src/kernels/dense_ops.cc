// The MLP and cross-layer elementwise steps: Highway vectors over the flat arrays,
// threads over large ones (a DLRM batch's activations are a few MB).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dense_ops.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include "kernels/dense_ops.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

void AddTo(float* y, const float* x, size_t n) {
  const DF d;
  const size_t L = hn::Lanes(d);
  size_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::Add(hn::LoadU(d, y + i), hn::LoadU(d, x + i)), d, y + i);
  for (; i < n; ++i) y[i] += x[i];
}

void ReluForward(float* x, size_t n) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF zero = hn::Zero(d);
  size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Max(hn::LoadU(d, x + i), zero), d, x + i);
  for (; i < n; ++i) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void ReluBackward(const float* y, float* dy, size_t n) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF zero = hn::Zero(d);
  size_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::IfThenElseZero(hn::Gt(hn::LoadU(d, y + i), zero), hn::LoadU(d, dy + i)), d,
               dy + i);
  for (; i < n; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

// db[c0, c1) += column sums of rows [0, rows).
void ColumnSums(const float* dy, size_t rows, size_t cols, float* db, size_t c0, size_t c1) {
  const DF d;
  const size_t L = hn::Lanes(d);
  size_t j = c0;
  for (; j + L <= c1; j += L) {
    VF a = hn::LoadU(d, db + j);
    for (size_t r = 0; r < rows; ++r) a = hn::Add(a, hn::LoadU(d, dy + r * cols + j));
    hn::StoreU(a, d, db + j);
  }
  for (; j < c1; ++j) {
    float a = db[j];
    for (size_t r = 0; r < rows; ++r) a += dy[r * cols + j];
    db[j] = a;
  }
}

void CrossForward(const float* x0, const float* z, const float* x, float* out, size_t n) {
  const DF d;
  const size_t L = hn::Lanes(d);
  size_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::MulAdd(hn::LoadU(d, x0 + i), hn::LoadU(d, z + i), hn::LoadU(d, x + i)), d,
               out + i);
  for (; i < n; ++i) out[i] = x0[i] * z[i] + x[i];
}

void CrossBackward(const float* dout, const float* x0, const float* z, float* dz, float* dx0,
                   size_t n) {
  const DF d;
  const size_t L = hn::Lanes(d);
  size_t i = 0;
  for (; i + L <= n; i += L) {
    const VF g = hn::LoadU(d, dout + i);
    hn::StoreU(hn::MulAdd(g, hn::LoadU(d, z + i), hn::LoadU(d, dx0 + i)), d, dx0 + i);
    hn::StoreU(hn::Mul(g, hn::LoadU(d, x0 + i)), d, dz + i);
  }
  for (; i < n; ++i) {
    dx0[i] += dout[i] * z[i];
    dz[i] = dout[i] * x0[i];
  }
}

void AdagradUpdate(float* w, float* state, const float* g, size_t n, float lr, float eps) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF vlr = hn::Set(d, lr), veps = hn::Set(d, eps);
  size_t i = 0;
  for (; i + L <= n; i += L) {
    const VF v = hn::LoadU(d, g + i);
    const VF s = hn::MulAdd(v, v, hn::LoadU(d, state + i));
    hn::StoreU(s, d, state + i);
    hn::StoreU(hn::Sub(hn::LoadU(d, w + i), hn::Div(hn::Mul(vlr, v), hn::Add(hn::Sqrt(s), veps))),
               d, w + i);
  }
  for (; i < n; ++i) {
    state[i] += g[i] * g[i];
    w[i] -= lr * g[i] / (std::sqrt(state[i]) + eps);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cmath>

#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(AddTo);
HWY_EXPORT(ReluForward);
HWY_EXPORT(ReluBackward);
HWY_EXPORT(ColumnSums);
HWY_EXPORT(CrossForward);
HWY_EXPORT(CrossBackward);
HWY_EXPORT(AdagradUpdate);

namespace {
constexpr int64_t kGrain = 16384;  // elements per thread chunk
}

void add_to(float* y, const float* x, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(AddTo)(y + b, x + b, size_t(e - b));
  });
}

void relu_forward(float* x, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(ReluForward)(x + b, size_t(e - b));
  });
}

void relu_backward(const float* y, float* dy, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(ReluBackward)(y + b, dy + b, size_t(e - b));
  });
}

void column_sums(const float* dy, int64_t rows, int64_t cols, float* db, bool accumulate) {
  if (!accumulate) std::fill(db, db + cols, 0.0f);
  // Threads split the columns (in blocks of 16: one cache line of db each).
  const int64_t blocks = (cols + 15) / 16;
  parallel_chunks(blocks, std::max<int64_t>(1, kGrain / std::max<int64_t>(rows * 16, 1)),
                  [&](int64_t b, int64_t e) {
                    HWY_DYNAMIC_DISPATCH(ColumnSums)
                    (dy, size_t(rows), size_t(cols), db, size_t(b * 16),
                     size_t(std::min(cols, e * 16)));
                  });
}

void cross_forward(const float* x0, const float* z, const float* x, float* out, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(CrossForward)(x0 + b, z + b, x + b, out + b, size_t(e - b));
  });
}

void cross_backward(const float* dout, const float* x0, const float* z, float* dz, float* dx0,
                    int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(CrossBackward)(dout + b, x0 + b, z + b, dz + b, dx0 + b, size_t(e - b));
  });
}

void adagrad_update(float* w, float* state, const float* g, int64_t n, float lr, float eps) {
  parallel_chunks(n, kGrain, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(AdagradUpdate)(w + b, state + b, g + b, size_t(e - b), lr, eps);
  });
}

double bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits,
                       float scale) {
  // n is a batch of logits (thousands): the exp and log1p dominate, scalar is fine.
  return ref::bce_with_logits(logits, labels, n, dlogits, scale);
}

namespace ref {

void add_to(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
void relu_forward(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
void relu_backward(const float* y, float* dy, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!(y[i] > 0.0f)) dy[i] = 0.0f;
}
void column_sums(const float* dy, int64_t rows, int64_t cols, float* db, bool accumulate) {
  for (int64_t j = 0; j < cols; ++j) {
    float a = accumulate ? db[j] : 0.0f;
    for (int64_t r = 0; r < rows; ++r) a += dy[r * cols + j];
    db[j] = a;
  }
}
void cross_forward(const float* x0, const float* z, const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x0[i] * z[i] + x[i];
}
void cross_backward(const float* dout, const float* x0, const float* z, float* dz, float* dx0,
                    int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dx0[i] += dout[i] * z[i];
    dz[i] = dout[i] * x0[i];
  }
}
void adagrad_update(float* w, float* state, const float* g, int64_t n, float lr, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    state[i] += g[i] * g[i];
    w[i] -= lr * g[i] / (std::sqrt(state[i]) + eps);
  }
}
double bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits,
                       float scale) {
  double loss = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = logits[i], y = labels[i];
    loss += std::max(x, 0.0) - x * y + std::log1p(std::exp(-std::fabs(x)));
    if (dlogits) {
      const double p = x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
      dlogits[i] = static_cast<float>(scale * (p - y));
    }
  }
  return loss;
}
}  // namespace ref

}  // namespace hyperion
#endif  // HWY_ONCE
