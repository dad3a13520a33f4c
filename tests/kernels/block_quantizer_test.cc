// quantize_blocks (kernels/block_quantizer.cc): f32 values into llama.cpp's Q4_0, Q8_0,
// Q4_K, Q5_K and Q6_K blocks. Checked through the reference dequantisation on rows of
// several blocks (Gaussian rows, outliers, all-zero and constant blocks, tiny and mixed
// magnitudes): the RMS relative error per format, every element within the format's
// worst-case bound derived below, every element on the level of its block nearest to it
// (the scales decoded here from the bytes, as block_quant.h lays them out), the byte size,
// determinism, Q8_0 byte-identical to ggml's reference, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "kernels/block_quant.h"
#include "tensor/convert.h"
#include "tensor/quantize_q8_0.h"

namespace hyperion {
namespace {

using testing_util::expect_error;

constexpr BlockType kAll[] = {BlockType::kQ4_0, BlockType::kQ8_0, BlockType::kQ4_K,
                              BlockType::kQ5_K, BlockType::kQ6_K};
constexpr double k2m24 = 5.9604644775390625e-08;  // 2^-24: f16's smallest subnormal step

std::string name_of(BlockType t) {
  return block_format(t).name;
}

int64_t values_of(BlockType t) {
  return block_format(t).values;
}

std::vector<float> randn(size_t n, std::mt19937& rng, float sd) {
  std::normal_distribution<float> g(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

float half_at(const unsigned char* p) {
  f16 h;
  std::memcpy(&h.bits, p, 2);
  return f16_to_f32(h);
}

// The levels element e of a block can take: scale * q + offset for q in [qmin, qmax],
// decoded from the bytes as block_quant.h describes the layouts (scale and offset formed
// in float as a dequantiser forms them).
struct Levels {
  float scale, offset;
  int qmin, qmax;
};
Levels levels_of(BlockType t, const unsigned char* blk, int e) {
  switch (t) {
    case BlockType::kQ4_0:
      return {half_at(blk), 0.0f, -8, 7};
    case BlockType::kQ8_0:
      return {half_at(blk), 0.0f, -128, 127};
    case BlockType::kQ4_K:
    case BlockType::kQ5_K: {
      uint8_t sc, m;
      block_layout::k_scale_min(blk + 4, e / 32, &sc, &m);
      return {half_at(blk) * float(sc), -(half_at(blk + 2) * float(m)), 0,
              t == BlockType::kQ4_K ? 15 : 31};
    }
    case BlockType::kQ6_K: {
      const auto sc = static_cast<int8_t>(blk[192 + e / 16]);
      return {half_at(blk + 208) * float(sc), 0.0f, -32, 31};
    }
    default:  // the types read, never written
      break;
  }
  return {0, 0, 0, 0};
}

// The worst-case |x - x'| of the quantiser for a block whose largest magnitude is A
// (a 32-value block for Q4_0/Q8_0, the 256-value super-block for the K formats),
// derived from how block_quantizer.cc chooses the scales:
//   Q8_0  d = A / 127 (or, where f16 makes d subnormal, the f16 step at or above it):
//         half a step plus the f16 rounding of d over 127 levels, 0.5625 A / 127 + 2^-24.
//   Q4_0  |d| in [A / 9, A / 7.5]: in range half a step (<= A / 15), clipped at most
//         (9 - 7) d = 2A / 9 on the short (+7) side; 2A / 9 plus f16 rounding.
//   Q4_K / Q5_K  each sub-block's grid (before 6-bit quantisation) has a step s <=
//         range / (nmax - 2) <= 2A / (nmax - 2) and reaches within one step of both ends
//         of the range, so every value is within s of a level; the 6-bit scale and min
//         move each level by at most nmax * d + dmin, with d <= max s / 63 and
//         dmin <= max m / 63, m <= A + 3 s.
//   Q6_K  each group's scale s has |s| in [A_g / 33, A_g / 30]: within 2 A_g / 33 of a level
//         (one step short on the +31 side); the int8 scale moves a level by at most 32 d,
//         d <= max |s| / 127 <= A / 3810.
// Each term gets f16's relative rounding (2^-10 here) and, for a super-block scale that
// is an f16 subnormal (which the quantiser may move up to 4 steps of 2^-24), 4 * 2^-24.
double worst_case(BlockType t, double A) {
  const double r = 1.0 + 1.0 / 1024;
  switch (t) {
    case BlockType::kQ8_0:
      return 0.5625 * A / 127 * r + k2m24;
    case BlockType::kQ4_0:
      return 2 * A / 9 * r + 8 * k2m24;
    case BlockType::kQ4_K:
    case BlockType::kQ5_K: {
      const double nmax = t == BlockType::kQ4_K ? 15 : 31;
      const double s = 2 * A / (nmax - 2);
      const double d = s / 63 * r + 4 * k2m24, dmin = (A + 3 * s) / 63 * r + 4 * k2m24;
      return s + nmax * d + dmin;
    }
    case BlockType::kQ6_K:
      return 2 * A / 33 + 32 * (A / 30 / 127 * r + 4 * k2m24);
    default:  // the types read, never written
      break;
  }
  return 0;
}

// RMS relative error bound per format on Gaussian rows (measured, with ~8% headroom:
// q8_0 0.534%, q6_K 1.69%, q5_K 3.48%, q4_K 7.03%, q4_0 8.13%; llama.cpp's reference
// quantisers give 0.534%, 1.77%, 3.60%, 7.12%, 8.57% on the same kind of data).
double rms_bound(BlockType t) {
  switch (t) {
    case BlockType::kQ8_0:
      return 0.0058;
    case BlockType::kQ6_K:
      return 0.0183;
    case BlockType::kQ5_K:
      return 0.0376;
    case BlockType::kQ4_K:
      return 0.0760;
    case BlockType::kQ4_0:
      return 0.0880;
    default:  // the types read, never written
      break;
  }
  return 0;
}

std::vector<unsigned char> quantize(BlockType t, const std::vector<float>& x) {
  std::vector<unsigned char> q(block_bytes(t, int64_t(x.size())));
  quantize_blocks(t, x.data(), q.data(), int64_t(x.size()));
  return q;
}

std::vector<float> dequantize(BlockType t, const std::vector<unsigned char>& q, size_t n) {
  std::vector<float> y(n);
  dequantize_blocks_reference(t, q.data(), y.data(), int64_t(n));
  return y;
}

double rms_rel(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    s += double(x[i]) * x[i];
  }
  return s > 0 ? std::sqrt(e / s) : std::sqrt(e);
}

// Quantises x and checks every element: within the worst-case bound of its block, on a
// level of its block, and on the nearest one. Returns the RMS relative error.
double check_elements(BlockType t, const std::vector<float>& x, const std::string& what) {
  SCOPED_TRACE(name_of(t) + ": " + what);
  const std::vector<unsigned char> q = quantize(t, x);
  EXPECT_EQ(q.size(), block_bytes(t, int64_t(x.size())));
  const std::vector<float> y = dequantize(t, q, x.size());
  const int64_t per = values_of(t);
  const size_t bytes = block_format(t).bytes;
  int failures = 0;
  for (size_t b = 0; b < x.size() / size_t(per); ++b) {
    double A = 0;
    for (int64_t j = 0; j < per; ++j) A = std::max(A, std::fabs(double(x[b * per + j])));
    const double bound = worst_case(t, A);
    const unsigned char* blk = q.data() + b * bytes;
    for (int e = 0; e < per && failures < 10; ++e) {
      const size_t i = b * size_t(per) + size_t(e);
      const double err = std::fabs(double(x[i]) - y[i]);
      if (err > bound) {
        ADD_FAILURE() << "element " << i << ": x = " << x[i] << ", x' = " << y[i] << ", error "
                      << err << " > worst case " << bound << " (block absmax " << A << ")";
        ++failures;
      }
      // On a level, and no level nearer (up to float rounding of the scale arithmetic).
      const Levels L = levels_of(t, blk, e);
      double nearest = std::numeric_limits<double>::infinity();
      bool on_level = false;
      for (int v = L.qmin; v <= L.qmax; ++v) {
        const float level = L.scale * float(v) + L.offset;
        nearest = std::min(nearest, std::fabs(double(x[i]) - level));
        on_level = on_level || std::fabs(double(level) - y[i]) <= 1e-6 * std::fabs(y[i]) + 1e-30;
      }
      // Q8_0 rounds x / d with ggml's f32 d = A / 127 rather than the stored f16 d, so a
      // value may land one level off where x / d is within 127 * 2^-11 of a tie.
      const double tie = t == BlockType::kQ8_0 ? 0.0625 * std::fabs(double(L.scale)) : 0.0;
      const double tol = 1e-6 * (std::fabs(double(x[i])) + std::fabs(double(L.scale)) * 32 +
                                 std::fabs(double(L.offset))) +
                         tie + 1e-30;
      if (!on_level || err > nearest + tol) {
        ADD_FAILURE() << "element " << i << ": x = " << x[i] << ", x' = " << y[i]
                      << (on_level ? "" : " is not a level of its block")
                      << ", nearest level at distance " << nearest;
        ++failures;
      }
    }
  }
  return rms_rel(x, y);
}

TEST(BlockQuantizer, GaussianRowsWithinTheFormatsErrorBounds) {
  std::mt19937 rng(11);
  for (const BlockType t : kAll) {
    // Rows of an odd number of blocks (7 of 32, 3 of 256), several rows.
    const int64_t row = values_of(t) == 32 ? 7 * 32 : 3 * 256, rows = 40;
    double worst_row = 0;
    std::vector<float> all;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> x = randn(size_t(row), rng, r % 2 ? 0.02f : 1.0f);
      worst_row = std::max(worst_row, check_elements(t, x, "gaussian row " + std::to_string(r)));
      all.insert(all.end(), x.begin(), x.end());
    }
    const double total = rms_rel(all, dequantize(t, quantize(t, all), all.size()));
    EXPECT_LT(total, rms_bound(t)) << name_of(t);
    EXPECT_LT(worst_row, 1.25 * rms_bound(t)) << name_of(t);
    std::printf("  %s: RMS relative error %.3f%% (worst row %.3f%%)\n", name_of(t).c_str(),
                100 * total, 100 * worst_row);
  }
}

TEST(BlockQuantizer, OutliersZerosConstantsAndTinyValues) {
  std::mt19937 rng(5);
  for (const BlockType t : kAll) {
    const int64_t per = values_of(t);
    const int64_t n = 4 * std::max<int64_t>(per, 64);
    // Outliers: one value of 40 sigma (either sign) in every 64.
    std::vector<float> x = randn(size_t(n), rng, 0.02f);
    for (int64_t i = 0; i < n; i += 64) x[size_t(i + (i / 64) % 7)] = (i / 64) % 2 ? 0.8f : -0.8f;
    const double outliers = check_elements(t, x, "outliers");
    EXPECT_LT(outliers, 4 * rms_bound(t));

    // All-zero blocks decode to exact zeros.
    x.assign(size_t(n), 0.0f);
    check_elements(t, x, "zeros");
    EXPECT_EQ(dequantize(t, quantize(t, x), x.size()), x);

    // Constant blocks (positive, negative) are exact up to the f16 rounding of the scale
    // (relative 2^-11), or, where the scale is an f16 subnormal, up to its step (2^-24)
    // times the levels it is multiplied by.
    for (const float c : {0.37f, -1.25f, 3e-3f, -7e-5f}) {
      x.assign(size_t(n), c);
      check_elements(t, x, "constant " + std::to_string(c));
      const std::vector<float> y = dequantize(t, quantize(t, x), x.size());
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_NEAR(y[i], c, 2e-3 * std::fabs(c) + 32 * k2m24) << name_of(t) << " constant " << c;
    }

    // Tiny values (the f16 scales near or in the subnormal range) keep their precision as
    // far as f16 allows: the relative error stays near the Gaussian one down to ~1e-4.
    for (const float sd : {1e-3f, 1e-4f}) {
      x = randn(size_t(n), rng, sd);
      const double tiny = check_elements(t, x, "tiny " + std::to_string(sd));
      EXPECT_LT(tiny, (sd < 5e-4f ? 1.3 : 1.15) * rms_bound(t)) << name_of(t) << " sd " << sd;
    }
    x = randn(size_t(n), rng, 1e-6f);
    check_elements(t, x, "tiny 1e-6");

    // Mixed magnitudes in one row, and in one K super-block: runs of 32 values of 1e3,
    // 1e-5 and 0 next to each other.
    x = randn(size_t(n), rng, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t blk = i / 32;
      x[size_t(i)] *= blk % 3 == 0 ? 1e3f : blk % 3 == 1 ? 1e-5f : 0.0f;
    }
    check_elements(t, x, "mixed magnitudes");
  }
}

TEST(BlockQuantizer, SizesAndDeterminism) {
  std::mt19937 rng(3);
  for (const BlockType t : kAll) {
    const int64_t n = 5 * values_of(t);
    const std::vector<float> x = randn(size_t(n), rng, 0.1f);
    const size_t bytes = block_bytes(t, n);
    EXPECT_EQ(bytes, size_t(5) * block_format(t).bytes);
    // Every byte written, whatever the buffer held, nothing past the end touched, and the
    // same bytes every time.
    std::vector<unsigned char> a(bytes + 16, 0x00), b(bytes + 16, 0xFF);
    quantize_blocks(t, x.data(), a.data(), n);
    quantize_blocks(t, x.data(), b.data(), n);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), bytes), 0) << name_of(t);
    for (size_t i = bytes; i < bytes + 16; ++i) {
      EXPECT_EQ(a[i], 0x00) << name_of(t);
      EXPECT_EQ(b[i], 0xFF) << name_of(t);
    }
    // Quantising blocks one at a time gives the same bytes as all at once.
    std::vector<unsigned char> c(bytes);
    for (int64_t blk = 0; blk < 5; ++blk)
      quantize_blocks(t, x.data() + blk * values_of(t), c.data() + blk * block_format(t).bytes,
                      values_of(t));
    EXPECT_EQ(std::memcmp(a.data(), c.data(), bytes), 0) << name_of(t);
    // No values, no bytes.
    quantize_blocks(t, x.data(), c.data(), 0);
  }
}

// Q8_0 is ggml's quantize_row_q8_0_ref byte for byte (wherever its f16 scale is a normal
// number), as llama-quantize writes it.
TEST(BlockQuantizer, Q8_0IsGgmlsReferenceQuantisation) {
  std::mt19937 rng(8);
  const std::vector<float> x = randn(32 * 64, rng, 0.05f);
  std::vector<unsigned char> want(block_bytes(BlockType::kQ8_0, int64_t(x.size())));
  ref::quantize_row_q8_0(x.data(), want.data(), int64_t(x.size()));
  EXPECT_EQ(quantize(BlockType::kQ8_0, x), want);
}

TEST(BlockQuantizer, RefusesNonFiniteAndOverflowingValuesNamingTheElement) {
  for (const BlockType t : kAll) {
    const int64_t n = 2 * values_of(t);
    std::vector<float> x(size_t(n), 0.5f);
    std::vector<unsigned char> q(block_bytes(t, n));
    for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
      x[size_t(n - 3)] = bad;
      expect_error([&] { quantize_blocks(t, x.data(), q.data(), n); },
                   {name_of(t), "element " + std::to_string(n - 3), "non-finite"});
    }
    // A magnitude whose block scale overflows f16.
    x.assign(size_t(n), 1.0f);
    x[size_t(values_of(t) + 5)] = -3e38f;
    expect_error([&] { quantize_blocks(t, x.data(), q.data(), n); },
                 {name_of(t), "element " + std::to_string(values_of(t) + 5), "too large"});
    // Not a whole number of blocks.
    expect_error([&] { quantize_blocks(t, x.data(), q.data(), n - 1); }, {name_of(t)});
  }
  // The largest magnitudes that fit are accepted: 6e4 * 127 for Q8_0, 6e4 * 8 for Q4_0.
  std::vector<float> big(32, 1.0f);
  big[3] = 6.0e4f * 127;
  std::vector<unsigned char> q(34);
  quantize_blocks(BlockType::kQ8_0, big.data(), q.data(), 32);
  big[3] = 6.0e4f * 8;
  quantize_blocks(BlockType::kQ4_0, big.data(), q.data(), 32);
}

}  // namespace
}  // namespace hyperion
