#include "tensor/dtype.h"

#include "base/error.h"

namespace hyperion {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kE4M3:
    case DType::kE5M2:
    case DType::kI8:
    case DType::kU8:
      return 1;
  }
  fail("dtype_size: invalid dtype {}", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kE4M3:
      return "fp8_e4m3";
    case DType::kE5M2:
      return "fp8_e5m2";
    case DType::kI8:
      return "int8";
    case DType::kU8:
      return "uint8";
    case DType::kI32:
      return "int32";
  }
  return "invalid";
}

DType parse_dtype(std::string_view n, std::string_view what) {
  if (n == "f32" || n == "float32" || n == "fp32" || n == "float") return DType::kF32;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  if (n == "f16" || n == "float16" || n == "fp16" || n == "half") return DType::kF16;
  if (n == "fp8_e4m3" || n == "e4m3" || n == "float8_e4m3fn") return DType::kE4M3;
  if (n == "fp8_e5m2" || n == "e5m2" || n == "float8_e5m2") return DType::kE5M2;
  if (n == "int8" || n == "i8") return DType::kI8;
  if (n == "uint8" || n == "u8") return DType::kU8;
  if (n == "int32" || n == "i32") return DType::kI32;
  fail(
      "{}: unknown dtype '{}' (expected one of f32, bf16, f16, fp8_e4m3, fp8_e5m2, int8, uint8, "
      "int32)",
      what, n);
}

bool is_floating(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16 || d == DType::kE4M3 ||
         d == DType::kE5M2;
}

}  // namespace hyperion
