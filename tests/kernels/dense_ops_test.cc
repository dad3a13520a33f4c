#include "kernels/dense_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernel_test_util.h"

namespace hyperion {
namespace {

using namespace testing_util;

TEST(DenseOps, MatchReference) {
  RestoreNumThreads restore;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (int64_t n : {1, 15, 17, 100, 40000}) {
      std::mt19937 rng(static_cast<unsigned>(n));
      const std::vector<float> x0 = randn(size_t(n), rng), z = randn(size_t(n), rng),
                               x = randn(size_t(n), rng), g = randn(size_t(n), rng);
      for_each_target([&] {
        std::vector<float> s1 = x, s2 = x;
        add_to(s1.data(), z.data(), n);
        ref::add_to(s2.data(), z.data(), n);
        EXPECT_EQ(s1, s2);
        std::vector<float> a = x, b = x;
        relu_forward(a.data(), n);
        ref::relu_forward(b.data(), n);
        EXPECT_EQ(a, b);
        std::vector<float> da = g, dbv = g;
        relu_backward(a.data(), da.data(), n);
        ref::relu_backward(b.data(), dbv.data(), n);
        EXPECT_EQ(da, dbv);
        std::vector<float> o1(static_cast<size_t>(n)), o2(static_cast<size_t>(n));
        cross_forward(x0.data(), z.data(), x.data(), o1.data(), n);
        ref::cross_forward(x0.data(), z.data(), x.data(), o2.data(), n);
        for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(o1[size_t(i)], o2[size_t(i)], 1e-6f);
        std::vector<float> dz1(static_cast<size_t>(n)), dz2(static_cast<size_t>(n)), dx1 = x,
                                                                                     dx2 = x;
        cross_backward(g.data(), x0.data(), z.data(), dz1.data(), dx1.data(), n);
        ref::cross_backward(g.data(), x0.data(), z.data(), dz2.data(), dx2.data(), n);
        EXPECT_EQ(dz1, dz2);
        for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(dx1[size_t(i)], dx2[size_t(i)], 1e-6f);
      });
    }
    for (const auto& shape :
         std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 33}, {300, 130}}) {
      const int64_t rows = shape.first, cols = shape.second;
      std::mt19937 rng(9);
      const std::vector<float> dy = randn(size_t(rows * cols), rng);
      for_each_target([&] {
        std::vector<float> a(size_t(cols), 1.0f), b(size_t(cols), 1.0f);
        column_sums(dy.data(), rows, cols, a.data(), true);
        ref::column_sums(dy.data(), rows, cols, b.data(), true);
        for (int64_t j = 0; j < cols; ++j) ASSERT_NEAR(a[size_t(j)], b[size_t(j)], 1e-4f);
        column_sums(dy.data(), rows, cols, a.data(), false);
        ref::column_sums(dy.data(), rows, cols, b.data(), false);
        for (int64_t j = 0; j < cols; ++j) ASSERT_NEAR(a[size_t(j)], b[size_t(j)], 1e-4f);
      });
    }
  }
}

TEST(DenseOps, AdagradMatchesReference) {
  for (int64_t n : {3, 16, 1000}) {
    std::mt19937 rng(static_cast<unsigned>(n));
    const std::vector<float> w0 = randn(size_t(n), rng), g = randn(size_t(n), rng);
    std::vector<float> s0(size_t(n), 0.5f);
    for_each_target([&] {
      std::vector<float> w1 = w0, w2 = w0, s1 = s0, s2 = s0;
      adagrad_update(w1.data(), s1.data(), g.data(), n, 0.1f, 1e-8f);
      ref::adagrad_update(w2.data(), s2.data(), g.data(), n, 0.1f, 1e-8f);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(w1[size_t(i)], w2[size_t(i)], 1e-6f);
        ASSERT_NEAR(s1[size_t(i)], s2[size_t(i)], 1e-6f);
      }
    });
  }
}

TEST(DenseOps, BceMatchesFormulaAndFiniteDifferences) {
  const std::vector<float> logits = {-800.0f, -3.0f, 0.0f, 0.5f, 40.0f, 800.0f};
  const std::vector<float> labels = {0, 1, 1, 0, 1, 0};
  std::vector<float> d(logits.size());
  const double loss = bce_with_logits(logits.data(), labels.data(), 6, d.data(), 0.5f);
  double want = 0;
  for (size_t i = 0; i < 6; ++i) {
    const double x = logits[i], y = labels[i];
    // log(1 + e^x) - x y, written stably by hand for the extremes.
    const double softplus = x > 30 ? x : x < -30 ? std::exp(x) : std::log1p(std::exp(x));
    want += softplus - x * y;
  }
  EXPECT_NEAR(loss, want, 1e-9 * want);
  EXPECT_TRUE(std::isfinite(loss));
  for (size_t i = 1; i < 5; ++i) {
    const float h = 1e-3f;
    std::vector<float> up = logits, down = logits;
    up[i] += h;
    down[i] -= h;
    const double fd = (bce_with_logits(up.data(), labels.data(), 6, nullptr, 1) -
                       bce_with_logits(down.data(), labels.data(), 6, nullptr, 1)) /
                      (2 * h);
    EXPECT_NEAR(d[i], 0.5 * fd, 1e-4) << i;
  }
  EXPECT_NEAR(d[0], 0.0f, 1e-12);  // sigmoid(-800) - 0
  EXPECT_NEAR(d[5], 0.5f, 1e-12);  // 0.5 * (1 - 0)
}

}  // namespace
}  // namespace hyperion
