// GGML's Q8_0 block format (see tensor/quantize_q8_0.h) with Highway dynamic dispatch;
// this file is compiled once per SIMD target (foreach_target.h), and everything outside
// HWY_NAMESPACE lives under HWY_ONCE.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/quantize_q8_0.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstring>

#include "tensor/convert.h"
#include "tensor/quantize_q8_0.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kQK = 32;
constexpr size_t kQ8Bytes = 34;

void QuantizeQ8_0(const float* x, unsigned char* out, int64_t nblocks) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto half = hn::Set(df, 0.5f);
  const auto one = hn::Set(df, 1.0f);
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* xb = x + b * kQK;
    auto vmax = hn::Zero(df);
    for (int64_t j = 0; j < kQK; j += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xb + j)));
    const float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    unsigned char* ob = out + b * kQ8Bytes;
    const f16 dh = f32_to_f16(d);
    std::memcpy(ob, &dh, 2);
    auto* qs = reinterpret_cast<int8_t*>(ob + 2);
    const auto vid = hn::Set(df, id);
    for (int64_t j = 0; j < kQK; j += N) {
      const auto v = hn::Mul(hn::LoadU(df, xb + j), vid);
      // roundf: round half away from zero. v - trunc(v) is exact for |v| < 2^23.
      const auto t = hn::Trunc(v);
      auto r = hn::Add(t, hn::IfThenElseZero(hn::Abs(hn::Sub(v, t)) >= half, hn::CopySign(one, v)));
      r = hn::IfThenElseZero(hn::Eq(v, v), r);  // NaN -> 0
      hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, r)), d8, qs + j);
    }
  }
}

void DequantizeQ8_0(const unsigned char* in, float* y, int64_t nblocks) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t b = 0; b < nblocks; ++b) {
    const unsigned char* ib = in + b * kQ8Bytes;
    f16 dh;
    std::memcpy(&dh, ib, 2);
    const auto vd = hn::Set(df, f16_to_f32(dh));
    const auto* qs = reinterpret_cast<const int8_t*>(ib + 2);
    for (int64_t j = 0; j < kQK; j += N) {
      const auto q = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, qs + j)));
      hn::StoreU(hn::Mul(q, vd), df, y + b * kQK + j);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(QuantizeQ8_0);
HWY_EXPORT(DequantizeQ8_0);

namespace {
constexpr int64_t kQK8_0 = 32;
constexpr size_t kQ8_0Bytes = 34;
}  // namespace

namespace ref {

void quantize_row_q8_0(const float* x, void* blocks, int64_t n) {
  HYP_CHECK(n % kQK8_0 == 0, "quantize_row_q8_0: n = {} is not a multiple of 32", n);
  auto* out = static_cast<unsigned char*>(blocks);
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const float* xb = x + b * kQK8_0;
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const f16 dh = f32_to_f16(d);
    std::memcpy(out + b * kQ8_0Bytes, &dh, 2);
    auto* qs = reinterpret_cast<int8_t*>(out + b * kQ8_0Bytes + 2);
    for (int j = 0; j < kQK8_0; ++j) {
      // The clamp only matters when id overflows to inf (amax < ~4e-37), where llama.cpp's
      // float -> int8 conversion would be undefined; the SIMD path saturates the same way.
      const float r = std::round(xb[j] * id);
      qs[j] = std::isnan(r) ? int8_t{0} : static_cast<int8_t>(std::clamp(r, -128.0f, 127.0f));
    }
  }
}

void dequantize_row_q8_0(const void* blocks, float* y, int64_t n) {
  HYP_CHECK(n % kQK8_0 == 0, "dequantize_row_q8_0: n = {} is not a multiple of 32", n);
  const auto* in = static_cast<const unsigned char*>(blocks);
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    f16 dh;
    std::memcpy(&dh, in + b * kQ8_0Bytes, 2);
    const float d = f16_to_f32(dh);
    const auto* qs = reinterpret_cast<const int8_t*>(in + b * kQ8_0Bytes + 2);
    for (int j = 0; j < kQK8_0; ++j) y[b * kQK8_0 + j] = static_cast<float>(qs[j]) * d;
  }
}

}  // namespace ref

void quantize_row_q8_0(const float* x, void* blocks, int64_t n) {
  HYP_CHECK(n % kQK8_0 == 0, "quantize_row_q8_0: n = {} is not a multiple of 32", n);
  auto* out = static_cast<unsigned char*>(blocks);
  parallel_chunks(n / kQK8_0, 2048, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(QuantizeQ8_0)(x + b * kQK8_0, out + b * kQ8_0Bytes, e - b);
  });
}

void dequantize_row_q8_0(const void* blocks, float* y, int64_t n) {
  HYP_CHECK(n % kQK8_0 == 0, "dequantize_row_q8_0: n = {} is not a multiple of 32", n);
  const auto* in = static_cast<const unsigned char*>(blocks);
  parallel_chunks(n / kQK8_0, 2048, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(DequantizeQ8_0)(in + b * kQ8_0Bytes, y + b * kQK8_0, e - b);
  });
}

}  // namespace hyperion
#endif  // HWY_ONCE
