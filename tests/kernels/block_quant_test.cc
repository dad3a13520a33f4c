// llama.cpp's block formats (kernels/block_quant.h): the reference dequantisation puts
// each stored bit where ggml's layout says; the reference dot equals the dot of the
// dequantised rows; every instruction set's kernel equals the reference on odd shapes
// and every row count; the matmul (decode and prefill paths) equals a plain matmul of the
// dequantised weights; bad shapes are refused by name.
#include "kernels/block_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "block_test_util.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace block_test;

constexpr BlockType kAll[] = {BlockType::kQ4_0, BlockType::kQ4_1, BlockType::kQ5_0, BlockType::kQ5_1,
                              BlockType::kQ8_0, BlockType::kQ4_K, BlockType::kQ5_K, BlockType::kQ6_K};

std::vector<float> dequant(BlockType t, const unsigned char* p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_blocks_reference(t, p, out.data(), n);
  return out;
}

// The f32 values a quantised activation row stands for.
std::vector<float> act_values(BlockType t, const std::vector<unsigned char>& act, int64_t k) {
  const int64_t block = block_format(t).values == 32 ? 32 : 256;
  const auto* qs = reinterpret_cast<const int8_t*>(act.data());
  const auto* d = reinterpret_cast<const float*>(act.data() + k);
  std::vector<float> v(static_cast<size_t>(k));
  for (int64_t e = 0; e < k; ++e) v[size_t(e)] = d[e / block] * float(qs[e]);
  return v;
}

TEST(BlockQuant, FormatTableIsGgmls) {
  EXPECT_EQ(block_format(BlockType::kQ4_0).bytes, 18u);
  EXPECT_EQ(block_format(BlockType::kQ8_0).bytes, 34u);
  EXPECT_EQ(block_format(BlockType::kQ4_K).bytes, 144u);
  EXPECT_EQ(block_format(BlockType::kQ5_K).bytes, 176u);
  EXPECT_EQ(block_format(BlockType::kQ6_K).bytes, 210u);
  for (BlockType t : kAll) {
    const BlockFormat& f = block_format(t);
    EXPECT_EQ(block_format_of_ggml(f.ggml_type), &f);
    EXPECT_EQ(block_format_named(f.name), &f);
  }
  EXPECT_EQ(block_format_named("Q4_k"), &block_format(BlockType::kQ4_K));
  EXPECT_EQ(block_format(BlockType::kQ4_1).bytes, 20u);
  EXPECT_EQ(block_format(BlockType::kQ5_0).bytes, 22u);
  EXPECT_EQ(block_format(BlockType::kQ5_1).bytes, 24u);
  EXPECT_EQ(block_format_of_ggml(9), nullptr);  // q8_1: not read
  EXPECT_EQ(block_bytes(BlockType::kQ4_K, 512), 288u);
  EXPECT_THROW(block_bytes(BlockType::kQ4_K, 100), Error);
}

// One stored value at a time: each lands at the element ggml's layout gives it.
TEST(BlockQuant, ReferencePutsEachBitWhereGgmlsLayoutSays) {
  // Q4_0: qs[3] = 0x9F -> element 3 = d * (15 - 8), element 19 = d * (9 - 8).
  {
    std::vector<unsigned char> b(18, 0x88);
    put_half(b.data(), 0.5f);
    b[2 + 3] = 0x9F;
    const auto v = dequant(BlockType::kQ4_0, b.data(), 32);
    EXPECT_EQ(v[3], 3.5f);
    EXPECT_EQ(v[19], 0.5f);
    EXPECT_EQ(v[0], 0.0f);
  }
  // Q5_0: value 19's fifth bit is bit 19 of the u32 qh; q = (qs[3] >> 4) | 16 = 25.
  {
    std::vector<unsigned char> b(22, 0);
    put_half(b.data(), 0.5f);
    b[2 + 2] = 0x08;  // qh bit 19
    b[6 + 3] = 0x90;  // element 19's low 4 bits: 9
    const auto v = dequant(BlockType::kQ5_0, b.data(), 32);
    EXPECT_EQ(v[19], 0.5f * float(25 - 16));
    EXPECT_EQ(v[3], 0.5f * float(0 - 16));
  }
  // Q4_1 and Q5_1: x = d q + m.
  {
    std::vector<unsigned char> b(20, 0);
    put_half(b.data(), 2.0f);
    put_half(b.data() + 2, -1.0f);
    b[4 + 1] = 0x3A;  // element 1: 10, element 17: 3
    const auto v = dequant(BlockType::kQ4_1, b.data(), 32);
    EXPECT_EQ(v[1], 19.0f);
    EXPECT_EQ(v[17], 5.0f);
    std::vector<unsigned char> c(24, 0);
    put_half(c.data(), 2.0f);
    put_half(c.data() + 2, -1.0f);
    c[4] = 0x02;       // qh bit 1: element 1's fifth bit
    c[8 + 1] = 0x0A;
    const auto w = dequant(BlockType::kQ5_1, c.data(), 32);
    EXPECT_EQ(w[1], 2.0f * 26 - 1.0f);
  }
  // Q4_K: d = 1, dmin = 1; sub-block 5's scale 3 and min 2 in the packed high bits;
  // qs[32 * 2 + 7] high nibble = 9 is element 64 * 2 + 32 + 7 = 167 (sub-block 5).
  {
    std::vector<unsigned char> b(144, 0);
    put_half(b.data(), 1.0f);
    put_half(b.data() + 2, 1.0f);
    unsigned char* sc = b.data() + 4;
    // j = 5: sc = (sc[9] & 15) | (sc[1] >> 6) << 4; m = (sc[9] >> 4) | (sc[5] >> 6) << 4.
    sc[9] = 0x23;
    b[16 + 64 + 7] = 0x90;
    const auto v = dequant(BlockType::kQ4_K, b.data(), 256);
    EXPECT_EQ(v[167], 3.0f * 9.0f - 2.0f);
    EXPECT_EQ(v[160], -2.0f);  // same sub-block, q = 0
    EXPECT_EQ(v[135], 0.0f);   // sub-block 4: scale and min 0
    // A 6-bit scale's top bits: sub-block 4's scale 0x35 = (sc[8] & 15) | (sc[0] >> 6) << 4.
    sc[8] = 0x05;
    sc[0] = 0xC0;
    b[16 + 64 + 3] = 0x01;  // element 128 + 3, sub-block 4, q = 1
    const auto w = dequant(BlockType::kQ4_K, b.data(), 256);
    EXPECT_EQ(w[131], float(0x35));
  }
  // Q5_K: the fifth bit of element 64 * 1 + 32 + 4 = 100 is bit 3 of qh[4].
  {
    std::vector<unsigned char> b(176, 0);
    put_half(b.data(), 1.0f);
    b[4 + 3] = 1;  // sub-block 3's scale 1 (element 100 is in sub-block 3)
    b[16 + 4] = 0x08;
    const auto v = dequant(BlockType::kQ5_K, b.data(), 256);
    EXPECT_EQ(v[100], 16.0f);
    EXPECT_EQ(v[68], 0.0f);
  }
  // Q6_K: element 128 + 96 + 5 = 229 is (ql[64 + 37] >> 4) | ((qh[32 + 5] >> 6) & 3) << 4,
  // in group 229 / 16 = 14.
  {
    std::vector<unsigned char> b(210, 0);
    put_half(b.data() + 208, 1.0f);
    for (int g = 0; g < 16; ++g) b[192 + g] = static_cast<unsigned char>(int8_t(g == 14 ? -2 : 1));
    b[64 + 37] = 0x70;
    b[128 + 32 + 5] = 0x80;
    const auto v = dequant(BlockType::kQ6_K, b.data(), 256);
    EXPECT_EQ(v[229], -2.0f * float((0x7 | (2 << 4)) - 32));
    EXPECT_EQ(v[0], -32.0f);
  }
}

TEST(BlockQuant, ActivationsRoundTripWithinHalfAStep) {
  std::mt19937 rng(3);
  for (BlockType t : kAll) {
    const int64_t k = 512;
    auto x = randn(size_t(k), rng, 1.5f);
    x[7] = 0.0f;
    std::vector<unsigned char> act(block_act_row_bytes(t, k));
    quantize_block_activations(t, x.data(), DType::kF32, k, act.data());
    const auto back = act_values(t, act, k);
    const int64_t block = block_format(t).values == 32 ? 32 : 256;
    const auto* d = reinterpret_cast<const float*>(act.data() + k);
    for (int64_t e = 0; e < k; ++e)
      ASSERT_LE(std::fabs(back[size_t(e)] - x[size_t(e)]), d[e / block] * 0.5001f) << e;
    // The group sums are the sums of the stored values.
    const int64_t group = block_format(t).values == 32 ? 32 : 16;
    const auto* qs = reinterpret_cast<const int8_t*>(act.data());
    const auto* sums = reinterpret_cast<const int16_t*>(act.data() + k + (k / block) * 4);
    for (int64_t g = 0; g < k / group; ++g) {
      int s = 0;
      for (int64_t j = 0; j < group; ++j) s += qs[g * group + j];
      ASSERT_EQ(sums[g], s);
    }
  }
}

TEST(BlockQuant, ReferenceDotIsTheDotOfTheDequantisedRows) {
  std::mt19937 rng(11);
  for (BlockType t : kAll) {
    const int64_t k = 768;
    const auto w = random_blocks(t, k, rng);
    const auto x = randn(size_t(k), rng, 1.0f);
    std::vector<unsigned char> act(block_act_row_bytes(t, k));
    quantize_block_activations(t, x.data(), DType::kF32, k, act.data());
    const auto wv = dequant(t, w.data(), k);
    const auto av = act_values(t, act, k);
    double want = 0, mag = 0;
    for (int64_t e = 0; e < k; ++e) {
      want += double(wv[size_t(e)]) * av[size_t(e)];
      mag += std::fabs(double(wv[size_t(e)]) * av[size_t(e)]);
    }
    EXPECT_NEAR(block_dot_reference(t, w.data(), act.data(), k), want, 1e-5 * mag)
        << block_format(t).name;
  }
}

// The matmul's y against the reference dot per element (decode) or a double-precision
// matmul of the dequantised weights with bf16-rounded activations (prefill).
void check_matmul(BlockType t, int64_t m, int64_t n, int64_t k, DType xd, DType yd, float beta,
                  std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << block_format(t).name << " m " << m << " n " << n << " k " << k
                                  << " " << dtype_name(xd) << "->" << dtype_name(yd) << " beta "
                                  << beta << " isa " << block_isa_name());
  const auto w = random_blocks(t, n * k, rng);
  const auto xf = randn(size_t(m * k), rng, 1.0f);
  std::vector<bf16> xb(xf.size());
  for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(xf[i]);
  const void* x = xd == DType::kF32 ? static_cast<const void*>(xf.data()) : xb.data();
  const auto y0 = randn(size_t(m * n), rng, 1.0f);
  std::vector<float> yf(y0);
  std::vector<bf16> yb(y0.size());
  for (size_t i = 0; i < y0.size(); ++i) yb[i] = f32_to_bf16(y0[i]);
  void* y = yd == DType::kF32 ? static_cast<void*>(yf.data()) : yb.data();
  block_matmul(t, m, n, k, x, xd, w.data(), y, yd, beta);
  const size_t row_bytes = block_bytes(t, k);
  std::vector<unsigned char> act(block_act_row_bytes(t, k));
  for (int64_t i = 0; i < m; ++i) {
    const void* xi = xd == DType::kF32 ? static_cast<const void*>(xf.data() + i * k)
                                       : static_cast<const void*>(xb.data() + i * k);
    if (m <= kBlockDotMaxRows) quantize_block_activations(t, xi, xd, k, act.data());
    for (int64_t r = 0; r < n; ++r) {
      const unsigned char* wr = w.data() + size_t(r) * row_bytes;
      double want, mag = 0;
      if (m <= kBlockDotMaxRows) {
        want = block_dot_reference(t, wr, act.data(), k);
        const auto wv = dequant(t, wr, k);
        const auto av = act_values(t, act, k);
        for (int64_t e = 0; e < k; ++e) mag += std::fabs(double(wv[size_t(e)]) * av[size_t(e)]);
      } else {
        const auto wv = dequant(t, wr, k);
        want = 0;
        for (int64_t e = 0; e < k; ++e) {
          const double p = double(bf16_to_f32(f32_to_bf16(wv[size_t(e)]))) *
                           bf16_to_f32(xb[size_t(i * k + e)]);
          want += p;
          mag += std::fabs(p);
        }
      }
      const size_t idx = size_t(i * n + r);
      const double prev = yd == DType::kF32 ? double(y0[idx]) : double(bf16_to_f32(f32_to_bf16(y0[idx])));
      want += beta * prev;
      const double got = yd == DType::kF32 ? yf[idx] : bf16_to_f32(yb[idx]);
      const double tol = 2e-5 * mag + (yd == DType::kBF16 ? std::fabs(want) / 128 : 1e-6) +
                         (m > kBlockDotMaxRows ? 1e-4 * mag : 0.0);
      ASSERT_NEAR(got, want, tol) << "row " << i << " col " << r;
    }
  }
}

TEST(BlockQuant, EveryIsaEqualsTheReferenceOnOddShapes) {
  std::mt19937 rng(7);
  for (BlockIsa isa : {BlockIsa::kPortable, BlockIsa::kAvx2, BlockIsa::kAvx512Vnni}) {
    set_block_isa_for_testing(isa);
    for (BlockType t : kAll) {
      const int64_t blk = block_format(t).values;
      for (int64_t m = 1; m <= kBlockDotMaxRows; ++m) check_matmul(t, m, 5, blk * 3, DType::kF32, DType::kF32, 0.0f, rng);
      check_matmul(t, 3, 37, blk * 5, DType::kBF16, DType::kBF16, 0.0f, rng);
      check_matmul(t, 1, 19, blk, DType::kBF16, DType::kF32, 1.0f, rng);
    }
  }
  set_block_isa_for_testing(BlockIsa::kAuto);
}

TEST(BlockQuant, PrefillRowsDequantiseTilesIntoTheGemm) {
  std::mt19937 rng(9);
  for (BlockType t : kAll) {
    const int64_t blk = block_format(t).values;
    check_matmul(t, kBlockDotMaxRows + 1, 23, blk * 2, DType::kBF16, DType::kF32, 0.0f, rng);
    check_matmul(t, 20, 9, blk, DType::kF32, DType::kBF16, 1.0f, rng);
  }
}

TEST(BlockQuant, ResultsDoNotDependOnTheThreadCount) {
  std::mt19937 rng(13);
  const int64_t m = 2, n = 300, k = 512;
  const auto w = random_blocks(BlockType::kQ4_K, n * k, rng);
  const auto x = randn(size_t(m * k), rng, 1.0f);
  std::vector<float> one(size_t(m * n)), many(size_t(m * n));
  const int before = num_threads();
  set_num_threads(1);
  block_matmul(BlockType::kQ4_K, m, n, k, x.data(), DType::kF32, w.data(), one.data(), DType::kF32);
  set_num_threads(std::max(2, before));
  block_matmul(BlockType::kQ4_K, m, n, k, x.data(), DType::kF32, w.data(), many.data(), DType::kF32);
  set_num_threads(before);
  EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float)));
}

TEST(BlockQuant, DequantisedRowsEqualTheReference) {
  std::mt19937 rng(17);
  for (BlockType t : kAll) {
    const int64_t k = block_format(t).values * 2, rows = 7;
    const auto w = random_blocks(t, rows * k, rng);
    const auto want = dequant(t, w.data(), rows * k);
    std::vector<float> got(size_t(3 * k));
    dequantize_block_rows(t, w.data(), k, 2, 3, got.data(), DType::kF32);
    for (int64_t e = 0; e < 3 * k; ++e) ASSERT_EQ(got[size_t(e)], want[size_t(2 * k + e)]);
    std::vector<bf16> gb(size_t(3 * k));
    dequantize_block_rows(t, w.data(), k, 2, 3, gb.data(), DType::kBF16);
    for (int64_t e = 0; e < 3 * k; ++e)
      ASSERT_EQ(gb[size_t(e)].bits, f32_to_bf16(want[size_t(2 * k + e)]).bits);
  }
}

TEST(BlockQuant, RefusesPartialBlocksByName) {
  std::vector<float> x(100), y(4);
  std::vector<unsigned char> w(1000);
  try {
    block_matmul(BlockType::kQ6_K, 1, 1, 100, x.data(), DType::kF32, w.data(), y.data(), DType::kF32);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q6_K"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("100"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyperion
