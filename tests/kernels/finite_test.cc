#include "kernels/finite.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernel_test_util.h"

namespace hyperion {
namespace {

using namespace testing_util;

TEST(FirstNonfinite, MatchesTheReferenceOnEveryTargetAndDtype) {
  std::mt19937 rng(7);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // Sizes around vector widths and the 65536-element chunk; positions at the ends, in a
  // vector tail, at chunk boundaries.
  for (const int64_t n : {1, 7, 16, 33, 65535, 65536, 65537, 200003}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      for (const int64_t at : {int64_t{-1}, int64_t{0}, n - 1, n / 2, int64_t{65536}}) {
        if (at >= n) continue;
        for (const float bad : {nan, inf, -inf}) {
          Tensor t = random_tensor(dtype, {n}, rng, 1e3f);
          if (at >= 0) {
            if (dtype == DType::kF32)
              t.as<float>()[at] = bad;
            else
              t.as<bf16>()[at] = f32_to_bf16(bad);
            // A later bad value must not win over the first.
            if (at + 3 < n) {
              if (dtype == DType::kF32)
                t.as<float>()[at + 3] = nan;
              else
                t.as<bf16>()[at + 3] = f32_to_bf16(nan);
            }
          }
          EXPECT_EQ(ref::first_nonfinite(t.view()), at) << n << " " << at;
          for_each_target([&] {
            for (int threads : {1, 2}) {
              RestoreNumThreads restore;
              set_num_threads(threads);
              EXPECT_EQ(first_nonfinite(t.view()), at) << n << " at " << at << " threads "
                                                       << threads;
            }
          });
        }
      }
    }
  }
}

TEST(FirstNonfinite, LargestFiniteValuesAreFiniteAndBadInputsAreNamed) {
  Tensor t(DType::kF32, {4});
  t.as<float>()[0] = std::numeric_limits<float>::max();
  t.as<float>()[1] = -std::numeric_limits<float>::max();
  t.as<float>()[2] = std::numeric_limits<float>::denorm_min();
  t.as<float>()[3] = 0.0f;
  EXPECT_EQ(first_nonfinite(t.view()), -1);
  Tensor ids(DType::kI32, {4});
  EXPECT_NE(error_message([&] { first_nonfinite(ids.view()); }).find("first_nonfinite"),
            std::string::npos);
  Tensor empty(DType::kF32, {0});
  EXPECT_EQ(first_nonfinite(empty.view()), -1);
}

}  // namespace
}  // namespace hyperion
