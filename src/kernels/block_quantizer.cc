// quantize_blocks (kernels/block_quant.h): f32 values into llama.cpp's Q4_0, Q8_0, Q4_K,
// Q5_K and Q6_K blocks, in ggml's exact byte layouts (block_quant.h describes them; ggml's
// ggml-common.h and ggml-quants.c are the specification), so that llama.cpp reads them.
//
// How each block's scales are chosen (all with the plain squared error as the objective;
// there is no importance matrix here):
//   Q8_0  ggml's reference quantiser, byte for byte: d = absmax / 127, q = round(x / d)
//         (half away from zero), d stored as f16; except where that d is an f16 subnormal
//         (absmax below ~7.8e-3), where the values round against the stored d.
//   Q4_0  absmax-based as ggml's: the value of largest magnitude maps to the -8 end of the
//         range (which has one more level than the + end). Besides ggml's d = max / -8, a
//         few nearby divisors (7.5 ... 9) and each one's least-squares refit are tried; the
//         one with the least squared error (with d rounded to f16) is kept.
//   Q4_K, Q5_K  per 32-value sub-block a scale s >= 0 and min m >= 0 (x ~ s * q - m, q in
//         [0, nmax]): from the sub-block's range [min(x, 0), max(x)], a sweep of ~26 grid
//         spacings around range / nmax, each rounded and refitted by least squares (s, m);
//         the best is kept. Then the 8 scales and 8 mins are quantised to 6 bits against
//         the super-block's f16 d = max(s) / 63 and dmin = max(m) / 63: for each sub-block
//         the 4 (scale, min) pairs around its own values are tried, each with its values
//         re-rounded, and the best kept.
//   Q6_K  per 16-value group a signed scale s (x ~ s * q, q in [-32, 31]): ~42 candidate
//         spacings mapping the group's largest-magnitude value to either end of the range,
//         each rounded and refitted by least squares. The 16 scales are quantised to int8
//         against the f16 d = max|s| / 127, again trying the two nearest int8 scales per
//         group with re-rounded values.
// Every block's values are finally rounded to the nearest level its stored (f16, 6-bit,
// int8) scales give, so no single value could be moved to a closer level. A super-block
// scale that f16 rounds down below what its largest sub-block scale needs is moved up one
// f16 step at a time, and where it is an f16 subnormal (common: Q6_K's d is subnormal for
// any block whose absmax is below ~0.25, Q4_K's below ~0.03) the next 3 steps up are
// tried too, keeping the one with the least squared error; so small values keep their
// relative precision as far as f16 allows.
// The candidates are kept within ranges that bound every value's error (A the block's or
// group's largest magnitude): Q4_0 |d| in [A / 9, A / 7.5]; Q4_K/Q5_K grids with a step of
// at most range / (nmax - 2) reaching within one step of both ends of the range; Q6_K
// |s| in [A / 33, A / 30]. tests/kernels/block_quantizer_test.cc derives the resulting
// worst case per format and checks it.
//
// Measured RMS relative error (sqrt(sum (x - x')^2 / sum x^2)) on N(0, sigma^2) data, 2^20
// values, dequantised by llama.cpp's own dequantize_row_*, against llama.cpp's reference
// quantisers (quantize_row_*_ref: what llama-quantize runs without an importance matrix)
// on the same data:
//   format  sigma = 1 (0.02, 1000 alike)  sigma = 1e-4        sigma = 1e-6
//           here     llama.cpp            here    llama.cpp   here   llama.cpp
//   q8_0    0.534%   0.534% (same bytes)  0.55%   1.09%       1.7%   99.9%
//   q6_K    1.69%    1.77%                1.73%   11.3%       2.8%   100%
//   q5_K    3.48%    3.60%                3.45%   5.43%       4.3%   302%
//   q4_K    7.03%    7.12%                6.99%   8.00%       7.8%   301%
//   q4_0    8.13%    8.57%                8.13%   8.57%       8.7%   10.4%
// Speed on one core: Q8_0 ~5 ns per value, Q4_0 ~50, Q4_K/Q5_K ~60 (~200 where the super-block
// scales are f16 subnormals), Q6_K ~95-140.
//
// Non-finite input is refused (an Error naming the element), as are magnitudes beyond what
// the format's f16 scales can reach (roughly 8.3e6 for Q8_0, 5.2e5 for Q4_0, 6e7 for
// Q4_K, 1.3e8 for Q5_K, 2.7e8 for Q6_K). Deterministic and single-threaded: callers
// parallelise over rows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "base/error.h"
#include "kernels/block_quant.h"
#include "tensor/convert.h"

namespace hyperion {

namespace {

constexpr int64_t kSuper = 256;  // values per K-format super-block

float h2f(f16 h) {
  return f16_to_f32(h);
}

void put_f16(unsigned char* p, f16 h) {
  std::memcpy(p, &h.bits, 2);
}

bool f16_is_inf(f16 h) {
  return (h.bits & 0x7FFFu) >= 0x7C00u;
}

// Round to nearest, ties to even (the default rounding mode), inline: std::lrint is a
// library call. Clamped first, so a huge quotient cannot wrap.
int round_int(float v) {
  v = std::min(std::max(v, -1.0e9f), 1.0e9f);
#if defined(__SSE2__)
  return _mm_cvtss_si32(_mm_set_ss(v));
#else
  return static_cast<int>(std::lrint(v));
#endif
}

int clampi(int v, int lo, int hi) {
  return std::min(std::max(v, lo), hi);
}

const char* fmt_name(BlockType t) {
  return block_format(t).name;
}

// The index (in x[0, n)) of the value of largest magnitude.
int64_t argmax_abs(const float* x, int64_t n) {
  int64_t at = 0;
  for (int64_t i = 1; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(x[at])) at = i;
  return at;
}

[[noreturn]] void too_large(BlockType t, const float* src, int64_t block_start, const float* x,
                            int64_t n) {
  const int64_t at = block_start + argmax_abs(x, n);
  fail(
      "quantize_blocks({}): element {} = {} is too large for the format: its block's scale "
      "overflows f16",
      fmt_name(t), at, src[at]);
}

// The f16 scale d for which a value `target` >= 0 lands on `levels` (d ~ target / levels),
// moved up one f16 step at a time while target / d would round past `levels` (f16
// subnormals round coarsely). Inf when target / levels overflows f16.
f16 f16_scale_for(float target, int levels) {
  if (!(target > 0.0f)) return f16{0};
  f16 d = f32_to_f16(target / float(levels));
  if (f16_is_inf(d)) return d;
  while (h2f(d) * (float(levels) + 0.5f) < target && !f16_is_inf(d)) ++d.bits;
  return d;
}

// ---- Q8_0: ggml's quantize_row_q8_0_ref, byte for byte, wherever its f16 d is a normal
// number (block absmax >= 127 * 2^-14 ~ 7.8e-3 ... and below 8.3e6). ggml rounds x / d
// with the f32 d but stores d in f16; where d is subnormal in f16 that mismatch costs up to
// tens of percent, so such blocks round against the stored f16 d instead.
void quantize_q8_0(const float* src, unsigned char* dst, int64_t n) {
  constexpr int64_t kQK = 32;
  constexpr float kMinNormalF16 = 6.103515625e-05f;  // 2^-14
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = src + b * kQK;
    unsigned char* blk = dst + b * 34;
    float amax = 0.0f;
    for (int64_t j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    f16 dh = f32_to_f16(d);
    if (f16_is_inf(dh)) too_large(BlockType::kQ8_0, src, b * kQK, x, kQK);
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (d != 0.0f && d < kMinNormalF16) {
      dh = f16_scale_for(amax, 127);
      id = 1.0f / h2f(dh);
    }
    put_f16(blk, dh);
    for (int64_t j = 0; j < kQK; ++j) {
      const float q = std::min(std::max(std::round(x[j] * id), -127.0f), 127.0f);
      blk[2 + j] = static_cast<unsigned char>(static_cast<int8_t>(q));
    }
  }
}

// ---- Q4_0: x = d * (q - 8), q in [0, 15].

// Squared error of the 32 values x rounded onto dd * (-8..7).
float q4_0_error(const float* x, float dd) {
  const float inv = dd != 0.0f ? 1.0f / dd : 0.0f;
  float err = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const int q = clampi(round_int(x[j] * inv), -8, 7);
    const float e = dd * float(q) - x[j];
    err += e * e;
  }
  return err;
}

void quantize_q4_0(const float* src, unsigned char* dst, int64_t n) {
  constexpr int64_t kQK = 32;
  // Divisors of the largest-magnitude value; ggml's 8 first, so it wins ties.
  static constexpr float kDivisors[] = {8.0f, 7.5f, 7.75f, 8.25f, 8.5f, 8.75f, 9.0f};
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = src + b * kQK;
    unsigned char* blk = dst + b * 18;
    const float mx = x[argmax_abs(x, kQK)];
    f16 best{0};
    if (mx != 0.0f) {
      const f16 plain = f32_to_f16(mx / -8.0f);
      if (f16_is_inf(plain)) too_large(BlockType::kQ4_0, src, b * kQK, x, kQK);
      float best_err = std::numeric_limits<float>::infinity();
      // Only scales between A / 9 and A / 7.5 (A = |mx|): every value then lies within
      // 2A / 9 of a level (the worst-case bound the tests check).
      const float lo_d = std::fabs(mx) / 9.0f, hi_d = std::fabs(mx) / 7.5f;
      auto consider = [&](float d) {
        if (!(std::fabs(d) >= lo_d && std::fabs(d) <= hi_d)) return;
        const f16 dh = f32_to_f16(d);
        if (f16_is_inf(dh) || dh.bits == 0 || dh.bits == 0x8000u) return;
        const float dd = h2f(dh);
        const float err = q4_0_error(x, dd);
        if (err < best_err) {
          best_err = err;
          best = dh;
        }
      };
      for (const float k : kDivisors) {
        const float d = mx / -k;
        consider(d);
        // The least-squares scale for the levels this d rounds to.
        const float inv = 1.0f / d;
        float sxl = 0.0f, sll = 0.0f;
        for (int j = 0; j < kQK; ++j) {
          const int q = clampi(round_int(x[j] * inv), -8, 7);
          sxl += x[j] * float(q);
          sll += float(q * q);
        }
        if (sll > 0.0f) consider(sxl / sll);
      }
    }
    put_f16(blk, best);
    const float dd = h2f(best);
    for (int j = 0; j < 16; ++j) {
      const int q0 = dd != 0.0f ? clampi(round_int(x[j] / dd), -8, 7) + 8 : 8;
      const int q1 = dd != 0.0f ? clampi(round_int(x[j + 16] / dd), -8, 7) + 8 : 8;
      blk[2 + j] = static_cast<unsigned char>(q0 | (q1 << 4));
    }
  }
}

// ---- Q4_K / Q5_K: 8 sub-blocks of 32, x = d * sc * q - dmin * m, q in [0, nmax].

struct ScaleMin {
  float scale = 0.0f;  // >= 0
  float min = 0.0f;    // >= 0: the sub-block's values are scale * q - min
};

// The (scale, min) with the least squared error found for the 32 values x.
ScaleMin fit_scale_min(const float* x, int nmax) {
  constexpr int n = 32;
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.0f);  // the offset -min is never positive
  if (hi <= lo) return ScaleMin{0.0f, -lo};
  float sum_x = 0.0f;
  for (int i = 0; i < n; ++i) sum_x += x[i];

  float sum_x2 = 0.0f;
  for (int i = 0; i < n; ++i) sum_x2 += x[i] * x[i];
  // Squared error of the values rounded onto scale * q + offset.
  auto error_of = [&](float scale, float offset) {
    const float inv = 1.0f / scale;
    float err = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int q = clampi(round_int((x[i] - offset) * inv), 0, nmax);
      const float e = scale * float(q) + offset - x[i];
      err += e * e;
    }
    return err;
  };
  ScaleMin best{(hi - lo) / float(nmax), -lo};
  float best_err = error_of(best.scale, lo);
  // Grid spacings around range / nmax; each rounding refitted by least squares, whose
  // error (for that rounding) is sum x^2 - scale * sum xl - offset * sum x.
  for (int step = -10; step <= 15; ++step) {
    const float inv = (float(nmax) + 0.1f * float(step)) / (hi - lo);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float l = float(clampi(round_int((x[i] - lo) * inv), 0, nmax));
      sum_l += l;
      sum_l2 += l * l;
      sum_xl += l * x[i];
    }
    const float det = float(n) * sum_l2 - sum_l * sum_l;
    float scale = 0.0f, offset = 0.0f;
    if (det > 0.0f) {
      scale = (float(n) * sum_xl - sum_x * sum_l) / det;
      offset = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    }
    if (det <= 0.0f || offset > 0.0f) {  // constrained to offset 0
      offset = 0.0f;
      scale = sum_l2 > 0.0f ? sum_xl / sum_l2 : 0.0f;
    }
    // Only grids that reach within one step of both ends of the range with a step of at
    // most range / (nmax - 2): every value then lies within one step of a level.
    if (!(scale > 0.0f && scale <= (hi - lo) / float(nmax - 2) && offset <= lo + scale &&
          offset + float(nmax) * scale >= hi - scale))
      continue;
    const float err = sum_x2 - scale * sum_xl - offset * sum_x;
    if (err < best_err) {
      best_err = err;
      best = ScaleMin{scale, -offset};
    }
  }
  return best;
}

// Packs the 6-bit scale and min of sub-block j into a K block's scales[12] (the inverse
// of k_scale_min). `scales` starts zeroed.
void pack_scale_min(uint8_t* scales, int j, int sc, int m) {
  if (j < 4) {
    scales[j] |= uint8_t(sc);
    scales[j + 4] |= uint8_t(m);
  } else {
    scales[j + 4] = uint8_t((sc & 15) | ((m & 15) << 4));
    scales[j - 4] |= uint8_t((sc >> 4) << 6);
    scales[j] |= uint8_t((m >> 4) << 6);
  }
}

// The 6-bit scale and min of each sub-block for the super-block scales dd and dm: of the
// (at most 4) pairs around the sub-block's fitted scale and min, the one whose re-rounded
// values have the least squared error. Returns the super-block's squared error.
float k_sub_scales(const float* x, const ScaleMin* fit, int nmax, float dd, float dm, int* sc_out,
                   int* m_out) {
  float total = 0.0f;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    const int sc0 = dd > 0.0f ? clampi(int(std::floor(fit[j].scale / dd)), 0, 63) : 0;
    const int m0 = dm > 0.0f ? clampi(int(std::floor(fit[j].min / dm)), 0, 63) : 0;
    int best_sc = sc0, best_m = m0;
    float best_err = std::numeric_limits<float>::infinity();
    for (int sc = sc0; sc <= std::min(sc0 + 1, dd > 0.0f ? 63 : 0); ++sc) {
      for (int m = m0; m <= std::min(m0 + 1, dm > 0.0f ? 63 : 0); ++m) {
        const float scale = dd * float(sc), mn = dm * float(m);  // as the dequantiser forms them
        const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        float err = 0.0f;
        for (int i = 0; i < 32; ++i) {
          const int q = clampi(round_int((xs[i] + mn) * inv), 0, nmax);
          const float e = scale * float(q) - mn - xs[i];
          err += e * e;
        }
        if (err < best_err) {
          best_err = err;
          best_sc = sc;
          best_m = m;
        }
      }
    }
    sc_out[j] = best_sc;
    m_out[j] = best_m;
    total += best_err;
  }
  return total;
}

// Candidate f16 super-block scales: d itself, and where d is an f16 subnormal (whose steps
// of 2^-24 are coarse) the next 3 steps up too, whose products with the 6-bit (or int8)
// sub-block scales may land nearer. Returns the count.
int f16_candidates(f16 d, f16* out) {
  out[0] = d;
  if (d.bits == 0 || d.bits >= 0x0400u) return 1;
  for (int k = 1; k < 4; ++k) out[k] = f16{uint16_t(d.bits + k)};
  return 4;
}

// One Q4_K (nmax 15) or Q5_K (nmax 31) super-block: fills its d, dmin, scales and the
// levels L[256] (0..nmax). Returns false when a scale overflows f16.
bool quantize_k_super(const float* x, int nmax, unsigned char* blk, uint8_t* L) {
  ScaleMin fit[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    fit[j] = fit_scale_min(x + 32 * j, nmax);
    max_scale = std::max(max_scale, fit[j].scale);
    max_min = std::max(max_min, fit[j].min);
  }
  const f16 d0 = f16_scale_for(max_scale, 63), dmin0 = f16_scale_for(max_min, 63);
  if (f16_is_inf(d0) || f16_is_inf(dmin0)) return false;
  f16 ds[4], dms[4];
  const int nd = f16_candidates(d0, ds), ndm = f16_candidates(dmin0, dms);
  f16 d = d0, dmin = dmin0;
  int sc[8] = {}, m[8] = {};
  float best = std::numeric_limits<float>::infinity();
  for (int a = 0; a < nd; ++a)
    for (int b = 0; b < ndm; ++b) {
      int sc_try[8], m_try[8];
      const float err = k_sub_scales(x, fit, nmax, h2f(ds[a]), h2f(dms[b]), sc_try, m_try);
      if (err < best) {
        best = err;
        d = ds[a];
        dmin = dms[b];
        std::copy(sc_try, sc_try + 8, sc);
        std::copy(m_try, m_try + 8, m);
      }
    }
  put_f16(blk, d);
  put_f16(blk + 2, dmin);
  uint8_t* scales = blk + 4;
  std::memset(scales, 0, 12);
  const float dd = h2f(d), dm = h2f(dmin);
  for (int j = 0; j < 8; ++j) {
    pack_scale_min(scales, j, sc[j], m[j]);
    const float* xs = x + 32 * j;
    const float scale = dd * float(sc[j]), mn = dm * float(m[j]);
    for (int i = 0; i < 32; ++i)
      L[32 * j + i] = uint8_t(scale > 0.0f ? clampi(round_int((xs[i] + mn) / scale), 0, nmax) : 0);
  }
  return true;
}

void quantize_q4_k(const float* src, unsigned char* dst, int64_t n) {
  uint8_t L[kSuper];
  for (int64_t b = 0; b < n / kSuper; ++b) {
    const float* x = src + b * kSuper;
    unsigned char* blk = dst + b * 144;
    if (!quantize_k_super(x, 15, blk, L)) too_large(BlockType::kQ4_K, src, b * kSuper, x, kSuper);
    unsigned char* qs = blk + 16;
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l)
        qs[32 * c + l] = uint8_t(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

void quantize_q5_k(const float* src, unsigned char* dst, int64_t n) {
  uint8_t L[kSuper];
  for (int64_t b = 0; b < n / kSuper; ++b) {
    const float* x = src + b * kSuper;
    unsigned char* blk = dst + b * 176;
    if (!quantize_k_super(x, 31, blk, L)) too_large(BlockType::kQ5_K, src, b * kSuper, x, kSuper);
    unsigned char* qh = blk + 16;
    unsigned char* qs = blk + 48;
    std::memset(qh, 0, 32);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
        qs[32 * c + l] = uint8_t((lo & 15) | ((hi & 15) << 4));
        qh[l] = uint8_t(qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
  }
}

// ---- Q6_K: 16 groups of 16, x = d * sc * (q - 32), q - 32 in [-32, 31].

// The signed scale with the least squared error found for the 16 values x.
float fit_q6_group(const float* x) {
  constexpr int n = 16;
  const float mx = x[argmax_abs(x, n)];
  if (mx == 0.0f) return 0.0f;
  float sum_x2 = 0.0f;
  for (int i = 0; i < n; ++i) sum_x2 += x[i] * x[i];
  float best = mx / -32.0f, best_err = std::numeric_limits<float>::infinity();
  // The largest-magnitude value onto either end of [-32, 31] (the -32 end, with its extra
  // level, usually wins), at spacings around it; each rounding refitted by least squares.
  for (const float end : {-32.0f, 31.0f}) {
    for (int step = -10; step <= 10; ++step) {
      const float inv = (end + (end < 0 ? -0.1f : 0.1f) * float(step)) / mx;
      float sum_xl = 0.0f, sum_l2 = 0.0f;
      for (int i = 0; i < n; ++i) {
        const float l = float(clampi(round_int(x[i] * inv), -32, 31));
        sum_xl += x[i] * l;
        sum_l2 += l * l;
      }
      if (!(sum_l2 > 0.0f)) continue;
      // Only scales between A / 33 and A / 30 (A = |mx|): every value then lies within
      // 2A / 33 of a level.
      const float scale = sum_xl / sum_l2;
      if (!(std::fabs(scale) >= std::fabs(mx) / 33.0f && std::fabs(scale) <= std::fabs(mx) / 30.0f))
        continue;
      // The refitted scale's error: sum x^2 - (sum xl)^2 / sum l^2.
      const float err = sum_x2 - sum_xl * sum_xl / sum_l2;
      if (err < best_err) {
        best_err = err;
        best = scale;
      }
    }
  }
  return best;
}

// The int8 scale of each group for the super-block scale dd: of the two around the
// group's fitted scale s[g], the one whose re-rounded values have the least squared error.
// Returns the super-block's squared error.
float q6_group_scales(const float* x, const float* s, float dd, int* sc_out) {
  float total = 0.0f;
  for (int g = 0; g < 16; ++g) {
    const float* xs = x + 16 * g;
    const int sc0 = dd > 0.0f ? clampi(int(std::floor(s[g] / dd)), -128, 127) : 0;
    int best_sc = sc0;
    float best_err = std::numeric_limits<float>::infinity();
    for (int sc = sc0; sc <= std::min(sc0 + 1, dd > 0.0f ? 127 : 0); ++sc) {
      const float scale = dd * float(sc);
      const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
      float err = 0.0f;
      for (int i = 0; i < 16; ++i) {
        const int q = clampi(round_int(xs[i] * inv), -32, 31);
        const float e = scale * float(q) - xs[i];
        err += e * e;
      }
      if (err < best_err) {
        best_err = err;
        best_sc = sc;
      }
    }
    sc_out[g] = best_sc;
    total += best_err;
  }
  return total;
}

void quantize_q6_k(const float* src, unsigned char* dst, int64_t n) {
  uint8_t L[kSuper];
  for (int64_t b = 0; b < n / kSuper; ++b) {
    const float* x = src + b * kSuper;
    unsigned char* blk = dst + b * 210;
    float s[16], max_abs = 0.0f;
    for (int g = 0; g < 16; ++g) {
      s[g] = fit_q6_group(x + 16 * g);
      max_abs = std::max(max_abs, std::fabs(s[g]));
    }
    const f16 d0 = f16_scale_for(max_abs, 127);
    if (f16_is_inf(d0)) too_large(BlockType::kQ6_K, src, b * kSuper, x, kSuper);
    f16 ds[4];
    const int nd = f16_candidates(d0, ds);
    f16 d = d0;
    int sc[16] = {};
    float best = std::numeric_limits<float>::infinity();
    for (int k = 0; k < nd; ++k) {
      int sc_try[16];
      const float err = q6_group_scales(x, s, h2f(ds[k]), sc_try);
      if (err < best) {
        best = err;
        d = ds[k];
        std::copy(sc_try, sc_try + 16, sc);
      }
    }
    const float dd = h2f(d);
    auto* scales = reinterpret_cast<int8_t*>(blk + 192);
    for (int g = 0; g < 16; ++g) {
      const float* xs = x + 16 * g;
      scales[g] = int8_t(sc[g]);
      const float scale = dd * float(sc[g]);
      for (int i = 0; i < 16; ++i)
        L[16 * g + i] =
            uint8_t((scale != 0.0f ? clampi(round_int(xs[i] / scale), -32, 31) : 0) + 32);
    }
    put_f16(blk + 208, d);
    for (int h = 0; h < 2; ++h) {
      unsigned char* ql = blk + 64 * h;
      unsigned char* qh = blk + 128 + 32 * h;
      const uint8_t* Lh = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int a = Lh[l], bq = Lh[l + 32], c = Lh[l + 64], e = Lh[l + 96];
        ql[l] = uint8_t((a & 15) | ((c & 15) << 4));
        ql[l + 32] = uint8_t((bq & 15) | ((e & 15) << 4));
        qh[l] = uint8_t((a >> 4) | ((bq >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6));
      }
    }
  }
}

}  // namespace

void quantize_blocks(BlockType t, const float* src, void* dst, int64_t n) {
  HYP_CHECK(t == BlockType::kQ4_0 || t == BlockType::kQ8_0 || t == BlockType::kQ4_K ||
                t == BlockType::kQ5_K || t == BlockType::kQ6_K,
            "quantize_blocks: {} is read, not written (hyperion writes q4_0, q8_0, q4_K, q5_K, q6_K)",
            block_format(t).name);
  const int64_t per_block = block_format(t).values;
  HYP_CHECK(n >= 0 && n % per_block == 0,
            "quantize_blocks({}): {} values are not a whole number of blocks of {}", fmt_name(t), n,
            per_block);
  for (int64_t i = 0; i < n; ++i)
    HYP_CHECK(std::isfinite(src[i]),
              "quantize_blocks({}): element {} is {}: a non-finite value cannot be quantised",
              fmt_name(t), i, src[i]);
  auto* out = static_cast<unsigned char*>(dst);
  switch (t) {
    case BlockType::kQ4_0:
      quantize_q4_0(src, out, n);
      return;
    case BlockType::kQ8_0:
      quantize_q8_0(src, out, n);
      return;
    case BlockType::kQ4_K:
      quantize_q4_k(src, out, n);
      return;
    case BlockType::kQ5_K:
      quantize_q5_k(src, out, n);
      return;
    case BlockType::kQ6_K:
      quantize_q6_k(src, out, n);
      return;
    default:
      break;
  }
  fail("quantize_blocks: invalid block type {}", static_cast<int>(t));
}

}  // namespace hyperion
