// Dropout with Highway dynamic dispatch: the mask's hash in 32-bit integer lanes, the
// scaling in f32 (a separate multiply and add, never fused, so the scalar reference and
// the CUDA kernel give the same bits).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dropout.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include <cstdint>

#include "kernels/dropout.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

HWY_INLINE VU Finalise(DU du, VU h) {
  h = hn::Xor(h, hn::ShiftRight<16>(h));
  h = hn::Mul(h, hn::Set(du, 0x7feb352dU));
  h = hn::Xor(h, hn::ShiftRight<15>(h));
  h = hn::Mul(h, hn::Set(du, 0x846ca68bU));
  return hn::Xor(h, hn::ShiftRight<16>(h));
}

// [0, n) of x and y, element 0 having index `first` in the mask.
template <typename TX, typename TY>
void DropoutT(const TX* x, TY* y, int64_t n, uint32_t first, const DropoutMask& m, bool accumulate) {
  const DF d;
  const DU du;
  const hn::RebindToSigned<DF> di;
  const int64_t l = static_cast<int64_t>(hn::Lanes(d));
  const VF scale = hn::Set(d, m.scale);
  const VU k0 = hn::Set(du, m.k0), k1 = hn::Set(du, m.k1);
  const auto thr = hn::Set(di, static_cast<int32_t>(m.threshold));
  VU idx = hn::Iota(du, first);
  const VU step = hn::Set(du, static_cast<uint32_t>(l));
  int64_t i = 0;
  for (; i + l <= n; i += l) {
    const VU h = hn::ShiftRight<8>(Finalise(du, hn::Xor(Finalise(du, hn::Xor(idx, k0)), k1)));
    const auto drop = hn::RebindMask(d, hn::Lt(hn::BitCast(di, h), thr));
    VF v = hn::IfThenZeroElse(drop, hn::Mul(LoadF(d, x + i), scale));
    if (accumulate) v = hn::Add(LoadF(d, y + i), v);
    StoreF(d, v, y + i);
    idx = hn::Add(idx, step);
  }
  for (; i < n; ++i) {
    const float v = dropout_keeps(m, first + static_cast<uint32_t>(i)) ? ToF32(x[i]) * m.scale : 0.0f;
    y[i] = FromF32<TY>(accumulate ? ToF32(y[i]) + v : v);
  }
}

void DropoutF32F32(const float* x, float* y, int64_t n, uint32_t first, const DropoutMask& m, bool acc) {
  DropoutT(x, y, n, first, m, acc);
}
void DropoutF32BF16(const float* x, bf16* y, int64_t n, uint32_t first, const DropoutMask& m, bool acc) {
  DropoutT(x, y, n, first, m, acc);
}
void DropoutBF16F32(const bf16* x, float* y, int64_t n, uint32_t first, const DropoutMask& m, bool acc) {
  DropoutT(x, y, n, first, m, acc);
}
void DropoutBF16BF16(const bf16* x, bf16* y, int64_t n, uint32_t first, const DropoutMask& m, bool acc) {
  DropoutT(x, y, n, first, m, acc);
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(DropoutF32F32);
HWY_EXPORT(DropoutF32BF16);
HWY_EXPORT(DropoutBF16F32);
HWY_EXPORT(DropoutBF16BF16);

namespace {

constexpr int64_t kGrain = 16384;

}  // namespace

void check_dropout(const char* op, const TensorView& x, const TensorView& y, float p, bool accumulate) {
  check_contiguous(op, "x", x);
  check_contiguous(op, "y", y);
  auto ok = [](DType t) { return t == DType::kF32 || t == DType::kBF16; };
  HYP_CHECK(ok(x.dtype) && ok(y.dtype) && x.numel() == y.numel(),
            "{}: x {} and y {} must be f32 or bf16 with as many elements", op, x.str(), y.str());
  HYP_CHECK(x.numel() <= (int64_t{1} << 32), "{}: {} elements; a mask indexes at most 2^32", op, x.numel());
  HYP_CHECK(p >= 0.0f && p < 1.0f, "{}: p must be in [0, 1), got {}", op, p);
  HYP_CHECK(!(accumulate && x.data == y.data) && (x.data != y.data || x.dtype == y.dtype),
            "{}: y may alias x only when both have one dtype and nothing accumulates", op);
}

uint64_t dropout_key(uint64_t base, uint64_t salt) {
  // splitmix64 of the pair: any change of either gives an unrelated key.
  uint64_t z = base + 0x9e3779b97f4a7c15ULL * (salt + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void dropout_apply(const TensorView& x, const TensorView& y, float p, uint64_t key, bool accumulate) {
  check_dropout("dropout_apply", x, y, p, accumulate);
  const DropoutMask m = dropout_mask(p, key);
  const bool xf = x.dtype == DType::kF32, yf = y.dtype == DType::kF32;
  parallel_chunks(x.numel(), kGrain, [&](int64_t b, int64_t e) {
    const auto first = static_cast<uint32_t>(b);
    if (xf && yf)
      HWY_DYNAMIC_DISPATCH(DropoutF32F32)(x.as<float>() + b, y.as<float>() + b, e - b, first, m, accumulate);
    else if (xf)
      HWY_DYNAMIC_DISPATCH(DropoutF32BF16)(x.as<float>() + b, y.as<bf16>() + b, e - b, first, m, accumulate);
    else if (yf)
      HWY_DYNAMIC_DISPATCH(DropoutBF16F32)(x.as<bf16>() + b, y.as<float>() + b, e - b, first, m, accumulate);
    else
      HWY_DYNAMIC_DISPATCH(DropoutBF16BF16)(x.as<bf16>() + b, y.as<bf16>() + b, e - b, first, m, accumulate);
  });
}

namespace ref {

void dropout_apply(const TensorView& x, const TensorView& y, float p, uint64_t key, bool accumulate) {
  check_dropout("ref::dropout_apply", x, y, p, accumulate);
  const DropoutMask m = dropout_mask(p, key);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = dropout_keeps(m, static_cast<uint32_t>(i))
                        ? load_as_f32(x.data, x.dtype, static_cast<size_t>(i)) * m.scale
                        : 0.0f;
    const float out = accumulate ? load_as_f32(y.data, y.dtype, static_cast<size_t>(i)) + v : v;
    if (y.dtype == DType::kF32)
      y.as<float>()[i] = out;
    else
      y.as<bf16>()[i] = f32_to_bf16(out);
  }
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
