#include "kernels/grouped_gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/gemm.h"

namespace hyperion {
namespace {

using namespace testing_util;

// Group layouts: balanced, empty groups, one group taking every row, sizes that are not
// multiples of any tile, a single row, and groups above the chunk size (512 rows) and the
// threaded-group threshold (lowered by the test to 2000 rows) beside small ones.
const std::vector<std::vector<int64_t>> kLayouts = {
    {16, 16, 16, 16}, {0, 37, 0, 11},         {0, 0, 53, 0}, {7, 1, 29, 3, 17}, {1},
    {0, 0, 0},        {4101, 600, 0, 1030, 3}};

double tol(DType d) {
  return d == DType::kF32 ? 2e-5 : 1.0 / 64;
}

void expect_close(const Tensor& got, const Tensor& want, double rel) {
  ASSERT_EQ(got.numel(), want.numel());
  for (int64_t i = 0; i < got.numel(); ++i)
    ASSERT_NEAR(at(got, i), at(want, i), rel * (1 + std::fabs(at(want, i)))) << "element " << i;
}

TEST(GroupedGemm, ForwardInputAndWeightGradsMatchReference) {
  // Groups of >= 2000 rows use every thread, smaller ones run side by side.
  const double saved = set_threaded_group_flops(2000.0 * 2 * 24 * 40);
  std::mt19937 rng(5);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const auto& sizes : kLayouts) {
      int64_t m = 0;
      for (int64_t s : sizes) m += s;
      const int64_t g = static_cast<int64_t>(sizes.size()), n = 24, k = 40;
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " groups " << g << " rows " << m);
      Tensor a = random_tensor(dt, {m, k}, rng), w = random_tensor(dt, {g, n, k}, rng);
      Tensor dc = random_tensor(dt, {m, n}, rng);
      // Forward, with beta = 1 accumulating into an f32 output.
      Tensor c = random_tensor(DType::kF32, {m, n}, rng);
      Tensor c_ref = c.clone();
      grouped_gemm(a, w, sizes, c, 1.0f);
      ref::grouped_gemm(a, w, sizes, c_ref, 1.0f);
      expect_close(c, c_ref, tol(dt));
      // Input gradient.
      Tensor da(DType::kF32, {m, k}), da_ref(DType::kF32, {m, k});
      grouped_gemm_input_grad(dc, w, sizes, da);
      ref::grouped_gemm_input_grad(dc, w, sizes, da_ref);
      expect_close(da, da_ref, tol(dt));
      // Weight gradient accumulates; empty groups stay untouched.
      Tensor dw = random_tensor(DType::kF32, {g, n, k}, rng);
      Tensor dw_ref = dw.clone(), dw_before = dw.clone();
      grouped_gemm_weight_grad(a, dc, sizes, dw);
      ref::grouped_gemm_weight_grad(a, dc, sizes, dw_ref);
      // The weight gradient sums over a group's rows: f32 rounding grows with sqrt(rows).
      expect_close(dw, dw_ref, tol(dt) * std::sqrt(std::max(1.0, double(m) / 256)));
      for (int64_t gi = 0; gi < g; ++gi) {
        if (sizes[size_t(gi)] != 0) continue;
        for (int64_t i = gi * n * k; i < (gi + 1) * n * k; ++i) {
          ASSERT_EQ(dw.as<float>()[i], dw_before.as<float>()[i]);
        }
      }
    }
  }
  set_threaded_group_flops(saved);
}

TEST(GroupedGemm, EqualsOneDenseGemmPerGroup) {
  // Every row routed to one group: the grouped product is that expert's dense product.
  std::mt19937 rng(6);
  Tensor a = random_tensor(DType::kF32, {33, 16}, rng),
         w = random_tensor(DType::kF32, {3, 8, 16}, rng);
  Tensor c(DType::kF32, {33, 8}), dense(DType::kF32, {33, 8});
  const std::vector<int64_t> sizes = {0, 33, 0};
  grouped_gemm(a, w, sizes, c);
  ref::gemm(GemmArgs{Trans::kN, Trans::kT, 33, 8, 16, a.data(), DType::kF32, 16,
                     w.as<float>() + 8 * 16, DType::kF32, 16, dense.data(), DType::kF32, 8});
  expect_close(c, dense, 2e-5);
}

TEST(GroupedGemm, ErrorsNameTheOpAndShapes) {
  Tensor a = Tensor::zeros(DType::kF32, {10, 4}), w = Tensor::zeros(DType::kF32, {2, 3, 4});
  Tensor c = Tensor::zeros(DType::kF32, {10, 3});
  expect_error(
      [&] {
        grouped_gemm(a, w, std::vector<int64_t>{4, 5}, c);
      },
      {"grouped_gemm", "add up to 9"});
  expect_error([&] { grouped_gemm(a, w, std::vector<int64_t>{10}, c); },
               {"grouped_gemm", "1 group"});
  expect_error([&] { grouped_gemm(a, w, std::vector<int64_t>{-1, 11}, c); }, {"negative"});
  Tensor wb = Tensor::zeros(DType::kBF16, {2, 3, 4});
  expect_error([&] { grouped_gemm(a, wb, std::vector<int64_t>{5, 5}, c); }, {"f32 or both bf16"});
  Tensor c_bad = Tensor::zeros(DType::kF32, {10, 4});
  expect_error([&] { grouped_gemm(a, w, std::vector<int64_t>{5, 5}, c_bad); }, {"disagree"});
}

}  // namespace
}  // namespace hyperion
