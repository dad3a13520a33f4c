#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

constexpr int64_t kSizes[] = {1, 7, 17, 31, 32, 33, 63, 100, 1000};
constexpr DType kInputs[] = {DType::kF32, DType::kBF16};
constexpr DType kOutputs[] = {DType::kI8, DType::kE4M3};

// Raw bytes of n values of f32 `v` stored as `xd`.
std::vector<unsigned char> store_as(const std::vector<float>& v, DType xd) {
  std::vector<unsigned char> out(v.size() * dtype_size(xd));
  if (!v.empty()) convert_any(v.data(), DType::kF32, out.data(), xd, v.size());
  return out;
}

float dequant(const std::vector<unsigned char>& q, DType qd, size_t i, float scale) {
  return load_as_f32(q.data(), qd, i) * scale;
}

void expect_same_as_ref(const std::vector<float>& vals, DType xd, DType qd) {
  const int64_t n = int64_t(vals.size());
  const auto x = store_as(vals, xd);
  std::vector<unsigned char> q(vals.size()), qp(vals.size()), qr(vals.size());
  const float s = quantize_row(x.data(), xd, n, q.data(), qd);
  const float sp = detail::quantize_row_portable(x.data(), xd, n, qp.data(), qd);
  const float sr = ref::quantize_row(x.data(), xd, n, qr.data(), qd);
  if (std::isnan(sr)) {
    EXPECT_TRUE(std::isnan(s));
    EXPECT_TRUE(std::isnan(sp));
  } else {
    EXPECT_EQ(std::bit_cast<uint32_t>(s), std::bit_cast<uint32_t>(sr));
    EXPECT_EQ(std::bit_cast<uint32_t>(sp), std::bit_cast<uint32_t>(sr));
  }
  EXPECT_EQ(q, qr);
  EXPECT_EQ(qp, qr);
}

TEST(Quantize, MatchesReferenceOnOddSizes) {
  std::mt19937 rng(1);
  for (DType xd : kInputs)
    for (DType qd : kOutputs)
      for (int64_t n : kSizes) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(xd) << "->" << dtype_name(qd) << " n=" << n);
        // Spread of magnitudes so rows exercise subnormal e4m3 codes and exact ties too.
        std::vector<float> v = randn(size_t(n), rng, 3.0f);
        if (n > 4) v[3] = 0.0f, v[4] = -0.0f;
        expect_same_as_ref(v, xd, qd);
        // Values that are exact multiples of half a step: ties round to even.
        std::vector<float> ties(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) ties[size_t(i)] = float(int(i % 255) - 127) * 0.5f;
        ties[0] = 63.5f;
        expect_same_as_ref(ties, xd, qd);
      }
}

TEST(Quantize, RoundTripErrorBound) {
  std::mt19937 rng(2);
  for (DType xd : kInputs)
    for (int64_t n : kSizes) {
      const std::vector<float> v = randn(size_t(n), rng, 0.7f);
      const auto x = store_as(v, xd);
      for (DType qd : kOutputs) {
        std::vector<unsigned char> q(size_t(n), 0);
        const float s = quantize_row(x.data(), xd, n, q.data(), qd);
        ASSERT_GT(s, 0.0f);
        for (int64_t i = 0; i < n; ++i) {
          const float xi = load_as_f32(x.data(), xd, size_t(i));
          const float err = std::fabs(xi - dequant(q, qd, size_t(i), s));
          if (qd == DType::kI8) {
            EXPECT_LE(err, s * 0.5f * (1 + 1e-5f)) << "n=" << n << " i=" << i;
          } else {
            // 3 mantissa bits: half an ulp is |y| / 16 for normal y = x / scale >= 2^-6,
            // and 2^-10 for subnormal codes.
            const float bound = std::max(std::fabs(xi) / 16.0f, s * 0x1p-10f) * (1 + 1e-5f);
            EXPECT_LE(err, bound) << "n=" << n << " i=" << i;
          }
        }
      }
    }
}

TEST(Quantize, HandExample) {
  // max|x| = 2.54: scale = 2.54 / 127 = 0.02, -1 / 0.02 = -50, 0.3 / 0.02 = 15.
  const std::vector<float> v = {2.54f, -1.0f, 0.0f, 0.3f, -2.54f};
  const auto x = store_as(v, DType::kF32);
  std::vector<int8_t> q(v.size());
  const float s = quantize_row(x.data(), DType::kF32, int64_t(v.size()), q.data(), DType::kI8);
  EXPECT_EQ(s, 2.54f / 127.0f);
  EXPECT_NEAR(s, 0.02f, 1e-8f);
  EXPECT_EQ(q, (std::vector<int8_t>{127, -50, 0, 15, -127}));

  // Scale exactly 1: halves are exact ties and round to even.
  const std::vector<float> w = {127.0f, 2.5f, -3.5f, 0.5f, -1.5f};
  const auto xw = store_as(w, DType::kBF16);
  std::vector<int8_t> qw(w.size());
  EXPECT_EQ(quantize_row(xw.data(), DType::kBF16, 5, qw.data(), DType::kI8), 1.0f);
  EXPECT_EQ(qw, (std::vector<int8_t>{127, 2, -4, 0, -2}));

  // E4M3: max 448 * 4 -> scale 4; 1792 / 4 = 448 (code 0x7E), 40 / 4 = 10 (1.25 * 8: code
  // exponent 10, mantissa 2 -> 0x52), -0.5 / 4 = -0.125 (2^-3: exponent 4 -> 0xA0).
  const std::vector<float> e = {1792.0f, 40.0f, -0.5f};
  const auto xe = store_as(e, DType::kF32);
  std::vector<uint8_t> qe(e.size());
  EXPECT_EQ(quantize_row(xe.data(), DType::kF32, 3, qe.data(), DType::kE4M3), 4.0f);
  EXPECT_EQ(qe, (std::vector<uint8_t>{0x7E, 0x52, 0xA0}));
}

TEST(Quantize, ZeroAndNonFiniteRows) {
  for (DType xd : kInputs)
    for (DType qd : kOutputs)
      for (int64_t n : {int64_t(0), int64_t(1), int64_t(17), int64_t(100)}) {
        std::vector<float> zeros(size_t(n), 0.0f);
        if (n > 1) zeros[1] = -0.0f;
        const auto x = store_as(zeros, xd);
        std::vector<unsigned char> q(size_t(n), 0xAB);
        EXPECT_EQ(quantize_row(x.data(), xd, n, q.data(), qd), 0.0f);
        for (unsigned char c : q) EXPECT_EQ(c, 0);
        expect_same_as_ref(zeros, xd, qd);
        if (n == 0) continue;
        // Tiny rows whose scale underflows are zero rows too (f32 only: bf16 keeps them).
        std::vector<float> tiny(size_t(n), 0.0f);
        tiny[0] = std::numeric_limits<float>::denorm_min();
        expect_same_as_ref(tiny, xd, qd);
        // inf gives an inf scale, NaN a NaN scale; q is zero either way.
        for (float bad :
             {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
          std::vector<float> v(size_t(n), 1.0f);
          v[size_t(n) / 2] = bad;
          const auto xb = store_as(v, xd);
          std::vector<unsigned char> qb(size_t(n), 0xAB);
          const float s = quantize_row(xb.data(), xd, n, qb.data(), qd);
          EXPECT_FALSE(std::isfinite(s));
          EXPECT_EQ(std::isnan(s), std::isnan(bad));
          for (unsigned char c : qb) EXPECT_EQ(c, 0);
          expect_same_as_ref(v, xd, qd);
        }
      }
}

TEST(Quantize, RowsAndDequantize) {
  std::mt19937 rng(3);
  for (DType xd : kInputs)
    for (DType qd : kOutputs)
      for (auto [rows, cols] :
           {std::pair<int64_t, int64_t>{1, 1}, {5, 7}, {3, 63}, {300, 129}, {64, 1000}}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(xd) << "->" << dtype_name(qd) << " " << rows << "x" << cols);
        Tensor x = random_tensor(xd, {rows, cols}, rng, 2.0f);
        if (rows > 2)
          std::memset(x.as<unsigned char>() + 2 * cols * dtype_size(xd), 0,
                      size_t(cols) * dtype_size(xd));  // one zero row
        Tensor q(qd, {rows, cols});
        std::vector<float> scales(static_cast<size_t>(rows));
        quantize_rows(x, q, scales.data());
        std::vector<unsigned char> qr(static_cast<size_t>(cols));
        for (int64_t r = 0; r < rows; ++r) {
          const void* xr = x.as<unsigned char>() + r * cols * dtype_size(xd);
          EXPECT_EQ(scales[size_t(r)], ref::quantize_row(xr, xd, cols, qr.data(), qd));
          ASSERT_EQ(std::memcmp(qr.data(), q.as<unsigned char>() + r * cols, size_t(cols)), 0)
              << "row " << r;
        }
        for (DType od : kInputs) {
          Tensor out(od, {rows, cols});
          dequantize_rows(q, scales.data(), out);
          for (int64_t i = 0; i < rows * cols; ++i) {
            const float expect = load_as_f32(q.data(), qd, size_t(i)) * scales[size_t(i / cols)];
            const float want = od == DType::kF32 ? expect : bf16_to_f32(f32_to_bf16(expect));
            ASSERT_EQ(at(out, i), want) << i;
          }
        }
      }
}

TEST(Quantize, DeterministicAcrossThreads) {
  RestoreNumThreads restore;
  std::mt19937 rng(4);
  Tensor x = random_tensor(DType::kF32, {200, 300}, rng);
  Tensor q1(DType::kI8, {200, 300}), q2(DType::kI8, {200, 300});
  std::vector<float> s1(200), s2(200);
  set_num_threads(1);
  quantize_rows(x, q1, s1.data());
  set_num_threads(2);
  quantize_rows(x, q2, s2.data());
  EXPECT_TRUE(bitwise_equal(q1, q2));
  EXPECT_EQ(s1, s2);
}

TEST(Quantize, Int8RowSums) {
  // By hand, with the extremes: 127 - 128 + 0 + 5 = 4; -128 * 3 = -384.
  std::vector<int8_t> q = {127, -128, 0, 5, -128, -128, -128, 0};
  std::vector<int32_t> sums(2, 99);
  int8_row_sums(TensorView(q.data(), DType::kI8, {2, 4}), sums.data());
  EXPECT_EQ(sums, (std::vector<int32_t>{4, -384}));
  // Many rows of an odd width (the parallel split), against a plain sum.
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> u(-128, 127);
  const int64_t rows = 301, cols = 4099;
  std::vector<int8_t> big(static_cast<size_t>(rows * cols));
  for (auto& v : big) v = int8_t(u(rng));
  std::vector<int32_t> got(static_cast<size_t>(rows));
  int8_row_sums(TensorView(big.data(), DType::kI8, {rows, cols}), got.data());
  for (int64_t r = 0; r < rows; ++r) {
    int64_t want = 0;
    for (int64_t c = 0; c < cols; ++c) want += big[size_t(r * cols + c)];
    ASSERT_EQ(got[size_t(r)], want) << "row " << r;
  }
  std::vector<float> f(4);
  EXPECT_THROW(int8_row_sums(TensorView(f.data(), DType::kF32, {1, 4}), sums.data()), Error);
}

TEST(Quantize, ErrorPaths) {
  float x[4] = {1, 2, 3, 4};
  int8_t q[4];
  float s[4];
  EXPECT_NE(
      error_message([&] { quantize_row(x, DType::kI8, 4, q, DType::kI8); }).find("quantize_row"),
      std::string::npos);
  EXPECT_NE(
      error_message([&] { quantize_row(x, DType::kF32, 4, q, DType::kBF16); }).find("quantize_row"),
      std::string::npos);
  EXPECT_THROW(quantize_row(x, DType::kF32, -1, q, DType::kI8), Error);
  EXPECT_THROW(ref::quantize_row(x, DType::kF16, 4, q, DType::kI8), Error);
  EXPECT_THROW(detail::quantize_row_portable(x, DType::kF32, 4, q, DType::kU8), Error);
  EXPECT_THROW(quantize_qmax(DType::kF32), Error);

  Tensor xf(DType::kF32, {2, 2}), qi(DType::kI8, {2, 2}), qbad(DType::kI8, {2, 3});
  Tensor qf(DType::kF32, {2, 2}), x1(DType::kF32, {4}), xi(DType::kI32, {2, 2});
  EXPECT_NE(error_message([&] { quantize_rows(xf, qbad, s); }).find("quantize_rows"),
            std::string::npos);
  EXPECT_NE(error_message([&] { quantize_rows(xf, qf, s); }).find("quantize_rows"),
            std::string::npos);
  EXPECT_THROW(quantize_rows(x1, qi, s), Error);
  EXPECT_THROW(quantize_rows(xi, qi, s), Error);
  EXPECT_THROW(quantize_rows(xf, qi, nullptr), Error);
  TensorView strided(xf.data(), DType::kF32, {2, 2}, {1, 2});
  EXPECT_THROW(quantize_rows(strided, qi, s), Error);

  EXPECT_NE(error_message([&] { dequantize_rows(qf, s, xf); }).find("dequantize_rows"),
            std::string::npos);
  EXPECT_THROW(dequantize_rows(qi, s, xi), Error);
  EXPECT_THROW(dequantize_rows(qbad, s, xf), Error);
  EXPECT_THROW(dequantize_rows(qi, nullptr, xf), Error);
}

}  // namespace
}  // namespace hyperion
