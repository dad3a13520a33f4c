#include "tensor/dtype.h"

#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <utility>

#include "base/error.h"

namespace hyperion {
namespace {

TEST(DType, SizesMatchStorageTypes) {
  EXPECT_EQ(dtype_size(DType::kF32), sizeof(float));
  EXPECT_EQ(dtype_size(DType::kBF16), sizeof(bf16));
  EXPECT_EQ(dtype_size(DType::kF16), sizeof(f16));
  EXPECT_EQ(dtype_size(DType::kE4M3), sizeof(fp8_e4m3));
  EXPECT_EQ(dtype_size(DType::kE5M2), sizeof(fp8_e5m2));
  EXPECT_EQ(dtype_size(DType::kI8), sizeof(int8_t));
  EXPECT_EQ(dtype_size(DType::kU8), sizeof(uint8_t));
  EXPECT_EQ(dtype_size(DType::kI32), sizeof(int32_t));
  // The storage structs are plain bit patterns (memcpy-able, no padding).
  static_assert(std::is_trivially_copyable_v<bf16> && sizeof(bf16) == 2);
  static_assert(std::is_trivially_copyable_v<f16> && sizeof(f16) == 2);
  static_assert(std::is_trivially_copyable_v<fp8_e4m3> && sizeof(fp8_e4m3) == 1);
  static_assert(std::is_trivially_copyable_v<fp8_e5m2> && sizeof(fp8_e5m2) == 1);
}

TEST(DType, DTypeOfMapsEveryStorageType) {
  static_assert(DTypeOf<float>::value == DType::kF32);
  static_assert(DTypeOf<bf16>::value == DType::kBF16);
  static_assert(DTypeOf<f16>::value == DType::kF16);
  static_assert(DTypeOf<fp8_e4m3>::value == DType::kE4M3);
  static_assert(DTypeOf<fp8_e5m2>::value == DType::kE5M2);
  static_assert(DTypeOf<int8_t>::value == DType::kI8);
  static_assert(DTypeOf<uint8_t>::value == DType::kU8);
  static_assert(DTypeOf<int32_t>::value == DType::kI32);
  EXPECT_EQ(std::size(kAllDTypes), 8u);
}

TEST(DType, NamesAreCanonicalAndRoundTrip) {
  EXPECT_EQ(dtype_name(DType::kF32), "f32");
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_EQ(dtype_name(DType::kF16), "f16");
  EXPECT_EQ(dtype_name(DType::kE4M3), "fp8_e4m3");
  EXPECT_EQ(dtype_name(DType::kE5M2), "fp8_e5m2");
  EXPECT_EQ(dtype_name(DType::kI8), "int8");
  EXPECT_EQ(dtype_name(DType::kU8), "uint8");
  EXPECT_EQ(dtype_name(DType::kI32), "int32");
  for (DType d : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(d)), d) << dtype_name(d);
}

TEST(DType, ParseAcceptsAliases) {
  const std::pair<const char*, DType> cases[] = {
      {"f32", DType::kF32},
      {"float32", DType::kF32},
      {"fp32", DType::kF32},
      {"float", DType::kF32},
      {"bf16", DType::kBF16},
      {"bfloat16", DType::kBF16},
      {"f16", DType::kF16},
      {"float16", DType::kF16},
      {"fp16", DType::kF16},
      {"half", DType::kF16},
      {"fp8_e4m3", DType::kE4M3},
      {"e4m3", DType::kE4M3},
      {"float8_e4m3fn", DType::kE4M3},
      {"fp8_e5m2", DType::kE5M2},
      {"e5m2", DType::kE5M2},
      {"float8_e5m2", DType::kE5M2},
      {"int8", DType::kI8},
      {"i8", DType::kI8},
      {"uint8", DType::kU8},
      {"u8", DType::kU8},
      {"int32", DType::kI32},
      {"i32", DType::kI32},
  };
  for (const auto& [name, dtype] : cases) EXPECT_EQ(parse_dtype(name), dtype) << name;
}

TEST(DType, ParseRejectsUnknownNamesNamingThem) {
  for (const char* bad : {"f64", "float64", "", "int4", "bf16 ", "e4m3fnuz"}) {
    try {
      parse_dtype(bad, "--param-dtype");
      ADD_FAILURE() << "parse_dtype accepted '" << bad << "'";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("--param-dtype"), std::string::npos) << msg;
    }
  }
  // The default `what` is "dtype".
  try {
    parse_dtype("complex64");
    ADD_FAILURE() << "parse_dtype accepted complex64";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("dtype:", 0), 0u) << msg;
    EXPECT_NE(msg.find("complex64"), std::string::npos) << msg;
  }
}

TEST(DType, IsFloating) {
  EXPECT_TRUE(is_floating(DType::kF32));
  EXPECT_TRUE(is_floating(DType::kBF16));
  EXPECT_TRUE(is_floating(DType::kF16));
  EXPECT_TRUE(is_floating(DType::kE4M3));
  EXPECT_TRUE(is_floating(DType::kE5M2));
  EXPECT_FALSE(is_floating(DType::kI8));
  EXPECT_FALSE(is_floating(DType::kU8));
  EXPECT_FALSE(is_floating(DType::kI32));
}

TEST(DType, InvalidEnumValueIsReported) {
  const DType bogus = static_cast<DType>(200);
  EXPECT_THROW(dtype_size(bogus), Error);
  EXPECT_EQ(dtype_name(bogus), "invalid");
}

}  // namespace
}  // namespace hyperion
