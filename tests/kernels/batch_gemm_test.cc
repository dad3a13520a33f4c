// The decode-batch path of hyperion::gemm (kernels/batch_gemm.h), checked against
// ref::gemm directly and through the public entry point.
#include "kernels/batch_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "gemm_problem.h"
#include "kernels/gemm.h"
#include "kernels/gemv.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using testing_util::Combo;
using testing_util::Problem;

const Combo kCombos[] = {
    {DType::kBF16, DType::kBF16, DType::kF32}, {DType::kBF16, DType::kBF16, DType::kBF16},
    {DType::kI8, DType::kI8, DType::kF32},     {DType::kI8, DType::kI8, DType::kBF16},
    {DType::kI8, DType::kI8, DType::kI32},     {DType::kU8, DType::kI8, DType::kF32},
    {DType::kU8, DType::kI8, DType::kBF16},    {DType::kU8, DType::kI8, DType::kI32},
};

// Whether this CPU runs the kernel for `combo` (AVX512-BF16 for bf16, AVX512-VNNI for
// int8); the tests skip what it cannot run.
bool supported(const Combo& combo) {
  GemmArgs g;
  g.trans_a = Trans::kN;
  g.trans_b = Trans::kT;
  g.m = 32;
  g.n = g.k = 64;
  g.lda = g.ldb = g.ldc = 64;
  g.a_dtype = combo.a;
  g.b_dtype = combo.b;
  g.c_dtype = combo.c;
  if (std::getenv("HYPERION_BATCH_GEMM")) return false;
  return detail::batch_gemm_applies(g);
}

// (n, k) pairs: K not a whole number of 4-byte steps (odd bf16 K, int8 K % 4 of 1..3),
// N tails of the 8-row groups, several prefetch lines per row.
const int64_t kShapes[][2] = {{1, 1},   {7, 7},    {31, 33},  {33, 30},
                              {17, 66}, {100, 99}, {9, 1001}, {300, 64}};
// One vector of rows (two accumulator sets), two (one pass: the common batch of 32), and
// two passes with a one-vector second pass (33, 48); the kernel takes any m from 1, gemm()
// only m above the GEMV's.
const int64_t kMs[] = {1, 5, 9, 16, 17, 32, 33, 48, 64};

TEST(BatchGemm, MatchesReference) {
  int variant = 0, ran = 0;
  for (const Combo& combo : kCombos) {
    if (!supported(combo)) continue;
    for (int64_t m : kMs) {
      for (const auto& nk : kShapes) {
        Problem p(combo, m, nk[0], nk[1], variant++);
        p.expect_close(p.run([](const GemmArgs& g) { detail::batch_gemm(g); }), "batch_gemm");
        p.expect_close(p.run([](const GemmArgs& g) { gemm(g); }), "gemm");
        ++ran;
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no AVX512-BF16 or AVX512-VNNI on this CPU";
}

TEST(BatchGemm, BitwiseIdenticalForAnyThreadCount) {
  const int saved = num_threads();
  int variant = 1;
  for (const Combo& combo : kCombos) {
    if (!supported(combo)) continue;
    // Enough W rows (and odd N) that two threads split it, with a group tail.
    Problem p(combo, 37, 4099, 301, variant++);
    set_num_threads(1);
    auto one = p.run([](const GemmArgs& g) { detail::batch_gemm(g); });
    set_num_threads(2);
    auto two = p.run([](const GemmArgs& g) { detail::batch_gemm(g); });
    EXPECT_EQ(one, two) << dtype_name(combo.a) << "x" << dtype_name(combo.b) << "->"
                        << dtype_name(combo.c);
    p.expect_close(two, "batch_gemm(2 threads)");
  }
  set_num_threads(saved);
}

// A K that ends inside a 4-byte step reads only the rows' own values: an Inf just past
// the end of each W row and each activation row (in the ldb and lda padding) must not
// meet the other side's zero padding and make NaN.
TEST(BatchGemm, PartialStepReadsOnlyTheRow) {
  const Combo combo{DType::kBF16, DType::kBF16, DType::kF32};
  if (!supported(combo)) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const int64_t m = 20, n = 9, k = 5, ldb = 8, lda = 7;
  const bf16 inf = f32_to_bf16(std::numeric_limits<float>::infinity());
  std::vector<bf16> a(size_t(m * lda), inf), b(size_t(n * ldb));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      a[size_t(i * lda + p)] = f32_to_bf16(float((i * k + p) % 7) * 0.25f - 0.5f);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t p = 0; p < ldb; ++p)
      b[size_t(j * ldb + p)] = p < k ? f32_to_bf16(float((j + p) % 5) - 2.0f)
                                     : f32_to_bf16(std::numeric_limits<float>::infinity());
  std::vector<float> c(size_t(m * n)), ref(size_t(m * n));
  GemmArgs g;
  g.trans_a = Trans::kN;
  g.trans_b = Trans::kT;
  g.m = m, g.n = n, g.k = k;
  g.lda = lda, g.ldb = ldb, g.ldc = n;
  g.a = a.data(), g.a_dtype = DType::kBF16;
  g.b = b.data(), g.b_dtype = DType::kBF16;
  g.c = ref.data(), g.c_dtype = DType::kF32;
  ref::gemm(g);
  g.c = c.data();
  detail::batch_gemm(g);
  for (size_t i = 0; i < c.size(); ++i) {
    ASSERT_TRUE(std::isfinite(c[i])) << "element " << i;
    EXPECT_NEAR(c[i], ref[i], 1e-5f * std::max(1.0f, std::fabs(ref[i]))) << "element " << i;
  }
}

TEST(BatchGemm, DecodeBatchesBypassOneDnn) {
  const Combo combo{DType::kBF16, DType::kBF16, DType::kF32};
  if (!supported(combo)) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  // Rows above the GEMV's, up to kBatchGemmMaxM: no oneDNN primitive is made.
  Problem p(combo, detail::kBatchGemmMaxM, 300, 200, 0);
  gemm_cache_clear();
  p.expect_close(p.run([](const GemmArgs& g) { gemm(g); }), "gemm");
  EXPECT_EQ(gemm_cache_stats().primitives, 0);
  // A prefill-sized M goes to oneDNN (or AMX tiles below their row limit: past both here).
  Problem q(combo, 2 * detail::kBatchGemmMaxM + 1, 30, 64, 0);
  q.expect_close(q.run([](const GemmArgs& g) { gemm(g); }), "gemm");
  EXPECT_EQ(gemm_cache_stats().primitives, 1);
}

TEST(BatchGemm, RejectsWhatItCannotRun) {
  const Combo combo{DType::kBF16, DType::kBF16, DType::kF32};
  if (!supported(combo)) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  GemmArgs g;
  g.trans_a = Trans::kN;
  g.trans_b = Trans::kT;
  g.m = detail::kBatchGemmMaxM + 1;
  g.n = g.k = 8;
  g.lda = g.ldb = g.ldc = 8;
  g.a_dtype = g.b_dtype = DType::kBF16;
  g.c_dtype = DType::kF32;
  EXPECT_FALSE(detail::batch_gemm_applies(g));
  EXPECT_THROW(detail::batch_gemm(g), Error);
  g.m = detail::kGemvMaxMBf16;  // the GEMV's rows stay with the GEMV
  EXPECT_FALSE(detail::batch_gemm_applies(g));
  g.m = detail::kGemvMaxMBf16 + 1;
  EXPECT_TRUE(detail::batch_gemm_applies(g));
  g.a_dtype = g.b_dtype = DType::kF32;  // f32 is oneDNN's
  g.c_dtype = DType::kF32;
  EXPECT_FALSE(detail::batch_gemm_applies(g));
}

}  // namespace
}  // namespace hyperion
