// Soft-capping and the residual add with Highway dynamic dispatch (tanh from Highway's
// contrib/math, a few ulp from std::tanh); scalar references in double.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/softcap.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>
#include "kernels/simd-inl.h"

#include <cmath>
#include <cstdint>

#include "kernels/softcap.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

// x <- post * tanh(pre * x) over [0, n); T is float or bf16.
template <typename T>
void SoftcapT(T* x, int64_t n, float pre, float post) {
  const DF d;
  const int64_t l = static_cast<int64_t>(hn::Lanes(d));
  const VF vpre = hn::Set(d, pre), vpost = hn::Set(d, post);
  int64_t i = 0;
  for (; i + l <= n; i += l)
    StoreF(d, hn::Mul(vpost, hn::Tanh(d, hn::Mul(vpre, LoadF(d, x + i)))), x + i);
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    StoreTail(d, hn::Mul(vpost, hn::Tanh(d, hn::Mul(vpre, LoadTail(d, x + i, rest, 0.0f)))),
              x + i, rest);
  }
}

void SoftcapF32(float* x, int64_t n, float pre, float post) {
  SoftcapT(x, n, pre, post);
}
void SoftcapBF16(bf16* x, int64_t n, float pre, float post) {
  SoftcapT(x, n, pre, post);
}

void SoftcapScaled(float* x, int64_t n, float pre, float post, float* dtanh) {
  const DF d;
  const int64_t l = static_cast<int64_t>(hn::Lanes(d));
  const VF vpre = hn::Set(d, pre), vpost = hn::Set(d, post), one = hn::Set(d, 1.0f);
  int64_t i = 0;
  auto step = [&](VF v, float* out, float* dt, size_t count) {
    const auto nan = hn::IsNaN(v);
    const VF t = hn::Tanh(d, hn::Mul(vpre, v));
    const VF y = hn::Mul(vpost, t);
    const VF g = hn::IfThenZeroElse(nan, hn::NegMulAdd(t, t, one));
    if (count == static_cast<size_t>(l)) {
      StoreF(d, y, out);
      if (dt != nullptr) StoreF(d, g, dt);
    } else {
      StoreTail(d, y, out, count);
      if (dt != nullptr) StoreTail(d, g, dt, count);
    }
  };
  for (; i + l <= n; i += l)
    step(LoadF(d, x + i), x + i, dtanh != nullptr ? dtanh + i : nullptr, static_cast<size_t>(l));
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    step(LoadTail(d, x + i, rest, 0.0f), x + i, dtanh != nullptr ? dtanh + i : nullptr, rest);
  }
}

template <typename T>
void ResidualAddT(const T* x, float* y, int64_t n) {
  const DF d;
  const int64_t l = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + l <= n; i += l) StoreF(d, hn::Add(LoadF(d, y + i), LoadF(d, x + i)), y + i);
  for (; i < n; ++i) y[i] += ToF32(x[i]);
}

void ResidualAddF32(const float* x, float* y, int64_t n) {
  ResidualAddT(x, y, n);
}
void ResidualAddBF16(const bf16* x, float* y, int64_t n) {
  ResidualAddT(x, y, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(SoftcapF32);
HWY_EXPORT(SoftcapBF16);
HWY_EXPORT(SoftcapScaled);
HWY_EXPORT(ResidualAddF32);
HWY_EXPORT(ResidualAddBF16);

namespace {

constexpr int64_t kGrain = 16384;

void check_cap(const char* op, const TensorView& x, float cap) {
  check_contiguous(op, "x", x);
  HYP_CHECK(x.dtype == DType::kF32 || x.dtype == DType::kBF16, "{}: x {} must be f32 or bf16", op,
            x.str());
  HYP_CHECK(std::isfinite(cap) && cap > 0.0f, "{}: cap must be finite and > 0, got {}", op, cap);
}

void check_add(const char* op, const TensorView& x, const TensorView& y) {
  check_contiguous(op, "x", x);
  check_contiguous(op, "y", y);
  HYP_CHECK(y.dtype == DType::kF32 && (x.dtype == DType::kF32 || x.dtype == DType::kBF16) &&
                x.numel() == y.numel(),
            "{}: y {} must be f32 and x {} f32 or bf16 with as many elements", op, y.str(),
            x.str());
}

}  // namespace

void softcap_forward(const TensorView& x, float cap) {
  check_cap("softcap_forward", x, cap);
  const float pre = 1.0f / cap;
  parallel_chunks(x.numel(), kGrain, [&](int64_t b, int64_t e) {
    if (x.dtype == DType::kF32)
      HWY_DYNAMIC_DISPATCH(SoftcapF32)(x.as<float>() + b, e - b, pre, cap);
    else
      HWY_DYNAMIC_DISPATCH(SoftcapBF16)(x.as<bf16>() + b, e - b, pre, cap);
  });
}

void softcap_scaled(float* x, int64_t n, float pre, float post, float* dtanh) {
  HWY_DYNAMIC_DISPATCH(SoftcapScaled)(x, n, pre, post, dtanh);
}

void residual_add(const TensorView& x, const TensorView& y) {
  check_add("residual_add", x, y);
  parallel_chunks(x.numel(), kGrain, [&](int64_t b, int64_t e) {
    if (x.dtype == DType::kF32)
      HWY_DYNAMIC_DISPATCH(ResidualAddF32)(x.as<float>() + b, y.as<float>() + b, e - b);
    else
      HWY_DYNAMIC_DISPATCH(ResidualAddBF16)(x.as<bf16>() + b, y.as<float>() + b, e - b);
  });
}

namespace ref {

void softcap_forward(const TensorView& x, float cap) {
  check_cap("ref::softcap_forward", x, cap);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = load_as_f32(x.data, x.dtype, static_cast<size_t>(i));
    const float y = static_cast<float>(double(cap) * std::tanh(v / double(cap)));
    if (x.dtype == DType::kF32)
      x.as<float>()[i] = y;
    else
      x.as<bf16>()[i] = f32_to_bf16(y);
  }
}

void softcap_scaled(float* x, int64_t n, float pre, float post, float* dtanh) {
  for (int64_t i = 0; i < n; ++i) {
    const double t = std::tanh(double(pre) * double(x[i]));
    x[i] = static_cast<float>(double(post) * t);
    if (dtanh != nullptr) dtanh[i] = std::isnan(t) ? 0.0f : static_cast<float>(1.0 - t * t);
  }
}

void residual_add(const TensorView& x, const TensorView& y) {
  check_add("ref::residual_add", x, y);
  for (int64_t i = 0; i < x.numel(); ++i)
    y.as<float>()[i] += load_as_f32(x.data, x.dtype, static_cast<size_t>(i));
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
