// Element types. Low-precision floats follow their standards: bf16 (truncated binary32),
// f16 (IEEE binary16), and the OCP 8-bit floating point formats E4M3 (bias 7, no
// infinities, max 448, NaN = S.1111.111) and E5M2 (bias 15, IEEE-like with inf and NaN).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace hyperion {

enum class DType : uint8_t { kF32, kBF16, kF16, kE4M3, kE5M2, kI8, kU8, kI32 };

inline constexpr DType kAllDTypes[] = {DType::kF32,  DType::kBF16, DType::kF16, DType::kE4M3,
                                       DType::kE5M2, DType::kI8,   DType::kU8,  DType::kI32};

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
// Parses "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16", "fp8_e4m3"/"e4m3",
// "fp8_e5m2"/"e5m2", "int8"/"i8", "uint8"/"u8", "int32"/"i32". Throws naming `what`.
DType parse_dtype(std::string_view name, std::string_view what = "dtype");
bool is_floating(DType dtype);

// Storage types for the 16- and 8-bit formats: plain bit patterns, so they are
// trivially copyable and never converted implicitly.
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};
struct fp8_e4m3 {
  uint8_t bits;
};
struct fp8_e5m2 {
  uint8_t bits;
};

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<bf16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<f16> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<fp8_e4m3> {
  static constexpr DType value = DType::kE4M3;
};
template <>
struct DTypeOf<fp8_e5m2> {
  static constexpr DType value = DType::kE5M2;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::kI8;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kU8;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};

}  // namespace hyperion
