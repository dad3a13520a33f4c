// The decode-shaped path of hyperion::gemm (kernels/gemv.h), checked against ref::gemm
// through the public entry point and, for each instruction-set variant, directly.
#include "kernels/gemv.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "base/cpu.h"
#include "base/threads.h"
#include "gemm_problem.h"
#include "kernels/gemm.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using detail::GemvIsa;
using testing_util::Combo;
using testing_util::Problem;

const Combo kCombos[] = {
    {DType::kF32, DType::kF32, DType::kF32},    {DType::kBF16, DType::kBF16, DType::kF32},
    {DType::kBF16, DType::kBF16, DType::kBF16}, {DType::kI8, DType::kI8, DType::kF32},
    {DType::kI8, DType::kI8, DType::kBF16},     {DType::kI8, DType::kI8, DType::kI32},
    {DType::kU8, DType::kI8, DType::kF32},      {DType::kU8, DType::kI8, DType::kI32},
};

// The instruction sets this CPU can run: AVX2 kernels need AVX2 + FMA (on an AVX-512 CPU
// they are what a CPU without AVX-512 runs).
std::vector<GemvIsa> isas() {
  std::vector<GemvIsa> v = {GemvIsa::kAuto, GemvIsa::kAvx512, GemvIsa::kPortable};
  if (cpu_features().avx2 && cpu_features().fma) v.push_back(GemvIsa::kAvx2);
  return v;
}

const char* isa_name(GemvIsa isa) {
  return isa == GemvIsa::kAuto     ? "gemv(auto)"
         : isa == GemvIsa::kAvx512 ? "gemv(avx512)"
         : isa == GemvIsa::kAvx2   ? "gemv(avx2)"
                                   : "gemv(portable)";
}

struct IsaGuard {
  explicit IsaGuard(GemvIsa isa) { detail::set_gemv_isa_for_testing(isa); }
  ~IsaGuard() { detail::set_gemv_isa_for_testing(GemvIsa::kAuto); }
};

// (n, k) pairs covering SIMD tails of every width (16 f32, 32 bf16, 64 int8) and the
// row-group tail (N not a multiple of 4 or 2).
const int64_t kShapes[][2] = {{1, 1},     {7, 7},      {31, 33},  {33, 31},
                              {100, 100}, {7, 1000},   {1000, 7}, {33, 2049},
                              {2049, 33}, {100, 1000}, {1, 2049}, {2049, 1}};
const int64_t kMs[] = {1, 2, 3, 5, 8, 19};  // 19: blocks of 8 rows (8, 8, 3)

TEST(Gemv, MatchesReferenceOnEveryPath) {
  int variant = 0;
  for (const Combo& combo : kCombos) {
    for (int64_t m : kMs) {
      for (const auto& nk : kShapes) {
        Problem p(combo, m, nk[0], nk[1], variant++);
        p.expect_close(p.run([](const GemmArgs& g) { gemm(g); }), "gemm");
        for (GemvIsa isa : isas()) {
          IsaGuard guard(isa);
          p.expect_close(p.run([](const GemmArgs& g) { detail::gemv(g); }), isa_name(isa));
        }
      }
    }
  }
}

TEST(Gemv, BitwiseIdenticalForAnyThreadCount) {
  const int saved = num_threads();
  int variant = 1;
  for (const Combo& combo : kCombos) {
    // Enough W rows (and odd N) that two threads split it, with a group tail.
    Problem p(combo, combo.b == DType::kI8 ? 5 : 3, 4099, 301, variant++);
    for (GemvIsa isa : isas()) {
      IsaGuard guard(isa);
      set_num_threads(1);
      auto one = p.run([](const GemmArgs& g) { detail::gemv(g); });
      set_num_threads(2);
      auto two = p.run([](const GemmArgs& g) { detail::gemv(g); });
      EXPECT_EQ(one, two) << dtype_name(combo.a) << "x" << dtype_name(combo.b) << "->"
                          << dtype_name(combo.c);
      p.expect_close(two, "gemv(2 threads)");
    }
  }
  set_num_threads(saved);
}

// Products at the int8 extremes, whose pair sums overflow int16 (255 * 127 * 2 > 32767):
// every path's int32 sums are exact, none saturates as vpmaddubsw does.
TEST(Gemv, Int8ExtremesSumExactly) {
  const int64_t m = 3, n = 5, k = 1001;
  std::vector<uint8_t> a(size_t(m * k), 255);
  std::vector<int8_t> w(size_t(n * k));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t p = 0; p < k; ++p) w[size_t(j * k + p)] = int8_t(p % 2 == 0 ? 127 : -128 + j);
  for (GemvIsa isa : isas()) {
    IsaGuard guard(isa);
    std::vector<int32_t> c(size_t(m * n), 0);
    GemmArgs g = contiguous_gemm_args(Trans::kN, Trans::kT, m, n, k, a.data(), DType::kU8,
                                      w.data(), DType::kI8, c.data(), DType::kI32);
    detail::gemv(g);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t odd = k / 2, even = k - odd;
      const int32_t want = int32_t(255 * (127 * even + (-128 + j) * odd));
      for (int64_t i = 0; i < m; ++i)
        EXPECT_EQ(c[size_t(i * n + j)], want) << isa_name(isa) << " row " << i << " col " << j;
    }
  }
}

TEST(Gemv, RoutingCondition) {
  GemmArgs g;
  g.trans_a = Trans::kN;
  g.trans_b = Trans::kT;
  g.m = 1;
  g.n = g.k = 64;
  g.lda = g.ldb = g.ldc = 64;
  g.a_dtype = g.b_dtype = DType::kBF16;
  g.c_dtype = DType::kBF16;
  if (std::getenv("HYPERION_GEMV")) GTEST_SKIP() << "HYPERION_GEMV is set";
  EXPECT_TRUE(detail::gemv_applies(g));
  // Rows: bf16 hands M > 4 to AMX or the batch GEMM and f32 / int8 M > 8 to those or
  // oneDNN, on AVX-512; the AVX2 kernels keep up to 8 of f32 and bf16, 64 of int8.
  const CpuFeatures& f = cpu_features();
  const bool avx2_kernels = !(f.avx512f && f.avx512bw && f.avx512vl) && f.avx2 && f.fma;
  EXPECT_EQ(detail::gemv_max_rows(g), avx2_kernels ? detail::kGemvMaxM : detail::kGemvMaxMBf16);
  GemmArgs t = g;
  t.m = detail::gemv_max_rows(g) + 1;
  EXPECT_FALSE(detail::gemv_applies(t));
  t.m = detail::gemv_max_rows(g);
  EXPECT_TRUE(detail::gemv_applies(t));
  t.a_dtype = t.b_dtype = t.c_dtype = DType::kF32;
  EXPECT_EQ(detail::gemv_max_rows(t), detail::kGemvMaxM);
  t.m = detail::gemv_max_rows(t);
  EXPECT_TRUE(detail::gemv_applies(t));
  t.a_dtype = t.b_dtype = DType::kI8;
  EXPECT_EQ(detail::gemv_max_rows(t), avx2_kernels ? detail::kGemvMaxMAvx2 : detail::kGemvMaxM);
  t.m = detail::gemv_max_rows(t);
  EXPECT_TRUE(detail::gemv_applies(t));
  t.m += 1;
  EXPECT_FALSE(detail::gemv_applies(t));
  t = g;
  t.trans_b = Trans::kN;
  EXPECT_FALSE(detail::gemv_applies(t));
  t = g;
  t.trans_a = Trans::kT;
  EXPECT_FALSE(detail::gemv_applies(t));
  t = g;
  t.batch = 2;
  EXPECT_FALSE(detail::gemv_applies(t));
  t = g;
  t.a_dtype = DType::kF32;  // mixed dtypes are not a supported combination
  EXPECT_FALSE(detail::gemv_applies(t));
}

TEST(Gemv, DecodeShapesBypassOneDnn) {
  if (std::getenv("HYPERION_GEMV")) GTEST_SKIP() << "HYPERION_GEMV is set";
  Problem p({DType::kBF16, DType::kBF16, DType::kF32}, 2, 300, 200, 0);
  gemm_cache_clear();
  p.expect_close(p.run([](const GemmArgs& g) { gemm(g); }), "gemm");
  EXPECT_EQ(gemm_cache_stats().primitives, 0);
  // One row too many: oneDNN as before.
  GemmArgs f32;
  f32.a_dtype = f32.b_dtype = f32.c_dtype = DType::kF32;
  Problem q({DType::kF32, DType::kF32, DType::kF32}, detail::gemv_max_rows(f32) + 1, 30, 20, 0);
  q.expect_close(q.run([](const GemmArgs& g) { gemm(g); }), "gemm");
  EXPECT_EQ(gemm_cache_stats().primitives, 1);
}

}  // namespace
}  // namespace hyperion
