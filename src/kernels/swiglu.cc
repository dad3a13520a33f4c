// SwiGLU forward and backward with Highway dynamic dispatch; exp is a local vectorised
// exp for non-positive arguments, see ExpNonPositive. The kernel is compute-bound on
// this machine class (~50 vector ops per 16 elements), so the bf16 paths trim work the
// bf16 rounding makes invisible (shorter polynomial, no Newton step, no lane shuffles).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/swiglu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/swiglu.h"
#include "tensor/convert.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

// exp(x) for x <= 0 (the sigmoid only needs exp(-|g|)). Cody-Waite reduction
// x = n ln2 + r, |r| <= ln2/2, with n rounded by the 1.5 * 2^23 shifter whose low
// mantissa bits then are the exponent field of 2^n: ~15 simple ops against ~35 for
// hn::Exp, which made the kernel compute-bound (it handles the full range with
// conversions and a two-step exponent fix-up we do not need). f32 results use a
// degree-7 polynomial (~1 ulp); kShort (for the bf16 forward pass, see Sigmoid) a
// degree-4 Taylor polynomial, relative error < 5e-5.
// x is clamped at -87 (2^n stays a normal number): exp(x < -87) gives exp(-87) ~ 1.6e-38
// instead of something smaller, and -inf or NaN as well (a NaN g still gives NaN
// outputs through the factor g).
// Kept here rather than using FastExp of simd-inl.h: the clamp (no zero select, NaN
// absorbed) and the short kShort polynomial for the bf16 forward pass are specific to
// the sigmoid.
template <bool kShort>
HWY_INLINE VF ExpNonPositive(DF df, VF x) {
  const hn::RebindToUnsigned<DF> du;
  x = hn::Max(x, hn::Set(df, -87.0f));
  const VF shifter = hn::Set(df, 12582912.0f + 127.0f);  // 1.5 * 2^23 + exponent bias
  const VF t = hn::MulAdd(x, hn::Set(df, 1.44269504088896341f), shifter);
  const VF n = hn::Sub(t, shifter);  // round(x / ln2), exact
  VF r = hn::MulAdd(n, hn::Set(df, -0.693145751953125f), x);
  r = hn::MulAdd(n, hn::Set(df, -1.428606765330187045e-6f), r);
  VF p;
  if constexpr (kShort) {
    VF q = hn::MulAdd(hn::Set(df, 1.0f / 24), r, hn::Set(df, 1.0f / 6));
    q = hn::MulAdd(q, r, hn::Set(df, 0.5f));
    q = hn::MulAdd(q, r, hn::Set(df, 1.0f));
    p = hn::MulAdd(q, r, hn::Set(df, 1.0f));
  } else {
    VF q = hn::MulAdd(hn::Set(df, 0.000198527617612853646278381f), r,
                      hn::Set(df, 0.00139304355252534151077271f));
    q = hn::MulAdd(q, r, hn::Set(df, 0.00833336077630519866943359f));
    q = hn::MulAdd(q, r, hn::Set(df, 0.0416664853692054748535156f));
    q = hn::MulAdd(q, r, hn::Set(df, 0.166666671633720397949219f));
    q = hn::MulAdd(q, r, hn::Set(df, 0.5f));
    p = hn::Add(hn::MulAdd(q, hn::Mul(r, r), r), hn::Set(df, 1.0f));
  }
  // The mantissa of t holds 2^22 + 127 + n; shifting by 23 keeps (127 + n) << 23 = 2^n.
  return hn::Mul(p, hn::BitCast(df, hn::ShiftLeft<23>(hn::BitCast(du, t))));
}

// sigmoid(g) from e = exp(-|g|) in (0, 1]: 1/(1+e) for g >= 0, e/(1+e) otherwise, and
// its complement 1 - sigmoid(g) = sigmoid(-g) the same way (so the backward pass gets
// 1 - s without cancellation: the error of 1/(1+e) stays relative). Never overflows,
// and keeps full relative precision for negative g. 1/(1+e) is the hardware reciprocal
// estimate (relative error <= 2^-14 on AVX-512, 1.5 * 2^-12 on AVX2/SSE4), refined by
// one Newton step (~1 ulp on [1, 2]) unless kRough; both are cheaper than a vector
// divide, whose throughput is low on x86. kRough (also the short exp polynomial) suits
// only the bf16 forward pass (relative error ~1e-4 against a 2^-9 rounding step): the
// backward pass has cancellation in 1 + g * (1 - s) near g = -1.28 that would amplify
// those errors beyond the bf16 tolerance, so it stays at f32 accuracy.
template <bool kRough>
HWY_INLINE void Sigmoid(DF df, VF g, VF& s, VF& sc) {
  const VF one = hn::Set(df, 1.0f);
  const VF e = ExpNonPositive<kRough>(df, hn::Neg(hn::Abs(g)));
  const VF d = hn::Add(one, e);  // in [1, 2]
  const VF r0 = hn::ApproximateReciprocal(d);
  const VF r = kRough ? r0 : hn::MulAdd(r0, hn::NegMulAdd(d, r0, one), r0);
  const VF er = hn::Mul(e, r);
  const auto pos = hn::Ge(g, hn::Zero(df));
  s = hn::IfThenElse(pos, r, er);
  sc = hn::IfThenElse(pos, er, r);
}
template <bool kRough>
HWY_INLINE VF Sigmoid(DF df, VF g) {
  VF s, sc;
  Sigmoid<kRough>(df, g, s, sc);
  return s;
}
HWY_INLINE float SigmoidScalar(float g) {
  const float e = std::exp(-std::fabs(g));
  const float r = 1.0f / (1.0f + e);
  return g >= 0.0f ? r : e * r;
}

template <bool kBf16>
HWY_INLINE VF Forward(DF df, VF g, VF u) {
  return hn::Mul(hn::Mul(g, Sigmoid<kBf16>(df, g)), u);
}
// dg = dh * u * s * (1 + g * (1 - s)), du = dh * silu(g).
HWY_INLINE void Backward(DF df, VF dh, VF g, VF u, VF& dg, VF& du) {
  VF s, sc;
  Sigmoid<false>(df, g, s, sc);
  const VF dhs = hn::Mul(dh, s);
  dg = hn::Mul(hn::Mul(dhs, u), hn::MulAdd(g, sc, hn::Set(df, 1.0f)));
  du = hn::Mul(dhs, g);
}

template <typename T>
void ForwardSpan(const T* g, const T* u, T* h, int64_t count) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + n <= count; i += n)
    StoreF(df, Forward<kBf16>(df, LoadF(df, g + i), LoadF(df, u + i)), h + i);
  for (; i < count; ++i) {
    const float gi = ToF32(g[i]), ui = ToF32(u[i]);
    h[i] = FromF32<T>(gi * SigmoidScalar(gi) * ui);
  }
}

template <typename T>
void BackwardSpan(const T* dh, const T* g, const T* u, T* dg, T* du, int64_t count) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + n <= count; i += n) {
    // All inputs are loaded before either output is stored (outputs may alias inputs).
    VF dgv, duv;
    Backward(df, LoadF(df, dh + i), LoadF(df, g + i), LoadF(df, u + i), dgv, duv);
    StoreF(df, dgv, dg + i);
    StoreF(df, duv, du + i);
  }
  for (; i < count; ++i) {
    const float dhi = ToF32(dh[i]), gi = ToF32(g[i]), ui = ToF32(u[i]);
    const float s = SigmoidScalar(gi);
    const float dgv = dhi * s * ui * (gi * (1.0f - s) + 1.0f), duv = dhi * s * gi;
    dg[i] = FromF32<T>(dgv);
    du[i] = FromF32<T>(duv);
  }
}

void ForwardF32(const float* g, const float* u, float* h, int64_t count) {
  ForwardSpan(g, u, h, count);
}
// The bf16 main loops use the pair layout of simd-inl.h: being elementwise, the kernel
// does not care about the order, and it saves the lane shuffles of per-vector bf16
// loads/stores (the kernel is compute-bound).
void ForwardBF16(const bf16* g, const bf16* u, bf16* h, int64_t count) {
  const DF df;
  const int64_t n2 = 2 * static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + n2 <= count; i += n2) {
    VF g0, g1, u0, u1;
    LoadPairs(df, g + i, g0, g1);
    LoadPairs(df, u + i, u0, u1);
    StorePairs(df, Forward<true>(df, g0, u0), Forward<true>(df, g1, u1), h + i);
  }
  ForwardSpan(g + i, u + i, h + i, count - i);
}
void BackwardF32(const float* dh, const float* g, const float* u, float* dg, float* du,
                 int64_t count) {
  BackwardSpan(dh, g, u, dg, du, count);
}
void BackwardBF16(const bf16* dh, const bf16* g, const bf16* u, bf16* dg, bf16* du, int64_t count) {
  const DF df;
  const int64_t n2 = 2 * static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + n2 <= count; i += n2) {
    VF dh0, dh1, g0, g1, u0, u1, dg0, dg1, du0, du1;
    LoadPairs(df, dh + i, dh0, dh1);
    LoadPairs(df, g + i, g0, g1);
    LoadPairs(df, u + i, u0, u1);
    Backward(df, dh0, g0, u0, dg0, du0);
    Backward(df, dh1, g1, u1, dg1, du1);
    StorePairs(df, dg0, dg1, dg + i);
    StorePairs(df, du0, du1, du + i);
  }
  BackwardSpan(dh + i, g + i, u + i, dg + i, du + i, count - i);
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
