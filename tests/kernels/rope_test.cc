#include "kernels/rope.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <array>
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

Tensor random_positions(Shape shape, int64_t max_positions, std::mt19937& rng) {
  Tensor p(DType::kI32, shape);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(max_positions - 1));
  for (int64_t i = 0; i < p.numel(); ++i) p.as<int32_t>()[i] = dist(rng);
  return p;
}

// [B, T, H, D]; D/2 of 1, 3, 17 (SIMD tails), 32, 64 and 100.
const std::vector<std::array<int64_t, 4>> kShapes = {{1, 1, 1, 2},  {2, 3, 4, 6},   {1, 5, 3, 34},
                                                     {2, 7, 2, 64}, {1, 4, 2, 128}, {2, 3, 1, 200}};

// f32: the table is f32-rounded cos/sin of exact angles, so results agree to ~1e-6. bf16
// outputs are one rounding of that, so within one bf16 ulp (relative 2^-8).
double tolerance(DType dtype, double ref) {
  return dtype == DType::kF32 ? 2e-6 * (1 + std::fabs(ref)) : std::fabs(ref) / 128 + 1e-6;
}

TEST(Rope, TableMatchesDoubleAngles) {
  const double theta = 500000.0;
  RopeTable table(4096, 128, theta);
  for (int64_t pos : {0, 1, 17, 1000, 4095}) {
    for (int64_t i = 0; i < 64; ++i) {
      const double angle = double(pos) * std::pow(theta, -2.0 * double(i) / 128.0);
      EXPECT_NEAR(table.cos_row(pos)[i], std::cos(angle), 1e-7);
      EXPECT_NEAR(table.sin_row(pos)[i], std::sin(angle), 1e-7);
    }
  }
}

TEST(Rope, ForwardAndBackwardMatchReference) {
  std::mt19937 rng(11);
  for_each_target([&] {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (const auto& s : kShapes) {
        SCOPED_TRACE(testing::Message()
                     << dtype_name(dt) << " " << (Shape{s[0], s[1], s[2], s[3]}.str()));
        RopeTable table(300, s[3], 10000.0);
        Tensor x = random_tensor(dt, {s[0], s[1], s[2], s[3]}, rng);
        // Positions per token [T] and per sequence [B, T].
        Tensor positions[2] = {random_positions({s[1]}, 300, rng),
                               random_positions({s[0], s[1]}, 300, rng)};
        for (const Tensor& pos : positions) {
          Tensor out(dt, x.shape()), out_ref(dt, x.shape());
          rope_forward(x, out, pos, table);
          ref::rope_forward(x, out_ref, pos, table);
          for (int64_t i = 0; i < x.numel(); ++i)
            ASSERT_NEAR(at(out, i), at(out_ref, i), tolerance(dt, at(out_ref, i))) << i;
          rope_backward(x, out, pos, table);
          ref::rope_backward(x, out_ref, pos, table);
          for (int64_t i = 0; i < x.numel(); ++i)
            ASSERT_NEAR(at(out, i), at(out_ref, i), tolerance(dt, at(out_ref, i))) << i;
        }
      }
    }
  });
}

TEST(Rope, StartOffsetEqualsExplicitPositions) {
  std::mt19937 rng(12);
  RopeTable table(100, 34, 10000.0);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor x = random_tensor(dt, {2, 9, 3, 34}, rng);
    Tensor pos(DType::kI32, {9});
    for (int t = 0; t < 9; ++t) pos.as<int32_t>()[t] = 40 + t;
    Tensor a(dt, x.shape()), b(dt, x.shape());
    rope_forward(x, a, pos, table);
    rope_forward(x, b, 40, table);
    EXPECT_TRUE(bitwise_equal(a, b));
    rope_backward(x, a, pos, table);
    rope_backward(x, b, 40, table);
    EXPECT_TRUE(bitwise_equal(a, b));
  }
}

TEST(Rope, InPlaceEqualsOutOfPlace) {
  std::mt19937 rng(13);
  RopeTable table(32, 128, 10000.0);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor x = random_tensor(dt, {2, 5, 4, 128}, rng);
    Tensor out(dt, x.shape());
    rope_forward(x, out, 3, table);
    rope_forward(x, x, 3, table);
    EXPECT_TRUE(bitwise_equal(x, out)) << dtype_name(dt);
  }
}

TEST(Rope, BackwardInvertsForward) {
  std::mt19937 rng(14);
  RopeTable table(2048, 64, 10000.0);
  Tensor x = random_tensor(DType::kF32, {2, 6, 3, 64}, rng);
  Tensor pos = random_positions({2, 6}, 2048, rng);
  Tensor y(DType::kF32, x.shape()), back(DType::kF32, x.shape());
  rope_forward(x, y, pos, table);
  rope_backward(y, back, pos, table);
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_NEAR(at(back, i), at(x, i), 1e-5) << i;
}

// L = sum(rope(x) * r) with an f64 forward written here; dL/dx must equal
// rope_backward(r).
TEST(Rope, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(15);
  const double theta = 10000.0;
  const int64_t b = 2, t = 3, h = 2, d = 6, half = d / 2;
  RopeTable table(50, d, theta);
  Tensor x = random_tensor(DType::kF32, {b, t, h, d}, rng);
  Tensor r = random_tensor(DType::kF32, {b, t, h, d}, rng);
  Tensor pos = random_positions({t}, 50, rng);
  Tensor dx(DType::kF32, x.shape());
  rope_backward(r, dx, pos, table);

  std::vector<double> xd(x.as<float>(), x.as<float>() + x.numel());
  auto loss = [&] {
    double l = 0;
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t ti = 0; ti < t; ++ti)
        for (int64_t hi = 0; hi < h; ++hi)
          for (int64_t i = 0; i < half; ++i) {
            const int64_t base = ((bi * t + ti) * h + hi) * d;
            const double a = pos.as<int32_t>()[ti] * std::pow(theta, -2.0 * i / double(d));
            const double x1 = xd[base + i], x2 = xd[base + half + i];
            l += (x1 * std::cos(a) - x2 * std::sin(a)) * at(r, base + i);
            l += (x2 * std::cos(a) + x1 * std::sin(a)) * at(r, base + half + i);
          }
    return l;
  };
  const double step = 1e-4;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double keep = xd[i];
    xd[i] = keep + step;
    const double lp = loss();
    xd[i] = keep - step;
    const double lm = loss();
    xd[i] = keep;
    EXPECT_NEAR(at(dx, i), (lp - lm) / (2 * step), 1e-5) << i;
  }
}

TEST(Rope, ErrorsNameTheOp) {
  RopeTable table(16, 8, 10000.0);
  Tensor x = Tensor::zeros(DType::kF32, {1, 4, 2, 8});
  Tensor out = Tensor::zeros(DType::kF32, {1, 4, 2, 8});
  Tensor pos = Tensor::zeros(DType::kI32, {4});
  Tensor x_odd = Tensor::zeros(DType::kF32, {1, 4, 2, 7});
  expect_error([&] { rope_forward(x_odd, x_odd, pos, table); },
               {"rope_forward", "even", "f32[1, 4, 2, 7]"});
  expect_error([&] { rope_backward(x_odd, x_odd, 0, table); }, {"rope_backward", "even"});
  expect_error([&] { RopeTable bad(16, 7); }, {"RopeTable", "even"});
  Tensor x_d16 = Tensor::zeros(DType::kF32, {1, 4, 2, 16});
  expect_error([&] { rope_forward(x_d16, x_d16, pos, table); }, {"rope_forward", "head dim"});
  Tensor out_bf16 = Tensor::zeros(DType::kBF16, {1, 4, 2, 8});
  expect_error([&] { rope_forward(x, out_bf16, pos, table); },
               {"rope_forward", "bf16[1, 4, 2, 8]"});
  Tensor pos_f32 = Tensor::zeros(DType::kF32, {4});
  expect_error([&] { rope_forward(x, out, pos_f32, table); }, {"rope_forward", "int32"});
  Tensor pos_short = Tensor::zeros(DType::kI32, {3});
  expect_error([&] { rope_forward(x, out, pos_short, table); }, {"rope_forward", "int32[3]"});
  Tensor pos_far = Tensor::zeros(DType::kI32, {4});
  pos_far.as<int32_t>()[2] = 16;
  expect_error([&] { rope_forward(x, out, pos_far, table); }, {"rope_forward", "16"});
  pos_far.as<int32_t>()[2] = -1;
  expect_error([&] { rope_backward(x, out, pos_far, table); }, {"rope_backward", "-1"});
  expect_error([&] { rope_forward(x, out, 13, table); }, {"rope_forward", "[13, 17)"});
  Tensor x3 = Tensor::zeros(DType::kF32, {4, 2, 8});
  expect_error([&] { rope_forward(x3, x3, 0, table); }, {"rope_forward", "rank"});
  Tensor x_i32 = Tensor::zeros(DType::kI32, {1, 4, 2, 8});
  expect_error([&] { rope_forward(x_i32, x_i32, 0, table); }, {"rope_forward", "int32"});
}

}  // namespace
}  // namespace hyperion
