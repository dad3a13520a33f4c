// Row-wise absmax quantisation: an AVX-512 path (absmax in the integer domain, then
// divide / round / clamp / saturating pack for int8), a portable scalar path, and the
// plain reference. All three compute the same thing element by element (the same f32
// division and round-to-nearest-even), so they agree exactly.
#include "kernels/quantize.h"

// GCC 12's AVX-512 intrinsic headers fill "don't care" operands from self-initialised
// _mm*_undefined_*() values, which -Wuninitialized flags once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

#define HYP_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;

void check_row_dtypes(const char* op, DType xd, int64_t n, DType qd) {
  HYP_CHECK(xd == DType::kF32 || xd == DType::kBF16, "{}: input must be f32 or bf16, got {}", op,
            dtype_name(xd));
  HYP_CHECK(qd == DType::kI8 || qd == DType::kE4M3, "{}: output must be int8 or fp8_e4m3, got {}",
            op, dtype_name(qd));
  HYP_CHECK(n >= 0, "{}: negative row length {}", op, n);
}

inline float load_f(const void* x, DType xd, int64_t i) {
  return xd == DType::kF32 ? static_cast<const float*>(x)[i]
                           : bf16_to_f32(static_cast<const bf16*>(x)[i]);
}

// The scale of a row from the bits of max|x| (an integer max over the sign-cleared bit
// patterns orders finite values, inf and NaN correctly, and any NaN wins). Returns the
// scale and whether the row must be written as zeros (zero, underflowed or non-finite).
inline float scale_from_bits(uint32_t amax_bits, float qmax, bool* zero_row) {
  const float scale = std::bit_cast<float>(amax_bits) / qmax;
  *zero_row = amax_bits >= kInfBits || scale == 0.0f;
  return scale;
}

inline int8_t round_i8(float v) {
  const float r = std::nearbyint(v);  // default rounding mode: nearest even
  return static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
}

// E4M3 rows go element by element through the exact saturating encoder (the spec allows
// scalar fp8); only the absmax pass is vectorised.
void encode_e4m3(const void* x, DType xd, int64_t n, float scale, void* q) {
  auto* out = static_cast<fp8_e4m3*>(q);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_e4m3(load_f(x, xd, i) / scale, true);
}

// ---------------------------------------------------------------------------------------
// Portable path: integer-domain absmax (auto-vectorises), scalar conversion.

uint32_t absmax_bits_portable(const void* x, DType xd, int64_t n) {
  uint32_t m = 0;
  if (xd == DType::kF32) {
    const auto* p = static_cast<const uint32_t*>(x);
    for (int64_t i = 0; i < n; ++i) m = std::max(m, p[i] & kAbsMask);
  } else {
    const auto* p = static_cast<const uint16_t*>(x);
    uint32_t m16 = 0;
    for (int64_t i = 0; i < n; ++i) m16 = std::max<uint32_t>(m16, p[i] & 0x7fffu);
    m = m16 << 16;
  }
  return m;
}

float quantize_portable(const void* x, DType xd, int64_t n, void* q, DType qd) {
  bool zero_row = false;
  const float scale = scale_from_bits(absmax_bits_portable(x, xd, n), quantize_qmax(qd), &zero_row);
  if (zero_row) {
    if (n > 0) std::memset(q, 0, static_cast<size_t>(n));
    return scale;
  }
  if (qd == DType::kI8) {
    auto* out = static_cast<int8_t*>(q);
    for (int64_t i = 0; i < n; ++i) out[i] = round_i8(load_f(x, xd, i) / scale);
  } else {
    encode_e4m3(x, xd, n, scale, q);
  }
  return scale;
}

// ---------------------------------------------------------------------------------------
// AVX-512 path

inline __mmask16 tail16(int64_t k) {
  return static_cast<__mmask16>((1u << k) - 1u);
}

HYP_AVX512 uint32_t absmax_bits_f32_avx512(const float* x, int64_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(static_cast<int>(kAbsMask));
  __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask));
    m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(x + i + 16), abs_mask));
  }
  for (; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : tail16(n - i);
    m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_maskz_loadu_epi32(k, x + i), abs_mask));
  }
  return _mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
}

HYP_AVX512 uint32_t absmax_bits_bf16_avx512(const bf16* x, int64_t n) {
  const __m512i abs_mask = _mm512_set1_epi16(0x7fff);
  __m512i m = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    m = _mm512_max_epu16(m, _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask));
  if (i < n) {
    const __mmask32 k = static_cast<__mmask32>((uint64_t(1) << (n - i)) - 1);
    m = _mm512_max_epu16(m, _mm512_and_si512(_mm512_maskz_loadu_epi16(k, x + i), abs_mask));
  }
  const __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(m));
  const __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(m, 1));
  return _mm512_reduce_max_epu32(_mm512_max_epu32(lo, hi)) << 16;
}

// 16 values (masked) as f32.
HYP_AVX512 inline __m512 load16(const float* x, __mmask16 k) {
  return _mm512_maskz_loadu_ps(k, x);
}
HYP_AVX512 inline __m512 load16(const bf16* x, __mmask16 k) {
  const __m256i h = _mm256_maskz_loadu_epi16(k, x);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <typename T>
HYP_AVX512 void quantize_i8_avx512(const T* x, int64_t n, float scale, int8_t* q) {
  const __m512 s = _mm512_set1_ps(scale);
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : tail16(n - i);
    __m512 v = _mm512_div_ps(load16(x + i, k), s);
    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    _mm512_mask_cvtsepi32_storeu_epi8(q + i, k, _mm512_cvtps_epi32(v));
  }
}

HYP_AVX512 float quantize_avx512(const void* x, DType xd, int64_t n, void* q, DType qd) {
  const uint32_t bits = xd == DType::kF32 ? absmax_bits_f32_avx512(static_cast<const float*>(x), n)
                                          : absmax_bits_bf16_avx512(static_cast<const bf16*>(x), n);
  bool zero_row = false;
  const float scale = scale_from_bits(bits, quantize_qmax(qd), &zero_row);
  if (zero_row) {
    if (n > 0) std::memset(q, 0, static_cast<size_t>(n));
  } else if (qd == DType::kE4M3) {
    encode_e4m3(x, xd, n, scale, q);
  } else if (xd == DType::kF32) {
    quantize_i8_avx512(static_cast<const float*>(x), n, scale, static_cast<int8_t*>(q));
  } else {
    quantize_i8_avx512(static_cast<const bf16*>(x), n, scale, static_cast<int8_t*>(q));
  }
  return scale;
}

bool use_avx512() {
  static const bool ok = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx512f && f.avx512bw && f.avx512vl;
  }();
  return ok;
}

// ---------------------------------------------------------------------------------------
// Dequantisation

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = e4m3_to_f32(fp8_e4m3{uint8_t(c)});
    return t;
  }();
  return table;
}

HYP_AVX512 void dequantize_i8_avx512(const int8_t* q, int64_t n, float scale, void* out, DType od) {
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : tail16(n - i);
    const __m512 v =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, q + i))), s);
    if (od == DType::kF32) {
      _mm512_mask_storeu_ps(static_cast<float*>(out) + i, k, v);
    } else {
      // Round to nearest even at bit 16; products are never signalling NaNs, so the
      // rounding cannot carry a NaN into infinity.
      const __m512i b = _mm512_castps_si512(v);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
      const __m512i r = _mm512_srli_epi32(
          _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
      _mm256_mask_storeu_epi16(static_cast<bf16*>(out) + i, k, _mm512_cvtepi32_epi16(r));
    }
  }
}

void dequantize_row(const void* q, DType qd, int64_t n, float scale, void* out, DType od) {
  if (qd == DType::kI8 && use_avx512())
    return dequantize_i8_avx512(static_cast<const int8_t*>(q), n, scale, out, od);
  const auto& table = e4m3_table();
  const auto* qb = static_cast<const uint8_t*>(q);
  for (int64_t i = 0; i < n; ++i) {
    const float v =
        (qd == DType::kI8 ? float(static_cast<const int8_t*>(q)[i]) : table[qb[i]]) * scale;
    if (od == DType::kF32)
      static_cast<float*>(out)[i] = v;
    else
      static_cast<bf16*>(out)[i] = f32_to_bf16(v);
  }
}

// Rows per parallel chunk: about 32K elements each, so small tensors stay on one thread.
int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(cols, 1));
}

}  // namespace

float quantize_qmax(DType qd) {
  switch (qd) {
    case DType::kI8:
      return 127.0f;
    case DType::kE4M3:
      return 448.0f;
    default:
      fail("quantize: no quantised format for dtype {} (expected int8 or fp8_e4m3)",
           dtype_name(qd));
  }
}

float quantize_row(const void* x, DType xd, int64_t n, void* q, DType qd) {
  check_row_dtypes("quantize_row", xd, n, qd);
  if (use_avx512()) return quantize_avx512(x, xd, n, q, qd);
  return quantize_portable(x, xd, n, q, qd);
}

namespace detail {
float quantize_row_portable(const void* x, DType xd, int64_t n, void* q, DType qd) {
  check_row_dtypes("quantize_row", xd, n, qd);
  return quantize_portable(x, xd, n, q, qd);
}
}  // namespace detail

void quantize_rows(const TensorView& x, const TensorView& q, float* scales) {
  const char* op = "quantize_rows";
  check_rank(op, "x", x, 2);
  check_rank(op, "q", q, 2);
  check_contiguous(op, "x", x);
  check_contiguous(op, "q", q);
  HYP_CHECK(x.shape == q.shape, "{}: x {} and q {} must have the same shape", op, x.str(), q.str());
  check_row_dtypes(op, x.dtype, 0, q.dtype);
  const int64_t rows = x.shape[0], cols = x.shape[1];
  HYP_CHECK(scales != nullptr || rows == 0, "{}: null scales for x {}", op, x.str());
  const size_t xs = dtype_size(x.dtype);
  const auto* xp = static_cast<const unsigned char*>(x.data);
  auto* qp = static_cast<unsigned char*>(q.data);
  const bool simd = use_avx512();
  parallel_chunks(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const void* xr = xp + r * cols * xs;
      void* qr = qp + r * cols;
      scales[r] = simd ? quantize_avx512(xr, x.dtype, cols, qr, q.dtype)
                       : quantize_portable(xr, x.dtype, cols, qr, q.dtype);
    }
  });
}

void dequantize_rows(const TensorView& q, const float* scales, const TensorView& out) {
  const char* op = "dequantize_rows";
  check_rank(op, "q", q, 2);
  check_rank(op, "out", out, 2);
  check_contiguous(op, "q", q);
  check_contiguous(op, "out", out);
  HYP_CHECK(q.shape == out.shape, "{}: q {} and out {} must have the same shape", op, q.str(),
            out.str());
  HYP_CHECK(q.dtype == DType::kI8 || q.dtype == DType::kE4M3,
            "{}: q must be int8 or fp8_e4m3, got {}", op, q.str());
  HYP_CHECK(out.dtype == DType::kF32 || out.dtype == DType::kBF16,
            "{}: out must be f32 or bf16, got {}", op, out.str());
  const int64_t rows = q.shape[0], cols = q.shape[1];
  HYP_CHECK(scales != nullptr || rows == 0, "{}: null scales for q {}", op, q.str());
  const size_t os = dtype_size(out.dtype);
  const auto* qp = static_cast<const unsigned char*>(q.data);
  auto* op_ = static_cast<unsigned char*>(out.data);
  parallel_chunks(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      dequantize_row(qp + r * cols, q.dtype, cols, scales[r], op_ + r * cols * os, out.dtype);
  });
}

void int8_row_sums(const TensorView& q, int32_t* sums) {
  const char* op = "int8_row_sums";
  check_rank(op, "q", q, 2);
  check_contiguous(op, "q", q);
  HYP_CHECK(q.dtype == DType::kI8, "{}: q must be int8, got {}", op, q.str());
  const int64_t rows = q.shape[0], cols = q.shape[1];
  HYP_CHECK(cols < (int64_t{1} << 24), "{}: {} columns could overflow an int32 sum", op, cols);
  HYP_CHECK(sums != nullptr || rows == 0, "{}: null sums for q {}", op, q.str());
  const auto* qp = static_cast<const int8_t*>(q.data);
  parallel_chunks(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int32_t sum = 0;  // a plain reduction the compiler vectorises
      for (int64_t c = 0; c < cols; ++c) sum += qp[r * cols + c];
      sums[r] = sum;
    }
  });
}

namespace ref {

float quantize_row(const void* x, DType xd, int64_t n, void* q, DType qd) {
  check_row_dtypes("ref::quantize_row", xd, n, qd);
  float amax = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(load_f(x, xd, i));
    if (std::isnan(a)) nan = true;
    amax = std::max(amax, a);
  }
  if (nan) amax = std::numeric_limits<float>::quiet_NaN();
  const float scale = amax / quantize_qmax(qd);
  const bool zero_row = !std::isfinite(scale) || scale == 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = zero_row ? 0.0f : load_f(x, xd, i) / scale;
    if (qd == DType::kI8)
      static_cast<int8_t*>(q)[i] = round_i8(v);
    else
      static_cast<fp8_e4m3*>(q)[i] = f32_to_e4m3(v, true);
  }
  return scale;
}

}  // namespace ref

}  // namespace hyperion
