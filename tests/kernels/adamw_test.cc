#include "kernels/adamw.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernel_test_util.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

Tensor filled(DType dtype, Shape shape, float value) {
  Tensor t(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kF32)
      t.as<float>()[i] = value;
    else
      t.as<bf16>()[i] = f32_to_bf16(value);
  }
  return t;
}

TEST(AdamW, MatchesReferenceOverSeveralSteps) {
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.95f;
  hp.eps = 1e-8f;
  hp.weight_decay = 0.1f;
  hp.grad_scale = 0.7f;
  for_each_target([&] {
    for (DType gdt : {DType::kF32, DType::kBF16}) {
      for (int64_t n : {1, 7, 17, 63, 100, 1000, 40000}) {
        SCOPED_TRACE(testing::Message() << "grads " << dtype_name(gdt) << " n=" << n);
        std::mt19937 rng(static_cast<unsigned>(31 + n));
        Tensor p = random_tensor(DType::kF32, {n}, rng);
        Tensor p_ref = p.clone();
        Tensor m = Tensor::zeros(DType::kF32, {n}), v = Tensor::zeros(DType::kF32, {n});
        Tensor m_ref = m.clone(), v_ref = v.clone();
        Tensor pb(DType::kBF16, {n}), pb_ref(DType::kBF16, {n});
        for (int64_t step = 1; step <= 5; ++step) {
          hp.step = step;
          Tensor g = random_tensor(gdt, {n}, rng, 0.5f);
          adamw_step(p, g, m, v, hp, pb);
          ref::adamw_step(p_ref, g, m_ref, v_ref, hp, pb_ref);
        }
        for (int64_t i = 0; i < n; ++i) {
          const float pi = p.as<float>()[i], pr = p_ref.as<float>()[i];
          ASSERT_NEAR(pi, pr, 2e-6 * (std::fabs(pr) + hp.lr)) << i;
          ASSERT_NEAR(m.as<float>()[i], m_ref.as<float>()[i],
                      1e-6 * (std::fabs(m_ref.as<float>()[i]) + 0.1))
              << i;
          ASSERT_NEAR(v.as<float>()[i], v_ref.as<float>()[i],
                      1e-6 * (std::fabs(v_ref.as<float>()[i]) + 1e-6))
              << i;
          // The bf16 copy is exactly the rounded f32 master weight.
          ASSERT_EQ(pb.as<bf16>()[i].bits, f32_to_bf16(pi).bits) << i;
        }
      }
    }
  });
}

// With a constant gradient the bias-corrected moments are exactly g and g^2, so every
// step moves each parameter by lr * g / (|g| + eps), i.e. by almost exactly lr.
TEST(AdamW, ConstantGradientMovesByLearningRate) {
  const std::vector<float> gv = {1.0f, -1.0f, 1e-3f, -250.0f, 0.37f, 3.0f, -0.01f};
  const int64_t n = static_cast<int64_t>(gv.size());
  for_each_target([&] {
    for (DType gdt : {DType::kF32, DType::kBF16}) {
      Tensor g(gdt, {n});
      for (int64_t i = 0; i < n; ++i) {
        if (gdt == DType::kF32)
          g.as<float>()[i] = gv[i];
        else
          g.as<bf16>()[i] = f32_to_bf16(gv[i]);
      }
      Tensor p = filled(DType::kF32, {n}, 1.0f);
      Tensor m = Tensor::zeros(DType::kF32, {n}), v = Tensor::zeros(DType::kF32, {n});
      AdamWParams hp;
      hp.lr = 1e-3f;
      hp.weight_decay = 0.0f;
      for (int64_t step = 1; step <= 4; ++step) {
        hp.step = step;
        Tensor before = p.clone();
        adamw_step(p, g, m, v, hp);
        for (int64_t i = 0; i < n; ++i) {
          const double moved = double(p.as<float>()[i]) - double(before.as<float>()[i]);
          const double expected = gv[i] > 0 ? -hp.lr : hp.lr;
          EXPECT_NEAR(moved, expected, 2e-6 * hp.lr + 1e-7) << "step " << step << " g " << gv[i];
        }
      }
    }
  });
}

TEST(AdamW, ZeroGradientOnlyDecays) {
  Tensor p = filled(DType::kF32, {37}, 2.0f);
  Tensor g = Tensor::zeros(DType::kBF16, {37});
  Tensor m = Tensor::zeros(DType::kF32, {37}), v = Tensor::zeros(DType::kF32, {37});
  AdamWParams hp;
  hp.lr = 0.1f;
  hp.weight_decay = 0.5f;
  adamw_step(p, g, m, v, hp);
  for (int64_t i = 0; i < 37; ++i) EXPECT_FLOAT_EQ(p.as<float>()[i], 2.0f * (1 - 0.1f * 0.5f));
}

TEST(AdamW, GradScaleMultipliesGradients) {
  std::mt19937 rng(32);
  Tensor g = random_tensor(DType::kF32, {101}, rng);
  Tensor g2(DType::kF32, {101});
  for (int64_t i = 0; i < 101; ++i) g2.as<float>()[i] = 2.0f * g.as<float>()[i];
  Tensor p = random_tensor(DType::kF32, {101}, rng);
  Tensor p2 = p.clone();
  Tensor m = Tensor::zeros(DType::kF32, {101}), v = Tensor::zeros(DType::kF32, {101});
  Tensor m2 = m.clone(), v2 = v.clone();
  AdamWParams hp;
  adamw_step(p, g, m, v, hp);
  hp.grad_scale = 0.5f;
  adamw_step(p2, g2, m2, v2, hp);
  EXPECT_TRUE(bitwise_equal(p, p2));
  EXPECT_TRUE(bitwise_equal(m, m2));
  EXPECT_TRUE(bitwise_equal(v, v2));
}

TEST(AdamW, ErrorsNameTheOp) {
  Tensor p = Tensor::zeros(DType::kF32, {10});
  Tensor g = Tensor::zeros(DType::kF32, {10});
  Tensor m = Tensor::zeros(DType::kF32, {10});
  Tensor v = Tensor::zeros(DType::kF32, {10});
  Tensor g_bad = Tensor::zeros(DType::kF32, {11});
  Tensor m_bf16 = Tensor::zeros(DType::kBF16, {10});
  Tensor g_i32 = Tensor::zeros(DType::kI32, {10});
  Tensor p_bf16 = Tensor::zeros(DType::kBF16, {10});
  AdamWParams hp;
  expect_error([&] { adamw_step(p, g_bad, m, v, hp); }, {"adamw_step", "f32[11]", "f32[10]"});
  expect_error([&] { adamw_step(p, g, m_bf16, v, hp); }, {"adamw_step", "bf16[10]"});
  expect_error([&] { adamw_step(p, g, m, g_bad, hp); }, {"adamw_step", "v f32[11]"});
  expect_error([&] { adamw_step(p, g_i32, m, v, hp); }, {"adamw_step", "int32"});
  expect_error([&] { adamw_step(p_bf16, g, m, v, hp); }, {"adamw_step", "bf16"});
  expect_error([&] { adamw_step(p, g, m, v, hp, g); }, {"adamw_step", "params_bf16"});
  AdamWParams bad = hp;
  bad.step = 0;
  expect_error([&] { adamw_step(p, g, m, v, bad); }, {"adamw_step", "step"});
  bad = hp;
  bad.beta1 = 1.0f;
  expect_error([&] { adamw_step(p, g, m, v, bad); }, {"adamw_step", "beta1"});
  EXPECT_THROW(ref::adamw_step(p, g_bad, m, v, hp), Error);
}

}  // namespace
}  // namespace hyperion
