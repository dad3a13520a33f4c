// Training quantisers. Each kernel body is written once as plain loops (always inlined)
// and compiled twice: for the baseline target and, picked at run time, for AVX-512, where
// the compiler vectorises the loops (hash, floor, clamp, pack). Both compute the same
// f32 operations element by element, so they agree exactly with each other and with the
// ref:: versions.
#include "kernels/quantize_train.h"

// GCC 12's AVX-512 intrinsic headers fill "don't care" operands from self-initialised
// _mm*_undefined_*() values, which -Wuninitialized flags once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

#define HYP_INLINE inline __attribute__((always_inline))
#define HYP_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

bool use_avx512() {
  static const bool yes = cpu_features().avx512f && cpu_features().avx512bw;
  return yes;
}

void check_in(const char* op, DType d) {
  HYP_CHECK(d == DType::kF32 || d == DType::kBF16, "{}: input must be f32 or bf16, got {}", op,
            dtype_name(d));
}

void check_2d(const char* op, const TensorView& x, const TensorView& q) {
  check_in(op, x.dtype);
  HYP_CHECK(x.rank() == 2 && x.is_contiguous(), "{}: input must be 2-D contiguous, got {}", op,
            x.str());
  HYP_CHECK(q.dtype == DType::kI8 && q.shape == x.shape && q.is_contiguous(),
            "{}: output must be contiguous int8 of shape {}, got {}", op, x.str(), q.str());
  HYP_CHECK(x.numel() < (int64_t(1) << 32), "{}: {} elements exceed the 2^32 a draw index covers",
            op, x.numel());
}

// Row r of x as f32, into buf (bf16 widened exactly).
HYP_INLINE const float* row_f32(const void* x, DType xd, int64_t r, int64_t cols, float* buf) {
  if (xd == DType::kF32) return static_cast<const float*>(x) + r * cols;
  const uint16_t* p = static_cast<const uint16_t*>(x) + r * cols;
  for (int64_t c = 0; c < cols; ++c) buf[c] = std::bit_cast<float>(uint32_t(p[c]) << 16);
  return buf;
}

HYP_INLINE bool bad_scale(float s) {
  return !(s > 0.0f) || !(s < std::numeric_limits<float>::infinity());
}

HYP_INLINE int8_t nearest_i8(float v) {
  float r = std::nearbyint(v);
  r = r < -127.0f ? -127.0f : (r > 127.0f ? 127.0f : r);
  return static_cast<int8_t>(r);
}

// ---------------------------------------------------------------------------------------
// Explicit AVX-512 loops for what the compiler leaves scalar (the hash, the fp8 decode,
// the column max), computing exactly the scalar expressions above lane by lane.

inline __mmask16 tail_mask(int64_t k) {
  return k >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << k) - 1u);
}

// The 32-bit draws of 16 consecutive elements base + c + lane (sr_bits, 16 lanes).
HYP_AVX512 inline __m512i sr_bits16(SrKey key, uint32_t first) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(first)), lane);
  __m512i h = _mm512_add_epi32(_mm512_mullo_epi32(idx, _mm512_set1_epi32(int(0x9E3779B1u))),
                               _mm512_set1_epi32(static_cast<int>(key.a)));
  h = _mm512_xor_si512(h, _mm512_set1_epi32(static_cast<int>(key.b)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0x85EBCA6Bu)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0xC2B2AE35u)));
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

// sr_round_i8(x * d + u), masked to k, zeroed where d == 0 when zero_where_d0.
HYP_AVX512 inline void sr_store16(__m512 x, __m512 d, __m512 u, __mmask16 k, bool zero_where_d0,
                                  int8_t* o) {
  __m512 r = _mm512_roundscale_ps(_mm512_add_ps(_mm512_mul_ps(x, d), u),
                                  _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  __mmask16 keep = k;
  if (zero_where_d0) keep = _mm512_mask_cmp_ps_mask(k, d, _mm512_setzero_ps(), _CMP_NEQ_OQ);
  _mm512_mask_cvtepi32_storeu_epi8(o, k, _mm512_maskz_cvttps_epi32(keep, r));
}

// One row of the gradient quantiser: o_rows[c] from v[c] * inv_row with the draw's low
// half, o_cols[c] from (v[c] * f) * inv_cols[c] with its high half (either may be null).
HYP_AVX512 void sr_row_avx512(const float* v, int64_t cols, float inv_row, int8_t* o_rows, float f,
                              const float* inv_cols, int8_t* o_cols, SrKey key, uint32_t base) {
  const __m512 scale16 = _mm512_set1_ps(1.0f / 65536.0f);
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  const __m512 ir = _mm512_set1_ps(inv_row), fv = _mm512_set1_ps(f);
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 k = tail_mask(cols - c);
    const __m512i h = sr_bits16(key, base + static_cast<uint32_t>(c));
    const __m512 x = _mm512_maskz_loadu_ps(k, v + c);
    if (o_rows != nullptr) {
      const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(h, low16)), scale16);
      sr_store16(x, ir, u, k, false, o_rows + c);
    }
    if (o_cols != nullptr) {
      const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 16)), scale16);
      const __m512 d = _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), k, inv_cols + c);
      sr_store16(_mm512_mul_ps(x, fv), d, u, k, true, o_cols + c);
    }
  }
}

// m[c] = max(m[c], |v[c] * f| bits).
HYP_AVX512 void col_max_avx512(const float* v, int64_t cols, float f, uint32_t* m) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512 fv = _mm512_set1_ps(f);
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 k = tail_mask(cols - c);
    const __m512i b = _mm512_and_si512(
        _mm512_castps_si512(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, v + c), fv)), abs_mask);
    _mm512_mask_storeu_epi32(m + c, k, _mm512_max_epu32(_mm512_maskz_loadu_epi32(k, m + c), b));
  }
}

// Column absmax of rows [r0, r1) of x [.., cols] into m[cols] (bit patterns: NaN orders
// above inf).
HYP_INLINE void col_absmax_bits(const void* x, DType xd, int64_t r0, int64_t r1, int64_t cols,
                                const float* row_factor, uint32_t* m, float* buf,
                                bool wide = false) {
  std::fill(m, m + cols, 0u);
  for (int64_t r = r0; r < r1; ++r) {
    const float* v = row_f32(x, xd, r, cols, buf);
    const float f = row_factor != nullptr ? row_factor[r] : 1.0f;
    if (wide) {
      col_max_avx512(v, cols, f, m);
      continue;
    }
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t b = std::bit_cast<uint32_t>(v[c] * f) & 0x7fffffffu;
      m[c] = b > m[c] ? b : m[c];
    }
  }
}

// Rows [r0, r1) of x -> q given the column scales (0 where the column is written as zeros).
HYP_INLINE void cols_apply(const TensorView& x, const TensorView& q, const float* scales,
                           const float* keep, int64_t r0, int64_t r1) {
  const int64_t cols = x.shape[1];
  std::vector<float> buf(static_cast<size_t>(cols));
  auto* out = static_cast<int8_t*>(q.data);
  for (int64_t r = r0; r < r1; ++r) {
    const float* v = row_f32(x.data, x.dtype, r, cols, buf.data());
    int8_t* o = out + r * cols;
    for (int64_t c = 0; c < cols; ++c)
      o[c] = keep[c] != 0.0f ? nearest_i8(v[c] / scales[c]) : int8_t(0);
  }
}

// Rows r .. r + 63 of the column quantisation, staged [64][cols], into q [cols, rows]:
// per 16 columns, each 4-row group becomes one dword per column (16 dwords in a buffer
// row), and each column's 16 dwords (64 consecutive rows: one cache line) are gathered
// from that L1 buffer and stored at once.
HYP_AVX512 void store_transposed64(const int8_t* stage, int64_t cols, int64_t rows, int64_t r,
                                   int8_t* q) {
  const __m512i m = _mm512_set1_epi32(0xFF);
  const __m512i lane16 =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(16));
  alignas(64) int32_t buf[16 * 16];
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 k = tail_mask(cols - c);
    for (int64_t g = 0; g < 16; ++g) {
      const int8_t* s0 = stage + (4 * g) * cols + c;
      const __m512i r0 = _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, s0)), m);
      const __m512i r1 =
          _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, s0 + cols)), m);
      const __m512i r2 =
          _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, s0 + 2 * cols)), m);
      const __m512i r3 = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, s0 + 3 * cols));
      _mm512_store_si512(
          buf + g * 16,
          _mm512_or_si512(_mm512_or_si512(r0, _mm512_slli_epi32(r1, 8)),
                          _mm512_or_si512(_mm512_slli_epi32(r2, 16), _mm512_slli_epi32(r3, 24))));
    }
    const int64_t nc = std::min<int64_t>(16, cols - c);
    for (int64_t i = 0; i < nc; ++i) {
      const __m512i col = _mm512_i32gather_epi32(
          _mm512_add_epi32(lane16, _mm512_set1_epi32(static_cast<int>(i))), buf, 4);
      _mm512_storeu_si512(q + (c + i) * rows + r, col);
    }
  }
}

// Row r's scale (from its absmax); returns the reciprocal (0 when the row is zeroed).
HYP_INLINE float row_inverse(const float* v, int64_t cols, float* scale_out) {
  uint32_t mb = 0;
  for (int64_t c = 0; c < cols; ++c) {
    const uint32_t b = std::bit_cast<uint32_t>(v[c]) & 0x7fffffffu;
    mb = b > mb ? b : mb;
  }
  const float s = std::bit_cast<float>(mb) / 127.0f;
  *scale_out = s;
  return bad_scale(s) ? 0.0f : 1.0f / s;
}

// Rows [r0, r1): the per-row quantisation and, given the reciprocal column scales (inv:
// 0 where the column is written as zeros), the per-column one; one draw per element,
// its low half for the row quantisation, its high half for the column one.
HYP_INLINE void grad_apply(const TensorView& dy, const float* row_factor, SrKey key,
                           const float* inv, const GradQuantized& out, int64_t r0, int64_t r1,
                           bool wide) {
  const int64_t rows = dy.shape[0], cols = dy.shape[1];
  std::vector<float> buf(static_cast<size_t>(cols));
  // Transposed column output: the wide path stages 64 rows, then stores 64 consecutive
  // rows per column at once (r0 is a multiple of 64); the plain path writes bytes.
  const bool transposed = out.q_cols != nullptr && out.cols_transposed;
  std::vector<int8_t> stage(transposed && wide ? static_cast<size_t>(64 * cols) : 0);
  for (int64_t r = r0; r < r1; ++r) {
    const float* v = row_f32(dy.data, dy.dtype, r, cols, buf.data());
    int8_t* orow = out.q_rows != nullptr ? out.q_rows + r * cols : nullptr;
    int8_t* ocol = out.q_cols != nullptr ? out.q_cols + r * cols : nullptr;
    if (transposed) ocol = wide ? stage.data() + (r & 63) * cols : nullptr;
    float ir = 0.0f;
    if (orow != nullptr) {
      ir = row_inverse(v, cols, out.s_rows + r);
      if (ir == 0.0f) {
        std::memset(orow, 0, static_cast<size_t>(cols));
        orow = nullptr;
      }
    }
    const float f = row_factor != nullptr ? row_factor[r] : 1.0f;
    const uint32_t base = static_cast<uint32_t>(r * cols);
    if (wide) {
      sr_row_avx512(v, cols, ir, orow, f, inv, ocol, key, base);
      if (transposed && (r & 63) == 63)
        store_transposed64(stage.data(), cols, rows, r - 63, out.q_cols);
      continue;
    }
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t h = sr_bits(key, base + static_cast<uint32_t>(c));
      if (orow != nullptr) orow[c] = sr_round_i8(v[c] * ir, sr_low(h));
      if (out.q_cols != nullptr) {
        const int8_t qv = sr_round_i8((v[c] * f) * inv[c], sr_high(h));
        const int8_t q = inv[c] != 0.0f ? qv : int8_t(0);
        if (transposed)
          out.q_cols[c * rows + r] = q;
        else
          ocol[c] = q;
      }
    }
  }
}

// fp8 encoding of v = x / scale, saturating, round to nearest even, by bit arithmetic:
// the mantissa is rounded in the f32 bit pattern; below the smallest normal the grid is
// uniform (a multiple of the smallest subnormal), where nearbyint rounds. Returns the
// code (sign in bit 7) and, through value, the code's value.
template <int kMan, int kBias>
HYP_INLINE uint32_t fp8_code(float v, float maxv, float* value) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  const uint32_t sign = bits & 0x80000000u;
  float a = std::bit_cast<float>(bits & 0x7fffffffu);
  const bool nan = !(a == a);
  a = a > maxv ? maxv : a;
  constexpr int kDrop = 23 - kMan;
  constexpr float kMinNormal = 1.0f / float(1u << (kBias - 1));                // 2^(1 - bias)
  constexpr float kSubStep = 1.0f / float(uint64_t(1) << (kBias - 1 + kMan));  // 2^(1-bias-man)
  uint32_t code, vbits;
  if (a < kMinNormal) {
    const float m = std::nearbyint(a / kSubStep);  // 0 .. 2^kMan (the last is the min normal)
    code = static_cast<uint32_t>(m);
    vbits = std::bit_cast<uint32_t>(m * kSubStep);
  } else {
    uint32_t ab = std::bit_cast<uint32_t>(a);
    ab += ((1u << (kDrop - 1)) - 1u) + ((ab >> kDrop) & 1u);
    ab &= ~((1u << kDrop) - 1u);
    vbits = ab;
    code =
        ((((ab >> 23) - 127u + uint32_t(kBias)) << kMan) | ((ab >> kDrop) & ((1u << kMan) - 1u)));
  }
  if (nan) {
    code = 0x7fu;
    vbits = 0x7fc00000u;
  }
  *value = std::bit_cast<float>(vbits | sign);
  return code | (sign >> 24);
}

template <int kMan, int kBias>
HYP_INLINE float fp8_body(const void* x, DType xd, int64_t n, float scale, float maxv,
                          uint8_t* bytes, bf16* values) {
  uint32_t mb = 0;
  constexpr int64_t kBlock = 1024;
  float buf[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t len = std::min(kBlock, n - i0);
    const float* v;
    if (xd == DType::kF32) {
      v = static_cast<const float*>(x) + i0;
    } else {
      const uint16_t* p = static_cast<const uint16_t*>(x) + i0;
      for (int64_t i = 0; i < len; ++i) buf[i] = std::bit_cast<float>(uint32_t(p[i]) << 16);
      v = buf;
    }
    for (int64_t i = 0; i < len; ++i) {
      const uint32_t b = std::bit_cast<uint32_t>(v[i]) & 0x7fffffffu;
      mb = b > mb ? b : mb;
      float val;
      const uint32_t code = fp8_code<kMan, kBias>(v[i] / scale, maxv, &val);
      if (bytes != nullptr) bytes[i0 + i] = static_cast<uint8_t>(code);
      // The value has at most 4 significant bits: its bf16 pattern is the top half.
      if (values != nullptr) values[i0 + i] = bf16{uint16_t(std::bit_cast<uint32_t>(val) >> 16)};
    }
  }
  return std::bit_cast<float>(mb);
}

template <int kMan, int kBias>
HYP_INLINE void fp8_decode_body(const uint8_t* bytes, int64_t n, bf16* values) {
  constexpr float kSubStep = 1.0f / float(uint64_t(1) << (kBias - 1 + kMan));
  constexpr uint32_t kExpMask = (0x7fu >> kMan);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = bytes[i];
    const uint32_t e = (b >> kMan) & kExpMask, m = b & ((1u << kMan) - 1u);
    uint32_t f = e == 0 ? std::bit_cast<uint32_t>(float(m) * kSubStep)
                        : (((e + 127u - uint32_t(kBias)) << 23) | (m << (23 - kMan)));
    // NaN codes: e4m3's S.1111.111 and e5m2's exponent 31 (never written but for NaN input).
    if ((kMan == 3 && (b & 0x7fu) == 0x7fu) || (kMan == 2 && e == kExpMask)) f = 0x7fc00000u;
    values[i] = bf16{uint16_t((f | ((b & 0x80u) << 24)) >> 16)};
  }
}

float absmax_body(const void* x, DType xd, int64_t n) {
  uint32_t mb = 0;
  if (xd == DType::kF32) {
    const auto* p = static_cast<const uint32_t*>(x);
    for (int64_t i = 0; i < n; ++i) mb = std::max(mb, p[i] & 0x7fffffffu);
  } else {
    const auto* p = static_cast<const uint16_t*>(x);
    uint32_t m16 = 0;
    for (int64_t i = 0; i < n; ++i) m16 = std::max<uint32_t>(m16, p[i] & 0x7fffu);
    mb = m16 << 16;
  }
  return std::bit_cast<float>(mb);
}

// The two compilations of each body.
void absmax_cols_plain(const void* x, DType xd, int64_t r0, int64_t r1, int64_t cols,
                       const float* f, uint32_t* m) {
  std::vector<float> buf(static_cast<size_t>(cols));
  col_absmax_bits(x, xd, r0, r1, cols, f, m, buf.data());
}
HYP_AVX512 void absmax_cols_avx512(const void* x, DType xd, int64_t r0, int64_t r1, int64_t cols,
                                   const float* f, uint32_t* m) {
  std::vector<float> buf(static_cast<size_t>(cols));
  col_absmax_bits(x, xd, r0, r1, cols, f, m, buf.data(), true);
}
void cols_plain(const TensorView& x, const TensorView& q, const float* s, const float* keep,
                int64_t r0, int64_t r1) {
  cols_apply(x, q, s, keep, r0, r1);
}
HYP_AVX512 void cols_avx512(const TensorView& x, const TensorView& q, const float* s,
                            const float* keep, int64_t r0, int64_t r1) {
  cols_apply(x, q, s, keep, r0, r1);
}
void grad_plain(const TensorView& dy, const float* f, SrKey key, const float* inv,
                const GradQuantized& o, int64_t r0, int64_t r1) {
  grad_apply(dy, f, key, inv, o, r0, r1, false);
}
HYP_AVX512 void grad_avx512(const TensorView& dy, const float* f, SrKey key, const float* inv,
                            const GradQuantized& o, int64_t r0, int64_t r1) {
  grad_apply(dy, f, key, inv, o, r0, r1, true);
}

// Column absmax of x (times row_factor) over every row, rows split over the threads; the
// max is order-independent, so any split gives the same bits.
std::vector<uint32_t> column_absmax(const void* x, DType xd, int64_t rows, int64_t cols,
                                    const float* row_factor) {
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(cols, 1));
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(64, (rows + grain - 1) / grain));
  std::vector<uint32_t> all(static_cast<size_t>(parts * cols), 0u);
  const bool wide = use_avx512();
  parallel_chunks(parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t r0 = rows * p / parts, r1 = rows * (p + 1) / parts;
      uint32_t* m = all.data() + p * cols;
      if (wide)
        absmax_cols_avx512(x, xd, r0, r1, cols, row_factor, m);
      else
        absmax_cols_plain(x, xd, r0, r1, cols, row_factor, m);
    }
  });
  std::vector<uint32_t> m(all.begin(), all.begin() + cols);
  for (int64_t p = 1; p < parts; ++p)
    for (int64_t c = 0; c < cols; ++c)
      m[size_t(c)] = std::max(m[size_t(c)], all[size_t(p * cols + c)]);
  return m;
}

int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
}

float fp8_plain(const void* x, DType xd, int64_t n, float s, DType fd, void* b, bf16* v) {
  auto* bytes = static_cast<uint8_t*>(b);
  return fd == DType::kE4M3 ? fp8_body<3, 7>(x, xd, n, s, 448.0f, bytes, v)
                            : fp8_body<2, 15>(x, xd, n, s, 57344.0f, bytes, v);
}
HYP_AVX512 float fp8_avx512(const void* x, DType xd, int64_t n, float s, DType fd, void* b,
                            bf16* v) {
  auto* bytes = static_cast<uint8_t*>(b);
  return fd == DType::kE4M3 ? fp8_body<3, 7>(x, xd, n, s, 448.0f, bytes, v)
                            : fp8_body<2, 15>(x, xd, n, s, 57344.0f, bytes, v);
}
void decode_plain(const void* b, DType fd, int64_t n, bf16* v) {
  auto* bytes = static_cast<const uint8_t*>(b);
  if (fd == DType::kE4M3)
    fp8_decode_body<3, 7>(bytes, n, v);
  else
    fp8_decode_body<2, 15>(bytes, n, v);
}
// fp8_decode_body, 16 lanes at a time.
template <int kMan, int kBias>
HYP_AVX512 void fp8_decode_avx512(const uint8_t* bytes, int64_t n, bf16* values) {
  constexpr float kSubStep = 1.0f / float(uint64_t(1) << (kBias - 1 + kMan));
  constexpr uint32_t kExpMask = (0x7fu >> kMan);
  const __m512i exp_mask = _mm512_set1_epi32(int(kExpMask));
  const __m512i man_mask = _mm512_set1_epi32(int((1u << kMan) - 1u));
  const __m512i rebias = _mm512_set1_epi32(int(127u - uint32_t(kBias)));
  const __m512 sub_step = _mm512_set1_ps(kSubStep);
  const __m512i nan = _mm512_set1_epi32(0x7fc00000);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, bytes + i));
    const __m512i e = _mm512_and_si512(_mm512_srli_epi32(b, kMan), exp_mask);
    const __m512i m = _mm512_and_si512(b, man_mask);
    __m512i f = _mm512_or_si512(_mm512_slli_epi32(_mm512_add_epi32(e, rebias), 23),
                                _mm512_slli_epi32(m, 23 - kMan));
    const __mmask16 sub = _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512());
    f = _mm512_mask_mov_epi32(f, sub,
                              _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(m), sub_step)));
    const __mmask16 is_nan =
        kMan == 3 ? _mm512_cmpeq_epi32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7f)),
                                            _mm512_set1_epi32(0x7f))
                  : _mm512_cmpeq_epi32_mask(e, exp_mask);
    f = _mm512_mask_mov_epi32(f, is_nan, nan);
    f = _mm512_or_si512(f, _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24));
    _mm256_mask_storeu_epi16(values + i, k, _mm512_cvtepi32_epi16(_mm512_srli_epi32(f, 16)));
  }
}

HYP_AVX512 void decode_avx512(const void* b, DType fd, int64_t n, bf16* v) {
  auto* bytes = static_cast<const uint8_t*>(b);
  if (fd == DType::kE4M3)
    fp8_decode_avx512<3, 7>(bytes, n, v);
  else
    fp8_decode_avx512<2, 15>(bytes, n, v);
}

void check_fp8(const char* op, DType fd) {
  HYP_CHECK(fd == DType::kE4M3 || fd == DType::kE5M2, "{}: fp8 dtype must be e4m3 or e5m2, got {}",
            op, dtype_name(fd));
}

// Splits [0, n) over the threads in chunks of whole 4096-element blocks; every element's
// result depends only on its own value and index, so any split gives the same bytes.
template <typename Fn>
void parallel_elements(int64_t n, Fn fn) {
  parallel_chunks((n + 4095) / 4096, 16,
                  [&](int64_t b0, int64_t b1) { fn(b0 * 4096, std::min(n, b1 * 4096)); });
}

}  // namespace

float fp8_max(DType fd) {
  check_fp8("fp8_max", fd);
  return fd == DType::kE4M3 ? 448.0f : 57344.0f;
}

void quantize_cols_int8(const TensorView& x, const TensorView& q, float* scales) {
  check_2d("quantize_cols_int8", x, q);
  const int64_t rows = x.shape[0], cols = x.shape[1];
  const std::vector<uint32_t> m = column_absmax(x.data, x.dtype, rows, cols, nullptr);
  std::vector<float> keep(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    scales[c] = std::bit_cast<float>(m[size_t(c)]) / 127.0f;
    keep[size_t(c)] = bad_scale(scales[c]) ? 0.0f : 1.0f;
  }
  const bool wide = use_avx512();
  parallel_chunks(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    if (wide)
      cols_avx512(x, q, scales, keep.data(), r0, r1);
    else
      cols_plain(x, q, scales, keep.data(), r0, r1);
  });
}

void quantize_grad_int8(const TensorView& dy, const float* row_factor, uint64_t seed,
                        const GradQuantized& out) {
  const TensorView qv(out.q_rows != nullptr ? static_cast<void*>(out.q_rows) : out.q_cols,
                      DType::kI8, dy.shape);
  check_2d("quantize_grad_int8", dy, qv);
  HYP_CHECK((out.q_rows == nullptr) == (out.s_rows == nullptr) &&
                (out.q_cols == nullptr) == (out.s_cols == nullptr),
            "quantize_grad_int8: each output needs both its values and its scales");
  const int64_t rows = dy.shape[0], cols = dy.shape[1];
  std::vector<float> sc(static_cast<size_t>(cols), 0.0f);
  if (out.q_cols != nullptr) {
    const std::vector<uint32_t> m = column_absmax(dy.data, dy.dtype, rows, cols, row_factor);
    for (int64_t c = 0; c < cols; ++c) {
      const float s = std::bit_cast<float>(m[size_t(c)]) / 127.0f;
      out.s_cols[c] = s;
      sc[size_t(c)] = bad_scale(s) ? 0.0f : 1.0f / s;  // the reciprocal (0: zero column)
    }
  }
  const SrKey key = sr_key(seed);
  const bool wide = use_avx512();
  // Transposed output: chunks of whole 64-row groups (the wide path stores them together).
  const int64_t unit = out.q_cols != nullptr && out.cols_transposed ? 64 : 1;
  HYP_CHECK(rows % unit == 0,
            "quantize_grad_int8: a transposed output needs rows % 64 == 0, got {}", rows);
  parallel_chunks(rows / unit, std::max<int64_t>(1, row_grain(cols) / unit),
                  [&](int64_t g0, int64_t g1) {
                    if (wide)
                      grad_avx512(dy, row_factor, key, sc.data(), out, g0 * unit, g1 * unit);
                    else
                      grad_plain(dy, row_factor, key, sc.data(), out, g0 * unit, g1 * unit);
                  });
}

float absmax(const void* x, DType xd, int64_t n) {
  check_in("absmax", xd);
  return absmax_body(x, xd, n);
}

float quantize_fp8(const void* x, DType xd, int64_t n, float scale, DType fd, void* bytes,
                   bf16* values) {
  check_in("quantize_fp8", xd);
  check_fp8("quantize_fp8", fd);
  HYP_CHECK(!bad_scale(scale), "quantize_fp8: scale must be finite and > 0, got {}", scale);
  const size_t xs = dtype_size(xd);
  std::vector<float> part(size_t(std::max<int64_t>(1, (n + 4095) / 4096)), 0.0f);
  const bool wide = use_avx512();
  parallel_elements(n, [&](int64_t i0, int64_t i1) {
    const void* xp = static_cast<const char*>(x) + size_t(i0) * xs;
    void* bp = bytes != nullptr ? static_cast<uint8_t*>(bytes) + i0 : nullptr;
    bf16* vp = values != nullptr ? values + i0 : nullptr;
    part[size_t(i0 / 4096)] = wide ? fp8_avx512(xp, xd, i1 - i0, scale, fd, bp, vp)
                                   : fp8_plain(xp, xd, i1 - i0, scale, fd, bp, vp);
  });
  uint32_t mb = 0;
  for (float p : part) mb = std::max(mb, std::bit_cast<uint32_t>(p));
  return std::bit_cast<float>(mb);
}

void dequantize_fp8_values(const void* bytes, DType fd, int64_t n, bf16* values) {
  check_fp8("dequantize_fp8_values", fd);
  const bool wide = use_avx512();
  parallel_elements(n, [&](int64_t i0, int64_t i1) {
    const void* bp = static_cast<const uint8_t*>(bytes) + i0;
    if (wide)
      decode_avx512(bp, fd, i1 - i0, values + i0);
    else
      decode_plain(bp, fd, i1 - i0, values + i0);
  });
}

namespace ref {

void quantize_cols_int8(const TensorView& x, const TensorView& q, float* scales) {
  check_2d("quantize_cols_int8", x, q);
  const int64_t rows = x.shape[0], cols = x.shape[1];
  auto* out = static_cast<int8_t*>(q.data);
  for (int64_t c = 0; c < cols; ++c) {
    float amax = 0.0f;
    bool nan = false;
    for (int64_t r = 0; r < rows; ++r) {
      const float v = load_as_f32(x.data, x.dtype, size_t(r * cols + c));
      nan = nan || std::isnan(v);
      amax = std::max(amax, std::fabs(v));
    }
    scales[c] = nan ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f;
    for (int64_t r = 0; r < rows; ++r) {
      const float v = load_as_f32(x.data, x.dtype, size_t(r * cols + c));
      out[r * cols + c] = bad_scale(scales[c]) ? int8_t(0) : nearest_i8(v / scales[c]);
    }
  }
}

void quantize_grad_int8(const TensorView& dy, const float* row_factor, uint64_t seed,
                        const GradQuantized& out) {
  const int64_t rows = dy.shape[0], cols = dy.shape[1];
  const SrKey key = sr_key(seed);
  auto at = [&](int64_t r, int64_t c) {
    return load_as_f32(dy.data, dy.dtype, size_t(r * cols + c));
  };
  auto scale_of = [](float amax, bool nan) {
    return nan ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f;
  };
  if (out.q_rows != nullptr) {
    for (int64_t r = 0; r < rows; ++r) {
      float amax = 0.0f;
      bool nan = false;
      for (int64_t c = 0; c < cols; ++c) {
        nan = nan || std::isnan(at(r, c));
        amax = std::max(amax, std::fabs(at(r, c)));
      }
      const float s = out.s_rows[r] = scale_of(amax, nan);
      for (int64_t c = 0; c < cols; ++c) {
        const uint32_t idx = static_cast<uint32_t>(r * cols + c);
        out.q_rows[idx] = bad_scale(s)
                              ? int8_t(0)
                              : sr_round_i8(at(r, c) * (1.0f / s), sr_low(sr_bits(key, idx)));
      }
    }
  }
  if (out.q_cols != nullptr) {
    for (int64_t c = 0; c < cols; ++c) {
      float amax = 0.0f;
      bool nan = false;
      for (int64_t r = 0; r < rows; ++r) {
        const float v = at(r, c) * (row_factor != nullptr ? row_factor[r] : 1.0f);
        nan = nan || std::isnan(v);
        amax = std::max(amax, std::fabs(v));
      }
      const float s = out.s_cols[c] = scale_of(amax, nan);
      for (int64_t r = 0; r < rows; ++r) {
        const float v = at(r, c) * (row_factor != nullptr ? row_factor[r] : 1.0f);
        const uint32_t idx = static_cast<uint32_t>(r * cols + c);
        out.q_cols[idx] =
            bad_scale(s) ? int8_t(0) : sr_round_i8(v * (1.0f / s), sr_high(sr_bits(key, idx)));
      }
    }
  }
}

float quantize_fp8(const void* x, DType xd, int64_t n, float scale, DType fd, void* bytes,
                   bf16* values) {
  float amax = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float v = load_as_f32(x, xd, size_t(i));
    nan = nan || std::isnan(v);
    amax = std::max(amax, std::fabs(v));
    const float q = v / scale;
    const uint8_t code = fd == DType::kE4M3 ? f32_to_e4m3(q, true).bits : f32_to_e5m2(q, true).bits;
    const float val =
        fd == DType::kE4M3 ? e4m3_to_f32(fp8_e4m3{code}) : e5m2_to_f32(fp8_e5m2{code});
    if (bytes != nullptr) static_cast<uint8_t*>(bytes)[i] = code;
    if (values != nullptr) values[i] = f32_to_bf16(val);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : amax;
}

}  // namespace ref
}  // namespace hyperion
