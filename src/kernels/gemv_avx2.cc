// The decode GEMV's AVX2 + FMA kernels (kernels/gemv.h), for CPUs without AVX-512 (Zen 2
// and 3, pre-Ice Lake Intel), where the AVX-512 kernels cannot run and the portable path
// is scalar. Same structure as the AVX-512 kernels: R consecutive W rows are dotted with
// all M packed activation rows in one pass over K, each (row, activation) pair keeping A
// accumulators that take the K chunks round-robin, summed in a fixed tree, so an output's
// value depends only on K, M and this instruction set, never on the thread count.
//
// bf16 weights widen to f32 (zero-extend, shift up 16); int8 weights widen to int16 and
// meet int16 activations in vpmaddwd, whose int32 pair sums are exact (|x w| <= 255 * 128),
// unlike vpmaddubsw's saturating int16 sums.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/gemv_common.h"

namespace hyperion::detail::gemv_impl {
namespace {

#define HYP_AVX2 __attribute__((target("avx2,fma")))

HYP_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

HYP_AVX2 inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// 8 weights of a row as f32, from p (`left` < 8: only that many, the rest zero; the row
// may end there, so nothing past it is read).
HYP_AVX2 inline __m256 load_w8(const float* p, int64_t left) {
  if (left >= 8) return _mm256_loadu_ps(p);
  alignas(32) float t[8] = {};
  std::memcpy(t, p, size_t(left) * sizeof(float));
  return _mm256_load_ps(t);
}
HYP_AVX2 inline __m256 load_w8(const bf16* p, int64_t left) {
  __m128i h;
  if (left >= 8) {
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else {
    alignas(16) bf16 t[8] = {};
    std::memcpy(t, p, size_t(left) * sizeof(bf16));
    h = _mm_load_si128(reinterpret_cast<const __m128i*>(t));
  }
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// 16 int8 weights as int16.
HYP_AVX2 inline __m256i load_w16(const int8_t* p, int64_t left) {
  if (left >= 16) return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  alignas(16) int8_t t[16] = {};
  std::memcpy(t, p, size_t(left));
  return _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
}

template <int A>
HYP_AVX2 inline __m256 tree(__m256* acc) {
  for (int s = 1; s < A; s *= 2)
    for (int a = 0; a + s < A; a += 2 * s) acc[a] = _mm256_add_ps(acc[a], acc[a + s]);
  return acc[0];
}

// f32 or bf16 weights (T), x packed f32 [M][kpad], kpad a multiple of 8.
template <typename T, int M, int R, int A>
HYP_AVX2 void float_rows(const Ctx& c, int64_t n0, int64_t /*pf0*/) {
  const float* x = static_cast<const float*>(c.x);
  const T* w[R];
  for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const T*>(wrow(c, n0 + r));
  __m256 acc[R][M][A];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i)
      for (int a = 0; a < A; ++a) acc[r][i][a] = _mm256_setzero_ps();
  const int64_t k = c.k;
  auto step = [&](int a, int64_t p) HYP_AVX2 {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = load_w8(w[r] + p, k - p);
    for (int i = 0; i < M; ++i) {
      const __m256 xv = _mm256_load_ps(x + i * c.kpad + p);
      for (int r = 0; r < R; ++r) acc[r][i][a] = _mm256_fmadd_ps(xv, wv[r], acc[r][i][a]);
    }
  };
  int64_t p = 0;
  for (; p + A * 8 <= k; p += A * 8)
    for (int a = 0; a < A; ++a) step(a, p + a * 8);
  for (int a = 0; a < A && p < k; ++a, p += 8) step(a, p);
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) store_f(c, i, n0 + r, hsum(tree<A>(acc[r][i])));
}

// int8 weights, x packed int16 [M][kpad], kpad a multiple of 16. Integer sums are exact
// (wrapping as int32), so one accumulator per pair and any order give the same result.
template <int M, int R>
HYP_AVX2 void int8_rows(const Ctx& c, int64_t n0, int64_t /*pf0*/) {
  const int16_t* x = static_cast<const int16_t*>(c.x);
  const int8_t* w[R];
  for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const int8_t*>(wrow(c, n0 + r));
  __m256i acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) acc[r][i] = _mm256_setzero_si256();
  const int64_t k = c.k;
  for (int64_t p = 0; p < k; p += 16) {
    __m256i wv[R];
    for (int r = 0; r < R; ++r) wv[r] = load_w16(w[r] + p, k - p);
    for (int i = 0; i < M; ++i) {
      const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + i * c.kpad + p));
      for (int r = 0; r < R; ++r)
        acc[r][i] = _mm256_add_epi32(acc[r][i], _mm256_madd_epi16(xv, wv[r]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) store_i(c, i, n0 + r, hsum(acc[r][i]));
}

// Registers: R * M * A accumulators next to R weight vectors and one activation vector,
// within 16 ymm; at least 8 independent FMA chains (two FMA units, 4-cycle latency). A
// depends only on M, so a row gives the same sum in a group and as an N tail.
constexpr int rows_for(int m) {
  return m <= 4 ? 2 : 1;
}
constexpr int accs_for(int m) {
  return m == 1 ? 4 : m == 2 ? 2 : 1;
}

template <int M>
Kernels pick_m(Avx2Kind kind) {
  constexpr int R = rows_for(M), A = accs_for(M);
  switch (kind) {
    case Avx2Kind::kF32:
      return {&float_rows<float, M, R, A>, &float_rows<float, M, 1, A>, R};
    case Avx2Kind::kBf16:
      return {&float_rows<bf16, M, R, A>, &float_rows<bf16, M, 1, A>, R};
    case Avx2Kind::kI8:
      break;
  }
  return {&int8_rows<M, R>, &int8_rows<M, 1>, R};
}

}  // namespace

int64_t pack_avx2(const GemmArgs& g, Avx2Kind kind, int64_t m, AlignedBuffer<unsigned char>& buf) {
  const int64_t k = g.k;
  const bool i8 = kind == Avx2Kind::kI8;
  const int64_t kpad = (k + 15) / 16 * 16;  // also a multiple of 8
  const size_t es = i8 ? sizeof(int16_t) : sizeof(float);
  const size_t bytes = size_t(m * kpad) * es;
  if (buf.size() < bytes) buf = AlignedBuffer<unsigned char>(bytes);
  std::memset(buf.data(), 0, bytes);
  const size_t as = dtype_size(g.a_dtype);
  for (int64_t i = 0; i < m; ++i) {
    const unsigned char* src = static_cast<const unsigned char*>(g.a) + size_t(i * g.lda) * as;
    unsigned char* dst = buf.data() + size_t(i * kpad) * es;
    if (i8) {
      auto* d = reinterpret_cast<int16_t*>(dst);
      if (g.a_dtype == DType::kI8)
        for (int64_t p = 0; p < k; ++p) d[p] = reinterpret_cast<const int8_t*>(src)[p];
      else
        for (int64_t p = 0; p < k; ++p) d[p] = src[p];
    } else {
      convert_any(src, g.a_dtype, dst, DType::kF32, size_t(k));
    }
  }
  return kpad;
}

Kernels pick_avx2(Avx2Kind kind, int m) {
  return pick_for_rows(m, [&](auto rows) { return pick_m<decltype(rows)::value>(kind); });
}

}  // namespace hyperion::detail::gemv_impl
