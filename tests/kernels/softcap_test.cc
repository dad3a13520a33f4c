#include "kernels/softcap.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "base/error.h"
#include "kernel_test_util.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

// Every Highway target against the double reference, f32 and bf16, with tails.
TEST(Softcap, ForwardMatchesReference) {
  std::mt19937 rng(3);
  for_each_target([&] {
    for (DType dt : {DType::kF32, DType::kBF16})
      for (int64_t n : {1, 7, 16, 33, 1000}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " n " << n);
        auto v = randn(size_t(n), rng, 40.0f);
        Tensor got = make_tensor(dt, {n}, v), want = make_tensor(dt, {n}, v);
        softcap_forward(got, 30.0f);
        ref::softcap_forward(want, 30.0f);
        auto g = values(got), w = values(want);
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_LT(std::fabs(g[size_t(i)]), 30.0f + 1e-3f);
          EXPECT_NEAR(g[size_t(i)], w[size_t(i)],
                      dt == DType::kF32 ? 1e-5 : std::fabs(w[size_t(i)]) / 128)
              << i;
        }
      }
  });
}

// The tiles' form: post * tanh(pre * x) and 1 - tanh^2, against double and the derivative
// of the forward by central differences; NaN lanes give dtanh 0.
TEST(Softcap, ScaledAndDerivative) {
  std::mt19937 rng(4);
  for_each_target([&] {
    const int64_t n = 37;
    auto x = randn(size_t(n), rng, 3.0f);
    x[5] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> got = x, want = x;
    std::vector<float> dg(static_cast<size_t>(n)), dw(static_cast<size_t>(n));
    softcap_scaled(got.data(), n, 0.4f, 2.5f, dg.data());
    ref::softcap_scaled(want.data(), n, 0.4f, 2.5f, dw.data());
    for (int64_t i = 0; i < n; ++i) {
      if (i == 5) {
        EXPECT_TRUE(std::isnan(got[size_t(i)]));
        EXPECT_EQ(dg[size_t(i)], 0.0f);
        continue;
      }
      EXPECT_NEAR(got[size_t(i)], want[size_t(i)], 1e-5) << i;
      EXPECT_NEAR(dg[size_t(i)], dw[size_t(i)], 1e-5) << i;
      const double h = 1e-4, xi = x[size_t(i)];
      const double fd = (2.5 * std::tanh(0.4 * (xi + h)) - 2.5 * std::tanh(0.4 * (xi - h))) / (2 * h);
      EXPECT_NEAR(2.5 * 0.4 * dg[size_t(i)], fd, 1e-4) << i;
    }
  });
}

TEST(Softcap, ResidualAdd) {
  std::mt19937 rng(5);
  for_each_target([&] {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const int64_t n = 45;
      auto a = randn(size_t(n), rng), b = randn(size_t(n), rng);
      Tensor x = make_tensor(dt, {n}, a);
      Tensor y = make_tensor(DType::kF32, {n}, b), y_ref = make_tensor(DType::kF32, {n}, b);
      residual_add(x, y);
      ref::residual_add(x, y_ref);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y.as<float>()[i], y_ref.as<float>()[i]) << i;
    }
  });
}

TEST(Softcap, RejectsBadArguments) {
  Tensor x(DType::kF32, {4}), y(DType::kBF16, {4}), z(DType::kF32, {5});
  EXPECT_THROW(softcap_forward(x, 0.0f), Error);
  EXPECT_THROW(softcap_forward(x, std::numeric_limits<float>::infinity()), Error);
  EXPECT_THROW(residual_add(x, y), Error);  // y must be f32
  EXPECT_THROW(residual_add(x, z), Error);  // sizes differ
}

}  // namespace
}  // namespace hyperion
