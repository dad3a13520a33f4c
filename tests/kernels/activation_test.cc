#include "kernels/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "finite_difference.h"
#include "kernel_test_util.h"

namespace hyperion {
namespace {

using namespace testing_util;

const Activation kAll[] = {Activation::kSilu, Activation::kGelu, Activation::kQuickGelu};

// Inputs over the range activations see, plus saturating and exact-zero values.
std::vector<float> inputs(size_t n, std::mt19937& rng) {
  auto v = randn(n, rng, 3.0f);
  if (n > 4) {
    v[0] = 0.0f;
    v[1] = -90.0f;
    v[2] = 90.0f;
    v[3] = -1e-4f;
  }
  return v;
}

TEST(Activation, ForwardAndBackwardMatchReference) {
  std::mt19937 rng(1);
  for_each_target([&] {
    for (Activation a : kAll) {
      for (size_t n : {size_t(1), size_t(5), size_t(16), size_t(37), size_t(40000)}) {
        SCOPED_TRACE(testing::Message() << activation_name(a) << " n=" << n);
        const auto x = inputs(n, rng), dy = randn(n, rng);
        std::vector<float> y(n), y_ref(n), dx(n), dx_ref(n);
        activation_forward(a, x.data(), y.data(), int64_t(n));
        ref::activation_forward(a, x.data(), y_ref.data(), int64_t(n));
        activation_backward(a, dy.data(), x.data(), dx.data(), int64_t(n));
        ref::activation_backward(a, dy.data(), x.data(), dx_ref.data(), int64_t(n));
        for (size_t i = 0; i < n; ++i) {
          // erf's approximation: absolute error < 2e-7 in Phi, times |x|.
          ASSERT_NEAR(y[i], y_ref[i], 1e-6 * std::max(1.0f, std::fabs(x[i]))) << i << " x=" << x[i];
          ASSERT_NEAR(dx[i], dx_ref[i], 2e-6 * std::max(1.0f, std::fabs(x[i] * dy[i]))) << i << " x=" << x[i];
        }
      }
    }
  });
}

TEST(Activation, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(2);
  for (Activation a : kAll) {
    const auto x = randn(50, rng, 2.0f), dy = randn(50, rng);
    std::vector<float> dx(50);
    ref::activation_backward(a, dy.data(), x.data(), dx.data(), 50);
    auto f = [&](const std::vector<float>& v, std::vector<float>& out) {
      ref::activation_forward(a, v.data(), out.data(), 50);
    };
    const auto coords = sample_coords(50, 20, rng);
    const auto fd = finite_difference(f, x, dy, coords, 1e-3);
    for (size_t i = 0; i < coords.size(); ++i)
      EXPECT_NEAR(dx[coords[i]], fd[i], 1e-3) << activation_name(a) << " " << coords[i];
  }
}

TEST(Activation, ParsesHuggingFaceNames) {
  Activation a;
  ASSERT_TRUE(parse_activation("swish", &a));
  EXPECT_EQ(a, Activation::kSilu);
  ASSERT_TRUE(parse_activation("quick_gelu", &a));
  EXPECT_EQ(a, Activation::kQuickGelu);
  EXPECT_FALSE(parse_activation("relu6", &a));
}

TEST(Geglu, MatchesReferenceAndFiniteDifferences) {
  std::mt19937 rng(3);
  for_each_target([&] {
    for (auto [rows, f] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {4, 40}, {17, 33}}) {
      SCOPED_TRACE(testing::Message() << rows << "x" << f);
      const auto x = randn(size_t(rows * 2 * f), rng, 2.0f), dh = randn(size_t(rows * f), rng);
      std::vector<float> h(dh.size()), h_ref(dh.size()), dx(x.size()), dx_ref(x.size());
      geglu_rows_forward(x.data(), rows, f, h.data());
      ref::geglu_rows_forward(x.data(), rows, f, h_ref.data());
      geglu_rows_backward(dh.data(), x.data(), rows, f, dx.data());
      ref::geglu_rows_backward(dh.data(), x.data(), rows, f, dx_ref.data());
      for (size_t i = 0; i < h.size(); ++i) ASSERT_NEAR(h[i], h_ref[i], 5e-6 * std::max(1.0f, std::fabs(h_ref[i])));
      for (size_t i = 0; i < dx.size(); ++i) ASSERT_NEAR(dx[i], dx_ref[i], 5e-6 * std::max(1.0f, std::fabs(dx_ref[i])));
    }
  });
  const int64_t rows = 2, f = 5;
  const auto x = randn(size_t(rows * 2 * f), rng, 2.0f), dh = randn(size_t(rows * f), rng);
  std::vector<float> dx(x.size());
  ref::geglu_rows_backward(dh.data(), x.data(), rows, f, dx.data());
  auto fn = [&](const std::vector<float>& v, std::vector<float>& out) {
    ref::geglu_rows_forward(v.data(), rows, f, out.data());
  };
  std::vector<size_t> all(x.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  const auto fd = finite_difference(fn, x, dh, all, 1e-3);
  for (size_t i = 0; i < all.size(); ++i) EXPECT_NEAR(dx[i], fd[i], 2e-3) << i;
}

}  // namespace
}  // namespace hyperion
