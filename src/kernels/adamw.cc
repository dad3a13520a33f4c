// Fused AdamW with Highway dynamic dispatch: params, grads, m and v are each read once
// and params, m, v (and the optional bf16 params) written once.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/adamw.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include <cmath>
#include <cstdint>

#include "kernels/adamw.h"
#include "tensor/convert.h"

// Outside HWY_NAMESPACE (and defined once, although this file is compiled once per
// target) so that every target's function has the same signature for dispatch.
#ifndef HYPERION_KERNELS_ADAMW_CONSTANTS_
#define HYPERION_KERNELS_ADAMW_CONSTANTS_
namespace hyperion::adamw_detail {
// Per-step scalars, folded on the host in double and rounded to f32 once.
struct StepConstants {
  float decay;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps;
  float grad_scale;
};
}  // namespace hyperion::adamw_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {
using adamw_detail::StepConstants;

template <typename G>
void StepSpan(float* p, const G* g, float* m, float* v, bf16* p_bf16, const StepConstants& k,
              int64_t count) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const VF decay = hn::Set(df, k.decay), b1 = hn::Set(df, k.beta1),
           c1 = hn::Set(df, k.one_minus_beta1);
  const VF b2 = hn::Set(df, k.beta2), c2 = hn::Set(df, k.one_minus_beta2);
  const VF step_size = hn::Set(df, k.step_size), inv_sqrt_bc2 = hn::Set(df, k.inv_sqrt_bc2);
  const VF eps = hn::Set(df, k.eps), scale = hn::Set(df, k.grad_scale);
  int64_t i = 0;
  for (; i + n <= count; i += n) {
    const VF gv = hn::Mul(LoadF(df, g + i), scale);
    const VF mv = hn::MulAdd(b1, hn::LoadU(df, m + i), hn::Mul(c1, gv));
    const VF vv = hn::MulAdd(b2, hn::LoadU(df, v + i), hn::Mul(hn::Mul(c2, gv), gv));
    const VF denom = hn::MulAdd(hn::Sqrt(vv), inv_sqrt_bc2, eps);
    const VF pv =
        hn::NegMulAdd(step_size, hn::Div(mv, denom), hn::Mul(hn::LoadU(df, p + i), decay));
    hn::StoreU(mv, df, m + i);
    hn::StoreU(vv, df, v + i);
    hn::StoreU(pv, df, p + i);
    if (p_bf16 != nullptr) StoreF(df, pv, p_bf16 + i);
  }
  for (; i < count; ++i) {
    const float gi = ToF32(g[i]) * k.grad_scale;
    const float mi = k.beta1 * m[i] + k.one_minus_beta1 * gi;
    const float vi = k.beta2 * v[i] + k.one_minus_beta2 * gi * gi;
    const float denom = std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps;
    const float pi = p[i] * k.decay - k.step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (p_bf16 != nullptr) p_bf16[i] = f32_to_bf16(pi);
  }
}

void StepF32(float* p, const float* g, float* m, float* v, bf16* p_bf16, const StepConstants& k,
             int64_t count) {
  StepSpan(p, g, m, v, p_bf16, k, count);
}
void StepBF16(float* p, const bf16* g, float* m, float* v, bf16* p_bf16, const StepConstants& k,
              int64_t count) {
  StepSpan(p, g, m, v, p_bf16, k, count);
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <utility>

#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(StepF32);
HWY_EXPORT(StepBF16);

namespace {

void check_args(const TensorView& params, const TensorView& grads, const TensorView& m,
                const TensorView& v, const AdamWParams& hp, const TensorView& params_bf16) {
  const char* op = "adamw_step";
  params.check_dtype(DType::kF32, op);
  check_contiguous(op, "params", params);
  HYP_CHECK(grads.dtype == DType::kF32 || grads.dtype == DType::kBF16,
            "{}: grads must be f32 or bf16, got {}", op, grads.str());
  check_contiguous(op, "grads", grads);
  HYP_CHECK(grads.shape == params.shape, "{}: grads {} and params {} differ in shape", op,
            grads.str(), params.str());
  for (const auto& [name, t] : {std::pair{"m", &m}, std::pair{"v", &v}}) {
    HYP_CHECK(t->dtype == DType::kF32 && t->shape == params.shape,
              "{}: {} {} must be f32 with the shape of params {}", op, name, t->str(),
              params.str());
    check_contiguous(op, name, *t);
  }
  if (params_bf16.data != nullptr) {
    HYP_CHECK(params_bf16.dtype == DType::kBF16 && params_bf16.shape == params.shape,
              "{}: params_bf16 {} must be bf16 with the shape of params {}", op, params_bf16.str(),
              params.str());
    check_contiguous(op, "params_bf16", params_bf16);
  }
  HYP_CHECK(hp.step >= 1, "{}: step must be >= 1 (1-based), got {}", op, hp.step);
  HYP_CHECK(hp.lr >= 0.0f && std::isfinite(hp.lr), "{}: invalid lr {}", op, hp.lr);
  HYP_CHECK(hp.eps >= 0.0f && std::isfinite(hp.eps), "{}: invalid eps {}", op, hp.eps);
  HYP_CHECK(hp.beta1 >= 0.0f && hp.beta1 < 1.0f, "{}: beta1 must be in [0, 1), got {}", op,
            hp.beta1);
  HYP_CHECK(hp.beta2 >= 0.0f && hp.beta2 < 1.0f, "{}: beta2 must be in [0, 1), got {}", op,
            hp.beta2);
  HYP_CHECK(hp.weight_decay >= 0.0f && std::isfinite(hp.weight_decay),
            "{}: invalid weight_decay {}", op, hp.weight_decay);
  HYP_CHECK(std::isfinite(hp.grad_scale), "{}: grad_scale must be finite, got {}", op,
            hp.grad_scale);
}

adamw_detail::StepConstants constants(const AdamWParams& hp) {
  const double t = static_cast<double>(hp.step);
  const double bc1 = 1.0 - std::pow(double(hp.beta1), t);
  const double bc2 = 1.0 - std::pow(double(hp.beta2), t);
  adamw_detail::StepConstants k;
  k.decay = static_cast<float>(1.0 - double(hp.lr) * double(hp.weight_decay));
  k.beta1 = hp.beta1;
  k.one_minus_beta1 = static_cast<float>(1.0 - double(hp.beta1));
  k.beta2 = hp.beta2;
  k.one_minus_beta2 = static_cast<float>(1.0 - double(hp.beta2));
  k.step_size = static_cast<float>(double(hp.lr) / bc1);
  k.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  k.eps = hp.eps;
  k.grad_scale = hp.grad_scale;
  return k;
}

}  // namespace

void adamw_step(const TensorView& params, const TensorView& grads, const TensorView& m,
                const TensorView& v, const AdamWParams& hp, const TensorView& params_bf16) {
  check_args(params, grads, m, v, hp, params_bf16);
  const adamw_detail::StepConstants k = constants(hp);
  float* p = params.as<float>();
  float* mp = m.as<float>();
  float* vp = v.as<float>();
  bf16* pb = params_bf16.data != nullptr ? params_bf16.as<bf16>() : nullptr;
  parallel_chunks(params.numel(), 16384, [&](int64_t b, int64_t e) {
    bf16* pbb = pb != nullptr ? pb + b : nullptr;
    if (grads.dtype == DType::kF32)
      HWY_DYNAMIC_DISPATCH(StepF32)(p + b, grads.as<float>() + b, mp + b, vp + b, pbb, k, e - b);
    else
      HWY_DYNAMIC_DISPATCH(StepBF16)(p + b, grads.as<bf16>() + b, mp + b, vp + b, pbb, k, e - b);
  });
}

namespace ref {

void adamw_step(const TensorView& params, const TensorView& grads, const TensorView& m,
                const TensorView& v, const AdamWParams& hp, const TensorView& params_bf16) {
  check_args(params, grads, m, v, hp, params_bf16);
  const double t = static_cast<double>(hp.step);
  const double bc1 = 1.0 - std::pow(double(hp.beta1), t);
  const double bc2 = 1.0 - std::pow(double(hp.beta2), t);
  const double lr = hp.lr, wd = hp.weight_decay, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps;
  for (int64_t i = 0; i < params.numel(); ++i) {
    const double g = double(load_as_f32(grads.data, grads.dtype, static_cast<size_t>(i))) *
                     double(hp.grad_scale);
    double p = params.as<float>()[i];
    double mi = m.as<float>()[i], vi = v.as<float>()[i];
    p -= lr * wd * p;
    mi = b1 * mi + (1 - b1) * g;
    vi = b2 * vi + (1 - b2) * g * g;
    p -= lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    params.as<float>()[i] = static_cast<float>(p);
    m.as<float>()[i] = static_cast<float>(mi);
    v.as<float>()[i] = static_cast<float>(vi);
    if (params_bf16.data != nullptr) params_bf16.as<bf16>()[i] = f32_to_bf16(static_cast<float>(p));
  }
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
