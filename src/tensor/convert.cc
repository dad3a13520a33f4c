// Bulk conversions with Highway dynamic dispatch (AVX-512, AVX2, SSE4 or scalar).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/convert.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "tensor/convert.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void F32ToBF16(const float* src, bf16* dst, size_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<hwy::bfloat16_t, decltype(df)> dbf;
  const size_t lanes = hn::Lanes(df);
  auto* out = reinterpret_cast<hwy::bfloat16_t*>(dst);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto v = hn::LoadU(df, src + i);
    auto bits = hn::BitCast(du, v);
    auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
    auto rounded = hn::Add(bits, hn::Add(hn::Set(du, 0x7fffu), lsb));
    auto quiet = hn::Or(bits, hn::Set(du, 0x00400000u));
    auto r = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, rounded);
    // DemoteTo keeps the upper 16 bits; the rounding was done above.
    hn::StoreU(hn::DemoteTo(dbf, hn::BitCast(df, r)), dbf, out + i);
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void BF16ToF32(const bf16* src, float* dst, size_t n) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::bfloat16_t, decltype(df)> dbf;
  const size_t lanes = hn::Lanes(df);
  const auto* in = reinterpret_cast<const hwy::bfloat16_t*>(src);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(dbf, in + i)), df, dst + i);
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

void F32ToF16(const float* src, f16* dst, size_t n) {
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const size_t lanes = hn::Lanes(df);
  auto* out = reinterpret_cast<hwy::float16_t*>(dst);
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh, out + i);
#endif
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void F16ToF32(const f16* src, float* dst, size_t n) {
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const size_t lanes = hn::Lanes(df);
  const auto* in = reinterpret_cast<const hwy::float16_t*>(src);
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, in + i)), df, dst + i);
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/error.h"

namespace hyperion {

HWY_EXPORT(F32ToBF16);
HWY_EXPORT(BF16ToF32);
HWY_EXPORT(F32ToF16);
HWY_EXPORT(F16ToF32);

float minifloat_decode(uint32_t code, const MiniFloatFormat& f) {
  const uint32_t exp_mask = (1u << f.exp_bits) - 1;
  const uint32_t man_mask = (1u << f.man_bits) - 1;
  const bool negative = (code >> (f.exp_bits + f.man_bits)) & 1u;
  const uint32_t e = (code >> f.man_bits) & exp_mask;
  const uint32_t m = code & man_mask;
  float value;
  if (e == exp_mask && f.has_inf) {
    value =
        m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (e == exp_mask && m == man_mask) {
    value = std::numeric_limits<float>::quiet_NaN();  // E4M3: S.1111.111 is the only NaN
  } else if (e == 0) {
    value = std::ldexp(static_cast<float>(m), 1 - f.bias - f.man_bits);
  } else {
    value = std::ldexp(static_cast<float>(m | (1u << f.man_bits)), int(e) - f.bias - f.man_bits);
  }
  return negative ? -value : value;
}

uint32_t minifloat_encode(float x, const MiniFloatFormat& f, bool saturate) {
  const uint32_t sign = std::signbit(x) ? 1u << (f.exp_bits + f.man_bits) : 0u;
  const uint32_t inf_code = ((1u << f.exp_bits) - 1) << f.man_bits;
  const uint32_t overflow_code = saturate ? f.max_code : (f.has_inf ? inf_code : f.nan_code);
  if (std::isnan(x)) return sign | f.nan_code;
  float a = std::fabs(x);
  if (std::isinf(a)) return sign | overflow_code;
  if (a == 0.0f) return sign;
  int e;
  std::frexp(a, &e);
  e -= 1;  // a = 1.m * 2^e
  const int min_exp = 1 - f.bias;
  if (e < min_exp) e = min_exp;  // subnormal range: fixed quantum
  // Scaling by a power of two is exact; nearbyint rounds half to even.
  float q = std::nearbyint(std::ldexp(a, f.man_bits - e));
  const float implicit = std::ldexp(1.0f, f.man_bits);
  if (q >= 2 * implicit) {  // rounded up into the next binade
    e += 1;
    q = implicit;
  }
  uint32_t code;
  if (q < implicit) {
    code = static_cast<uint32_t>(q);  // subnormal (or zero): exponent field 0
  } else {
    code = (uint32_t(e + f.bias) << f.man_bits) | (static_cast<uint32_t>(q) - (1u << f.man_bits));
  }
  if (code > f.max_code) return sign | overflow_code;
  return sign | code;
}

float f16_to_f32(f16 v) {
  return minifloat_decode(v.bits, kF16Format);
}
f16 f32_to_f16(float f, bool saturate) {
  return f16{uint16_t(minifloat_encode(f, kF16Format, saturate))};
}

namespace {
template <const MiniFloatFormat& F>
struct Fp8Table {
  float values[256];
  Fp8Table() {
    for (uint32_t c = 0; c < 256; ++c) values[c] = minifloat_decode(c, F);
  }
};
const Fp8Table<kE4M3Format>& e4m3_table() {
  static const Fp8Table<kE4M3Format> t;
  return t;
}
const Fp8Table<kE5M2Format>& e5m2_table() {
  static const Fp8Table<kE5M2Format> t;
  return t;
}
}  // namespace

float e4m3_to_f32(fp8_e4m3 v) {
  return e4m3_table().values[v.bits];
}
float e5m2_to_f32(fp8_e5m2 v) {
  return e5m2_table().values[v.bits];
}

void convert_f32_to_bf16(const float* s, bf16* d, size_t n) {
  HWY_DYNAMIC_DISPATCH(F32ToBF16)(s, d, n);
}
void convert_bf16_to_f32(const bf16* s, float* d, size_t n) {
  HWY_DYNAMIC_DISPATCH(BF16ToF32)(s, d, n);
}
void convert_f32_to_f16(const float* s, f16* d, size_t n) {
  HWY_DYNAMIC_DISPATCH(F32ToF16)(s, d, n);
}
void convert_f16_to_f32(const f16* s, float* d, size_t n) {
  HWY_DYNAMIC_DISPATCH(F16ToF32)(s, d, n);
}

float load_as_f32(const void* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const bf16*>(data)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const f16*>(data)[i]);
    case DType::kE4M3:
      return e4m3_to_f32(static_cast<const fp8_e4m3*>(data)[i]);
    case DType::kE5M2:
      return e5m2_to_f32(static_cast<const fp8_e5m2*>(data)[i]);
    case DType::kI8:
      return static_cast<const int8_t*>(data)[i];
    case DType::kU8:
      return static_cast<const uint8_t*>(data)[i];
    case DType::kI32:
      return static_cast<float>(static_cast<const int32_t*>(data)[i]);
  }
  fail("load_as_f32: invalid dtype {}", static_cast<int>(dtype));
}

namespace {
template <typename I>
I float_to_int(float v) {
  if (std::isnan(v)) return 0;
  double r = std::nearbyint(static_cast<double>(v));
  r = std::fmax(r, static_cast<double>(std::numeric_limits<I>::min()));
  r = std::fmin(r, static_cast<double>(std::numeric_limits<I>::max()));
  return static_cast<I>(r);
}

void store_from_f32(const float* src, void* dst, DType dtype, size_t n, bool saturate) {
  switch (dtype) {
    case DType::kF32:
      std::copy(src, src + n, static_cast<float*>(dst));
      return;
    case DType::kBF16:
      if (saturate) {
        for (size_t i = 0; i < n; ++i) static_cast<bf16*>(dst)[i] = f32_to_bf16_sat(src[i]);
      } else {
        convert_f32_to_bf16(src, static_cast<bf16*>(dst), n);
      }
      return;
    case DType::kF16:
      if (saturate) {
        for (size_t i = 0; i < n; ++i) static_cast<f16*>(dst)[i] = f32_to_f16(src[i], true);
      } else {
        convert_f32_to_f16(src, static_cast<f16*>(dst), n);
      }
      return;
    case DType::kE4M3:
      for (size_t i = 0; i < n; ++i) static_cast<fp8_e4m3*>(dst)[i] = f32_to_e4m3(src[i], saturate);
      return;
    case DType::kE5M2:
      for (size_t i = 0; i < n; ++i) static_cast<fp8_e5m2*>(dst)[i] = f32_to_e5m2(src[i], saturate);
      return;
    case DType::kI8:
      for (size_t i = 0; i < n; ++i) static_cast<int8_t*>(dst)[i] = float_to_int<int8_t>(src[i]);
      return;
    case DType::kU8:
      for (size_t i = 0; i < n; ++i) static_cast<uint8_t*>(dst)[i] = float_to_int<uint8_t>(src[i]);
      return;
    case DType::kI32:
      for (size_t i = 0; i < n; ++i) static_cast<int32_t*>(dst)[i] = float_to_int<int32_t>(src[i]);
      return;
  }
  fail("convert: invalid destination dtype {}", static_cast<int>(dtype));
}
}  // namespace

void convert_any(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
                 bool saturate) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, n * dtype_size(src_dtype));
    return;
  }
  // int32 does not fit f32 exactly; convert it directly.
  if (src_dtype == DType::kI32 && !is_floating(dst_dtype)) {
    const int32_t* s = static_cast<const int32_t*>(src);
    for (size_t i = 0; i < n; ++i) {
      int32_t lo = dst_dtype == DType::kI8 ? -128 : 0, hi = dst_dtype == DType::kI8 ? 127 : 255;
      int32_t v = std::min(std::max(s[i], lo), hi);
      if (dst_dtype == DType::kI8)
        static_cast<int8_t*>(dst)[i] = int8_t(v);
      else
        static_cast<uint8_t*>(dst)[i] = uint8_t(v);
    }
    return;
  }
  // f32 sources convert straight from the source (the SIMD f32 -> bf16 / f16 paths).
  if (src_dtype == DType::kF32) {
    store_from_f32(static_cast<const float*>(src), dst, dst_dtype, n, saturate);
    return;
  }
  constexpr size_t kBlock = 1024;
  float tmp[kBlock];
  for (size_t start = 0; start < n; start += kBlock) {
    size_t count = std::min(kBlock, n - start);
    const unsigned char* s = static_cast<const unsigned char*>(src) + start * dtype_size(src_dtype);
    if (src_dtype == DType::kBF16) {
      convert_bf16_to_f32(reinterpret_cast<const bf16*>(s), tmp, count);
    } else if (src_dtype == DType::kF16) {
      convert_f16_to_f32(reinterpret_cast<const f16*>(s), tmp, count);
    } else {
      for (size_t i = 0; i < count; ++i) tmp[i] = load_as_f32(s, src_dtype, i);
    }
    store_from_f32(tmp, static_cast<unsigned char*>(dst) + start * dtype_size(dst_dtype), dst_dtype,
                   count, saturate);
  }
}

}  // namespace hyperion
#endif  // HWY_ONCE
