// Pointwise activations with Highway. Each activation is one functor giving the value
// and the derivative factor of a vector; the loops (full vectors, then a partial tail
// through a stack buffer) are shared.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/activation.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include <algorithm>
#include <cmath>

#include "kernels/activation.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

// sigmoid(x) from e = exp(-|x|): 1 / (1 + e) for x >= 0, e / (1 + e) otherwise.
HWY_INLINE VF Sigmoid(DF d, VF x) {
  const VF one = hn::Set(d, 1.0f);
  const VF e = FastExp(d, hn::Neg(hn::Abs(x)));
  const VF r = hn::Div(one, hn::Add(one, e));
  return hn::IfThenElse(hn::Ge(x, hn::Zero(d)), r, hn::Mul(e, r));
}

// Phi(x) = 0.5 (1 + erf(x / sqrt 2)) with erf(z) = 1 - poly(t) exp(-z^2), t = 1/(1 + p|z|).
HWY_INLINE VF NormalCdf(DF d, VF x) {
  const VF z = hn::Mul(x, hn::Set(d, 0.70710678118654752f));
  const VF az = hn::Abs(z);
  const VF one = hn::Set(d, 1.0f);
  const VF t = hn::Div(one, hn::MulAdd(az, hn::Set(d, 0.3275911f), one));
  VF p = hn::MulAdd(hn::Set(d, 1.061405429f), t, hn::Set(d, -1.453152027f));
  p = hn::MulAdd(p, t, hn::Set(d, 1.421413741f));
  p = hn::MulAdd(p, t, hn::Set(d, -0.284496736f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.254829592f));
  p = hn::Mul(p, t);
  const VF erf_abs = hn::NegMulAdd(p, FastExp(d, hn::Neg(hn::Mul(az, az))), one);
  return hn::Mul(hn::Set(d, 0.5f), hn::Add(one, hn::CopySign(erf_abs, z)));
}

// phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
HWY_INLINE VF NormalPdf(DF d, VF x) {
  return hn::Mul(hn::Set(d, 0.39894228040143268f),
                 FastExp(d, hn::Mul(hn::Set(d, -0.5f), hn::Mul(x, x))));
}

// value(x) and derivative(x) of each activation.
struct Silu {
  static VF Value(DF d, VF x) { return hn::Mul(x, Sigmoid(d, x)); }
  static VF Derivative(DF d, VF x) {
    const VF s = Sigmoid(d, x);
    const VF one = hn::Set(d, 1.0f);
    return hn::Mul(s, hn::MulAdd(x, hn::Sub(one, s), one));
  }
};
struct Gelu {
  static VF Value(DF d, VF x) { return hn::Mul(x, NormalCdf(d, x)); }
  static VF Derivative(DF d, VF x) { return hn::MulAdd(x, NormalPdf(d, x), NormalCdf(d, x)); }
};
struct QuickGelu {
  static VF Value(DF d, VF x) { return hn::Mul(x, Sigmoid(d, hn::Mul(hn::Set(d, 1.702f), x))); }
  static VF Derivative(DF d, VF x) {
    const VF s = Sigmoid(d, hn::Mul(hn::Set(d, 1.702f), x));
    const VF one = hn::Set(d, 1.0f);
    return hn::MulAdd(hn::Mul(hn::Set(d, 1.702f), x), hn::Mul(s, hn::Sub(one, s)), s);
  }
};

template <class Act>
void ForwardLoop(const float* x, float* y, size_t n) {
  const DF d;
  const size_t L = hn::Lanes(d);
  size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(Act::Value(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) StoreTail(d, Act::Value(d, LoadTail(d, x + i, n - i, 0.0f)), y + i, n - i);
}

template <class Act>
void BackwardLoop(const float* dy, const float* x, float* dx, size_t n) {
  const DF d;
  const size_t L = hn::Lanes(d);
  size_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::Mul(hn::LoadU(d, dy + i), Act::Derivative(d, hn::LoadU(d, x + i))), d, dx + i);
  if (i < n) {
    const VF g = LoadTail(d, dy + i, n - i, 0.0f);
    StoreTail(d, hn::Mul(g, Act::Derivative(d, LoadTail(d, x + i, n - i, 0.0f))), dx + i, n - i);
  }
}

void Forward(int act, const float* x, float* y, size_t n) {
  if (act == 0) ForwardLoop<Silu>(x, y, n);
  else if (act == 1) ForwardLoop<Gelu>(x, y, n);
  else ForwardLoop<QuickGelu>(x, y, n);
}

void Backward(int act, const float* dy, const float* x, float* dx, size_t n) {
  if (act == 0) BackwardLoop<Silu>(dy, x, dx, n);
  else if (act == 1) BackwardLoop<Gelu>(dy, x, dx, n);
  else BackwardLoop<QuickGelu>(dy, x, dx, n);
}

// One GEGLU row: value = x[0, f), gate = x[f, 2f).
void GegluRow(const float* x, size_t f, float* h) {
  const DF d;
  const size_t L = hn::Lanes(d);
  size_t i = 0;
  for (; i + L <= f; i += L)
    hn::StoreU(hn::Mul(hn::LoadU(d, x + i), Gelu::Value(d, hn::LoadU(d, x + f + i))), d, h + i);
  if (i < f) {
    const VF v = LoadTail(d, x + i, f - i, 0.0f), g = LoadTail(d, x + f + i, f - i, 0.0f);
    StoreTail(d, hn::Mul(v, Gelu::Value(d, g)), h + i, f - i);
  }
}

void GegluRowBackward(const float* dh, const float* x, size_t f, float* dx) {
  const DF d;
  const size_t L = hn::Lanes(d);
  for (size_t i = 0; i < f; i += L) {
    const size_t c = std::min(L, f - i);
    const VF g = c == L ? hn::LoadU(d, dh + i) : LoadTail(d, dh + i, c, 0.0f);
    const VF v = c == L ? hn::LoadU(d, x + i) : LoadTail(d, x + i, c, 0.0f);
    const VF gate = c == L ? hn::LoadU(d, x + f + i) : LoadTail(d, x + f + i, c, 0.0f);
    const VF dvalue = hn::Mul(g, Gelu::Value(d, gate));
    const VF dgate = hn::Mul(hn::Mul(g, v), Gelu::Derivative(d, gate));
    if (c == L) {
      hn::StoreU(dvalue, d, dx + i);
      hn::StoreU(dgate, d, dx + f + i);
    } else {
      StoreTail(d, dvalue, dx + i, c);
      StoreTail(d, dgate, dx + f + i, c);
    }
  }
}

void GegluForward(const float* x, int64_t rows, int64_t f, float* h) {
  for (int64_t r = 0; r < rows; ++r) GegluRow(x + size_t(r * 2 * f), size_t(f), h + size_t(r * f));
}

void GegluBackward(const float* dh, const float* x, int64_t rows, int64_t f, float* dx) {
  for (int64_t r = 0; r < rows; ++r)
    GegluRowBackward(dh + size_t(r * f), x + size_t(r * 2 * f), size_t(f), dx + size_t(r * 2 * f));
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>

#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(Forward);
HWY_EXPORT(Backward);
HWY_EXPORT(GegluForward);
HWY_EXPORT(GegluBackward);

namespace {
constexpr int64_t kGrain = 16384;  // elements per parallel chunk
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::kSilu:
      return "silu";
    case Activation::kGelu:
      return "gelu";
    case Activation::kQuickGelu:
      return "quick_gelu";
  }
  return "?";
}

bool parse_activation(const std::string& name, Activation* out) {
  if (name == "silu" || name == "swish") *out = Activation::kSilu;
  else if (name == "gelu") *out = Activation::kGelu;
  else if (name == "quick_gelu") *out = Activation::kQuickGelu;
  else return false;
  return true;
}

void activation_forward(Activation a, const float* x, float* y, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(Forward)(int(a), x + b, y + b, size_t(e - b));
  });
}

void activation_backward(Activation a, const float* dy, const float* x, float* dx, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(Backward)(int(a), dy + b, x + b, dx + b, size_t(e - b));
  });
}

void geglu_rows_forward(const float* x, int64_t rows, int64_t f, float* h) {
  HYP_CHECK(f > 0, "geglu: the output width {} must be positive", f);
  parallel_chunks(rows, std::max<int64_t>(1, kGrain / f), [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(GegluForward)(x + b * 2 * f, e - b, f, h + b * f);
  });
}

void geglu_rows_backward(const float* dh, const float* x, int64_t rows, int64_t f, float* dx) {
  HYP_CHECK(f > 0, "geglu: the output width {} must be positive", f);
  parallel_chunks(rows, std::max<int64_t>(1, kGrain / f), [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(GegluBackward)(dh + b * f, x + b * 2 * f, e - b, f, dx + b * 2 * f);
  });
}

namespace ref {
namespace {

double cdf(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
}
double pdf(double x) {
  return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}
double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
double value(Activation a, double x) {
  switch (a) {
    case Activation::kSilu:
      return x * sigmoid(x);
    case Activation::kGelu:
      return x * cdf(x);
    case Activation::kQuickGelu:
      return x * sigmoid(1.702 * x);
  }
  return 0.0;
}
double derivative(Activation a, double x) {
  switch (a) {
    case Activation::kSilu: {
      const double s = sigmoid(x);
      return s * (1.0 + x * (1.0 - s));
    }
    case Activation::kGelu:
      return cdf(x) + x * pdf(x);
    case Activation::kQuickGelu: {
      const double s = sigmoid(1.702 * x);
      return s + 1.702 * x * s * (1.0 - s);
    }
  }
  return 0.0;
}

}  // namespace

void activation_forward(Activation a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float(value(a, x[i]));
}

void activation_backward(Activation a, const float* dy, const float* x, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = float(double(dy[i]) * derivative(a, x[i]));
}

void geglu_rows_forward(const float* x, int64_t rows, int64_t f, float* h) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < f; ++i)
      h[r * f + i] = float(double(x[r * 2 * f + i]) * value(Activation::kGelu, x[r * 2 * f + f + i]));
}

void geglu_rows_backward(const float* dh, const float* x, int64_t rows, int64_t f, float* dx) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < f; ++i) {
      const double g = dh[r * f + i], v = x[r * 2 * f + i], gate = x[r * 2 * f + f + i];
      dx[r * 2 * f + i] = float(g * value(Activation::kGelu, gate));
      dx[r * 2 * f + f + i] = float(g * v * derivative(Activation::kGelu, gate));
    }
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
