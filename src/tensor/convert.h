// Scalar and bulk conversions between f32 and the low-precision formats.
//
// All float conversions round to nearest, ties to even (RNE). NaN stays NaN (quiet).
// Overflow: bf16, f16 and E5M2 go to +-inf, E4M3 (no infinities) goes to NaN, unless
// `saturate` is set, in which case overflow and +-inf clamp to the largest finite value
// of the sign (OCP 8-bit floating point spec, "saturation mode").
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace hyperion {

// A binary floating-point format with `exp_bits` exponent and `man_bits` mantissa bits.
struct MiniFloatFormat {
  int exp_bits;
  int man_bits;
  int bias;
  bool has_inf;       // IEEE-like: all-ones exponent with zero mantissa is inf
  uint32_t nan_code;  // canonical positive NaN code
  uint32_t max_code;  // largest positive finite code
};

inline constexpr MiniFloatFormat kF16Format{5, 10, 15, true, 0x7E00, 0x7BFF};
inline constexpr MiniFloatFormat kE4M3Format{4, 3, 7, false, 0x7F, 0x7E};
inline constexpr MiniFloatFormat kE5M2Format{5, 2, 15, true, 0x7E, 0x7B};

// Exact reference conversions (any format above); used by tests and the scalar paths.
float minifloat_decode(uint32_t code, const MiniFloatFormat& format);
uint32_t minifloat_encode(float value, const MiniFloatFormat& format, bool saturate);

inline float bf16_to_f32(bf16 v) {
  return std::bit_cast<float>(uint32_t(v.bits) << 16);
}

inline bf16 f32_to_bf16(float f) {
  uint32_t b = std::bit_cast<uint32_t>(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((b >> 16) | 0x40)};  // quiet NaN
  b += 0x7fffu + ((b >> 16) & 1u);
  return bf16{uint16_t(b >> 16)};
}

// Saturating variant: finite values that would round to inf clamp to +-max (3.3895e38).
inline bf16 f32_to_bf16_sat(float f) {
  bf16 r = f32_to_bf16(f);
  if ((r.bits & 0x7fffu) == 0x7f80u) r.bits = uint16_t((r.bits & 0x8000u) | 0x7f7fu);
  return r;
}

float f16_to_f32(f16 v);
f16 f32_to_f16(float f, bool saturate = false);
float e4m3_to_f32(fp8_e4m3 v);
float e5m2_to_f32(fp8_e5m2 v);
inline fp8_e4m3 f32_to_e4m3(float f, bool saturate = false) {
  return fp8_e4m3{uint8_t(minifloat_encode(f, kE4M3Format, saturate))};
}
inline fp8_e5m2 f32_to_e5m2(float f, bool saturate = false) {
  return fp8_e5m2{uint8_t(minifloat_encode(f, kE5M2Format, saturate))};
}

// Bulk conversions (SIMD where it pays). `n` elements, no alignment requirement.
void convert_f32_to_bf16(const float* src, bf16* dst, size_t n);
void convert_bf16_to_f32(const bf16* src, float* dst, size_t n);
void convert_f32_to_f16(const float* src, f16* dst, size_t n);
void convert_f16_to_f32(const f16* src, float* dst, size_t n);

// Any supported dtype to any other, through f32 for floating types. Integer targets
// round to nearest even and clamp to their range; NaN converts to 0 for them.
void convert_any(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
                 bool saturate = false);

// Reads element i of a buffer of any dtype as f32 (for tests, reductions, printing).
float load_as_f32(const void* data, DType dtype, size_t i);

}  // namespace hyperion
