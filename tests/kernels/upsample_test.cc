#include "kernels/upsample.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "finite_difference.h"
#include "kernel_test_util.h"

namespace hyperion {
namespace {

using namespace testing_util;

TEST(UpsampleNearest, MatchesReferenceForwardAndBackward) {
  std::mt19937 rng(1);
  for (auto [n, h, w, c, s] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 1, 1, 1, 2},
                               {2, 3, 5, 7, 2}, {1, 4, 4, 320, 2}, {2, 2, 3, 4, 3}, {1, 3, 2, 5, 1}}) {
    SCOPED_TRACE(testing::Message() << n << "x" << h << "x" << w << "x" << c << " s" << s);
    const auto x = randn(size_t(n * h * w * c), rng), dy = randn(x.size() * size_t(s * s), rng);
    std::vector<float> y(dy.size()), y_ref(dy.size()), dx(x.size()), dx_ref(x.size());
    upsample_nearest_forward(x.data(), n, h, w, c, s, y.data());
    ref::upsample_nearest_forward(x.data(), n, h, w, c, s, y_ref.data());
    EXPECT_EQ(y, y_ref);
    upsample_nearest_backward(dy.data(), n, h, w, c, s, dx.data());
    ref::upsample_nearest_backward(dy.data(), n, h, w, c, s, dx_ref.data());
    for (size_t i = 0; i < dx.size(); ++i) ASSERT_NEAR(dx[i], dx_ref[i], 1e-5) << i;
    // The backward pass is the forward's adjoint: sum(dy * up(x)) = sum(down(dy) * x).
    double lhs = 0.0, rhs = 0.0;
    for (size_t i = 0; i < y.size(); ++i) lhs += double(dy[i]) * y[i];
    for (size_t i = 0; i < x.size(); ++i) rhs += double(dx_ref[i]) * x[i];
    EXPECT_NEAR(lhs, rhs, 1e-4 * std::max(1.0, std::fabs(lhs)));
  }
}

// To a size (odd latent sides in a UNet: 3 -> 5, 5 -> 9, and a 2x that takes the fast path),
// against PyTorch's rule written out, and the backward as the forward's adjoint.
TEST(UpsampleNearest, ToASizeMatchesReferenceForwardAndBackward) {
  std::mt19937 rng(2);
  for (auto [n, h, w, c, oh, ow] : {std::array<int64_t, 6>{1, 3, 2, 5, 5, 4}, {2, 5, 4, 8, 9, 7}, {1, 2, 3, 3, 4, 6},
                                    {1, 1, 1, 2, 3, 2}, {2, 4, 3, 16, 7, 5}}) {
    SCOPED_TRACE(testing::Message() << n << "x" << h << "x" << w << "x" << c << " -> " << oh << "x" << ow);
    const auto x = randn(size_t(n * h * w * c), rng), dy = randn(size_t(n * oh * ow * c), rng);
    std::vector<float> y(dy.size()), y_ref(dy.size()), dx(x.size()), dx_ref(x.size());
    upsample_nearest_to_forward(x.data(), n, h, w, c, oh, ow, y.data());
    ref::upsample_nearest_to_forward(x.data(), n, h, w, c, oh, ow, y_ref.data());
    EXPECT_EQ(y, y_ref);
    // PyTorch's nearest: source index floor(i * (in / out)) in float.
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const auto si = int64_t(std::floor(float(i) * (float(h) / float(oh))));
        const auto sj = int64_t(std::floor(float(j) * (float(w) / float(ow))));
        ASSERT_EQ(y[size_t((i * ow + j) * c)], x[size_t((si * w + sj) * c)]) << i << "," << j;
      }
    upsample_nearest_to_backward(dy.data(), n, h, w, c, oh, ow, dx.data());
    ref::upsample_nearest_to_backward(dy.data(), n, h, w, c, oh, ow, dx_ref.data());
    for (size_t i = 0; i < dx.size(); ++i) ASSERT_NEAR(dx[i], dx_ref[i], 1e-5) << i;
    double lhs = 0.0, rhs = 0.0;
    for (size_t i = 0; i < y.size(); ++i) lhs += double(dy[i]) * y[i];
    for (size_t i = 0; i < x.size(); ++i) rhs += double(dx_ref[i]) * x[i];
    EXPECT_NEAR(lhs, rhs, 1e-4 * std::max(1.0, std::fabs(lhs)));
  }
  std::vector<float> buf(64);
  EXPECT_NE(error_message([&] { upsample_nearest_to_forward(buf.data(), 1, 4, 4, 1, 3, 4, buf.data()); })
                .find("must be 1 to 16 times the input"),
            std::string::npos);
}

TEST(UpsampleNearest, RefusesBadFactor) {
  std::vector<float> buf(4);
  EXPECT_NE(error_message([&] { upsample_nearest_forward(buf.data(), 1, 1, 1, 1, 0, buf.data()); })
                .find("factor 0 must be in [1, 16]"),
            std::string::npos);
}

}  // namespace
}  // namespace hyperion
