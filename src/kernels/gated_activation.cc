// Gated-MLP activations (SwiGLU, GeGLU-tanh) forward and backward with Highway dynamic
// dispatch; exp is a local vectorised
// exp for non-positive arguments, see ExpNonPositive. The kernel is compute-bound on
// this machine class (~50 vector ops per 16 elements), so the bf16 paths trim work the
// bf16 rounding makes invisible (shorter polynomial, no Newton step, no lane shuffles).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gated_activation.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/gated_activation.h"
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

// kGelu selects GELU-tanh over SiLU in every helper below.
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

// GELU-tanh's sigmoid argument 2z = 2c g (1 + a g^2), and its derivative 2z'.
HWY_INLINE VF GeluArg(DF df, VF g) {
  return hn::Mul(hn::Mul(hn::Set(df, 2.0f * kGeluC), g),
                 hn::MulAdd(hn::Set(df, kGeluA), hn::Mul(g, g), hn::Set(df, 1.0f)));
}
HWY_INLINE VF GeluArgSlope(DF df, VF g) {
  return hn::Mul(hn::Set(df, 2.0f * kGeluC),
                 hn::MulAdd(hn::Set(df, 3.0f * kGeluA), hn::Mul(g, g), hn::Set(df, 1.0f)));
}
HWY_INLINE float GeluArgScalar(float g) {
  return 2.0f * kGeluC * g * (1.0f + kGeluA * g * g);
}
HWY_INLINE float GeluArgSlopeScalar(float g) {
  return 2.0f * kGeluC * (1.0f + 3.0f * kGeluA * g * g);
}

template <bool kGelu, bool kBf16>
HWY_INLINE VF Forward(DF df, VF g, VF u) {
  if constexpr (kGelu) return hn::Mul(hn::Mul(g, Sigmoid<kBf16>(df, GeluArg(df, g))), u);
  return hn::Mul(hn::Mul(g, Sigmoid<kBf16>(df, g)), u);
}
// SiLU: dg = dh * u * s * (1 + g * (1 - s)), du = dh * silu(g).
// GELU: dg = dh * u * (s + g s (1 - s) 2z'), du = dh * s * g, s = sigmoid(2z).
template <bool kGelu>
HWY_INLINE void Backward(DF df, VF dh, VF g, VF u, VF& dg, VF& du) {
  VF s, sc;
  if constexpr (kGelu) {
    Sigmoid<false>(df, GeluArg(df, g), s, sc);
    const VF slope = hn::MulAdd(hn::Mul(hn::Mul(g, s), sc), GeluArgSlope(df, g), s);
    dg = hn::Mul(hn::Mul(dh, u), slope);
    du = hn::Mul(hn::Mul(dh, s), g);
    return;
  }
  Sigmoid<false>(df, g, s, sc);
  const VF dhs = hn::Mul(dh, s);
  dg = hn::Mul(hn::Mul(dhs, u), hn::MulAdd(g, sc, hn::Set(df, 1.0f)));
  du = hn::Mul(dhs, g);
}

template <bool kGelu, typename T>
void ForwardSpan(const T* g, const T* u, T* h, int64_t count) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + n <= count; i += n)
    StoreF(df, Forward<kGelu, kBf16>(df, LoadF(df, g + i), LoadF(df, u + i)), h + i);
  for (; i < count; ++i) {
    const float gi = ToF32(g[i]), ui = ToF32(u[i]);
    const float s = SigmoidScalar(kGelu ? GeluArgScalar(gi) : gi);
    h[i] = FromF32<T>(gi * s * ui);
  }
}

template <bool kGelu, typename T>
void BackwardSpan(const T* dh, const T* g, const T* u, T* dg, T* du, int64_t count) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + n <= count; i += n) {
    // All inputs are loaded before either output is stored (outputs may alias inputs).
    VF dgv, duv;
    Backward<kGelu>(df, LoadF(df, dh + i), LoadF(df, g + i), LoadF(df, u + i), dgv, duv);
    StoreF(df, dgv, dg + i);
    StoreF(df, duv, du + i);
  }
  for (; i < count; ++i) {
    const float dhi = ToF32(dh[i]), gi = ToF32(g[i]), ui = ToF32(u[i]);
    float dgv, duv;
    if constexpr (kGelu) {
      const float s = SigmoidScalar(GeluArgScalar(gi));
      dgv = dhi * ui * (gi * s * (1.0f - s) * GeluArgSlopeScalar(gi) + s);
      duv = dhi * s * gi;
    } else {
      const float s = SigmoidScalar(gi);
      dgv = dhi * s * ui * (gi * (1.0f - s) + 1.0f);
      duv = dhi * s * gi;
    }
    dg[i] = FromF32<T>(dgv);
    du[i] = FromF32<T>(duv);
  }
}

template <bool kGelu>
void ForwardF32T(const float* g, const float* u, float* h, int64_t count) {
  ForwardSpan<kGelu>(g, u, h, count);
}
// The bf16 main loops use the pair layout of simd-inl.h: being elementwise, the kernel
// does not care about the order, and it saves the lane shuffles of per-vector bf16
// loads/stores (the kernel is compute-bound).
template <bool kGelu>
void ForwardBF16T(const bf16* g, const bf16* u, bf16* h, int64_t count) {
  const DF df;
  const int64_t n2 = 2 * static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + n2 <= count; i += n2) {
    VF g0, g1, u0, u1;
    LoadPairs(df, g + i, g0, g1);
    LoadPairs(df, u + i, u0, u1);
    StorePairs(df, Forward<kGelu, true>(df, g0, u0), Forward<kGelu, true>(df, g1, u1), h + i);
  }
  ForwardSpan<kGelu>(g + i, u + i, h + i, count - i);
}
template <bool kGelu>
void BackwardF32T(const float* dh, const float* g, const float* u, float* dg, float* du,
                  int64_t count) {
  BackwardSpan<kGelu>(dh, g, u, dg, du, count);
}
template <bool kGelu>
void BackwardBF16T(const bf16* dh, const bf16* g, const bf16* u, bf16* dg, bf16* du,
                   int64_t count) {
  const DF df;
  const int64_t n2 = 2 * static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + n2 <= count; i += n2) {
    VF dh0, dh1, g0, g1, u0, u1, dg0, dg1, du0, du1;
    LoadPairs(df, dh + i, dh0, dh1);
    LoadPairs(df, g + i, g0, g1);
    LoadPairs(df, u + i, u0, u1);
    Backward<kGelu>(df, dh0, g0, u0, dg0, du0);
    Backward<kGelu>(df, dh1, g1, u1, dg1, du1);
    StorePairs(df, dg0, dg1, dg + i);
    StorePairs(df, du0, du1, du + i);
  }
  BackwardSpan<kGelu>(dh + i, g + i, u + i, dg + i, du + i, count - i);
}

void ForwardF32(const float* g, const float* u, float* h, int64_t count) {
  ForwardF32T<false>(g, u, h, count);
}
void ForwardBF16(const bf16* g, const bf16* u, bf16* h, int64_t count) {
  ForwardBF16T<false>(g, u, h, count);
}
void BackwardF32(const float* dh, const float* g, const float* u, float* dg, float* du,
                 int64_t count) {
  BackwardF32T<false>(dh, g, u, dg, du, count);
}
void BackwardBF16(const bf16* dh, const bf16* g, const bf16* u, bf16* dg, bf16* du, int64_t count) {
  BackwardBF16T<false>(dh, g, u, dg, du, count);
}
void GeluForwardF32(const float* g, const float* u, float* h, int64_t count) {
  ForwardF32T<true>(g, u, h, count);
}
void GeluForwardBF16(const bf16* g, const bf16* u, bf16* h, int64_t count) {
  ForwardBF16T<true>(g, u, h, count);
}
void GeluBackwardF32(const float* dh, const float* g, const float* u, float* dg, float* du,
                     int64_t count) {
  BackwardF32T<true>(dh, g, u, dg, du, count);
}
void GeluBackwardBF16(const bf16* dh, const bf16* g, const bf16* u, bf16* dg, bf16* du,
                      int64_t count) {
  BackwardBF16T<true>(dh, g, u, dg, du, count);
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
HWY_EXPORT(GeluForwardF32);
HWY_EXPORT(GeluForwardBF16);
HWY_EXPORT(GeluBackwardF32);
HWY_EXPORT(GeluBackwardBF16);

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

void check_forward(const char* op, const TensorView& g, const TensorView& u, const TensorView& h) {
  check_input(op, "g", g);
  check_like(op, "u", g, u);
  check_like(op, "h", g, h);
}

void check_backward(const char* op, const TensorView& dh, const TensorView& g, const TensorView& u,
                    const TensorView& dg, const TensorView& du) {
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

// The fast paths of both activations, by kind.
void forward(GatedActivation act, const char* op, const TensorView& g, const TensorView& u,
             const TensorView& h) {
  check_forward(op, g, u, h);
  const bool gelu = act == GatedActivation::kGeluTanh;
  parallel_chunks(g.numel(), kGrain, [&](int64_t b, int64_t e) {
    if (g.dtype == DType::kF32) {
      const float *gp = g.as<float>() + b, *up = u.as<float>() + b;
      float* hp = h.as<float>() + b;
      if (gelu)
        HWY_DYNAMIC_DISPATCH(GeluForwardF32)(gp, up, hp, e - b);
      else
        HWY_DYNAMIC_DISPATCH(ForwardF32)(gp, up, hp, e - b);
    } else {
      const bf16 *gp = g.as<bf16>() + b, *up = u.as<bf16>() + b;
      bf16* hp = h.as<bf16>() + b;
      if (gelu)
        HWY_DYNAMIC_DISPATCH(GeluForwardBF16)(gp, up, hp, e - b);
      else
        HWY_DYNAMIC_DISPATCH(ForwardBF16)(gp, up, hp, e - b);
    }
  });
}

void backward(GatedActivation act, const char* op, const TensorView& dh, const TensorView& g,
              const TensorView& u, const TensorView& dg, const TensorView& du) {
  check_backward(op, dh, g, u, dg, du);
  const bool gelu = act == GatedActivation::kGeluTanh;
  parallel_chunks(g.numel(), kGrain, [&](int64_t b, int64_t e) {
    if (g.dtype == DType::kF32) {
      const float *dhp = dh.as<float>() + b, *gp = g.as<float>() + b, *up = u.as<float>() + b;
      float *dgp = dg.as<float>() + b, *dup = du.as<float>() + b;
      if (gelu)
        HWY_DYNAMIC_DISPATCH(GeluBackwardF32)(dhp, gp, up, dgp, dup, e - b);
      else
        HWY_DYNAMIC_DISPATCH(BackwardF32)(dhp, gp, up, dgp, dup, e - b);
    } else {
      const bf16 *dhp = dh.as<bf16>() + b, *gp = g.as<bf16>() + b, *up = u.as<bf16>() + b;
      bf16 *dgp = dg.as<bf16>() + b, *dup = du.as<bf16>() + b;
      if (gelu)
        HWY_DYNAMIC_DISPATCH(GeluBackwardBF16)(dhp, gp, up, dgp, dup, e - b);
      else
        HWY_DYNAMIC_DISPATCH(BackwardBF16)(dhp, gp, up, dgp, dup, e - b);
    }
  });
}

// GELU-tanh in double: act(g) = g * sigmoid(2z), and its derivative.
double gelu_ref(double g) {
  const double z2 = 2.0 * std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g);
  return g / (1.0 + std::exp(-z2));
}
double gelu_slope_ref(double g) {
  const double c = std::sqrt(2.0 / M_PI);
  const double t = std::tanh(c * (g + 0.044715 * g * g * g));
  return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * g * g);
}

}  // namespace

const char* gated_activation_name(GatedActivation a) {
  return a == GatedActivation::kGeluTanh ? "gelu_pytorch_tanh" : "silu";
}

bool parse_gated_activation(const std::string& name, GatedActivation* out) {
  if (name == "silu" || name == "swish") {
    *out = GatedActivation::kSilu;
    return true;
  }
  // (A Gemma config.json whose hidden_act says "gelu" also means the tanh form; the
  // Gemma reader maps that case, since elsewhere "gelu" is the exact erf GELU.)
  if (name == "gelu_pytorch_tanh" || name == "gelu_tanh") {
    *out = GatedActivation::kGeluTanh;
    return true;
  }
  return false;
}

void swiglu_forward(const TensorView& g, const TensorView& u, const TensorView& h) {
  forward(GatedActivation::kSilu, "swiglu_forward", g, u, h);
}
void swiglu_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                     const TensorView& dg, const TensorView& du) {
  backward(GatedActivation::kSilu, "swiglu_backward", dh, g, u, dg, du);
}
void geglu_forward(const TensorView& g, const TensorView& u, const TensorView& h) {
  forward(GatedActivation::kGeluTanh, "geglu_forward", g, u, h);
}
void geglu_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                    const TensorView& dg, const TensorView& du) {
  backward(GatedActivation::kGeluTanh, "geglu_backward", dh, g, u, dg, du);
}
void gated_forward(GatedActivation act, const TensorView& g, const TensorView& u,
                   const TensorView& h) {
  forward(act, act == GatedActivation::kGeluTanh ? "geglu_forward" : "swiglu_forward", g, u, h);
}
void gated_backward(GatedActivation act, const TensorView& dh, const TensorView& g,
                    const TensorView& u, const TensorView& dg, const TensorView& du) {
  backward(act, act == GatedActivation::kGeluTanh ? "geglu_backward" : "swiglu_backward", dh, g, u,
           dg, du);
}

namespace ref {

void swiglu_forward(const TensorView& g, const TensorView& u, const TensorView& h) {
  check_forward("swiglu_forward", g, u, h);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double gi = load(g, i);
    store(h, i, gi / (1.0 + std::exp(-gi)) * load(u, i));
  }
}

void swiglu_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                     const TensorView& dg, const TensorView& du) {
  check_backward("swiglu_backward", dh, g, u, dg, du);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double dhi = load(dh, i), gi = load(g, i), ui = load(u, i);
    const double s = 1.0 / (1.0 + std::exp(-gi));
    store(dg, i, dhi * ui * s * (1.0 + gi * (1.0 - s)));
    store(du, i, dhi * gi * s);
  }
}

void geglu_forward(const TensorView& g, const TensorView& u, const TensorView& h) {
  check_forward("geglu_forward", g, u, h);
  for (int64_t i = 0; i < g.numel(); ++i) store(h, i, gelu_ref(load(g, i)) * load(u, i));
}

void geglu_backward(const TensorView& dh, const TensorView& g, const TensorView& u,
                    const TensorView& dg, const TensorView& du) {
  check_backward("geglu_backward", dh, g, u, dg, du);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double dhi = load(dh, i), gi = load(g, i), ui = load(u, i);
    store(dg, i, dhi * ui * gelu_slope_ref(gi));
    store(du, i, dhi * gelu_ref(gi));
  }
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
