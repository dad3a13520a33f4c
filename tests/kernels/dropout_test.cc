// Dropout's keyed mask (kernels/dropout.h): every Highway target equals the scalar
// reference bit for bit in every dtype pair, forward and accumulating, across the
// parallel chunks' boundaries; the kept fraction and the mean are right; one key gives
// one mask, another key an independent one; D is its own adjoint; bad calls are refused.
#include "kernels/dropout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <string>
#include <random>
#include <vector>

#include "base/error.h"
#include "kernel_test_util.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(Dropout, EveryTargetEqualsTheReferenceBitForBit) {
  std::mt19937 rng(5);
  for_each_target([&] {
    for (DType xd : {DType::kF32, DType::kBF16})
      for (DType yd : {DType::kF32, DType::kBF16})
        for (int64_t n : {1, 7, 16, 33, 1000, 40001})
          for (float p : {0.0f, 0.1f, 0.5f, 0.9f})
            for (bool acc : {false, true}) {
              SCOPED_TRACE(testing::Message() << dtype_name(xd) << "->" << dtype_name(yd) << " n " << n << " p "
                                              << p << " acc " << acc);
              const Tensor x = make_tensor(xd, {n}, randn(size_t(n), rng, 2.0f));
              const auto y0 = randn(size_t(n), rng, 1.0f);
              Tensor got = make_tensor(yd, {n}, y0), want = make_tensor(yd, {n}, y0);
              dropout_apply(x, got, p, 0x1234abcd5678ULL, acc);
              ref::dropout_apply(x, want, p, 0x1234abcd5678ULL, acc);
              ASSERT_TRUE(bitwise_equal(got, want));
            }
  });
}

TEST(Dropout, KeepsOneMinusPAndPreservesTheMean) {
  const int64_t n = 1 << 20;
  const Tensor ones = make_tensor(DType::kF32, {n}, std::vector<float>(size_t(n), 1.0f));
  for (float p : {0.05f, 0.1f, 0.5f, 0.9f}) {
    Tensor y(DType::kF32, {n});
    dropout_apply(ones, y, p, 77, false);
    int64_t kept = 0;
    double sum = 0;
    for (float v : values(y)) {
      kept += v != 0.0f;
      sum += v;
      if (v != 0.0f) {
        ASSERT_FLOAT_EQ(v, 1.0f / (1.0f - p));
      }
    }
    // Binomial: 6 standard deviations.
    const double want = (1.0 - p) * double(n), sd = std::sqrt(double(n) * p * (1.0 - p));
    EXPECT_NEAR(double(kept), want, 6 * sd) << p;
    EXPECT_NEAR(sum / double(n), 1.0, 6 * sd / want) << p;
  }
  // p = 0: the identity.
  Tensor y(DType::kF32, {n});
  dropout_apply(ones, y, 0.0f, 77, false);
  EXPECT_TRUE(bitwise_equal(y, ones));
}

TEST(Dropout, OneKeyOneMaskAndOtherKeysIndependent) {
  const int64_t n = 1 << 18;
  const float p = 0.5f;
  const Tensor ones = make_tensor(DType::kF32, {n}, std::vector<float>(size_t(n), 1.0f));
  auto mask = [&](uint64_t key) {
    Tensor y(DType::kF32, {n});
    dropout_apply(ones, y, p, key, false);
    std::vector<bool> m;
    for (float v : values(y)) m.push_back(v != 0.0f);
    return m;
  };
  const auto a = mask(dropout_key(9, 3));
  EXPECT_EQ(mask(dropout_key(9, 3)), a);
  // Keys that differ in one bit of the base or the salt, and neighbouring elements: each
  // pair agrees on about half the elements (independent masks at p = 0.5).
  const double sd = 0.5 * std::sqrt(double(n));
  for (uint64_t other : {dropout_key(9, 4), dropout_key(8, 3), dropout_key(9 | (1ULL << 40), 3), uint64_t{0}}) {
    const auto b = mask(other);
    int64_t same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
    EXPECT_NEAR(double(same), 0.5 * double(n), 6 * sd) << other;
  }
  int64_t same_next = 0;
  for (size_t i = 0; i + 1 < a.size(); ++i) same_next += a[i] == a[i + 1];
  EXPECT_NEAR(double(same_next), 0.5 * double(n), 6 * sd);
}

// <D(x), y> = <x, D(y)>: the backward of y = D(x) is D with the same key; accumulating adds.
TEST(Dropout, IsItsOwnAdjointAndAccumulates) {
  std::mt19937 rng(6);
  const int64_t n = 5000;
  const Tensor x = make_tensor(DType::kF32, {n}, randn(size_t(n), rng, 1.0f));
  const Tensor y = make_tensor(DType::kF32, {n}, randn(size_t(n), rng, 1.0f));
  Tensor dx(DType::kF32, {n}), dy(DType::kF32, {n});
  dropout_apply(x, dx, 0.3f, 11, false);
  dropout_apply(y, dy, 0.3f, 11, false);
  double l = 0, r = 0, mag = 0;
  const auto vx = values(x), vy = values(y), vdx = values(dx), vdy = values(dy);
  for (size_t i = 0; i < vx.size(); ++i) {
    l += double(vdx[i]) * vy[i];
    r += double(vx[i]) * vdy[i];
    mag += std::fabs(double(vdx[i]) * vy[i]);
  }
  EXPECT_NEAR(l, r, 1e-7 * mag);  // the f32 scaling rounds each term once
  Tensor acc = make_tensor(DType::kF32, {n}, vy);
  dropout_apply(x, acc, 0.3f, 11, true);
  const auto va = values(acc);
  for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(va[i], vy[i] + vdx[i]) << i;
  // In place, one dtype: as into another buffer.
  Tensor inplace = make_tensor(DType::kF32, {n}, vx);
  dropout_apply(inplace, inplace, 0.3f, 11, false);
  EXPECT_TRUE(bitwise_equal(inplace, dx));
}

TEST(Dropout, BadCallsAreRefusedNamingTheProblem) {
  Tensor x(DType::kF32, {8}), y(DType::kF32, {8}), z(DType::kF32, {9}), i8(DType::kI8, {8});
  expect_error([&] { dropout_apply(x, y, 1.0f, 1, false); }, {"dropout_apply", "p must be in [0, 1)"});
  expect_error([&] { dropout_apply(x, y, -0.1f, 1, false); }, {"p must be in [0, 1)"});
  expect_error([&] { dropout_apply(x, z, 0.1f, 1, false); }, {"as many elements"});
  expect_error([&] { dropout_apply(i8, y, 0.1f, 1, false); }, {"f32 or bf16"});
  expect_error([&] { dropout_apply(x, x, 0.1f, 1, true); }, {"alias"});
  expect_error([&] { ref::dropout_apply(x, y, std::nanf(""), 1, false); }, {"ref::dropout_apply", "p"});
}

}  // namespace
}  // namespace hyperion
