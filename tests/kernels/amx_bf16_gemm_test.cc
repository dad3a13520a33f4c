// The AMX bf16 decode GEMM (kernels/amx_bf16_gemm.h) against ref::gemm: row counts on
// both blockings (up to 16 rows, and 32-row pieces with a tail), weight-row tails (the
// zero-padded last block), padded leading dimensions, every epilogue term, f32 and bf16
// outputs; bitwise the same for any thread count; and gemm() routing decode batches to it.
#include "kernels/amx_bf16_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "kernels/gemm.h"
#include "kernels/gemv.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

struct Case {
  GemmArgs g;
  std::vector<bf16> a, b;
  std::vector<unsigned char> c_init, c_ref;
  std::vector<float> bias, as, bs;

  Case(int64_t m, int64_t n, int64_t k, DType cd, int variant) {
    std::mt19937 rng(unsigned(m * 131 + n * 17 + k + variant));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), pos(0.01f, 0.1f);
    const int64_t pad = (variant / 2) % 2 == 0 ? 0 : 5;  // both outputs see both layouts
    g = contiguous_gemm_args(Trans::kN, Trans::kT, m, n, k, nullptr, DType::kBF16, nullptr,
                             DType::kBF16, nullptr, cd);
    g.lda = k + pad;
    g.ldb = k + 2 * pad;
    g.ldc = n + pad;
    a.resize(size_t(m * g.lda));
    b.resize(size_t(n * g.ldb));
    for (auto& x : a) x = f32_to_bf16(u(rng));
    for (auto& x : b) x = f32_to_bf16(u(rng));
    g.alpha = variant % 3 == 1 ? 0.75f : 1.0f;
    g.beta = variant % 4 >= 2 ? -0.5f : 0.0f;
    bias.resize(size_t(n));
    as.resize(size_t(m));
    bs.resize(size_t(n));
    for (auto& x : bias) x = pos(rng);
    for (auto& x : as) x = pos(rng);
    for (auto& x : bs) x = pos(rng);
    if (variant % 3 == 2) g.bias = bias.data();
    if (variant % 5 >= 3) g.a_scale = as.data(), g.b_scale = bs.data();
    // C: random where beta reads it, NaN where it must not, 7 in the padding.
    const size_t es = dtype_size(cd);
    c_init.resize(size_t(m * g.ldc) * es);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < g.ldc; ++j) {
        const float v = j >= n ? 7.0f : g.beta != 0.0f ? u(rng) : std::nanf("");
        convert_any(&v, DType::kF32, c_init.data() + size_t(i * g.ldc + j) * es, cd, 1);
      }
    c_ref = c_init;
    g.a = a.data();
    g.b = b.data();
    g.c = c_ref.data();
    ref::gemm(g);
  }

  template <typename Fn>
  std::vector<unsigned char> run(Fn&& fn) const {
    std::vector<unsigned char> c = c_init;
    GemmArgs args = g;
    args.c = c.data();
    fn(args);
    return c;
  }

  void expect_close(const std::vector<unsigned char>& got) const {
    const DType cd = g.c_dtype;
    const size_t es = dtype_size(cd);
    double max_ref = 1e-3;
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j)
        max_ref = std::max(max_ref,
                           std::fabs(double(load_as_f32(c_ref.data(), cd, size_t(i * g.ldc + j)))));
    // f32 sums of exact bf16 products against a double reference; bf16 output rounds.
    const double tol = (cd == DType::kBF16 ? 8e-3 : 2e-5) * max_ref;
    int bad = 0;
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.ldc; ++j) {
        const size_t idx = size_t(i * g.ldc + j);
        if (j >= g.n) {
          EXPECT_EQ(std::memcmp(got.data() + idx * es, c_init.data() + idx * es, es), 0)
              << "padding written at " << i << "," << j;
          continue;
        }
        double diff = std::fabs(double(load_as_f32(got.data(), cd, idx)) -
                                double(load_as_f32(c_ref.data(), cd, idx)));
        if (std::isnan(diff)) diff = 1e30;
        if (diff > tol && bad++ < 5)
          ADD_FAILURE() << "m=" << g.m << " n=" << g.n << " k=" << g.k << " " << dtype_name(cd)
                        << " alpha=" << g.alpha << " beta=" << g.beta
                        << " bias=" << (g.bias != nullptr) << " scales=" << (g.a_scale != nullptr)
                        << " at (" << i << "," << j << "): got " << load_as_f32(got.data(), cd, idx)
                        << " ref " << load_as_f32(c_ref.data(), cd, idx) << " tol " << tol;
      }
  }
};

TEST(AmxBf16Gemm, MatchesTheReference) {
  if (!amx_bf16_available()) GTEST_SKIP() << "no AMX-BF16 on this CPU";
  int variant = 0;
  for (int64_t m : {1, 3, 5, 15, 16, 17, 31, 32, 33, 48, 64})
    for (auto [n, k] :
         {std::tuple<int64_t, int64_t>{70, 64}, {48, 32}, {1, 96}, {613, 512}, {130, 1408}})
      for (DType cd : {DType::kF32, DType::kBF16}) {
        const Case c(m, n, k, cd, variant++);
        c.expect_close(c.run([](const GemmArgs& g) { amx_bf16_gemm(g); }));
      }
}

TEST(AmxBf16Gemm, BitwiseIdenticalForAnyThreadCount) {
  if (!amx_bf16_available()) GTEST_SKIP() << "no AMX-BF16 on this CPU";
  const int saved = num_threads();
  for (int64_t m : {7, 40}) {
    const Case c(m, 2051, 256, DType::kBF16, 1);
    set_num_threads(1);
    const auto one = c.run([](const GemmArgs& g) { amx_bf16_gemm(g); });
    set_num_threads(2);
    const auto two = c.run([](const GemmArgs& g) { amx_bf16_gemm(g); });
    EXPECT_EQ(one, two) << "m=" << m;
    c.expect_close(two);
  }
  set_num_threads(saved);
}

TEST(AmxBf16Gemm, GemmRoutesDecodeBatchesHere) {
  if (!amx_bf16_available()) GTEST_SKIP() << "no AMX-BF16 on this CPU";
  if (std::getenv("HYPERION_AMX_BF16") || std::getenv("HYPERION_GEMV"))
    GTEST_SKIP() << "a kernel switch is set";
  const Case c(12, 300, 256, DType::kF32, 0);
  EXPECT_TRUE(amx_bf16_gemm_applies(c.g));
  gemm_cache_clear();
  c.expect_close(c.run([](const GemmArgs& g) { gemm(g); }));
  EXPECT_EQ(gemm_cache_stats().primitives, 0);  // no oneDNN primitive was made
  GemmArgs t = c.g;
  t.k = 250;  // not a multiple of 32
  EXPECT_FALSE(amx_bf16_gemm_applies(t));
  t = c.g;
  t.m = kAmxBf16MaxRows + 1;  // prefill sizes stay on oneDNN
  EXPECT_FALSE(amx_bf16_gemm_applies(t));
  t = c.g;
  t.m = detail::kGemvMaxMBf16;  // the GEMV's rows stay there
  EXPECT_FALSE(amx_bf16_gemm_applies(t));
  t = c.g;
  t.lda = (int64_t(1) << 31) / 15 + 1;  // the A gather's int32 index would overflow
  EXPECT_FALSE(amx_bf16_gemm_applies(t));
  t = c.g;
  t.trans_b = Trans::kN;
  EXPECT_FALSE(amx_bf16_gemm_applies(t));
  t = c.g;
  t.a_dtype = t.b_dtype = t.c_dtype = DType::kF32;
  EXPECT_FALSE(amx_bf16_gemm_applies(t));
}

TEST(AmxBf16Gemm, RefusesWhatItCannotRun) {
  if (!amx_bf16_available()) GTEST_SKIP() << "no AMX-BF16 on this CPU";
  Case c(8, 40, 64, DType::kF32, 0);
  GemmArgs g = c.g;
  g.k = 48;  // not a multiple of 32: the last tile row would read past A and B
  EXPECT_THROW(amx_bf16_gemm(g), Error);
  g = c.g;
  g.m = kAmxBf16MaxRows + 1;
  EXPECT_THROW(amx_bf16_gemm(g), Error);
  g = c.g;
  g.ldb = g.k - 1;
  EXPECT_THROW(amx_bf16_gemm(g), Error);
}

}  // namespace
}  // namespace hyperion
