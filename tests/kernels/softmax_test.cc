#include "kernels/softmax.h"

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
#include "kernel_test_util.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Tolerance for an output of dtype `dt` relative to the reference value `ref`.
float tolerance(DType dt, float ref) {
  return dt == DType::kBF16 ? 1e-6f + std::fabs(ref) * (1.0f / 128)
                            : 1e-8f + std::fabs(ref) * 2e-5f;
}

const DType kDTypes[] = {DType::kF32, DType::kBF16};
const int64_t kCols[] = {1, 5, 7, 16, 17, 63, 100, 1000, 32003};

TEST(Softmax, ForwardMatchesReference) {
  std::mt19937 rng(1);
  for_each_target([&] {
    for (DType xt : kDTypes) {
      for (DType yt : kDTypes) {
        for (int64_t cols : kCols) {
          const int64_t rows = cols > 5000 ? 2 : 5;
          SCOPED_TRACE(fmt::format("x {} y {} cols {}", dtype_name(xt), dtype_name(yt), cols));
          Tensor x = make_tensor(xt, {rows, cols}, randn(size_t(rows * cols), rng, 3.0f));
          Tensor y(yt, {rows, cols}), y_ref(yt, {rows, cols});
          softmax_forward(x, y);
          ref::softmax_forward(x, y_ref);
          auto got = values(y), want = values(y_ref);
          for (size_t i = 0; i < got.size(); ++i)
            ASSERT_NEAR(got[i], want[i], tolerance(yt, want[i])) << "at " << i;
        }
      }
    }
  });
}

// Rows [x, 0] give p = e^x / (1 + e^x): a dense sweep of the exponential's argument
// range with an error budget of a few ulp.
TEST(Softmax, ExponentialIsAccurate) {
  const int64_t rows = 4001;
  std::vector<float> v(size_t(2 * rows));
  for (int64_t r = 0; r < rows; ++r) {
    v[size_t(2 * r)] = -85.0f * float(r) / float(rows - 1);
    v[size_t(2 * r + 1)] = 0.0f;
  }
  for_each_target([&] {
    Tensor x = make_tensor(DType::kF32, {rows, 2}, v);
    Tensor y(DType::kF32, {rows, 2});
    softmax_forward(x, y);
    for (int64_t r = 0; r < rows; ++r) {
      const double e = std::exp(double(v[size_t(2 * r)]));
      const double want = e / (1.0 + e);
      ASSERT_NEAR(y.as<float>()[2 * r], want, want * 6e-7) << "x = " << v[size_t(2 * r)];
    }
  });
}

TEST(Softmax, RowsSumToOneForLargeMagnitudes) {
  std::mt19937 rng(2);
  const int64_t rows = 4, cols = 1000;
  auto v = randn(size_t(rows * cols), rng, 1e4f);
  v[3] = 1e4f;
  v[cols + 5] = -1e4f;
  Tensor x = make_tensor(DType::kF32, {rows, cols}, v);
  Tensor y(DType::kF32, {rows, cols});
  softmax_forward(x, y);
  auto out = values(y);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const float p = out[size_t(r * cols + j)];
      ASSERT_TRUE(std::isfinite(p));
      ASSERT_GE(p, 0.0f);
      sum += p;
    }
    EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << r;
  }
}

TEST(Softmax, NegativeInfinityEntries) {
  for_each_target([&] {
    // Row 0: some -inf entries (masked); row 1: all -inf (fully masked, gives zeros).
    const int64_t cols = 37;
    std::vector<float> v(2 * cols);
    for (int64_t j = 0; j < cols; ++j) {
      v[size_t(j)] = j % 3 == 0 ? -kInf : 0.1f * float(j);
      v[size_t(cols + j)] = -kInf;
    }
    for (DType yt : kDTypes) {
      Tensor x = make_tensor(DType::kF32, {2, cols}, v);
      Tensor y(yt, {2, cols}), y_ref(yt, {2, cols});
      softmax_forward(x, y);
      ref::softmax_forward(x, y_ref);
      auto out = values(y), want = values(y_ref);
      double sum = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const float p = out[size_t(j)];
        ASSERT_FALSE(std::isnan(p)) << j;
        if (j % 3 == 0) {
          EXPECT_EQ(p, 0.0f) << j;
        }
        EXPECT_NEAR(p, want[size_t(j)], tolerance(yt, want[size_t(j)])) << j;
        sum += p;
        EXPECT_EQ(out[size_t(cols + j)], 0.0f) << "fully masked row, col " << j;
      }
      EXPECT_NEAR(sum, 1.0, yt == DType::kBF16 ? 1e-2 : 1e-5);
    }
  });
}

TEST(Softmax, NaNPropagatesToItsRowOnly) {
  const int64_t cols = 40;
  std::vector<float> v(2 * cols, 0.5f);
  v[7] = std::numeric_limits<float>::quiet_NaN();
  Tensor x = make_tensor(DType::kF32, {2, cols}, v);
  Tensor y(DType::kF32, {2, cols});
  softmax_forward(x, y);
  auto out = values(y);
  for (int64_t j = 0; j < cols; ++j) {
    EXPECT_TRUE(std::isnan(out[size_t(j)])) << j;
    EXPECT_FLOAT_EQ(out[size_t(cols + j)], 1.0f / cols) << j;
  }
}

TEST(Softmax, InPlaceMatchesSeparateBuffers) {
  std::mt19937 rng(3);
  for (DType dt : kDTypes) {
    const int64_t rows = 6, cols = 333;
    auto v = randn(size_t(rows * cols), rng);
    Tensor x = make_tensor(dt, {rows, cols}, v);
    Tensor y(dt, {rows, cols});
    softmax_forward(x, y);
    softmax_forward(x, x);
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0) << dtype_name(dt);

    Tensor dy = make_tensor(dt, {rows, cols}, randn(size_t(rows * cols), rng));
    Tensor dx(dt, {rows, cols});
    softmax_backward(y, dy, dx);
    softmax_backward(y, dy, dy);  // dx aliases dy
    EXPECT_EQ(std::memcmp(dx.data(), dy.data(), dx.nbytes()), 0) << dtype_name(dt);
  }
}

TEST(Softmax, HigherRankIsRowwise) {
  std::mt19937 rng(4);
  auto v = randn(2 * 3 * 9, rng);
  Tensor x = make_tensor(DType::kF32, {2, 3, 9}, v);
  Tensor y(DType::kF32, {2, 3, 9}), y2(DType::kF32, {6, 9});
  softmax_forward(x, y);
  softmax_forward(x.view().reshape({6, 9}), y2);
  EXPECT_EQ(std::memcmp(y.data(), y2.data(), y.nbytes()), 0);
}

TEST(Softmax, BackwardMatchesReference) {
  std::mt19937 rng(5);
  for_each_target([&] {
    for (DType yt : kDTypes) {
      for (DType gt : kDTypes) {
        for (DType ot : kDTypes) {
          for (int64_t cols : {1, 7, 17, 100, 1000}) {
            const int64_t rows = 3;
            SCOPED_TRACE(fmt::format("y {} dy {} dx {} cols {}", dtype_name(yt), dtype_name(gt),
                                     dtype_name(ot), cols));
            Tensor x = make_tensor(DType::kF32, {rows, cols}, randn(size_t(rows * cols), rng, 2));
            Tensor y(yt, {rows, cols});
            softmax_forward(x, y);
            Tensor dy = make_tensor(gt, {rows, cols}, randn(size_t(rows * cols), rng));
            Tensor dx(ot, {rows, cols}), dx_ref(ot, {rows, cols});
            softmax_backward(y, dy, dx);
            ref::softmax_backward(y, dy, dx_ref);
            auto got = values(dx), want = values(dx_ref);
            // The f32 path differs from the double reference by the rounding of
            // sum(y * dy); bound it by the magnitudes involved.
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_NEAR(got[i], want[i], tolerance(ot, want[i]) + 1e-6f) << "at " << i;
          }
        }
      }
    }
  });
}

// Central differences of L(x) = sum(softmax(x) * w): the analytic gradient is
// softmax_backward(y, dy = w).
TEST(Softmax, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(6);
  const int64_t rows = 3, cols = 7;
  auto xv = randn(size_t(rows * cols), rng);
  auto w = randn(size_t(rows * cols), rng);
  auto loss = [&](const std::vector<float>& xs) {
    Tensor x = make_tensor(DType::kF32, {rows, cols}, xs);
    Tensor y(DType::kF32, {rows, cols});
    softmax_forward(x, y);
    double l = 0;
    for (size_t i = 0; i < xs.size(); ++i) l += double(y.as<float>()[i]) * w[i];
    return l;
  };
  Tensor x = make_tensor(DType::kF32, {rows, cols}, xv);
  Tensor y(DType::kF32, {rows, cols});
  softmax_forward(x, y);
  Tensor dy = make_tensor(DType::kF32, {rows, cols}, w);
  Tensor dx(DType::kF32, {rows, cols});
  softmax_backward(y, dy, dx);
  const float h = 1e-2f;
  for (size_t i = 0; i < xv.size(); ++i) {
    auto plus = xv, minus = xv;
    plus[i] += h;
    minus[i] -= h;
    const double numeric = (loss(plus) - loss(minus)) / (double(plus[i]) - double(minus[i]));
    EXPECT_NEAR(dx.as<float>()[i], numeric, 2e-4) << "at " << i;
  }
}

TEST(Softmax, ErrorsNameTheOp) {
  Tensor x(DType::kF32, {4, 8}), y(DType::kF32, {4, 9}), i32(DType::kI32, {4, 8});
  std::string msg = error_message([&] { softmax_forward(x, y); });
  EXPECT_NE(msg.find("softmax_forward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[4, 8]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[4, 9]"), std::string::npos) << msg;
  msg = error_message([&] { softmax_forward(i32, x); });
  EXPECT_NE(msg.find("softmax_forward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("int32"), std::string::npos) << msg;
  // Non-contiguous view (every other row).
  Tensor big(DType::kF32, {8, 8});
  TensorView strided(big.data(), DType::kF32, {4, 8}, {16, 1});
  EXPECT_THROW(softmax_forward(strided, x), Error);
  // Partial overlap (shifted by one element) is rejected; exact aliasing is fine.
  TensorView shifted(static_cast<float*>(big.data()) + 1, DType::kF32, {4, 8});
  TensorView base(big.data(), DType::kF32, {4, 8});
  msg = error_message([&] { softmax_forward(base, shifted); });
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;

  Tensor g(DType::kF32, {4, 8}), d(DType::kF32, {3, 8});
  msg = error_message([&] { softmax_backward(x, g, d); });
  EXPECT_NE(msg.find("softmax_backward"), std::string::npos) << msg;
  EXPECT_THROW(softmax_backward(x, i32, g), Error);
}

TEST(Softmax, EmptyTensorsAreNoOps) {
  Tensor x(DType::kF32, {0, 8}), y(DType::kF32, {0, 8});
  softmax_forward(x, y);
  softmax_backward(y, x, y);
  Tensor x2(DType::kF32, {3, 0}), y2(DType::kF32, {3, 0});
  softmax_forward(x2, y2);
}

}  // namespace
}  // namespace hyperion
