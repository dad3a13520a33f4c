// SwiGLU forward and backward with Highway dynamic dispatch; exp is Highway's
// vectorised hn::Exp (contrib/math, max error 1 ulp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/swiglu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/contrib/math/math-inl.h>

#include <cmath>
#include <cstdint>

#include "kernels/swiglu.h"
#include "tensor/convert.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Loads/stores of f32 vectors from f32 or bf16 memory; bf16 stores round to nearest
// even (DemoteTo in Highway 1.0.3 truncates, so the rounding is done here).
HWY_INLINE VF LoadF(DF df, const float* p) {
  return hn::LoadU(df, p);
}
HWY_INLINE VF LoadF(DF df, const bf16* p) {
  const hn::Rebind<hwy::bfloat16_t, DF> dbf;
  return hn::PromoteTo(df, hn::LoadU(dbf, reinterpret_cast<const hwy::bfloat16_t*>(p)));
}
HWY_INLINE void StoreF(DF df, VF v, float* p) {
  hn::StoreU(v, df, p);
}
HWY_INLINE void StoreF(DF df, VF v, bf16* p) {
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<hwy::bfloat16_t, DF> dbf;
  const auto bits = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  const auto rounded = hn::Add(bits, hn::Add(hn::Set(du, 0x7fffu), lsb));
  const auto quiet = hn::Or(bits, hn::Set(du, 0x00400000u));
  const auto r = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, rounded);
  hn::StoreU(hn::DemoteTo(dbf, hn::BitCast(df, r)), dbf, reinterpret_cast<hwy::bfloat16_t*>(p));
}
HWY_INLINE float ToF32(float v) {
  return v;
}
HWY_INLINE float ToF32(bf16 v) {
  return bf16_to_f32(v);
}
HWY_INLINE void FromF32(float v, float* p) {
  *p = v;
}
HWY_INLINE void FromF32(float v, bf16* p) {
  *p = f32_to_bf16(v);
}

// sigmoid(g) from e = exp(-|g|) in (0, 1]: 1/(1+e) for g >= 0, e/(1+e) otherwise. Never
// overflows, and keeps full relative precision for very negative g. 1/(1+e) is the
// hardware reciprocal estimate refined by one Newton step (~1 ulp on [1, 2]), cheaper
// than a vector divide, whose throughput is low on x86.
HWY_INLINE VF Sigmoid(DF df, VF g) {
  const VF one = hn::Set(df, 1.0f);
  const VF e = hn::Exp(df, hn::Neg(hn::Abs(g)));
  const VF d = hn::Add(one, e);  // in [1, 2]
  const VF r0 = hn::ApproximateReciprocal(d);
  const VF r = hn::MulAdd(r0, hn::NegMulAdd(d, r0, one), r0);
  return hn::IfThenElse(hn::Ge(g, hn::Zero(df)), r, hn::Mul(e, r));
}
HWY_INLINE float SigmoidScalar(float g) {
  const float e = std::exp(-std::fabs(g));
  const float r = 1.0f / (1.0f + e);
  return g >= 0.0f ? r : e * r;
}

template <typename T>
void ForwardSpan(const T* g, const T* u, T* h, int64_t count) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + n <= count; i += n) {
    const VF vg = LoadF(df, g + i), vu = LoadF(df, u + i);
    StoreF(df, hn::Mul(hn::Mul(vg, Sigmoid(df, vg)), vu), h + i);
  }
  for (; i < count; ++i) {
    const float gi = ToF32(g[i]), ui = ToF32(u[i]);
    FromF32(gi * SigmoidScalar(gi) * ui, h + i);
  }
}

template <typename T>
void BackwardSpan(const T* dh, const T* g, const T* u, T* dg, T* du, int64_t count) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const VF one = hn::Set(df, 1.0f);
  int64_t i = 0;
  for (; i + n <= count; i += n) {
    // All inputs are loaded before either output is stored (outputs may alias inputs).
    const VF vdh = LoadF(df, dh + i), vg = LoadF(df, g + i), vu = LoadF(df, u + i);
    const VF s = Sigmoid(df, vg);
    const VF dhs = hn::Mul(vdh, s);
    // dg = dh * u * s * (1 + g * (1 - s))
    const VF dgv = hn::Mul(hn::Mul(dhs, vu), hn::MulAdd(vg, hn::Sub(one, s), one));
    const VF duv = hn::Mul(dhs, vg);  // dh * silu(g)
    StoreF(df, dgv, dg + i);
    StoreF(df, duv, du + i);
  }
  for (; i < count; ++i) {
    const float dhi = ToF32(dh[i]), gi = ToF32(g[i]), ui = ToF32(u[i]);
    const float s = SigmoidScalar(gi);
    const float dgv = dhi * s * ui * (gi * (1.0f - s) + 1.0f), duv = dhi * s * gi;
    FromF32(dgv, dg + i);
    FromF32(duv, du + i);
  }
}

void ForwardF32(const float* g, const float* u, float* h, int64_t count) {
  ForwardSpan(g, u, h, count);
}
void ForwardBF16(const bf16* g, const bf16* u, bf16* h, int64_t count) {
  ForwardSpan(g, u, h, count);
}
void BackwardF32(const float* dh, const float* g, const float* u, float* dg, float* du,
                 int64_t count) {
  BackwardSpan(dh, g, u, dg, du, count);
}
void BackwardBF16(const bf16* dh, const bf16* g, const bf16* u, bf16* dg, bf16* du, int64_t count) {
  BackwardSpan(dh, g, u, dg, du, count);
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(ForwardF32);
HWY_EXPORT(ForwardBF16);
HWY_EXPORT(BackwardF32);
HWY_EXPORT(BackwardBF16);

namespace {

constexpr int64_t kGrain = 16384;  // elements per parallel chunk at least

void check_input(const char* op, const char* name, const TensorView& t) {
  HYP_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16, "{}: {} must be f32 or bf16, got {}",
            op, name, t.str());
  check_contiguous(op, name, t);
}

// t must have g's shape and dtype.
void check_like(const char* op, const char* name, const TensorView& g, const TensorView& t) {
  check_contiguous(op, name, t);
  HYP_CHECK(t.shape == g.shape && t.dtype == g.dtype, "{}: {} {} must match g {}", op, name,
            t.str(), g.str());
}

void check_forward(const TensorView& g, const TensorView& u, const TensorView& h) {
  const char* op = "swiglu_forward";
  check_input(op, "g", g);
  check_like(op, "u", g, u);
  check_like(op, "h", g, h);
}

void check_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                    const TensorView& dg, const TensorView& du) {
  const char* op = "swiglu_backward";
  check_input(op, "g", g);
  check_like(op, "u", g, u);
  check_like(op, "dh", g, dh);
  check_like(op, "dg", g, dg);
  check_like(op, "du", g, du);
}

double load(const TensorView& t, int64_t i) {
  return load_as_f32(t.data, t.dtype, static_cast<size_t>(i));
}
void store(const TensorView& t, int64_t i, double v) {
  if (t.dtype == DType::kF32)
    static_cast<float*>(t.data)[i] = static_cast<float>(v);
  else
    static_cast<bf16*>(t.data)[i] = f32_to_bf16(static_cast<float>(v));
}

}  // namespace

void swiglu_forward(const TensorView& g, const TensorView& u, const TensorView& h) {
  check_forward(g, u, h);
  parallel_chunks(g.numel(), kGrain, [&](int64_t b, int64_t e) {
    if (g.dtype == DType::kF32) {
      const float *gp = g.as<float>() + b, *up = u.as<float>() + b;
      HWY_DYNAMIC_DISPATCH(ForwardF32)(gp, up, h.as<float>() + b, e - b);
    } else {
      const bf16 *gp = g.as<bf16>() + b, *up = u.as<bf16>() + b;
      HWY_DYNAMIC_DISPATCH(ForwardBF16)(gp, up, h.as<bf16>() + b, e - b);
    }
  });
}

void swiglu_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                     const TensorView& dg, const TensorView& du) {
  check_backward(dh, g, u, dg, du);
  parallel_chunks(g.numel(), kGrain, [&](int64_t b, int64_t e) {
    if (g.dtype == DType::kF32) {
      const float *dhp = dh.as<float>() + b, *gp = g.as<float>() + b, *up = u.as<float>() + b;
      float *dgp = dg.as<float>() + b, *dup = du.as<float>() + b;
      HWY_DYNAMIC_DISPATCH(BackwardF32)(dhp, gp, up, dgp, dup, e - b);
    } else {
      const bf16 *dhp = dh.as<bf16>() + b, *gp = g.as<bf16>() + b, *up = u.as<bf16>() + b;
      bf16 *dgp = dg.as<bf16>() + b, *dup = du.as<bf16>() + b;
      HWY_DYNAMIC_DISPATCH(BackwardBF16)(dhp, gp, up, dgp, dup, e - b);
    }
  });
}

namespace ref {

void swiglu_forward(const TensorView& g, const TensorView& u, const TensorView& h) {
  check_forward(g, u, h);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double gi = load(g, i);
    store(h, i, gi / (1.0 + std::exp(-gi)) * load(u, i));
  }
}

void swiglu_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                     const TensorView& dg, const TensorView& du) {
  check_backward(dh, g, u, dg, du);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double dhi = load(dh, i), gi = load(g, i), ui = load(u, i);
    const double s = 1.0 / (1.0 + std::exp(-gi));
    store(dg, i, dhi * ui * s * (1.0 + gi * (1.0 - s)));
    store(du, i, dhi * gi * s);
  }
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
