#include "kernels/quantize_train.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

std::vector<unsigned char> store_as(const std::vector<float>& v, DType xd) {
  std::vector<unsigned char> out(v.size() * dtype_size(xd));
  convert_any(v.data(), DType::kF32, out.data(), xd, v.size());
  return out;
}

std::vector<float> random_values(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

void expect_bits_eq(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i])) << "at " << i;
}

TEST(QuantizeTrain, ColumnsMatchReferenceAndRoundTrip) {
  for (DType xd : {DType::kF32, DType::kBF16}) {
    const int64_t rows = 37, cols = 45;
    std::vector<float> v = random_values(size_t(rows * cols), 1);
    for (int64_t r = 0; r < rows; ++r) v[size_t(r * cols + 3)] = 0.0f;  // an all-zero column
    v[size_t(5 * cols + 7)] = std::numeric_limits<float>::quiet_NaN();  // a NaN column
    const auto x = store_as(v, xd);
    const TensorView xv(const_cast<unsigned char*>(x.data()), xd, {rows, cols});
    std::vector<int8_t> q(static_cast<size_t>(rows * cols)), qr(q.size());
    std::vector<float> s(static_cast<size_t>(cols)), sr(s.size());
    quantize_cols_int8(xv, TensorView(q.data(), DType::kI8, {rows, cols}), s.data());
    ref::quantize_cols_int8(xv, TensorView(qr.data(), DType::kI8, {rows, cols}), sr.data());
    EXPECT_EQ(q, qr);
    for (int64_t c = 0; c < cols; ++c) {
      if (c == 7) {
        EXPECT_TRUE(std::isnan(s[size_t(c)]));
        continue;
      }
      EXPECT_EQ(s[size_t(c)], sr[size_t(c)]);
      for (int64_t r = 0; r < rows; ++r) {
        const float x0 = load_as_f32(x.data(), xd, size_t(r * cols + c));
        EXPECT_LE(std::fabs(x0 - q[size_t(r * cols + c)] * s[size_t(c)]),
                  s[size_t(c)] * 0.5001f + 1e-30f);
      }
    }
    EXPECT_EQ(s[3], 0.0f);
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(q[size_t(r * cols + 7)], 0);
  }
}

TEST(QuantizeTrain, GradientMatchesReferenceAtAnyThreadCount) {
  const int saved_threads = num_threads();
  for (DType xd : {DType::kF32, DType::kBF16}) {
    const int64_t rows = 29, cols = 67;
    const auto x = store_as(random_values(size_t(rows * cols), 2), xd);
    const std::vector<float> factor = random_values(size_t(rows), 3, 0.1f);
    const TensorView dy(const_cast<unsigned char*>(x.data()), xd, {rows, cols});
    auto run = [&](bool reference, int threads) {
      set_num_threads(threads);
      std::vector<int8_t> qr(static_cast<size_t>(rows * cols)), qc(qr.size());
      std::vector<float> sr(static_cast<size_t>(rows)), sc(static_cast<size_t>(cols));
      const GradQuantized out{qr.data(), sr.data(), qc.data(), sc.data()};
      if (reference)
        ref::quantize_grad_int8(dy, factor.data(), 1234, out);
      else
        quantize_grad_int8(dy, factor.data(), 1234, out);
      std::vector<float> all(sr);
      all.insert(all.end(), sc.begin(), sc.end());
      for (int8_t v : qr) all.push_back(float(v));
      for (int8_t v : qc) all.push_back(float(v));
      return all;
    };
    const auto ref_out = run(true, 1);
    expect_bits_eq(run(false, 1), ref_out);
    expect_bits_eq(run(false, 2), ref_out);
  }
  set_num_threads(saved_threads);
}

// The transposed column output (the AMX weight gradient's operand) holds the same values.
TEST(QuantizeTrain, TransposedColumnsEqualTheTranspose) {
  const int saved_threads = num_threads();
  const int64_t rows = 192, cols = 53;
  const auto x = store_as(random_values(size_t(rows * cols), 8), DType::kBF16);
  const std::vector<float> factor = random_values(size_t(rows), 9, 0.1f);
  const TensorView dy(const_cast<unsigned char*>(x.data()), DType::kBF16, {rows, cols});
  std::vector<int8_t> qc(size_t(rows * cols)), qr(qc.size());
  std::vector<float> sc(static_cast<size_t>(cols)), sr(static_cast<size_t>(rows));
  quantize_grad_int8(dy, factor.data(), 77, {qr.data(), sr.data(), qc.data(), sc.data()});
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<int8_t> qt(qc.size()), qr2(qc.size());
    std::vector<float> sc2(sc.size()), sr2(sr.size());
    GradQuantized out{qr2.data(), sr2.data(), qt.data(), sc2.data()};
    out.cols_transposed = true;
    quantize_grad_int8(dy, factor.data(), 77, out);
    EXPECT_EQ(qr2, qr);
    EXPECT_EQ(sc2, sc);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(qt[size_t(c * rows + r)], qc[size_t(r * cols + c)]) << r << "," << c;
  }
  set_num_threads(saved_threads);
}

// Stochastic rounding is unbiased: the mean of many draws of one value is within 3 sigma
// of the value, for several fractional parts; and a different seed changes the draws.
TEST(QuantizeTrain, StochasticRoundingIsUnbiased) {
  const int64_t n = 200000;
  for (float target : {37.3f, -5.75f, 0.02f, 126.5f}) {
    std::vector<float> v(size_t(n), target);
    v[0] = 127.0f;  // scale 1: the draws round `target` itself
    std::vector<int8_t> q(static_cast<size_t>(n));
    float s = 0;
    quantize_grad_int8(TensorView(v.data(), DType::kF32, {1, n}), nullptr, 99,
                       {q.data(), &s, nullptr, nullptr});
    ASSERT_EQ(s, 1.0f);
    double sum = 0;
    for (int64_t i = 1; i < n; ++i) {
      EXPECT_TRUE(q[size_t(i)] == std::floor(target) || q[size_t(i)] == std::ceil(target));
      sum += q[size_t(i)];
    }
    const double mean = sum / double(n - 1);
    const double p = target - std::floor(target);
    const double sigma = std::sqrt(p * (1 - p) / double(n - 1));
    EXPECT_NEAR(mean, target, 3 * sigma + 1e-12) << target;
  }
  // The column form is unbiased too, and seeds give independent draws.
  std::vector<float> col(1000, 0.5f);
  col[0] = 127.0f;
  std::vector<int8_t> a(1000), b(1000);
  float sa, sb;
  quantize_grad_int8(TensorView(col.data(), DType::kF32, {1000, 1}), nullptr, 1,
                     {nullptr, nullptr, a.data(), &sa});
  quantize_grad_int8(TensorView(col.data(), DType::kF32, {1000, 1}), nullptr, 2,
                     {nullptr, nullptr, b.data(), &sb});
  EXPECT_NE(a, b);
  double mean = 0;
  for (size_t i = 1; i < a.size(); ++i) mean += a[i];
  mean /= 999.0;
  EXPECT_NEAR(mean, 0.5, 3 * std::sqrt(0.25 / 999.0));
}

TEST(QuantizeTrain, GradientSaturatesAndZeroRows) {
  std::vector<float> v = {0, 0, 0, 0, 1e-3f, -2.0f, 1.0f, 0.5f};
  std::vector<int8_t> q(8);
  std::vector<float> s(2);
  quantize_grad_int8(TensorView(v.data(), DType::kF32, {2, 4}), nullptr, 5,
                     {q.data(), s.data(), nullptr, nullptr});
  EXPECT_EQ(s[0], 0.0f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q[size_t(i)], 0);
  EXPECT_EQ(s[1], 2.0f / 127.0f);
  EXPECT_EQ(q[5], -127);  // the absmax element lands on the end of the grid exactly
  for (int i = 4; i < 8; ++i) EXPECT_LE(std::fabs(v[size_t(i)] - q[size_t(i)] * s[1]), s[1]);
}

TEST(QuantizeTrain, Fp8MatchesExactEncoder) {
  for (DType fd : {DType::kE4M3, DType::kE5M2}) {
    for (DType xd : {DType::kF32, DType::kBF16}) {
      const float fmax = fp8_max(fd);
      std::vector<float> v = random_values(9000, 4, fmax / 8);
      // Saturation, subnormals, the rounding midpoints near the min normal, signed zero.
      const std::vector<float> edge = {fmax * 1.5f, -fmax * 4,    fmax,    0.0f,    -0.0f,
                                       1e-9f,       -3e-6f,       0.0155f, 0.0157f, 6.1e-5f,
                                       1.52e-5f,    0.001953125f, -1e30f};
      v.insert(v.end(), edge.begin(), edge.end());
      for (int i = 0; i < 2000; ++i) v.push_back(v[size_t(i)] * 1e-4f);
      const auto x = store_as(v, xd);
      const int64_t n = int64_t(v.size());
      const float scale = 0.5f;
      std::vector<uint8_t> b(static_cast<size_t>(n)), br(static_cast<size_t>(n));
      std::vector<bf16> val(static_cast<size_t>(n)), valr(static_cast<size_t>(n)),
          dec(static_cast<size_t>(n));
      const float amax = quantize_fp8(x.data(), xd, n, scale, fd, b.data(), val.data());
      const float amaxr = ref::quantize_fp8(x.data(), xd, n, scale, fd, br.data(), valr.data());
      EXPECT_EQ(amax, amaxr);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(b[size_t(i)], br[size_t(i)]) << dtype_name(fd) << " value " << v[size_t(i)];
        ASSERT_EQ(val[size_t(i)].bits, valr[size_t(i)].bits) << v[size_t(i)];
      }
      dequantize_fp8_values(b.data(), fd, n, dec.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dec[size_t(i)].bits, val[size_t(i)].bits);
      // Round trip: relative error within half an fp8 ulp for normal values.
      const float rel = fd == DType::kE4M3 ? 1.0f / 16 : 1.0f / 8;
      for (int64_t i = 0; i < 9000; ++i) {
        const float xi = load_as_f32(x.data(), xd, size_t(i));
        if (std::fabs(xi / scale) > fmax || std::fabs(xi / scale) < 0.02f) continue;
        EXPECT_LE(std::fabs(bf16_to_f32(val[size_t(i)]) * scale - xi), std::fabs(xi) * rel);
      }
    }
  }
}

TEST(QuantizeTrain, Fp8DecodeEveryCode) {
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[size_t(i)] = uint8_t(i);
  for (DType fd : {DType::kE4M3, DType::kE5M2}) {
    std::vector<bf16> v(256);
    dequantize_fp8_values(codes.data(), fd, 256, v.data());
    for (int i = 0; i < 256; ++i) {
      const float want = fd == DType::kE4M3 ? e4m3_to_f32(fp8_e4m3{uint8_t(i)})
                                            : e5m2_to_f32(fp8_e5m2{uint8_t(i)});
      const float got = bf16_to_f32(v[size_t(i)]);
      if (std::isnan(want) || std::isinf(want)) {
        EXPECT_TRUE(std::isnan(got)) << i;  // NaN codes, and e5m2's inf (never written)
      } else {
        EXPECT_EQ(got, want) << dtype_name(fd) << " code " << i;
      }
    }
  }
}

TEST(QuantizeTrain, Fp8ThreadsAndBadScale) {
  const std::vector<float> v = random_values(50000, 6);
  std::vector<uint8_t> b1(v.size()), b2(v.size());
  const int saved_threads = num_threads();
  set_num_threads(1);
  const float a1 = quantize_fp8(v.data(), DType::kF32, int64_t(v.size()), 0.01f, DType::kE4M3,
                                b1.data(), nullptr);
  set_num_threads(2);
  const float a2 = quantize_fp8(v.data(), DType::kF32, int64_t(v.size()), 0.01f, DType::kE4M3,
                                b2.data(), nullptr);
  set_num_threads(saved_threads);
  EXPECT_EQ(a1, a2);
  EXPECT_EQ(b1, b2);
  EXPECT_EQ(a1, absmax(v.data(), DType::kF32, int64_t(v.size())));
  EXPECT_THROW(quantize_fp8(v.data(), DType::kF32, 4, 0.0f, DType::kE4M3, b1.data(), nullptr),
               Error);
  EXPECT_THROW(quantize_fp8(v.data(), DType::kF32, 4, 1.0f, DType::kI8, b1.data(), nullptr), Error);
}

}  // namespace
}  // namespace hyperion
