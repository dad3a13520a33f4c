#include "kernels/amx_int8_gemm.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/gemm.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

// The AMX kernel against kernels/gemm.h's scaled int8 path (oneDNN's exact int32 sums and
// the same f32 epilogue): bit for bit, with row and column tails, f32 and bf16 outputs,
// beta 0 and 1, and both packings (B given [n, k] and [k, n]).
TEST(AmxInt8Gemm, EqualsTheScaledGemmBitForBit) {
  if (!amx_int8_available()) GTEST_SKIP() << "no AMX-INT8 on this CPU";
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> q(-127, 127);
  std::uniform_real_distribution<float> sc(1e-3f, 2e-2f);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{45, 70, 128},
                         {64, 32, 64},
                         {7, 3, 192},
                         {96, 130, 1408 / 2 - 64}}) {
    if (!amx_int8_gemm_applies(k)) continue;
    std::vector<int8_t> a(size_t(m * k)), b(size_t(n * k)), bt(size_t(k * n));
    for (auto& v : a) v = int8_t(q(rng));
    for (auto& v : b) v = int8_t(q(rng));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j) bt[size_t(j * n + i)] = b[size_t(i * k + j)];
    std::vector<float> as(static_cast<size_t>(m)), bs(static_cast<size_t>(n));
    for (auto& v : as) v = sc(rng);
    for (auto& v : bs) v = sc(rng);
    std::vector<int8_t> p_nk(size_t(amx_packed_b_bytes(k, n))), p_kn(p_nk.size());
    amx_pack_b_nk(b.data(), n, k, p_nk.data());
    amx_pack_b_kn(bt.data(), k, n, p_kn.data());
    EXPECT_EQ(p_nk, p_kn);
    for (DType cd : {DType::kF32, DType::kBF16}) {
      for (float beta : {0.0f, 1.0f}) {
        std::vector<float> init(size_t(m * n));
        for (auto& v : init) v = sc(rng) - 0.01f;
        std::vector<unsigned char> want(size_t(m * n) * dtype_size(cd)), got(want.size());
        convert_any(init.data(), DType::kF32, want.data(), cd, init.size());
        got = want;
        GemmArgs g = contiguous_gemm_args(Trans::kN, Trans::kT, m, n, k, a.data(), DType::kI8,
                                          b.data(), DType::kI8, want.data(), cd, beta);
        g.a_scale = as.data();
        g.b_scale = bs.data();
        gemm(g);
        amx_int8_gemm(m, n, k, a.data(), k, p_nk.data(), as.data(), bs.data(), got.data(), cd, n,
                      beta);
        EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size()), 0)
            << m << "x" << n << "x" << k << " " << dtype_name(cd) << " beta " << beta;
      }
    }
  }
}

}  // namespace
}  // namespace hyperion
