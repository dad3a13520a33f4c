// Conversions are checked against decoders and encoders written here from the bit-field
// definitions (OCP OFP8 for E4M3/E5M2, IEEE binary16, bf16 = upper half of binary32), so a
// shared mistake in minifloat_decode/minifloat_encode cannot hide itself.
#include "tensor/convert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"

namespace hyperion {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits_of(float f) {
  return std::bit_cast<uint32_t>(f);
}
float float_of(uint32_t b) {
  return std::bit_cast<float>(b);
}

// Same value including the sign of zero; any NaN matches any NaN.
::testing::AssertionResult SameFloat(float actual, float expected) {
  if (std::isnan(expected) && std::isnan(actual)) return ::testing::AssertionSuccess();
  if (bits_of(actual) == bits_of(expected)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "got " << actual << " (0x" << std::hex << bits_of(actual) << "), expected " << expected
         << " (0x" << bits_of(expected) << ")";
}

// ---- Independent reference decoders (double; every code is exactly representable). ----

double ref_decode_e4m3(uint32_t c) {
  const bool neg = c & 0x80;
  const int e = (c >> 3) & 0xF, m = c & 0x7;
  double v;
  if (e == 0xF && m == 0x7) {
    v = std::numeric_limits<double>::quiet_NaN();  // the only NaN; no infinities
  } else if (e == 0) {
    v = m * std::ldexp(1.0, -9);  // subnormal: m/8 * 2^(1-7)
  } else {
    v = (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  }
  return neg ? -v : v;
}

double ref_decode_e5m2(uint32_t c) {
  const bool neg = c & 0x80;
  const int e = (c >> 2) & 0x1F, m = c & 0x3;
  double v;
  if (e == 0x1F) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = m * std::ldexp(1.0, -16);  // m/4 * 2^(1-15)
  } else {
    v = (1.0 + m / 4.0) * std::ldexp(1.0, e - 15);
  }
  return neg ? -v : v;
}

double ref_decode_f16(uint32_t c) {
  const bool neg = c & 0x8000;
  const int e = (c >> 10) & 0x1F, m = c & 0x3FF;
  double v;
  if (e == 0x1F) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = m * std::ldexp(1.0, -24);  // m/1024 * 2^(1-15)
  } else {
    v = (1.0 + m / 1024.0) * std::ldexp(1.0, e - 15);
  }
  return neg ? -v : v;
}

// A format under test: its API entry points plus the facts the reference encoder needs.
struct Format {
  const char* name;
  uint32_t num_codes;
  uint32_t sign_bit;
  uint32_t max_code;       // largest positive finite code
  double max_value;        // its value
  double next_value;       // the value code max_code+1 would have if the binade continued
  uint32_t overflow_code;  // positive non-saturating overflow result (inf, or NaN for E4M3)
  int num_nan_codes;
  double (*ref_decode)(uint32_t);
  float (*decode)(uint32_t);
  uint32_t (*encode)(float, bool);
};

const Format kE4M3{"E4M3",
                   256,
                   0x80,
                   0x7E,
                   448.0,
                   480.0,
                   0x7F,
                   2,
                   ref_decode_e4m3,
                   [](uint32_t c) { return e4m3_to_f32(fp8_e4m3{uint8_t(c)}); },
                   [](float x, bool sat) -> uint32_t { return f32_to_e4m3(x, sat).bits; }};
const Format kE5M2{"E5M2",
                   256,
                   0x80,
                   0x7B,
                   57344.0,
                   65536.0,
                   0x7C,
                   6,
                   ref_decode_e5m2,
                   [](uint32_t c) { return e5m2_to_f32(fp8_e5m2{uint8_t(c)}); },
                   [](float x, bool sat) -> uint32_t { return f32_to_e5m2(x, sat).bits; }};
const Format kF16{"F16",
                  65536,
                  0x8000,
                  0x7BFF,
                  65504.0,
                  65536.0,
                  0x7C00,
                  2046,
                  ref_decode_f16,
                  [](uint32_t c) { return f16_to_f32(f16{uint16_t(c)}); },
                  [](float x, bool sat) -> uint32_t { return f32_to_f16(x, sat).bits; }};

// Reference encoder by search over the positive finite values: nearest value, ties to
// the even code; the virtual code max_code+1 (value next_value) stands for overflow.
uint32_t ref_encode(const Format& f, float x, bool saturate) {
  const uint32_t sign = std::signbit(x) ? f.sign_bit : 0;
  const uint32_t overflow = saturate ? f.max_code : f.overflow_code;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= f.next_value) return sign | overflow;
  auto value = [&](uint32_t c) { return c > f.max_code ? f.next_value : f.ref_decode(c); };
  // Binary search for the first code with value >= a (values increase with the code).
  uint32_t lo = 0, hi = f.max_code + 1;
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (value(mid) < a) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  uint32_t code = lo;
  if (value(code) != a) {
    // Between code-1 and code; their midpoint is exact in double.
    const double midpoint = (value(code - 1) + value(code)) / 2;
    if (a < midpoint || (a == midpoint && (code & 1))) code -= 1;
  }
  return sign | (code > f.max_code ? overflow : code);
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%X", v);
  return buf;
}

class MiniFloat : public ::testing::TestWithParam<const Format*> {};

TEST_P(MiniFloat, DecodesEveryCodeFromItsBitFields) {
  const Format& f = *GetParam();
  int nans = 0;
  for (uint32_t c = 0; c < f.num_codes; ++c) {
    const float expected = static_cast<float>(f.ref_decode(c));
    ASSERT_TRUE(SameFloat(f.decode(c), expected)) << f.name << " code " << hex(c);
    nans += std::isnan(expected);
  }
  EXPECT_EQ(nans, f.num_nan_codes);
  EXPECT_EQ(f.decode(f.max_code), f.max_value);
  EXPECT_EQ(f.decode(f.sign_bit | f.max_code), -f.max_value);
  EXPECT_TRUE(std::signbit(f.decode(f.sign_bit)));  // -0
  EXPECT_EQ(f.decode(f.sign_bit), 0.0f);
}

TEST_P(MiniFloat, EncodeOfDecodeIsIdentity) {
  const Format& f = *GetParam();
  for (uint32_t c = 0; c < f.num_codes; ++c) {
    const float v = f.decode(c);
    if (std::isnan(v)) continue;
    ASSERT_EQ(hex(f.encode(v, false)), hex(c)) << f.name << " value " << v;
    // Saturation only changes infinities (E5M2, F16) into the signed max.
    const uint32_t sat_expected = std::isinf(v) ? (c & f.sign_bit) | f.max_code : c;
    ASSERT_EQ(hex(f.encode(v, true)), hex(sat_expected)) << f.name << " value " << v;
  }
}

TEST_P(MiniFloat, NaNEncodesToNaNKeepingSign) {
  const Format& f = *GetParam();
  const float nans[] = {kNaN, std::numeric_limits<float>::signaling_NaN(), float_of(0x7F800001u),
                        float_of(0x7FFFFFFFu), float_of(0x7FC12345u)};
  for (float n : nans) {
    for (bool sat : {false, true}) {
      for (float x : {n, -n}) {
        const uint32_t c = f.encode(x, sat);
        EXPECT_TRUE(std::isnan(f.ref_decode(c)))
            << f.name << " NaN 0x" << std::hex << bits_of(x) << " -> " << hex(c);
        EXPECT_EQ((c & f.sign_bit) != 0, std::signbit(x)) << f.name << " " << hex(c);
      }
    }
  }
}

// For each pair of adjacent finite codes (and the top code with the overflow value), the
// exact midpoint rounds to the even code and one f32 ulp either side to the nearer code.
TEST_P(MiniFloat, RoundsToNearestEvenAtEveryMidpoint) {
  const Format& f = *GetParam();
  for (uint32_t c = 0; c <= f.max_code; ++c) {
    const double lo = f.ref_decode(c);
    const double hi = c == f.max_code ? f.next_value : f.ref_decode(c + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2) << "midpoint not exact in f32";
    const float below = std::nextafter(mid, 0.0f), above = std::nextafter(mid, kInf);
    const uint32_t even = (c & 1) ? c + 1 : c;
    for (bool sat : {false, true}) {
      const uint32_t overflow = sat ? f.max_code : f.overflow_code;
      auto fix = [&](uint32_t code) { return code > f.max_code ? overflow : code; };
      for (uint32_t sign : {0u, f.sign_bit}) {
        const float s = sign ? -1.0f : 1.0f;
        ASSERT_EQ(hex(f.encode(s * mid, sat)), hex(sign | fix(even)))
            << f.name << " midpoint " << s * mid << " sat=" << sat;
        ASSERT_EQ(hex(f.encode(s * below, sat)), hex(sign | c))
            << f.name << " just below midpoint " << s * below << " sat=" << sat;
        ASSERT_EQ(hex(f.encode(s * above, sat)), hex(sign | fix(c + 1)))
            << f.name << " just above midpoint " << s * above << " sat=" << sat;
      }
    }
  }
}

// Random f32 values spread over the whole exponent range of the format (and beyond, into
// f32 subnormals and overflow) against the search-based reference encoder.
TEST_P(MiniFloat, RandomValuesMatchReferenceEncoder) {
  const Format& f = *GetParam();
  std::mt19937 rng(1234);
  const int min_exp = std::ilogb(f.ref_decode(1)), max_exp = std::ilogb(f.max_value);
  std::uniform_int_distribution<int> exp_dist(min_exp - 3, max_exp + 2);
  std::uniform_int_distribution<uint32_t> man_dist(0, (1u << 23) - 1);
  for (int i = 0; i < 20000; ++i) {
    const int e = i % 64 == 0 ? 0 : exp_dist(rng) + 127;  // biased; 0 gives f32 subnormals
    const uint32_t b = (uint32_t(rng() & 1) << 31) | (uint32_t(e) << 23) | man_dist(rng);
    const float x = float_of(b);
    for (bool sat : {false, true})
      ASSERT_EQ(hex(f.encode(x, sat)), hex(ref_encode(f, x, sat)))
          << f.name << " x=" << x << " (0x" << std::hex << b << ") sat=" << sat;
  }
}

TEST_P(MiniFloat, TinyValuesFlushToSignedZero) {
  const Format& f = *GetParam();
  const double min_sub = f.ref_decode(1);
  for (bool sat : {false, true}) {
    // Exactly half the smallest subnormal is a tie between 0 (even) and 1.
    EXPECT_EQ(f.encode(static_cast<float>(min_sub / 2), sat), 0u) << f.name;
    EXPECT_EQ(f.encode(static_cast<float>(-min_sub / 2), sat), f.sign_bit) << f.name;
    EXPECT_EQ(f.encode(std::nextafter(static_cast<float>(min_sub / 2), kInf), sat), 1u);
    for (float tiny : {static_cast<float>(min_sub / 2.5), 1e-30f, 1e-40f,
                       std::numeric_limits<float>::denorm_min(), 0.0f}) {
      EXPECT_EQ(hex(f.encode(tiny, sat)), hex(0)) << f.name << " " << tiny;
      EXPECT_EQ(hex(f.encode(-tiny, sat)), hex(f.sign_bit)) << f.name << " " << -tiny;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, MiniFloat, ::testing::Values(&kE4M3, &kE5M2, &kF16),
                         [](const auto& param_info) {
                           return std::string(param_info.param->name);
                         });

TEST(Fp8, E4M3KnownValues) {
  EXPECT_EQ(e4m3_to_f32(fp8_e4m3{0x7E}), 448.0f);
  EXPECT_EQ(e4m3_to_f32(fp8_e4m3{0x08}), 0.015625f);             // min normal 2^-6
  EXPECT_EQ(e4m3_to_f32(fp8_e4m3{0x01}), std::ldexp(1.0f, -9));  // min subnormal
  EXPECT_EQ(e4m3_to_f32(fp8_e4m3{0x38}), 1.0f);
  EXPECT_EQ(e4m3_to_f32(fp8_e4m3{0x78}), 256.0f);  // S.1111.000 is a number, not inf
  EXPECT_TRUE(std::isnan(e4m3_to_f32(fp8_e4m3{0x7F})));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(fp8_e4m3{0xFF})));
  // Non-saturating overflow has no infinity to go to: NaN.
  for (float x : {464.1f, 480.0f, 1e6f, kInf, 3e38f}) {
    EXPECT_EQ(hex(f32_to_e4m3(x).bits), "0x7F") << x;
    EXPECT_EQ(hex(f32_to_e4m3(-x).bits), "0xFF") << -x;
    EXPECT_EQ(hex(f32_to_e4m3(x, true).bits), "0x7E") << x;
    EXPECT_EQ(hex(f32_to_e4m3(-x, true).bits), "0xFE") << -x;
  }
  EXPECT_EQ(f32_to_e4m3(464.0f).bits, 0x7E);  // tie: 448 (mantissa 110) is even
  EXPECT_EQ(f32_to_e4m3(449.0f).bits, 0x7E);
  EXPECT_EQ(f32_to_e4m3(kNaN, true).bits, 0x7F);
}

TEST(Fp8, E5M2KnownValues) {
  EXPECT_EQ(e5m2_to_f32(fp8_e5m2{0x7B}), 57344.0f);
  EXPECT_EQ(e5m2_to_f32(fp8_e5m2{0x04}), std::ldexp(1.0f, -14));  // min normal
  EXPECT_EQ(e5m2_to_f32(fp8_e5m2{0x01}), std::ldexp(1.0f, -16));  // min subnormal
  EXPECT_EQ(e5m2_to_f32(fp8_e5m2{0x3C}), 1.0f);
  EXPECT_EQ(e5m2_to_f32(fp8_e5m2{0x7C}), kInf);
  EXPECT_EQ(e5m2_to_f32(fp8_e5m2{0xFC}), -kInf);
  for (uint8_t c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF})
    EXPECT_TRUE(std::isnan(e5m2_to_f32(fp8_e5m2{c}))) << int(c);
  EXPECT_EQ(f32_to_e5m2(61440.0f).bits, 0x7C);  // tie between 57344 (odd) and inf (even)
  EXPECT_EQ(f32_to_e5m2(std::nextafter(61440.0f, 0.0f)).bits, 0x7B);
  for (float x : {61440.0f, 1e6f, kInf}) {
    EXPECT_EQ(hex(f32_to_e5m2(x).bits), "0x7C") << x;
    EXPECT_EQ(hex(f32_to_e5m2(-x).bits), "0xFC") << -x;
    EXPECT_EQ(hex(f32_to_e5m2(x, true).bits), "0x7B") << x;
    EXPECT_EQ(hex(f32_to_e5m2(-x, true).bits), "0xFB") << -x;
  }
  EXPECT_TRUE(std::isnan(e5m2_to_f32(f32_to_e5m2(kNaN, true))));
}

// ---- bf16 ----

// Reference: pick the nearer of the two bf16 neighbours of x (truncation toward zero and
// one bf16 ulp further out), comparing distances in double; ties go to the even one.
uint16_t ref_f32_to_bf16(float x) {
  const uint32_t b = bits_of(x);
  if (std::isnan(x)) return uint16_t((b >> 16) | 0x40);
  if (std::isinf(x)) return uint16_t(b >> 16);
  const uint32_t down = b >> 16, up = down + 1;  // same sign, larger magnitude
  auto magnitude = [](uint32_t h) {
    // The bf16 value of h (sign ignored); the code after max is 2^128 (overflow).
    if (((h >> 7) & 0xFF) == 0xFF) return std::ldexp(1.0, 128);
    return std::fabs(static_cast<double>(float_of(h << 16)));
  };
  const double a = std::fabs(static_cast<double>(x));
  const double d_down = a - magnitude(down), d_up = magnitude(up) - a;
  if (d_up < d_down || (d_up == d_down && (up & 1) == 0)) return uint16_t(up);
  return uint16_t(down);
}

std::vector<float> special_floats() {
  const float fmax = std::numeric_limits<float>::max();
  return {0.0f,
          -0.0f,
          1.0f,
          -1.0f,
          kInf,
          -kInf,
          kNaN,
          -kNaN,
          float_of(0x7F800001u),  // signalling NaN, payload only in the low half
          float_of(0xFF812345u),
          fmax,
          -fmax,
          float_of(0x7F7F7FFFu),  // just below the bf16 overflow tie
          float_of(0x7F7F8000u),  // tie at the top: rounds to inf (even)
          std::numeric_limits<float>::denorm_min(),
          -std::numeric_limits<float>::denorm_min(),
          float_of(0x00018000u),  // subnormal ties
          float_of(0x00028000u),
          float_of(0x807FFFFFu),
          std::numeric_limits<float>::min(),
          float_of(0x3F808000u),  // 1 + half a bf16 ulp: tie, stays 1 (even)
          float_of(0x3F818000u),  // tie, rounds up to even
          65504.0f,
          65520.0f,
          65519.0f,
          1e-8f,
          6e-8f,
          3e-8f};
}

TEST(BF16, ScalarMatchesReferenceOnRandomBitPatterns) {
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i) {
    uint32_t b = rng();
    if (i % 4 == 0) b = (b & 0xFFFF0000u) | 0x8000u;                      // exact ties
    if (i % 4 == 1) b = (b & 0xFFFF0000u) | (0x7FFFu + (rng() & 3) - 1);  // near ties
    const float x = float_of(b);
    ASSERT_EQ(hex(f32_to_bf16(x).bits), hex(ref_f32_to_bf16(x))) << "0x" << std::hex << b;
  }
  for (float x : special_floats())
    EXPECT_EQ(hex(f32_to_bf16(x).bits), hex(ref_f32_to_bf16(x))) << "0x" << std::hex << bits_of(x);
}

TEST(BF16, SpecialValues) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3F80);
  EXPECT_EQ(f32_to_bf16(float_of(0x3F808000u)).bits, 0x3F80);  // tie to even (down)
  EXPECT_EQ(f32_to_bf16(float_of(0x3F818000u)).bits, 0x3F82);  // tie to even (up)
  EXPECT_EQ(f32_to_bf16(float_of(0x3F808001u)).bits, 0x3F81);
  EXPECT_EQ(f32_to_bf16(kInf).bits, 0x7F80);
  EXPECT_EQ(f32_to_bf16(-kInf).bits, 0xFF80);
  EXPECT_EQ(f32_to_bf16(-0.0f).bits, 0x8000);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()).bits, 0x7F80);  // rounds to inf
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::max()).bits, 0xFF80);
  EXPECT_EQ(f32_to_bf16(float_of(0x7F7F7FFFu)).bits, 0x7F7F);
  // Subnormals are kept (no flush to zero).
  EXPECT_EQ(f32_to_bf16(float_of(0x00010000u)).bits, 0x0001);
  EXPECT_EQ(f32_to_bf16(float_of(0x0001C000u)).bits, 0x0002);
  EXPECT_EQ(f32_to_bf16(float_of(0x80008000u)).bits, 0x8000);  // tie to even: -0
  EXPECT_EQ(bf16_to_f32(bf16{0x0001}), float_of(0x00010000u));
  // NaN stays NaN, quiet, sign kept; a payload only in the low half must not become inf.
  for (uint32_t nb : {0x7FC00000u, 0x7F800001u, 0x7FBFFFFFu, 0xFF800001u, 0xFFFFFFFFu}) {
    const bf16 r = f32_to_bf16(float_of(nb));
    EXPECT_TRUE(std::isnan(bf16_to_f32(r))) << std::hex << nb;
    EXPECT_TRUE(r.bits & 0x40) << "not quiet: " << std::hex << r.bits;
    EXPECT_EQ(r.bits >> 15, nb >> 31);
  }
  for (uint32_t h = 0; h < 65536; ++h) {  // decode is exact
    const float v = bf16_to_f32(bf16{uint16_t(h)});
    EXPECT_EQ(bits_of(v), h << 16);
  }
}

TEST(BF16, SaturatingConversion) {
  const float fmax = std::numeric_limits<float>::max();
  EXPECT_EQ(f32_to_bf16_sat(fmax).bits, 0x7F7F);
  EXPECT_EQ(f32_to_bf16_sat(-fmax).bits, 0xFF7F);
  EXPECT_EQ(f32_to_bf16_sat(float_of(0x7F7F8000u)).bits, 0x7F7F);
  EXPECT_EQ(f32_to_bf16_sat(kInf).bits, 0x7F7F);  // header: +-inf clamp too
  EXPECT_EQ(f32_to_bf16_sat(-kInf).bits, 0xFF7F);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16_sat(kNaN))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16_sat(-kNaN))));
  EXPECT_NEAR(bf16_to_f32(bf16{0x7F7F}), 3.3895e38f, 1e34f);
  std::mt19937 rng(7);
  for (int i = 0; i < 10000; ++i) {  // identical to the plain conversion when in range
    const float x = float_of(rng() & 0xBF7FFFFFu);  // exponent field < 0xFF: finite, |x| < 2^65
    EXPECT_EQ(f32_to_bf16_sat(x).bits, f32_to_bf16(x).bits);
  }
}

// Random bit patterns plus the special values, interleaved so they land in SIMD bodies and
// in tails alike.
std::vector<float> mixed_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<float> special = special_floats();
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = (i % 3 == 1) ? special[rng() % special.size()] : float_of(rng());
  return v;
}

const size_t kBulkSizes[] = {0, 1, 7, 15, 16, 17, 31, 33, 1000};

TEST(BF16, BulkMatchesScalar) {
  for (size_t n : kBulkSizes) {
    for (size_t offset : {0, 1}) {  // unaligned pointers too
      std::vector<float> src = mixed_floats(n + offset, uint32_t(n));
      std::vector<bf16> dst(n + offset + 1, bf16{0xABCD});
      convert_f32_to_bf16(src.data() + offset, dst.data() + offset, n);
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(hex(dst[offset + i].bits), hex(f32_to_bf16(src[offset + i]).bits))
            << "n=" << n << " i=" << i << " x=0x" << std::hex << bits_of(src[offset + i]);
      EXPECT_EQ(dst[offset + n].bits, 0xABCD) << "wrote past the end, n=" << n;

      std::vector<float> back(n + offset + 1, 123.0f);
      convert_bf16_to_f32(dst.data() + offset, back.data() + offset, n);
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(bits_of(back[offset + i]), bits_of(bf16_to_f32(dst[offset + i])))
            << "n=" << n << " i=" << i;
      EXPECT_EQ(back[offset + n], 123.0f) << "wrote past the end, n=" << n;
    }
  }
}

// ---- f16 ----

TEST(F16, SaturationAndOverflow) {
  EXPECT_EQ(f32_to_f16(65504.0f).bits, 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.0f).bits, 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f).bits, 0x7C00);  // tie: 65504 is odd, inf even
  EXPECT_EQ(f32_to_f16(-65520.0f).bits, 0xFC00);
  EXPECT_EQ(f32_to_f16(1e6f).bits, 0x7C00);
  EXPECT_EQ(f32_to_f16(kInf).bits, 0x7C00);
  for (float x : {65520.0f, 1e6f, kInf}) {
    EXPECT_EQ(f32_to_f16(x, true).bits, 0x7BFF) << x;
    EXPECT_EQ(f32_to_f16(-x, true).bits, 0xFBFF) << x;
  }
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)).bits, 0x0001);  // min subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie to even: 0
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)).bits, 0x0002);  // tie to even: 2
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(kNaN, true))));
}

TEST(F16, BulkDecodeMatchesScalarForEveryCode) {
  std::vector<f16> codes(65536 + 1);
  for (uint32_t c = 0; c < 65536; ++c) codes[c + 1].bits = uint16_t(c);
  for (size_t offset : {0, 1}) {
    std::vector<float> out(65536);
    convert_f16_to_f32(codes.data() + 1 - offset, out.data(), 65536 - offset);
    for (uint32_t i = 0; i + offset < 65536; ++i) {
      const f16 c = codes[1 - offset + i];
      const float s = f16_to_f32(c);
      ASSERT_TRUE(SameFloat(out[i], s)) << "code " << hex(c.bits);
      if (std::isnan(s)) {
        ASSERT_EQ(std::signbit(out[i]), std::signbit(s));
      }
    }
  }
}

TEST(F16, BulkEncodeMatchesScalar) {
  std::mt19937 rng(99);
  // Magnitudes from below the f16 subnormals to beyond its overflow, plus specials.
  std::uniform_int_distribution<int> exp_dist(127 - 30, 127 + 18);
  const std::vector<float> special = special_floats();
  for (size_t n : kBulkSizes) {
    for (size_t offset : {0, 1}) {
      std::vector<float> src(n + offset);
      for (size_t i = 0; i < src.size(); ++i) {
        src[i] = (i % 4 == 3) ? special[rng() % special.size()]
                              : float_of((rng() & 0x807FFFFFu) | uint32_t(exp_dist(rng)) << 23);
      }
      std::vector<f16> dst(n + offset + 1, f16{0xABCD});
      convert_f32_to_f16(src.data() + offset, dst.data() + offset, n);
      for (size_t i = 0; i < n; ++i) {
        const float x = src[offset + i];
        const f16 got = dst[offset + i], want = f32_to_f16(x);
        if (std::isnan(x)) {
          // Hardware F16C keeps NaN payload bits that the scalar path drops; only
          // NaN-ness and sign are specified.
          EXPECT_TRUE(std::isnan(f16_to_f32(got))) << hex(got.bits);
          EXPECT_EQ(got.bits >> 15, want.bits >> 15);
        } else {
          ASSERT_EQ(hex(got.bits), hex(want.bits))
              << "n=" << n << " i=" << i << " x=" << x << " (0x" << std::hex << bits_of(x) << ")";
          ASSERT_EQ(hex(want.bits), hex(ref_encode(kF16, x, false)));
        }
      }
      EXPECT_EQ(dst[offset + n].bits, 0xABCD) << "wrote past the end, n=" << n;
    }
  }
}

// ---- convert_any / load_as_f32 ----

const float kRepresentative[] = {0.0f,   -0.0f,  1.0f,   -1.0f,    2.5f,   3.5f,   -2.5f,
                                 0.1f,   100.0f, 127.5f, 254.5f,   255.5f, 300.0f, -300.0f,
                                 448.0f, 1e5f,   -1e5f,  1e10f,    -1e10f, kInf,   -kInf,
                                 kNaN,   1e-3f,  -7.0f,  65520.0f, 3e-6f,  42.0f};

// Element i of a buffer of dtype d holding the scalar conversion of x.
void store_scalar(void* buf, DType d, size_t i, float x, bool sat) {
  auto to_int = [](float v, double lo, double hi) {
    if (std::isnan(v)) return 0.0;
    return std::clamp(std::nearbyint(static_cast<double>(v)), lo, hi);
  };
  switch (d) {
    case DType::kF32:
      static_cast<float*>(buf)[i] = x;
      break;
    case DType::kBF16:
      static_cast<bf16*>(buf)[i] = sat ? f32_to_bf16_sat(x) : f32_to_bf16(x);
      break;
    case DType::kF16:
      static_cast<f16*>(buf)[i] = f32_to_f16(x, sat);
      break;
    case DType::kE4M3:
      static_cast<fp8_e4m3*>(buf)[i] = f32_to_e4m3(x, sat);
      break;
    case DType::kE5M2:
      static_cast<fp8_e5m2*>(buf)[i] = f32_to_e5m2(x, sat);
      break;
    case DType::kI8:
      static_cast<int8_t*>(buf)[i] = int8_t(to_int(x, -128, 127));
      break;
    case DType::kU8:
      static_cast<uint8_t*>(buf)[i] = uint8_t(to_int(x, 0, 255));
      break;
    case DType::kI32:
      static_cast<int32_t*>(buf)[i] = int32_t(to_int(x, -2147483648.0, 2147483647.0));
      break;
  }
}

TEST(ConvertAny, EveryPairMatchesScalarConversions) {
  const size_t n = 2 * std::size(kRepresentative) + 3;  // SIMD body plus tail
  for (DType from : kAllDTypes) {
    std::vector<unsigned char> src(n * dtype_size(from));
    for (size_t i = 0; i < n; ++i)
      store_scalar(src.data(), from, i, kRepresentative[i % std::size(kRepresentative)], false);
    for (DType to : kAllDTypes) {
      for (bool sat : {false, true}) {
        std::vector<unsigned char> got(n * dtype_size(to)), want(n * dtype_size(to));
        convert_any(src.data(), from, got.data(), to, n, sat);
        for (size_t i = 0; i < n; ++i) {
          const float v = load_as_f32(src.data(), from, i);
          if (from == to) {
            EXPECT_EQ(std::memcmp(got.data() + i * dtype_size(to), src.data() + i * dtype_size(to),
                                  dtype_size(to)),
                      0);
            continue;
          }
          store_scalar(want.data(), to, i, v, sat);
          const float g = load_as_f32(got.data(), to, i), w = load_as_f32(want.data(), to, i);
          EXPECT_TRUE(SameFloat(g, w)) << dtype_name(from) << " -> " << dtype_name(to)
                                       << " sat=" << sat << " element " << i << " value " << v;
        }
      }
    }
  }
}

template <typename T>
std::vector<T> convert_floats(std::initializer_list<float> xs, DType to, bool sat = false) {
  std::vector<float> src(xs);
  std::vector<T> dst(src.size());
  convert_any(src.data(), DType::kF32, dst.data(), to, src.size(), sat);
  return dst;
}

TEST(ConvertAny, IntegerTargetsRoundToEvenAndClamp) {
  EXPECT_EQ(convert_floats<int8_t>({2.5f, 3.5f, -2.5f, 300.0f, -300.0f, kNaN, kInf, -kInf, 0.49f},
                                   DType::kI8),
            (std::vector<int8_t>{2, 4, -2, 127, -128, 0, 127, -128, 0}));
  EXPECT_EQ(convert_floats<uint8_t>({-1.0f, 254.5f, 255.5f, 1e9f, kNaN, 0.5f, 1.5f}, DType::kU8),
            (std::vector<uint8_t>{0, 254, 255, 255, 0, 0, 2}));
  EXPECT_EQ(convert_floats<int32_t>({2.5f, -3.5f, 1e10f, -1e10f, kNaN, 16777216.0f}, DType::kI32),
            (std::vector<int32_t>{2, -4, 2147483647, -2147483647 - 1, 0, 16777216}));

  const std::vector<int32_t> ints{5,    -5,   127,   128,        -128,
                                  -129, 1000, -1000, 2147483647, -2147483647 - 1};
  std::vector<int8_t> i8(ints.size());
  convert_any(ints.data(), DType::kI32, i8.data(), DType::kI8, ints.size());
  EXPECT_EQ(i8, (std::vector<int8_t>{5, -5, 127, 127, -128, -128, 127, -128, 127, -128}));
  std::vector<uint8_t> u8(ints.size());
  convert_any(ints.data(), DType::kI32, u8.data(), DType::kU8, ints.size());
  EXPECT_EQ(u8, (std::vector<uint8_t>{5, 0, 127, 128, 0, 0, 255, 0, 255, 0}));
  // int32 -> f32 rounds like static_cast (2^24 + 1 is not representable).
  const int32_t big[] = {16777217, -16777219};
  float f[2];
  convert_any(big, DType::kI32, f, DType::kF32, 2);
  EXPECT_EQ(f[0], 16777216.0f);
  EXPECT_EQ(f[1], -16777220.0f);
}

TEST(ConvertAny, FloatTargetsAndSaturation) {
  auto e4 = convert_floats<fp8_e4m3>({1.0f, 1000.0f, -1000.0f, kNaN}, DType::kE4M3);
  EXPECT_EQ(e4[0].bits, 0x38);
  EXPECT_EQ(e4[1].bits, 0x7F);
  EXPECT_EQ(e4[2].bits, 0xFF);
  EXPECT_EQ(e4[3].bits & 0x7F, 0x7F);
  auto e4s = convert_floats<fp8_e4m3>({1000.0f, -kInf}, DType::kE4M3, true);
  EXPECT_EQ(e4s[0].bits, 0x7E);
  EXPECT_EQ(e4s[1].bits, 0xFE);
  auto e5 = convert_floats<fp8_e5m2>({1e6f, -1e6f}, DType::kE5M2);
  EXPECT_EQ(e5[0].bits, 0x7C);
  EXPECT_EQ(e5[1].bits, 0xFC);
  auto h = convert_floats<f16>({65520.0f, 1.0f}, DType::kF16, true);
  EXPECT_EQ(h[0].bits, 0x7BFF);
  EXPECT_EQ(h[1].bits, 0x3C00);
  auto b = convert_floats<bf16>({std::numeric_limits<float>::max(), -kInf}, DType::kBF16, true);
  EXPECT_EQ(b[0].bits, 0x7F7F);
  EXPECT_EQ(b[1].bits, 0xFF7F);
}

TEST(ConvertAny, LargeBuffersCrossBlockBoundaries) {
  // More than the internal 1024-element staging block, with an odd remainder.
  const size_t n = 2500;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-600.0f, 600.0f);
  std::vector<bf16> src(n);
  for (auto& v : src) v = f32_to_bf16(dist(rng));
  std::vector<fp8_e4m3> dst(n);
  convert_any(src.data(), DType::kBF16, dst.data(), DType::kE4M3, n, true);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(dst[i].bits, f32_to_e4m3(bf16_to_f32(src[i]), true).bits) << i;

  std::vector<int32_t> ints(n);
  for (auto& v : ints) v = int32_t(rng() % 1000) - 500;
  std::vector<int8_t> i8(n);
  convert_any(ints.data(), DType::kI32, i8.data(), DType::kI8, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(i8[i], std::clamp(ints[i], -128, 127)) << i;

  std::vector<f16> halves(n);
  for (auto& v : halves) v.bits = uint16_t(rng() & 0x7BFF);  // finite
  std::vector<float> out(n);
  convert_any(halves.data(), DType::kF16, out.data(), DType::kF32, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], f16_to_f32(halves[i])) << i;
}

TEST(LoadAsF32, EveryDType) {
  const float f32v[] = {1.5f, -2.0f};
  const bf16 bf[] = {{0x3F80}, {0xC040}};
  const f16 h[] = {{0x3C00}, {0xC500}};
  const fp8_e4m3 e4[] = {{0x38}, {0xC4}};
  const fp8_e5m2 e5[] = {{0x3C}, {0xC2}};
  const int8_t i8[] = {-5, 127};
  const uint8_t u8[] = {200, 0};
  const int32_t i32[] = {16777217, -7};
  EXPECT_EQ(load_as_f32(f32v, DType::kF32, 1), -2.0f);
  EXPECT_EQ(load_as_f32(bf, DType::kBF16, 0), 1.0f);
  EXPECT_EQ(load_as_f32(bf, DType::kBF16, 1), -3.0f);
  EXPECT_EQ(load_as_f32(h, DType::kF16, 0), 1.0f);
  EXPECT_EQ(load_as_f32(h, DType::kF16, 1), -5.0f);
  EXPECT_EQ(load_as_f32(e4, DType::kE4M3, 0), 1.0f);
  EXPECT_EQ(load_as_f32(e4, DType::kE4M3, 1), -3.0f);  // 1.100 * 2^(8-7)
  EXPECT_EQ(load_as_f32(e5, DType::kE5M2, 0), 1.0f);
  EXPECT_EQ(load_as_f32(e5, DType::kE5M2, 1), -3.0f);  // 1.10 * 2^(16-15)
  EXPECT_EQ(load_as_f32(i8, DType::kI8, 0), -5.0f);
  EXPECT_EQ(load_as_f32(i8, DType::kI8, 1), 127.0f);
  EXPECT_EQ(load_as_f32(u8, DType::kU8, 0), 200.0f);
  EXPECT_EQ(load_as_f32(i32, DType::kI32, 0), 16777216.0f);
  EXPECT_EQ(load_as_f32(i32, DType::kI32, 1), -7.0f);
  EXPECT_THROW(load_as_f32(f32v, static_cast<DType>(99), 0), Error);
}

}  // namespace
}  // namespace hyperion
