#include "kernels/rmsnorm.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "kernel_test_util.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

// f32 results agree with the f64 reference to a few ulp. bf16 results are the f32 value
// rounded once, so they are within one bf16 ulp (relative 2^-8) of the rounded reference.
double rel_tol(DType dtype) {
  return dtype == DType::kF32 ? 2e-5 : 1.0 / 128;
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {1, 1}, {3, 7}, {5, 17}, {4, 33}, {2, 63}, {3, 100}, {2, 1000}, {37, 64}, {9, 129}};

TEST(RmsNorm, ForwardMatchesReference) {
  std::mt19937 rng(1);
  for_each_target([&] {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (auto [n, h] : kShapes) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " N=" << n << " H=" << h);
        Tensor x = random_normal_tensor(dt, {n, h}, rng, 0.3f, 2.0f);
        Tensor w = random_normal_tensor(DType::kF32, {h}, rng, 1.0f, 0.2f);
        Tensor y(dt, {n, h}), y_ref(dt, {n, h});
        Tensor rstd(DType::kF32, {n}), rstd_ref(DType::kF32, {n});
        rmsnorm_forward(x, w, 1e-5f, y, rstd);
        ref::rmsnorm_forward(x, w, 1e-5f, y_ref, rstd_ref);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_NEAR(at(rstd, i), at(rstd_ref, i), 2e-5 * std::fabs(at(rstd_ref, i)));
        for (int64_t i = 0; i < n * h; ++i)
          ASSERT_NEAR(at(y, i), at(y_ref, i), rel_tol(dt) * std::fabs(at(y_ref, i)) + 1e-6) << i;
      }
    }
  });
}

TEST(RmsNorm, ForwardInPlaceMatchesOutOfPlace) {
  std::mt19937 rng(2);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor x = random_tensor(dt, {6, 45}, rng);
    Tensor w = random_normal_tensor(DType::kF32, {45}, rng, 1.0f, 0.2f);
    Tensor y(dt, {6, 45}), rstd(DType::kF32, {6});
    rmsnorm_forward(x, w, 1e-6f, y, rstd);
    rmsnorm_forward(x, w, 1e-6f, x, rstd);
    EXPECT_TRUE(bitwise_equal(x, y)) << dtype_name(dt);
  }
}

TEST(RmsNorm, BackwardMatchesReferenceAndAccumulates) {
  std::mt19937 rng(3);
  for_each_target([&] {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (auto [n, h] : kShapes) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " N=" << n << " H=" << h);
        Tensor x = random_normal_tensor(dt, {n, h}, rng, 0.1f, 1.5f);
        Tensor w = random_normal_tensor(DType::kF32, {h}, rng, 1.0f, 0.3f);
        Tensor dy = random_tensor(dt, {n, h}, rng);
        Tensor y(dt, {n, h}), rstd(DType::kF32, {n});
        rmsnorm_forward(x, w, 1e-5f, y, rstd);
        // dweight starts non-zero: the kernel must add to it.
        Tensor dw = random_tensor(DType::kF32, {h}, rng);
        Tensor dw_ref = dw.clone();
        Tensor dx(dt, {n, h}), dx_ref(dt, {n, h});
        rmsnorm_backward(dy, x, w, rstd, dx, dw);
        ref::rmsnorm_backward(dy, x, w, rstd, dx_ref, dw_ref);
        for (int64_t i = 0; i < n * h; ++i)
          ASSERT_NEAR(at(dx, i), at(dx_ref, i), rel_tol(dt) * std::fabs(at(dx_ref, i)) + 1e-4) << i;
        for (int64_t j = 0; j < h; ++j)
          ASSERT_NEAR(at(dw, j), at(dw_ref, j), 1e-4 * (1 + std::fabs(at(dw_ref, j)))) << j;
      }
    }
  });
}

// f64 forward written independently of the kernel: L = sum(y * r).
double loss_f64(const std::vector<double>& x, const std::vector<double>& w,
                const std::vector<double>& r, int64_t n, int64_t h, double eps,
                double offset = 0.0) {
  double loss = 0;
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < h; ++j) ss += x[i * h + j] * x[i * h + j];
    const double rs = 1.0 / std::sqrt(ss / double(h) + eps);
    for (int64_t j = 0; j < h; ++j) loss += x[i * h + j] * rs * (w[j] + offset) * r[i * h + j];
  }
  return loss;
}

TEST(RmsNorm, ForwardF32InputBf16OutputEqualsRoundedF32Output) {
  std::mt19937 rng(11);
  for_each_target([&] {
    for (auto [n, h] : kShapes) {
      Tensor x = random_normal_tensor(DType::kF32, {n, h}, rng, 0.2f, 1.5f);
      Tensor w = random_normal_tensor(DType::kF32, {h}, rng, 1.0f, 0.2f);
      Tensor y32(DType::kF32, {n, h}), y16(DType::kBF16, {n, h}), y_ref(DType::kBF16, {n, h});
      Tensor rstd(DType::kF32, {n}), rstd_ref(DType::kF32, {n});
      rmsnorm_forward(x, w, 1e-5f, y32, rstd);
      rmsnorm_forward(x, w, 1e-5f, y16, rstd);
      ref::rmsnorm_forward(x, w, 1e-5f, y_ref, rstd_ref);
      for (int64_t i = 0; i < n * h; ++i) {
        ASSERT_EQ(y16.as<bf16>()[i].bits, f32_to_bf16(y32.as<float>()[i]).bits) << i;
        ASSERT_NEAR(at(y16, i), at(y_ref, i),
                    rel_tol(DType::kBF16) * std::fabs(at(y_ref, i)) + 1e-6);
      }
    }
  });
}

TEST(RmsNorm, BackwardAccumulateAddsToDx) {
  std::mt19937 rng(12);
  for_each_target([&] {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (auto [n, h] : kShapes) {
        Tensor x = random_normal_tensor(dt, {n, h}, rng, 0.1f, 1.5f);
        Tensor w = random_normal_tensor(DType::kF32, {h}, rng, 1.0f, 0.3f);
        Tensor dy = random_tensor(dt, {n, h}, rng);
        Tensor y(dt, {n, h}), rstd(DType::kF32, {n});
        rmsnorm_forward(x, w, 1e-5f, y, rstd);
        Tensor base = random_tensor(dt, {n, h}, rng);
        Tensor dx_acc = base.clone(), dx_ref = base.clone(), dx_plain(dt, {n, h});
        Tensor dw1 = Tensor::zeros(DType::kF32, {h}), dw2 = Tensor::zeros(DType::kF32, {h});
        Tensor dw3 = Tensor::zeros(DType::kF32, {h});
        rmsnorm_backward(dy, x, w, rstd, dx_plain, dw1);
        rmsnorm_backward(dy, x, w, rstd, dx_acc, dw2, /*accumulate_dx=*/true);
        ref::rmsnorm_backward(dy, x, w, rstd, dx_ref, dw3, /*accumulate_dx=*/true);
        EXPECT_TRUE(bitwise_equal(dw1, dw2));
        for (int64_t i = 0; i < n * h; ++i) {
          const double want = at(base, i) + at(dx_plain, i);
          ASSERT_NEAR(at(dx_acc, i), want, rel_tol(dt) * (std::fabs(want) + 1) + 1e-5) << i;
          ASSERT_NEAR(at(dx_acc, i), at(dx_ref, i), rel_tol(dt) * (std::fabs(want) + 1) + 1e-4);
        }
      }
    }
  });
  Tensor x(DType::kF32, {2, 4}), w = Tensor::zeros(DType::kF32, {4}), r(DType::kF32, {2});
  Tensor dw = Tensor::zeros(DType::kF32, {4});
  EXPECT_THROW(rmsnorm_backward(x, x, w, r, x, dw, true), Error);
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(4);
  const float eps = 1e-5f;
  for (auto [n, h] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 5}, {2, 8}, {2, 19}}) {
    SCOPED_TRACE(testing::Message() << "N=" << n << " H=" << h);
    Tensor x = random_normal_tensor(DType::kF32, {n, h}, rng, 0.2f, 1.0f);
    Tensor w = random_normal_tensor(DType::kF32, {h}, rng, 1.0f, 0.3f);
    Tensor r = random_tensor(DType::kF32, {n, h}, rng);
    Tensor y(DType::kF32, {n, h}), rstd(DType::kF32, {n});
    rmsnorm_forward(x, w, eps, y, rstd);
    Tensor dx(DType::kF32, {n, h});
    Tensor dw = Tensor::zeros(DType::kF32, {h});
    rmsnorm_backward(r, x, w, rstd, dx, dw);

    std::vector<double> xd(x.as<float>(), x.as<float>() + n * h);
    std::vector<double> wd(w.as<float>(), w.as<float>() + h);
    std::vector<double> rd(r.as<float>(), r.as<float>() + n * h);
    const double step = 1e-6;
    for (int64_t i = 0; i < n * h; ++i) {
      const double keep = xd[i];
      xd[i] = keep + step;
      const double lp = loss_f64(xd, wd, rd, n, h, eps);
      xd[i] = keep - step;
      const double lm = loss_f64(xd, wd, rd, n, h, eps);
      xd[i] = keep;
      const double fd = (lp - lm) / (2 * step);
      EXPECT_NEAR(at(dx, i), fd, 1e-4 * (1 + std::fabs(fd))) << "dx " << i;
    }
    for (int64_t j = 0; j < h; ++j) {
      const double keep = wd[j];
      wd[j] = keep + step;
      const double lp = loss_f64(xd, wd, rd, n, h, eps);
      wd[j] = keep - step;
      const double lm = loss_f64(xd, wd, rd, n, h, eps);
      wd[j] = keep;
      const double fd = (lp - lm) / (2 * step);
      EXPECT_NEAR(at(dw, j), fd, 1e-4 * (1 + std::fabs(fd))) << "dweight " << j;
    }
  }
}

// Gemma's (1 + w): forward and backward against the reference, and the gradients
// against finite differences of the f64 loss with the offset weight.
TEST(RmsNorm, WeightOffsetMatchesReferenceAndFiniteDifferences) {
  std::mt19937 rng(5);
  const float eps = 1e-6f;
  for_each_target([&] {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (auto [n, h] : std::vector<std::pair<int64_t, int64_t>>{{3, 7}, {4, 33}, {2, 100}}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " N=" << n << " H=" << h);
        Tensor x = random_normal_tensor(dt, {n, h}, rng, 0.1f, 1.5f);
        Tensor w = random_normal_tensor(DType::kF32, {h}, rng, 0.0f, 0.3f);
        Tensor dy = random_tensor(dt, {n, h}, rng);
        Tensor y(dt, {n, h}), y_ref(dt, {n, h}), rstd(DType::kF32, {n}), rs_ref(DType::kF32, {n});
        rmsnorm_forward(x, w, eps, y, rstd, 1.0f);
        ref::rmsnorm_forward(x, w, eps, y_ref, rs_ref, 1.0f);
        for (int64_t i = 0; i < n * h; ++i)
          ASSERT_NEAR(at(y, i), at(y_ref, i), rel_tol(dt) * std::fabs(at(y_ref, i)) + 1e-6) << i;
        Tensor dw = Tensor::zeros(DType::kF32, {h}), dw_ref = Tensor::zeros(DType::kF32, {h});
        Tensor dx(dt, {n, h}), dx_ref(dt, {n, h});
        rmsnorm_backward(dy, x, w, rstd, dx, dw, false, 1.0f);
        ref::rmsnorm_backward(dy, x, w, rstd, dx_ref, dw_ref, false, 1.0f);
        for (int64_t i = 0; i < n * h; ++i)
          ASSERT_NEAR(at(dx, i), at(dx_ref, i), rel_tol(dt) * std::fabs(at(dx_ref, i)) + 1e-4) << i;
        for (int64_t j = 0; j < h; ++j)
          ASSERT_NEAR(at(dw, j), at(dw_ref, j), 1e-4 * (1 + std::fabs(at(dw_ref, j)))) << j;
      }
    }
  });
  const int64_t n = 2, h = 9;
  Tensor x = random_normal_tensor(DType::kF32, {n, h}, rng, 0.2f, 1.0f);
  Tensor w = random_normal_tensor(DType::kF32, {h}, rng, 0.0f, 0.3f);
  Tensor r = random_tensor(DType::kF32, {n, h}, rng);
  Tensor y(DType::kF32, {n, h}), rstd(DType::kF32, {n}), dx(DType::kF32, {n, h});
  Tensor dw = Tensor::zeros(DType::kF32, {h});
  rmsnorm_forward(x, w, eps, y, rstd, 1.0f);
  rmsnorm_backward(r, x, w, rstd, dx, dw, false, 1.0f);
  std::vector<double> xd(x.as<float>(), x.as<float>() + n * h);
  std::vector<double> wd(w.as<float>(), w.as<float>() + h);
  std::vector<double> rd(r.as<float>(), r.as<float>() + n * h);
  const double step = 1e-6;
  auto fd = [&](std::vector<double>& v, size_t i) {
    const double keep = v[i];
    v[i] = keep + step;
    const double lp = loss_f64(xd, wd, rd, n, h, eps, 1.0);
    v[i] = keep - step;
    const double lm = loss_f64(xd, wd, rd, n, h, eps, 1.0);
    v[i] = keep;
    return (lp - lm) / (2 * step);
  };
  for (int64_t i = 0; i < n * h; ++i) {
    const double g = fd(xd, static_cast<size_t>(i));
    EXPECT_NEAR(at(dx, i), g, 1e-4 * (1 + std::fabs(g))) << "dx " << i;
  }
  for (int64_t j = 0; j < h; ++j) {
    const double g = fd(wd, static_cast<size_t>(j));
    EXPECT_NEAR(at(dw, j), g, 1e-4 * (1 + std::fabs(g))) << "dweight " << j;
  }
}

TEST(RmsNorm, ResultsIndependentOfThreadCount) {
  const RestoreNumThreads restore_threads;
  for (auto [n, h] : std::vector<std::pair<int64_t, int64_t>>{{256, 300}, {64, 4096}, {3, 17}}) {
    std::mt19937 rng(5);
    Tensor x = random_tensor(DType::kBF16, {n, h}, rng);
    Tensor w = random_normal_tensor(DType::kF32, {h}, rng, 1.0f, 0.2f);
    Tensor dy = random_tensor(DType::kBF16, {n, h}, rng);
    Tensor y[2] = {Tensor(DType::kBF16, {n, h}), Tensor(DType::kBF16, {n, h})};
    Tensor dx[2] = {Tensor(DType::kBF16, {n, h}), Tensor(DType::kBF16, {n, h})};
    Tensor rstd[2] = {Tensor(DType::kF32, {n}), Tensor(DType::kF32, {n})};
    Tensor dw[2] = {Tensor::zeros(DType::kF32, {h}), Tensor::zeros(DType::kF32, {h})};
    for (int k = 0; k < 2; ++k) {
      set_num_threads(k + 1);
      rmsnorm_forward(x, w, 1e-5f, y[k], rstd[k]);
      rmsnorm_backward(dy, x, w, rstd[k], dx[k], dw[k]);
    }
    EXPECT_TRUE(bitwise_equal(y[0], y[1]));
    EXPECT_TRUE(bitwise_equal(rstd[0], rstd[1]));
    EXPECT_TRUE(bitwise_equal(dx[0], dx[1]));
    EXPECT_TRUE(bitwise_equal(dw[0], dw[1])) << "N=" << n << " H=" << h;
  }
}

TEST(RmsNorm, ErrorsNameTheOpAndShapes) {
  Tensor x = Tensor::zeros(DType::kF32, {4, 64});
  Tensor y = Tensor::zeros(DType::kF32, {4, 64});
  Tensor w = Tensor::zeros(DType::kF32, {64});
  Tensor w_bad = Tensor::zeros(DType::kF32, {32});
  Tensor rstd = Tensor::zeros(DType::kF32, {4});
  Tensor rstd_bad = Tensor::zeros(DType::kF32, {5});
  Tensor y_bf16 = Tensor::zeros(DType::kBF16, {4, 64});
  Tensor x_i32 = Tensor::zeros(DType::kI32, {4, 64});
  Tensor x3 = Tensor::zeros(DType::kF32, {2, 2, 64});
  Tensor w_bf16 = Tensor::zeros(DType::kBF16, {64});
  expect_error([&] { rmsnorm_forward(x, w_bad, 1e-5f, y, rstd); },
               {"rmsnorm_forward", "f32[4, 64]", "f32[32]", "hidden size"});
  // f32 x -> bf16 y is allowed (residual stream into a bf16 matmul); bf16 -> f32 is not.
  expect_error([&] { rmsnorm_forward(y_bf16, w, 1e-5f, y, rstd); },
               {"rmsnorm_forward", "bf16[4, 64]"});
  expect_error([&] { rmsnorm_forward(x, w, 1e-5f, y, rstd_bad); }, {"rmsnorm_forward", "f32[5]"});
  expect_error([&] { rmsnorm_forward(x_i32, w, 1e-5f, x_i32, rstd); },
               {"rmsnorm_forward", "int32"});
  expect_error([&] { rmsnorm_forward(x3, w, 1e-5f, x3, rstd); }, {"rmsnorm_forward", "rank"});
  expect_error([&] { rmsnorm_forward(x, w_bf16, 1e-5f, y, rstd); }, {"rmsnorm_forward"});
  expect_error([&] { rmsnorm_forward(x, w, -1.0f, y, rstd); }, {"rmsnorm_forward", "eps"});
  Tensor dw_bad = Tensor::zeros(DType::kF32, {63});
  Tensor dx = Tensor::zeros(DType::kF32, {4, 64});
  Tensor dy_bad = Tensor::zeros(DType::kF32, {4, 65});
  expect_error([&] { rmsnorm_backward(y, x, w, rstd, dx, dw_bad); },
               {"rmsnorm_backward", "f32[63]"});
  expect_error([&] { rmsnorm_backward(dy_bad, x, w, rstd, dx, w); },
               {"rmsnorm_backward", "f32[4, 65]"});
  EXPECT_THROW(ref::rmsnorm_forward(x, w_bad, 1e-5f, y, rstd), Error);
}

}  // namespace
}  // namespace hyperion
