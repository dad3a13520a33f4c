#include "kernels/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "kernels/gemm_widened.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

struct Buffer {
  std::vector<unsigned char> bytes;
  DType dtype;
  Buffer(DType d, size_t n) : bytes(n * dtype_size(d)), dtype(d) {}
  void* data() { return bytes.data(); }
  float at(size_t i) const { return load_as_f32(bytes.data(), dtype, i); }
  size_t size() const { return bytes.size() / dtype_size(dtype); }
};

Buffer random_buffer(DType d, size_t n, std::mt19937& rng) {
  Buffer b(d, n);
  std::uniform_real_distribution<float> uf(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ui(-128, 127), uu(0, 255);
  for (size_t i = 0; i < n; ++i) {
    float v = d == DType::kI8 ? float(ui(rng)) : d == DType::kU8 ? float(uu(rng)) : uf(rng);
    convert_any(&v, DType::kF32, static_cast<unsigned char*>(b.data()) + i * dtype_size(d), d, 1);
  }
  return b;
}

struct Case {
  Trans ta, tb;
  int64_t m, n, k;
  DType ad, bd, cd;
  float alpha, beta;
  bool bias, scales;
  int64_t pad;  // extra leading-dimension padding
  int64_t batch;
};

void run_case(const Case& c, double tol, void (*run)(const GemmArgs&) = &gemm) {
  std::mt19937 rng(unsigned(c.m * 131 + c.n * 31 + c.k));
  GemmArgs g;
  g.trans_a = c.ta;
  g.trans_b = c.tb;
  g.m = c.m;
  g.n = c.n;
  g.k = c.k;
  g.lda = (c.ta == Trans::kN ? c.k : c.m) + c.pad;
  g.ldb = (c.tb == Trans::kN ? c.n : c.k) + c.pad;
  g.ldc = c.n + c.pad;
  const int64_t a_rows = c.ta == Trans::kN ? c.m : c.k, b_rows = c.tb == Trans::kN ? c.k : c.n;
  g.stride_a = a_rows * g.lda;
  g.stride_b = b_rows * g.ldb;
  g.stride_c = c.m * g.ldc;
  g.batch = c.batch;
  Buffer a = random_buffer(c.ad, size_t(g.stride_a * c.batch), rng);
  Buffer b = random_buffer(c.bd, size_t(g.stride_b * c.batch), rng);
  Buffer c_init =
      random_buffer(c.cd == DType::kI32 ? DType::kF32 : c.cd, size_t(g.stride_c * c.batch), rng);
  if (c.cd == DType::kI32) c_init = Buffer(DType::kI32, size_t(g.stride_c * c.batch));
  std::vector<float> bias(size_t(c.n)), as(size_t(c.m)), bs(size_t(c.n));
  std::uniform_real_distribution<float> u(0.01f, 0.1f);
  for (auto& x : bias) x = u(rng);
  for (auto& x : as) x = u(rng);
  for (auto& x : bs) x = u(rng);
  g.a = a.data();
  g.a_dtype = c.ad;
  g.b = b.data();
  g.b_dtype = c.bd;
  g.c_dtype = c.cd;
  g.alpha = c.alpha;
  g.beta = c.beta;
  g.bias = c.bias ? bias.data() : nullptr;
  g.a_scale = c.scales ? as.data() : nullptr;
  g.b_scale = c.scales ? bs.data() : nullptr;

  Buffer got = c_init, want = c_init;
  g.c = got.data();
  run(g);
  g.c = want.data();
  ref::gemm(g);
  double max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i)
    max_ref = std::max(max_ref, std::fabs(double(want.at(i))));
  for (int64_t bi = 0; bi < c.batch; ++bi)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        size_t idx = size_t(bi * g.stride_c + i * g.ldc + j);
        ASSERT_NEAR(got.at(idx), want.at(idx), tol * std::max(1.0, max_ref))
            << "m=" << c.m << " n=" << c.n << " k=" << c.k << " at batch " << bi << " (" << i << ","
            << j << ")";
      }
  // Padding between rows is never written.
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = c.n; j < g.ldc; ++j)
      EXPECT_EQ(got.at(size_t(i * g.ldc + j)), c_init.at(size_t(i * g.ldc + j)));
}

TEST(Gemm, F32AllTransposesOddShapes) {
  for (Trans ta : {Trans::kN, Trans::kT})
    for (Trans tb : {Trans::kN, Trans::kT})
      for (auto [m, n, k] :
           {std::tuple{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 100, 48}, {1, 129, 77}}) {
        run_case({ta, tb, m, n, k, DType::kF32, DType::kF32, DType::kF32, 1.0f, 0.0f, false, false,
                  0, 1},
                 1e-5);
        run_case(
            {ta, tb, m, n, k, DType::kF32, DType::kF32, DType::kF32, 0.5f, 1.5f, true, false, 3, 1},
            1e-5);
      }
}

// The widened path (kernels/gemm_widened.h: bf16 without AVX-512, int8 without VNNI),
// run directly so that every machine tests it: bf16 to within one rounding, int8 sums
// exactly, with K past one exact chunk (512), transposes, padding, batches, scales, bias
// and beta.
TEST(Gemm, WidenedPathMatchesTheReference) {
  auto widened = [](const GemmArgs& g) { detail::widened_gemm(g); };
  for (Trans ta : {Trans::kN, Trans::kT})
    for (Trans tb : {Trans::kN, Trans::kT}) {
      run_case({ta, tb, 37, 29, 70, DType::kBF16, DType::kBF16, DType::kF32, 1.0f, 0.0f, false,
                false, 0, 1},
               1e-5, widened);
      run_case({ta, tb, 20, 48, 64, DType::kBF16, DType::kBF16, DType::kBF16, 0.5f, 1.0f, true,
                true, 3, 2},
               8e-3, widened);
      // Exact integer sums over three K chunks (-128 * -128 * 1300 needs 22 bits).
      run_case({ta, tb, 9, 31, 1300, DType::kI8, DType::kI8, DType::kI32, 1.0f, 0.0f, false, false,
                2, 2},
               0, widened);
      run_case({ta, tb, 13, 40, 600, DType::kU8, DType::kI8, DType::kF32, 1.0f, 0.5f, true, true,
                0, 1},
               1e-6, widened);
      run_case({ta, tb, 5, 17, 96, DType::kI8, DType::kI8, DType::kBF16, 0.25f, 0.0f, false, true,
                1, 1},
               8e-3, widened);
      // Several tiles in M and N (with tails) and several K pieces.
      run_case({ta, tb, 150, 260, 300, DType::kBF16, DType::kBF16, DType::kF32, 1.0f, 0.0f, true,
                false, 0, 1},
               1e-5, widened);
      run_case({ta, tb, 140, 130, 520, DType::kU8, DType::kI8, DType::kI32, 1.0f, 0.0f, false,
                false, 0, 2},
               0, widened);
    }
  // The same bits at any thread count.
  const int saved = num_threads();
  for (DType dt : {DType::kBF16, DType::kI8}) {
    std::mt19937 rng(7);
    const int64_t m = 200, n = 300, k = 700;
    Buffer a = random_buffer(dt, size_t(m * k), rng);
    Buffer b = random_buffer(dt, size_t(k * n), rng);
    std::vector<std::vector<unsigned char>> outs;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Buffer c(DType::kF32, size_t(m * n));
      detail::widened_gemm(contiguous_gemm_args(Trans::kN, Trans::kT, m, n, k, a.data(), dt,
                                                b.data(), dt, c.data(), DType::kF32));
      outs.push_back(c.bytes);
    }
    EXPECT_EQ(outs[0], outs[1]) << dtype_name(dt);
  }
  set_num_threads(saved);
}

// The f32 tiles give the same bits at any thread count (oneDNN's AVX2 GEMM splits K over
// threads for small outputs with long sums, as these).
TEST(Gemm, TiledF32IsBitwiseEqualAtAnyThreadCount) {
  const int saved = num_threads();
  for (auto [m, n, k, batch] : {std::tuple{8, 16, 4096, 1}, {300, 200, 64, 2}, {1, 3, 9000, 1}}) {
    std::mt19937 rng(unsigned(m + n + k));
    Buffer a = random_buffer(DType::kF32, size_t(m * k * batch), rng);
    Buffer b = random_buffer(DType::kF32, size_t(k * n * batch), rng);
    std::vector<std::vector<unsigned char>> outs;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Buffer c(DType::kF32, size_t(m * n * batch));
      GemmArgs g = contiguous_gemm_args(Trans::kN, Trans::kN, m, n, k, a.data(), DType::kF32,
                                        b.data(), DType::kF32, c.data(), DType::kF32);
      g.batch = batch;
      g.stride_a = m * k;
      g.stride_b = k * n;
      g.stride_c = m * n;
      detail::tiled_f32_gemm(g);
      outs.push_back(c.bytes);
    }
    EXPECT_EQ(outs[0], outs[1]) << m << "x" << n << "x" << k;
  }
  set_num_threads(saved);
  run_case({Trans::kT, Trans::kT, 200, 150, 70, DType::kF32, DType::kF32, DType::kF32, 0.5f, 1.5f,
            true, true, 3, 2},
           1e-5, [](const GemmArgs& g) { detail::tiled_f32_gemm(g); });
  // A bias without scales on tiles narrower than C (computed densely, then combined with
  // beta * C), with and without beta, and a tile as wide as C.
  for (float beta : {0.0f, 1.5f})
    for (int64_t n : {int64_t(150), int64_t(96)})
      run_case({Trans::kN, Trans::kT, 260, n, 40, DType::kF32, DType::kF32, DType::kF32, 1.0f,
                beta, true, false, 0, 1},
               1e-5, [](const GemmArgs& g) { detail::tiled_f32_gemm(g); });
}

TEST(Gemm, Bf16InputsF32AndBf16Outputs) {
  for (Trans tb : {Trans::kN, Trans::kT}) {
    run_case({Trans::kN, tb, 37, 29, 70, DType::kBF16, DType::kBF16, DType::kF32, 1.0f, 0.0f, false,
              false, 0, 1},
             1e-5);
    run_case({Trans::kT, tb, 16, 64, 33, DType::kBF16, DType::kBF16, DType::kF32, 2.0f, 1.0f, true,
              false, 5, 1},
             1e-5);
    // bf16 output: one rounding of the f32 result (relative 2^-8).
    run_case({Trans::kN, tb, 20, 48, 64, DType::kBF16, DType::kBF16, DType::kBF16, 1.0f, 0.0f, true,
              false, 0, 1},
             8e-3);
  }
}

TEST(Gemm, Int8WithPerRowAndPerColumnScales) {
  for (DType ad : {DType::kI8, DType::kU8}) {
    for (Trans tb : {Trans::kN, Trans::kT}) {
      run_case(
          {Trans::kN, tb, 13, 40, 96, ad, DType::kI8, DType::kF32, 1.0f, 0.0f, true, true, 0, 1},
          1e-6);
      run_case(
          {Trans::kN, tb, 1, 64, 128, ad, DType::kI8, DType::kF32, 0.25f, 1.0f, false, true, 2, 1},
          1e-6);
      // Raw int32 sums are exact.
      run_case(
          {Trans::kN, tb, 9, 31, 200, ad, DType::kI8, DType::kI32, 1.0f, 0.0f, false, false, 0, 1},
          0.0);
    }
  }
}

TEST(Gemm, BatchedStrided) {
  run_case({Trans::kN, Trans::kT, 8, 12, 16, DType::kF32, DType::kF32, DType::kF32, 1.0f, 0.0f,
            false, false, 1, 3},
           1e-5);
  run_case({Trans::kT, Trans::kN, 5, 9, 7, DType::kBF16, DType::kBF16, DType::kF32, 1.0f, 0.5f,
            true, false, 0, 4},
           1e-5);
}

TEST(Gemm, BatchedWithSharedWeights) {
  std::mt19937 rng(7);
  const int64_t batch = 3, m = 4, n = 6, k = 5;
  Buffer a = random_buffer(DType::kF32, size_t(batch * m * k), rng),
         b = random_buffer(DType::kF32, size_t(k * n), rng);
  Buffer got(DType::kF32, size_t(batch * m * n)), want(DType::kF32, size_t(batch * m * n));
  GemmArgs g;
  g.m = m, g.n = n, g.k = k, g.lda = k, g.ldb = n, g.ldc = n;
  g.a = a.data(), g.b = b.data();
  g.batch = batch, g.stride_a = m * k, g.stride_b = 0, g.stride_c = m * n;
  g.c = got.data();
  gemm(g);
  g.c = want.data();
  ref::gemm(g);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got.at(i), want.at(i), 1e-5);
}

TEST(Gemm, EmptyReductionGivesBetaCPlusBias) {
  std::vector<float> c = {1, 2, 3, 4}, bias = {10, 20};
  float dummy = 0;
  GemmArgs g;
  g.m = 2, g.n = 2, g.k = 0, g.lda = 1, g.ldb = 2, g.ldc = 2;
  g.a = &dummy, g.b = &dummy, g.c = c.data(), g.beta = 2.0f, g.bias = bias.data();
  gemm(g);
  EXPECT_EQ(c, (std::vector<float>{12, 24, 16, 28}));
}

TEST(Gemm, PrimitivesAreCachedByShape) {
  gemm_cache_clear();
  // 96 rows: past every decode path (the GEMV takes up to 64 int8 rows on AVX2 CPUs).
  std::vector<float> a(96 * 64, 1.0f), b(64 * 64, 1.0f), c(96 * 64);
  TensorView av(a.data(), DType::kF32, {96, 64}), bv(b.data(), DType::kF32, {64, 64}),
      cv(c.data(), DType::kF32, {96, 64});
  for (int i = 0; i < 5; ++i) gemm(av, Trans::kN, bv, Trans::kT, cv);
  EXPECT_EQ(c[0], 64.0f);
  GemmCacheStats s = gemm_cache_stats();
  EXPECT_EQ(s.primitives, 1);
  EXPECT_EQ(s.hits, 4);
  // Scaled calls (alpha != 1 or scales) run raw sums plus our epilogue: one more
  // primitive, shared by every alpha value.
  gemm(av, Trans::kN, bv, Trans::kT, cv, 0.5f);
  EXPECT_EQ(c[0], 32.0f);
  gemm(av, Trans::kN, bv, Trans::kT, cv, 0.25f);
  EXPECT_EQ(c[0], 16.0f);
  EXPECT_EQ(gemm_cache_stats().primitives, 2);
}

TEST(Gemm, ErrorsNameTheOpAndShapes) {
  std::vector<float> a(12), b(12), c(16);
  TensorView av(a.data(), DType::kF32, {3, 4}), bv(b.data(), DType::kF32, {3, 4}),
      cv(c.data(), DType::kF32, {4, 4});
  try {
    gemm(av, Trans::kN, bv, Trans::kN, cv);
    FAIL() << "expected a shape error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("gemm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[3, 4]"), std::string::npos) << msg;
  }
  std::vector<int8_t> ai(12);
  TensorView aiv(ai.data(), DType::kI8, {3, 4});
  TensorView c33(c.data(), DType::kF32, {3, 3});
  EXPECT_THROW(gemm(aiv, Trans::kN, bv, Trans::kT, c33), Error);  // int8 x f32 unsupported
  GemmArgs g;
  g.m = 2, g.n = 2, g.k = 4, g.lda = 3, g.ldb = 2, g.ldc = 2;  // lda < k
  g.a = a.data(), g.b = b.data(), g.c = c.data();
  EXPECT_THROW(gemm(g), Error);
  g.lda = 4;
  g.a_dtype = DType::kI8, g.b_dtype = DType::kI8, g.c_dtype = DType::kI32, g.alpha = 2.0f;
  EXPECT_THROW(gemm(g), Error);  // int32 output takes no alpha
}

}  // namespace
}  // namespace hyperion
