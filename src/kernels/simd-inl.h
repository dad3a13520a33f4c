// Per-target Highway helpers shared by the elementwise/row kernels (softmax,
// cross_entropy, swiglu, rmsnorm, rope, adamw, embedding): f32/bf16 vector and scalar
// load/store with round-to-nearest-even bf16 stores, partial-vector tails through a
// stack buffer, the bf16 "pair layout" and the softmax-range FastExp.
//
// Include it at the top level of a kernel .cc right after <hwy/highway.h>, so that
// foreach_target.h re-includes it once per target. The guard below is Highway's
// per-target idiom (as in hwy/contrib/math/math-inl.h): it toggles with
// HWY_TARGET_TOGGLE instead of staying defined, so each target gets its own copy in
// its own hyperion::HWY_NAMESPACE.
#if defined(HYPERION_KERNELS_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HYPERION_KERNELS_SIMD_INL_H_
#undef HYPERION_KERNELS_SIMD_INL_H_
#else
#define HYPERION_KERNELS_SIMD_INL_H_
#endif

#include <hwy/highway.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/convert.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VU = hn::Vec<DU>;
// Upper bound on the lanes of any target (tails go through a stack buffer this big).
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// Scalar conversions: f32 math on f32 or bf16 storage; bf16 rounds to nearest even.
HWY_INLINE float ToF32(float v) {
  return v;
}
HWY_INLINE float ToF32(bf16 v) {
  return bf16_to_f32(v);
}
template <typename T>
HWY_INLINE T FromF32(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return f32_to_bf16(v);
  }
}

// f32 bits rounded to nearest even at bit 16 (the bf16 is the high half); NaN stays a
// quiet NaN (rounding could otherwise carry a signalling NaN's payload into infinity).
HWY_INLINE VU RoundBits(DF /*d*/, VF v) {
  const DU du;
  const VU bits = hn::BitCast(du, v);
  const VU lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  const VU rounded = hn::Add(bits, hn::Add(hn::Set(du, 0x7fffu), lsb));
  const VU quiet = hn::Or(bits, hn::Set(du, 0x00400000u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, rounded);
}

// Full vectors of f32 from f32 or bf16 memory, unaligned.
HWY_INLINE VF LoadF(DF d, const float* p) {
  return hn::LoadU(d, p);
}
HWY_INLINE VF LoadF(DF d, const bf16* p) {
  const hn::Rebind<hwy::bfloat16_t, DF> dbf;
  return hn::PromoteTo(d, hn::LoadU(dbf, reinterpret_cast<const hwy::bfloat16_t*>(p)));
}
HWY_INLINE void StoreF(DF d, VF v, float* p) {
  hn::StoreU(v, d, p);
}
// Rounds explicitly: DemoteTo(f32 -> bf16) itself truncates in Highway 1.0.3, so it
// only drops the (already rounded) low halves here.
HWY_INLINE void StoreF(DF d, VF v, bf16* p) {
  const hn::Rebind<hwy::bfloat16_t, DF> dbf;
  hn::StoreU(hn::DemoteTo(dbf, hn::BitCast(d, RoundBits(d, v))), dbf,
             reinterpret_cast<hwy::bfloat16_t*>(p));
}

// Partial vectors: `count` < Lanes(d) elements, the rest of the lanes set to `pad`.
template <typename T>
HWY_INLINE VF LoadTail(DF d, const T* p, size_t count, float pad) {
  HWY_ALIGN float buf[kMaxLanes];
  const size_t lanes = hn::Lanes(d);
  for (size_t i = 0; i < lanes; ++i) buf[i] = i < count ? ToF32(p[i]) : pad;
  return hn::Load(d, buf);
}
template <typename T>
HWY_INLINE void StoreTail(DF d, VF v, T* p, size_t count) {
  HWY_ALIGN float buf[kMaxLanes] = {};  // zero-init: GCC 12 -O3 warns falsely otherwise
  hn::Store(v, d, buf);
  for (size_t i = 0; i < count; ++i) p[i] = FromF32<T>(buf[i]);
}

// bf16 "pair layout" for main loops over 2 vectors of bf16: a u32 lane holds elements
// 2k (low half) and 2k+1 (high half), so two f32 vectors are the lanes << 16 (even) and
// the lanes with the low half cleared (odd). Elementwise work and reductions do not care
// about the order (an f32 scratch row is written and read back in that same order), and
// this drops the widening loads and the narrowing pack + lane permute of per-vector
// bf16 loads/stores.
HWY_INLINE void LoadPairs(DF d, const bf16* p, VF& even, VF& odd) {
  const DU du;
  const VU v = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  even = hn::BitCast(d, hn::ShiftLeft<16>(v));
  odd = hn::BitCast(d, hn::And(v, hn::Set(du, 0xffff0000u)));
}
HWY_INLINE void StorePairs(DF d, VF even, VF odd, bf16* p) {
  const DU du;
  const VU lo = hn::ShiftRight<16>(RoundBits(d, even));
  const VU hi = hn::And(RoundBits(d, odd), hn::Set(du, 0xffff0000u));
  hn::StoreU(hn::Or(lo, hi), du, reinterpret_cast<uint32_t*>(p));
}
// Two vectors (2 * Lanes(d) elements): in pair order if kPairs (T must be bf16), else
// the plain consecutive order.
template <bool kPairs, typename T>
HWY_INLINE void Load2(DF d, const T* p, VF& a, VF& b) {
  if constexpr (kPairs) {
    LoadPairs(d, p, a, b);
  } else {
    a = LoadF(d, p);
    b = LoadF(d, p + hn::Lanes(d));
  }
}

// f32 row tails for short rows (the MoE router's e = 8..64 is often below one vector, so
// the tail is most of the row): a single masked load/store on AVX2/AVX-512 (fault-suppressing)
// instead of the stack-buffer round trip of LoadTail/StoreTail above, which the
// other targets keep (their MaskedLoad reads the whole vector).
HWY_INLINE VF LoadTailF(DF d, const float* p, size_t count, float pad) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const auto m = hn::FirstN(d, count);
  return hn::IfThenElse(m, hn::MaskedLoad(m, d, p), hn::Set(d, pad));
#else
  return LoadTail(d, p, count, pad);
#endif
}
HWY_INLINE void StoreTailF(DF d, VF v, float* p, size_t count) {
  hn::BlendedStore(v, hn::FirstN(d, count), d, p);
}

// Largest element of a row of `cols` (f32, or bf16 read as pairs when kPairs). Starts
// at -FLT_MAX, not -inf, so that x - max stays finite or -inf (never NaN) for a row
// that is all -inf.
template <bool kPairs, typename T>
HWY_INLINE float RowMax(DF d, const T* x, size_t cols) {
  const size_t n = hn::Lanes(d);
  VF m0 = hn::Set(d, -FLT_MAX), m1 = m0;
  size_t i = 0;
  for (; i + 2 * n <= cols; i += 2 * n) {
    VF v0, v1;
    Load2<kPairs>(d, x + i, v0, v1);
    m0 = hn::Max(m0, v0);
    m1 = hn::Max(m1, v1);
  }
  for (; i + n <= cols; i += n) m0 = hn::Max(m0, LoadF(d, x + i));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (i < cols) {
    if constexpr (std::is_same_v<T, float>)
      m0 = hn::Max(m0, LoadTailF(d, x + i, cols - i, neg_inf));
    else
      m0 = hn::Max(m0, LoadTail(d, x + i, cols - i, neg_inf));
  }
  return hn::GetLane(hn::MaxOfLanes(d, hn::Max(m0, m1)));
}

// exp(x) for softmax-style arguments x - max (<= 0; valid up to +88). Cody-Waite
// reduction x = n ln2 + r with |r| <= ln2/2 and Highway's degree-7 polynomial (~1 ulp),
// but n is rounded with the 1.5 * 2^23 shifter whose low bits are then the exponent
// of 2^n: ~16 simple ops against ~35 for hn::Exp (no conversions, no range fix-ups).
// x < -86 gives 0 (the true value is < 5e-38; this also avoids slow denormal results),
// -inf gives 0, NaN stays NaN (so a diverging model shows up as NaN, not as zeros).
HWY_INLINE VF FastExp(DF d, VF x) {
  const DU du;
  const VF shifter = hn::Set(d, 12582912.0f + 127.0f);  // 1.5 * 2^23 + exponent bias
  const VF t = hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), shifter);
  const VF n = hn::Sub(t, shifter);  // round(x / ln2), exact
  VF r = hn::MulAdd(n, hn::Set(d, -0.693145751953125f), x);
  r = hn::MulAdd(n, hn::Set(d, -1.428606765330187045e-6f), r);
  VF q = hn::MulAdd(hn::Set(d, 0.000198527617612853646278381f), r,
                    hn::Set(d, 0.00139304355252534151077271f));
  q = hn::MulAdd(q, r, hn::Set(d, 0.00833336077630519866943359f));
  q = hn::MulAdd(q, r, hn::Set(d, 0.0416664853692054748535156f));
  q = hn::MulAdd(q, r, hn::Set(d, 0.166666671633720397949219f));
  q = hn::MulAdd(q, r, hn::Set(d, 0.5f));
  const VF p = hn::Add(hn::MulAdd(q, hn::Mul(r, r), r), hn::Set(d, 1.0f));
  // The mantissa of t holds 2^22 + 127 + n; shifting by 23 keeps (127 + n) << 23 = 2^n.
  const VF pow2n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(du, t)));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -86.0f)), hn::Mul(p, pow2n));
}

// Row softmax primitives for short f32 rows (the MoE router; kernels/softmax.cc has the
// long-row, bf16-aware version with prefetching).
// Sum of exp(x - m) over a row; with kStore the exps are written to out as well.
template <bool kStore>
HWY_INLINE float ExpRow(DF d, const float* x, size_t cols, float m, float* out) {
  const size_t n = hn::Lanes(d);
  const VF vm = hn::Set(d, m);
  VF s0 = hn::Zero(d), s1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * n <= cols; i += 2 * n) {
    const VF e0 = FastExp(d, hn::Sub(hn::LoadU(d, x + i), vm));
    const VF e1 = FastExp(d, hn::Sub(hn::LoadU(d, x + i + n), vm));
    if constexpr (kStore) {
      hn::StoreU(e0, d, out + i);
      hn::StoreU(e1, d, out + i + n);
    }
    s0 = hn::Add(s0, e0);
    s1 = hn::Add(s1, e1);
  }
  for (; i + n <= cols; i += n) {
    const VF e0 = FastExp(d, hn::Sub(hn::LoadU(d, x + i), vm));
    if constexpr (kStore) hn::StoreU(e0, d, out + i);
    s0 = hn::Add(s0, e0);
  }
  if (i < cols) {
    // Padding lanes are -inf, whose exp is 0.
    const VF e0 = FastExp(
        d, hn::Sub(LoadTailF(d, x + i, cols - i, -std::numeric_limits<float>::infinity()), vm));
    if constexpr (kStore) StoreTailF(d, e0, out + i, cols - i);
    s0 = hn::Add(s0, e0);
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
}

// probs = softmax(logits) of one row of `cols`.
HWY_INLINE void SoftmaxRow(DF d, const float* x, float* p, size_t cols) {
  const size_t n = hn::Lanes(d);
  const float sum = ExpRow<true>(d, x, cols, RowMax<false>(d, x, cols), p);
  // sum == 0 only for an all -inf row: zeros. A NaN sum stays NaN.
  const VF vinv = hn::Set(d, sum == 0.0f ? 0.0f : 1.0f / sum);
  size_t i = 0;
  for (; i + n <= cols; i += n) hn::StoreU(hn::Mul(hn::LoadU(d, p + i), vinv), d, p + i);
  if (i < cols) StoreTailF(d, hn::Mul(LoadTailF(d, p + i, cols - i, 0.0f), vinv), p + i, cols - i);
}


}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#endif  // HYPERION_KERNELS_SIMD_INL_H_
