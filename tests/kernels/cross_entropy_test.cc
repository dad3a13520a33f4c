#include "kernels/cross_entropy.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "kernel_test_util.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

// Random targets in [0, cols), with about one row in four set to ignore_index.
std::vector<int32_t> random_targets(int64_t rows, int64_t cols, std::mt19937& rng,
                                    int32_t ignore = kIgnoreIndex) {
  std::uniform_int_distribution<int32_t> pick(0, int32_t(cols - 1));
  std::vector<int32_t> t(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) t[size_t(r)] = (r % 4 == 1) ? ignore : pick(rng);
  return t;
}

const DType kDTypes[] = {DType::kF32, DType::kBF16};

TEST(CrossEntropy, FusedMatchesReference) {
  std::mt19937 rng(11);
  for_each_target([&] {
    for (DType dt : kDTypes) {
      for (int64_t cols : {1, 5, 7, 17, 64, 100, 1000, 32000}) {
        const int64_t rows = cols > 5000 ? 3 : 9;
        SCOPED_TRACE(fmt::format("{} cols {}", dtype_name(dt), cols));
        auto lv = randn(size_t(rows * cols), rng, 2.0f);
        Tensor logits = make_tensor(dt, {rows, cols}, lv);
        Tensor targets = make_i32(random_targets(rows, cols, rng));
        Tensor grad(dt, {rows, cols}), grad_ref(dt, {rows, cols});
        Tensor rl(DType::kF32, {rows}), rl_ref(DType::kF32, {rows});
        const float dloss = 0.75f;
        auto got = cross_entropy_fused(logits, targets, grad, dloss, rl);
        auto want = ref::cross_entropy(logits, targets, grad_ref, dloss, rl_ref);
        EXPECT_EQ(got.count, want.count);
        EXPECT_NEAR(got.loss, want.loss, 1e-5 * std::fabs(want.loss) + 1e-6);
        for (int64_t r = 0; r < rows; ++r)
          EXPECT_NEAR(rl.as<float>()[r], rl_ref.as<float>()[r],
                      1e-5 * std::fabs(rl_ref.as<float>()[r]) + 1e-6);
        auto g = values(grad), gr = values(grad_ref);
        const double scale = dloss / double(want.count);
        for (size_t i = 0; i < g.size(); ++i) {
          // bf16 gradients may land one rounding step apart (last bit of 8).
          const double tol = dt == DType::kBF16 ? std::fabs(gr[i]) / 128 + 1e-12
                                                : std::fabs(gr[i]) * 2e-5 + scale * 1e-7;
          ASSERT_NEAR(g[i], gr[i], tol) << "at " << i;
        }
        // Forward-only: the same pass 1, so the same bits.
        Tensor rl2(DType::kF32, {rows});
        auto fwd = cross_entropy_forward(logits, targets, rl2);
        EXPECT_EQ(fwd.loss, got.loss);
        EXPECT_EQ(fwd.count, got.count);
        EXPECT_EQ(std::memcmp(rl2.data(), rl.data(), rl.nbytes()), 0);
      }
    }
  });
}

TEST(CrossEntropy, InPlaceMatchesSeparateBuffers) {
  std::mt19937 rng(12);
  for (DType dt : kDTypes) {
    const int64_t rows = 7, cols = 1001;
    Tensor logits = make_tensor(dt, {rows, cols}, randn(size_t(rows * cols), rng, 3.0f));
    Tensor targets = make_i32(random_targets(rows, cols, rng));
    Tensor grad(dt, {rows, cols});
    auto separate = cross_entropy_fused(logits, targets, grad);
    auto in_place = cross_entropy_fused(logits, targets, logits);
    EXPECT_EQ(separate.loss, in_place.loss);
    EXPECT_EQ(std::memcmp(grad.data(), logits.data(), grad.nbytes()), 0) << dtype_name(dt);
  }
}

// Central differences of the mean loss (scaled by dloss) against the fused gradient.
TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(13);
  const int64_t rows = 4, cols = 6;
  auto lv = randn(size_t(rows * cols), rng);
  std::vector<int32_t> tv = {2, kIgnoreIndex, 0, 5};
  Tensor targets = make_i32(tv);
  const float dloss = 2.5f;
  Tensor logits = make_tensor(DType::kF32, {rows, cols}, lv);
  Tensor grad(DType::kF32, {rows, cols});
  cross_entropy_fused(logits, targets, grad, dloss);
  auto loss = [&](const std::vector<float>& xs) {
    Tensor x = make_tensor(DType::kF32, {rows, cols}, xs);
    return dloss * cross_entropy_forward(x, targets).loss;
  };
  const float h = 1e-2f;
  for (size_t i = 0; i < lv.size(); ++i) {
    auto plus = lv, minus = lv;
    plus[i] += h;
    minus[i] -= h;
    const double numeric = (loss(plus) - loss(minus)) / (double(plus[i]) - double(minus[i]));
    EXPECT_NEAR(grad.as<float>()[i], numeric, 2e-4) << "at " << i;
    if (i / cols == 1) {
      EXPECT_EQ(grad.as<float>()[i], 0.0f) << "ignored row";
    }
  }
}

// Gemma 2's final_logit_softcapping: the loss over cap * tanh(logits / cap), the gradient
// w.r.t. the logits before the cap; against the reference, in place, and against finite
// differences.
TEST(CrossEntropy, SoftCapMatchesReferenceAndFiniteDifferences) {
  std::mt19937 rng(17);
  const float cap = 3.0f;
  for_each_target([&] {
    for (DType dt : kDTypes)
      for (int64_t cols : {5, 17, 1000}) {
        const int64_t rows = 9;
        SCOPED_TRACE(fmt::format("{} cols {}", dtype_name(dt), cols));
        auto lv = randn(size_t(rows * cols), rng, 4.0f);
        Tensor logits = make_tensor(dt, {rows, cols}, lv);
        Tensor targets = make_i32(random_targets(rows, cols, rng));
        Tensor grad(dt, {rows, cols}), grad_ref(dt, {rows, cols});
        auto got = cross_entropy_fused(logits, targets, grad, 0.5f, TensorView(), kIgnoreIndex, cap);
        auto want = ref::cross_entropy(logits, targets, grad_ref, 0.5f, TensorView(), kIgnoreIndex,
                                       cap);
        EXPECT_NEAR(got.loss, want.loss, 1e-5 * std::fabs(want.loss) + 1e-6);
        auto g = values(grad), gr = values(grad_ref);
        for (size_t i = 0; i < g.size(); ++i)
          ASSERT_NEAR(g[i], gr[i], dt == DType::kBF16 ? std::fabs(gr[i]) / 128 + 1e-9 : 1e-6)
              << "at " << i;
        EXPECT_EQ(cross_entropy_forward(logits, targets, TensorView(), kIgnoreIndex, cap).loss,
                  got.loss);
        // The cap changes the loss.
        EXPECT_GT(std::fabs(cross_entropy_forward(logits, targets).loss - got.loss), 1e-3);
        cross_entropy_fused(logits, targets, logits, 0.5f, TensorView(), kIgnoreIndex, cap);
        EXPECT_EQ(std::memcmp(logits.data(), grad.data(), grad.nbytes()), 0) << "in place";
      }
  });
  const int64_t rows = 3, cols = 5;
  auto lv = randn(size_t(rows * cols), rng, 4.0f);
  Tensor targets = make_i32({4, 0, 2});
  Tensor logits = make_tensor(DType::kF32, {rows, cols}, lv);
  Tensor grad(DType::kF32, {rows, cols});
  cross_entropy_fused(logits, targets, grad, 1.0f, TensorView(), kIgnoreIndex, cap);
  auto loss = [&](const std::vector<float>& xs) {
    Tensor x = make_tensor(DType::kF32, {rows, cols}, xs);
    return ref::cross_entropy(x, targets, TensorView(), 1.0f, TensorView(), kIgnoreIndex, cap).loss;
  };
  for (size_t i = 0; i < lv.size(); ++i) {
    auto plus = lv, minus = lv;
    plus[i] += 1e-2f;
    minus[i] -= 1e-2f;
    const double numeric = (loss(plus) - loss(minus)) / (double(plus[i]) - double(minus[i]));
    EXPECT_NEAR(grad.as<float>()[i], numeric, 2e-4) << "at " << i;
  }
  EXPECT_THROW(cross_entropy_forward(logits, targets, TensorView(), kIgnoreIndex, -1.0f), Error);
}

TEST(CrossEntropy, IgnoreIndexHandling) {
  std::mt19937 rng(14);
  const int64_t rows = 5, cols = 19;
  auto lv = randn(size_t(rows * cols), rng);
  Tensor logits = make_tensor(DType::kF32, {rows, cols}, lv);
  Tensor grad(DType::kF32, {rows, cols});
  Tensor rl(DType::kF32, {rows});

  // Mean over the non-ignored rows only: equals the mean of those rows alone.
  Tensor targets = make_i32({3, kIgnoreIndex, 7, kIgnoreIndex, 18});
  auto all = cross_entropy_fused(logits, targets, grad, 1.0f, rl);
  EXPECT_EQ(all.count, 3);
  EXPECT_EQ(rl.as<float>()[1], 0.0f);
  EXPECT_EQ(rl.as<float>()[3], 0.0f);
  for (int64_t j = 0; j < cols; ++j) {
    EXPECT_EQ(grad.as<float>()[cols + j], 0.0f);
    EXPECT_EQ(grad.as<float>()[3 * cols + j], 0.0f);
  }
  std::vector<float> kept;
  for (int64_t r : {0, 2, 4})
    kept.insert(kept.end(), lv.begin() + r * cols, lv.begin() + (r + 1) * cols);
  Tensor kept_logits = make_tensor(DType::kF32, {3, cols}, kept);
  auto only = cross_entropy_forward(kept_logits, make_i32({3, 7, 18}));
  EXPECT_NEAR(all.loss, only.loss, 1e-12);
  // Gradient rows sum to zero (softmax minus one-hot).
  for (int64_t r : {0, 2, 4}) {
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) sum += grad.as<float>()[r * cols + j];
    EXPECT_NEAR(sum, 0.0, 1e-6);
  }

  // Every row ignored: loss 0, count 0, zero gradient, no NaN.
  Tensor none = make_i32(std::vector<int32_t>(rows, kIgnoreIndex));
  Tensor logits2 = make_tensor(DType::kF32, {rows, cols}, lv);
  auto r0 = cross_entropy_fused(logits2, none, logits2);
  EXPECT_EQ(r0.count, 0);
  EXPECT_EQ(r0.loss, 0.0);
  for (float g : values(logits2)) EXPECT_EQ(g, 0.0f);

  // A custom ignore_index, and -100 then being an out-of-range target.
  Tensor custom = make_i32({3, -1, 7, -1, 18});
  auto c = cross_entropy_forward(logits, custom, TensorView(), -1);
  EXPECT_EQ(c.count, 3);
  EXPECT_NEAR(c.loss, all.loss, 1e-12);
  EXPECT_THROW(cross_entropy_forward(logits, targets, TensorView(), -1), Error);
}

TEST(CrossEntropy, ExtremeLogits) {
  for_each_target([&] {
    const int64_t cols = 50;
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> v(3 * cols, 0.0f);
    for (int64_t j = 0; j < cols; ++j) {
      v[size_t(j)] = j % 2 ? 1e4f : -1e4f;             // row 0: large magnitudes
      v[size_t(cols + j)] = j % 3 ? -inf : 0.25f * j;  // row 1: masked vocabulary
    }
    v[size_t(2 * cols + 4)] = std::numeric_limits<float>::quiet_NaN();  // row 2: NaN
    Tensor logits = make_tensor(DType::kF32, {3, cols}, v);
    Tensor grad(DType::kF32, {3, cols}), grad_ref(DType::kF32, {3, cols});
    Tensor rl(DType::kF32, {3}), rl_ref(DType::kF32, {3});
    Tensor targets = make_i32({3, 6, 1});
    auto got = cross_entropy_fused(logits, targets, grad, 1.0f, rl);
    ref::cross_entropy(logits, targets, grad_ref, 1.0f, rl_ref);
    EXPECT_TRUE(std::isnan(got.loss));
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(std::isfinite(rl.as<float>()[r])) << r;
      EXPECT_NEAR(rl.as<float>()[r], rl_ref.as<float>()[r],
                  1e-5 * std::fabs(rl_ref.as<float>()[r]) + 1e-6);
      for (int64_t j = 0; j < cols; ++j) {
        const float g = grad.as<float>()[r * cols + j], g_ref = grad_ref.as<float>()[r * cols + j];
        ASSERT_FALSE(std::isnan(g));
        EXPECT_NEAR(g, g_ref, 1e-6);
      }
    }
    EXPECT_TRUE(std::isnan(rl.as<float>()[2]));
    // A target whose logit is -inf has infinite loss.
    auto masked = cross_entropy_forward(logits.view().slice0(1, 2), make_i32({1}));
    EXPECT_TRUE(std::isinf(masked.loss) && masked.loss > 0);
  });
}

TEST(CrossEntropy, DeterministicAcrossThreadCounts) {
  std::mt19937 rng(15);
  const RestoreNumThreads restore_threads;
  for (DType dt : kDTypes) {
    const int64_t rows = 64, cols = 777;
    auto lv = randn(size_t(rows * cols), rng, 2.0f);
    Tensor targets = make_i32(random_targets(rows, cols, rng));
    Tensor a = make_tensor(dt, {rows, cols}, lv), b = make_tensor(dt, {rows, cols}, lv);
    set_num_threads(1);
    auto ra = cross_entropy_fused(a, targets, a);
    set_num_threads(2);
    auto rb = cross_entropy_fused(b, targets, b);
    EXPECT_EQ(ra.loss, rb.loss);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << dtype_name(dt);
  }
}

TEST(CrossEntropy, ErrorsNameTheOpAndRow) {
  Tensor logits(DType::kF32, {4, 5});
  std::memset(logits.data(), 0, logits.nbytes());
  Tensor grad(DType::kF32, {4, 5});
  std::string msg = error_message([&] {
    cross_entropy_fused(logits, make_i32({0, 7, 1, 2}), grad);
  });
  EXPECT_NE(msg.find("cross_entropy_fused"), std::string::npos) << msg;
  EXPECT_NE(msg.find("target 7 at row 1"), std::string::npos) << msg;
  msg = error_message([&] { cross_entropy_forward(logits, make_i32({0, 1, 2, -5})); });
  EXPECT_NE(msg.find("cross_entropy_forward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("target -5 at row 3"), std::string::npos) << msg;

  msg = error_message([&] { cross_entropy_forward(logits, make_i32({0, 1, 2})); });
  EXPECT_NE(msg.find("f32[4, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("int32[3]"), std::string::npos) << msg;
  Tensor f32_targets(DType::kF32, {4});
  EXPECT_THROW(cross_entropy_forward(logits, f32_targets), Error);
  Tensor bf16_grad(DType::kBF16, {4, 5});
  msg = error_message([&] { cross_entropy_fused(logits, make_i32({0, 1, 2, 3}), bf16_grad); });
  EXPECT_NE(msg.find("dlogits"), std::string::npos) << msg;
  Tensor bad_rl(DType::kF32, {5});
  EXPECT_THROW(cross_entropy_forward(logits, make_i32({0, 1, 2, 3}), bad_rl), Error);
  Tensor logits3(DType::kF32, {2, 2, 5});
  EXPECT_THROW(cross_entropy_forward(logits3, make_i32({0, 1})), Error);
  // Partial overlap of gradient and logits.
  Tensor big(DType::kF32, {5, 5});
  TensorView l(big.data(), DType::kF32, {4, 5}), g(big.as<float>() + 5, DType::kF32, {4, 5});
  msg = error_message([&] { cross_entropy_fused(l, make_i32({0, 1, 2, 3}), g); });
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
}

}  // namespace
}  // namespace hyperion
