// The decode-shaped path of hyperion::gemm (kernels/gemv.h), checked against ref::gemm
// through the public entry point and, for each instruction-set variant, directly.
#include "kernels/gemv.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

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

struct IsaGuard {
  explicit IsaGuard(GemvIsa isa) { detail::set_gemv_isa_for_testing(isa); }
  ~IsaGuard() { detail::set_gemv_isa_for_testing(GemvIsa::kAuto); }
};

// (n, k) pairs covering SIMD tails of every width (16 f32, 32 bf16, 64 int8) and the
// row-group tail (N not a multiple of 4 or 2).
const int64_t kShapes[][2] = {{1, 1},     {7, 7},      {31, 33},  {33, 31},
                              {100, 100}, {7, 1000},   {1000, 7}, {33, 2049},
                              {2049, 33}, {100, 1000}, {1, 2049}, {2049, 1}};
const int64_t kMs[] = {1, 2, 3, 5, 8};

TEST(Gemv, MatchesReferenceOnEveryPath) {
  int variant = 0;
  for (const Combo& combo : kCombos) {
    for (int64_t m : kMs) {
      for (const auto& nk : kShapes) {
        Problem p(combo, m, nk[0], nk[1], variant++);
        p.expect_close(p.run([](const GemmArgs& g) { gemm(g); }), "gemm");
        for (GemvIsa isa : {GemvIsa::kAuto, GemvIsa::kAvx512, GemvIsa::kPortable}) {
          IsaGuard guard(isa);
          const char* name = isa == GemvIsa::kAuto     ? "gemv(auto)"
                             : isa == GemvIsa::kAvx512 ? "gemv(avx512)"
                                                       : "gemv(portable)";
          p.expect_close(p.run([](const GemmArgs& g) { detail::gemv(g); }), name);
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
    for (GemvIsa isa : {GemvIsa::kAuto, GemvIsa::kAvx512, GemvIsa::kPortable}) {
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
  GemmArgs t = g;
  t.m = detail::kGemvMaxM + 1;
  EXPECT_FALSE(detail::gemv_applies(t));
  t = g;
  t.m = detail::kGemvMaxMBf16 + 1;  // bf16 hands larger M to oneDNN, f32 and int8 do not
  EXPECT_FALSE(detail::gemv_applies(t));
  t.a_dtype = t.b_dtype = t.c_dtype = DType::kF32;
  EXPECT_TRUE(detail::gemv_applies(t));
  t.m = detail::kGemvMaxM;
  t.a_dtype = t.b_dtype = DType::kI8;
  EXPECT_TRUE(detail::gemv_applies(t));
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
  Problem q({DType::kF32, DType::kF32, DType::kF32}, detail::kGemvMaxM + 1, 30, 20, 0);
  q.expect_close(q.run([](const GemmArgs& g) { gemm(g); }), "gemm");
  EXPECT_EQ(gemm_cache_stats().primitives, 1);
}

}  // namespace
}  // namespace hyperion
