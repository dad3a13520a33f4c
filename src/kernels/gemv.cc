#include "kernels/gemv.h"

// GCC 12's AVX-512 intrinsic headers fill "don't care" operands from self-initialised
// _mm*_undefined_*() values, which -Wuninitialized flags once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/aligned.h"
#include "base/cpu.h"
#include "base/threads.h"
#include "kernels/gemv_common.h"
#include "tensor/convert.h"

namespace hyperion::detail {
namespace {

using namespace gemv_impl;

#define HYP_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define HYP_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define HYP_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

GemvIsa g_isa = GemvIsa::kAuto;

// Software prefetch distance in row groups: while a thread dots one group of W rows it
// prefetches the same offsets of the group this many groups ahead (within its block).
constexpr int64_t kPrefetchGroups = 1;

// Horizontal sums in a fixed order, independent of the compiler's reduce_add expansion.
HYP_AVX512 inline float hsum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
  return _mm512_cvtss_f32(v);
}

HYP_AVX512 inline int32_t hsum(__m512i v) {
  v = _mm512_add_epi32(v, _mm512_shuffle_i32x4(v, v, 0x4E));
  v = _mm512_add_epi32(v, _mm512_shuffle_i32x4(v, v, 0xB1));
  v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_BADC));
  v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_CDAB));
  return _mm512_cvtsi512_si32(v);
}

// Each kernel dots R consecutive W rows with the M packed activation rows. Every
// (row, activation) pair has A accumulators that take K steps round-robin, so short
// dependency chains do not limit a small M; A depends only on M (never on R), which keeps
// a row's sum order the same whether it runs in a group or as an N tail.
HYP_AVX512 inline __m512 tree_sum_add(__m512 u, __m512 v) {
  return _mm512_add_ps(u, v);
}
HYP_AVX512 inline __m512i tree_sum_add(__m512i u, __m512i v) {
  return _mm512_add_epi32(u, v);
}

template <int A, typename V>
HYP_AVX512 inline V tree_sum(V* acc) {
  for (int s = 1; s < A; s *= 2)
    for (int a = 0; a + s < A; a += 2 * s) acc[a] = tree_sum_add(acc[a], acc[a + s]);
  return acc[0];
}

// Streams R rows of bf16 weights over K in 32-element chunks, A chunks per step,
// prefetching the rows at `pf`; calls step(a, wv, p) with one zmm of W per row (the last
// partial chunk zero-filled by a masked load). Shared by the AVX512-BF16 kernel and the
// widening kernel; always inlined so `step` inlines into the caller's target.
template <int R, int A, typename Step>
HYP_AVX512 __attribute__((always_inline)) inline void stream_bf16_rows(const bf16* const* w,
                                                                       const char* const* pf,
                                                                       int64_t k, Step& step) {
  int64_t p = 0;
  for (; p + A * 32 <= k; p += A * 32) {
    for (int a = 0; a < A; ++a) {
      __m512i wv[R];
      for (int r = 0; r < R; ++r) {
        wv[r] = _mm512_loadu_si512(w[r] + p + a * 32);
        _mm_prefetch(pf[r] + 2 * (p + a * 32), _MM_HINT_T1);
      }
      step(a, wv, p + a * 32);
    }
  }
  for (int a = 0; a < A && p < k; ++a, p += 32) {
    const int64_t left = k - p;
    const __mmask32 mask = left >= 32 ? ~__mmask32(0) : __mmask32((uint64_t(1) << left) - 1);
    __m512i wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_epi16(mask, w[r] + p);
    step(a, wv, p);
  }
}

// ---- AVX512-BF16: x packed as bf16 [M][kpad], kpad a multiple of 32. ----
template <int M, int R, int A>
HYP_AVX512_BF16 void bf16_dp_rows(const Ctx& c, int64_t n0, int64_t pf0) {
  const bf16* x = static_cast<const bf16*>(c.x);
  const bf16* w[R];
  const char* pf[R];
  for (int r = 0; r < R; ++r) {
    w[r] = reinterpret_cast<const bf16*>(wrow(c, n0 + r));
    pf[r] = reinterpret_cast<const char*>(wrow(c, pf0 + r));
  }
  __m512 acc[R][M][A];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i)
      for (int a = 0; a < A; ++a) acc[r][i][a] = _mm512_setzero_ps();
  const int64_t k = c.k;
  auto step = [&](int a, const __m512i* wv, int64_t p) HYP_AVX512_BF16 {
    for (int i = 0; i < M; ++i) {
      const __m512i xv = _mm512_load_si512(x + i * c.kpad + p);
      for (int r = 0; r < R; ++r)
        acc[r][i][a] = _mm512_dpbf16_ps(acc[r][i][a], (__m512bh)xv, (__m512bh)wv[r]);
    }
  };
  stream_bf16_rows<R, A>(w, pf, k, step);
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) store_f(c, i, n0 + r, hsum(tree_sum<A>(acc[r][i])));
}

// ---- AVX-512F for bf16 without AVX512-BF16: x packed as f32, each 32-element chunk
// stored as its 16 even then its 16 odd elements, matching how a 32 x bf16 load of W
// widens (even = low halves shifted up, odd = high halves masked). ----
template <int M, int R, int A>
HYP_AVX512 void bf16_widen_rows(const Ctx& c, int64_t n0, int64_t pf0) {
  const float* x = static_cast<const float*>(c.x);
  const bf16* w[R];
  const char* pf[R];
  for (int r = 0; r < R; ++r) {
    w[r] = reinterpret_cast<const bf16*>(wrow(c, n0 + r));
    pf[r] = reinterpret_cast<const char*>(wrow(c, pf0 + r));
  }
  __m512 acc[R][M][A];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i)
      for (int a = 0; a < A; ++a) acc[r][i][a] = _mm512_setzero_ps();
  const __m512i hi = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  const int64_t k = c.k;
  auto step = [&](int a, const __m512i* wv, int64_t p) HYP_AVX512 {
    __m512 we[R], wo[R];
    for (int r = 0; r < R; ++r) {
      we[r] = _mm512_castsi512_ps(_mm512_slli_epi32(wv[r], 16));
      wo[r] = _mm512_castsi512_ps(_mm512_and_si512(wv[r], hi));
    }
    for (int i = 0; i < M; ++i) {
      const __m512 xe = _mm512_load_ps(x + i * c.kpad + p);
      const __m512 xo = _mm512_load_ps(x + i * c.kpad + p + 16);
      for (int r = 0; r < R; ++r) {
        acc[r][i][a] = _mm512_fmadd_ps(xe, we[r], acc[r][i][a]);
        acc[r][i][a] = _mm512_fmadd_ps(xo, wo[r], acc[r][i][a]);
      }
    }
  };
  stream_bf16_rows<R, A>(w, pf, k, step);
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) store_f(c, i, n0 + r, hsum(tree_sum<A>(acc[r][i])));
}

// ---- AVX-512F f32: x packed as f32 [M][kpad], kpad a multiple of 16. ----
template <int M, int R, int A>
HYP_AVX512 void f32_rows(const Ctx& c, int64_t n0, int64_t pf0) {
  const float* x = static_cast<const float*>(c.x);
  const float* w[R];
  const char* pf[R];
  for (int r = 0; r < R; ++r) {
    w[r] = reinterpret_cast<const float*>(wrow(c, n0 + r));
    pf[r] = reinterpret_cast<const char*>(wrow(c, pf0 + r));
  }
  __m512 acc[R][M][A];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i)
      for (int a = 0; a < A; ++a) acc[r][i][a] = _mm512_setzero_ps();
  const int64_t k = c.k;
  auto step = [&](int a, const __m512* wv, int64_t p) HYP_AVX512 {
    for (int i = 0; i < M; ++i) {
      const __m512 xv = _mm512_load_ps(x + i * c.kpad + p);
      for (int r = 0; r < R; ++r) acc[r][i][a] = _mm512_fmadd_ps(xv, wv[r], acc[r][i][a]);
    }
  };
  int64_t p = 0;
  for (; p + A * 16 <= k; p += A * 16) {
    for (int a = 0; a < A; ++a) {
      __m512 wv[R];
      for (int r = 0; r < R; ++r) {
        wv[r] = _mm512_loadu_ps(w[r] + p + a * 16);
        _mm_prefetch(pf[r] + 4 * (p + a * 16), _MM_HINT_T1);
      }
      step(a, wv, p + a * 16);
    }
  }
  for (int a = 0; a < A && p < k; ++a, p += 16) {
    const int64_t left = k - p;
    const __mmask16 mask = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_ps(mask, w[r] + p);
    step(a, wv, p);
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) store_f(c, i, n0 + r, hsum(tree_sum<A>(acc[r][i])));
}

// ---- AVX512-VNNI int8: dpbusd multiplies unsigned x signed bytes, so x is packed as
// uint8 [M][kpad] (kpad a multiple of 64); signed activations are stored as x + 128 and
// the excess 128 * sum(W row) is removed at the end, with the row sums given
// (GemmArgs::b_sums) or taken in the same pass (dpbusd against ones). All int32
// arithmetic wraps, like oneDNN's. kSignedA: 0 unsigned A, 1 signed A with the sums
// computed here, 2 signed A with the sums given. ----
template <int M, int R, int A, int kSignedA>
HYP_AVX512_VNNI void i8_vnni_rows(const Ctx& c, int64_t n0, int64_t pf0) {
  const uint8_t* x = static_cast<const uint8_t*>(c.x);
  const int8_t* w[R];
  const char* pf[R];
  for (int r = 0; r < R; ++r) {
    w[r] = reinterpret_cast<const int8_t*>(wrow(c, n0 + r));
    pf[r] = reinterpret_cast<const char*>(wrow(c, pf0 + r));
  }
  __m512i acc[R][M][A], rsum[R][A];
  for (int r = 0; r < R; ++r)
    for (int a = 0; a < A; ++a) {
      rsum[r][a] = _mm512_setzero_si512();
      for (int i = 0; i < M; ++i) acc[r][i][a] = _mm512_setzero_si512();
    }
  const __m512i ones = _mm512_set1_epi8(1);
  const int64_t k = c.k;
  auto step = [&](int a, const __m512i* wv, int64_t p) HYP_AVX512_VNNI {
    if constexpr (kSignedA == 1) {
      for (int r = 0; r < R; ++r) rsum[r][a] = _mm512_dpbusd_epi32(rsum[r][a], ones, wv[r]);
    }
    for (int i = 0; i < M; ++i) {
      const __m512i xv = _mm512_load_si512(x + i * c.kpad + p);
      for (int r = 0; r < R; ++r) acc[r][i][a] = _mm512_dpbusd_epi32(acc[r][i][a], xv, wv[r]);
    }
  };
  int64_t p = 0;
  for (; p + A * 64 <= k; p += A * 64) {
    for (int a = 0; a < A; ++a) {
      __m512i wv[R];
      for (int r = 0; r < R; ++r) {
        wv[r] = _mm512_loadu_si512(w[r] + p + a * 64);
        _mm_prefetch(pf[r] + p + a * 64, _MM_HINT_T1);
      }
      step(a, wv, p + a * 64);
    }
  }
  for (int a = 0; a < A && p < k; ++a, p += 64) {
    const int64_t left = k - p;
    const __mmask64 mask = left >= 64 ? ~__mmask64(0) : (__mmask64(1) << left) - 1;
    __m512i wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_epi8(mask, w[r] + p);
    step(a, wv, p);
  }
  for (int r = 0; r < R; ++r) {
    uint32_t corr = 0;
    if constexpr (kSignedA == 1) corr = uint32_t(hsum(tree_sum<A>(rsum[r]))) * 128u;
    if constexpr (kSignedA == 2) corr = uint32_t(c.g->b_sums[n0 + r]) * 128u;
    for (int i = 0; i < M; ++i) {
      const uint32_t s = uint32_t(hsum(tree_sum<A>(acc[r][i]))) - corr;
      store_i(c, i, n0 + r, int32_t(s));
    }
  }
}

// ---- Portable scalar path: one W row at a time, x read in place (lda). ----
void portable_row(const Ctx& c, int64_t n0, int64_t /*pf0*/) {
  const GemmArgs& g = *c.g;
  const int64_t k = c.k;
  const unsigned char* wr = wrow(c, n0);
  for (int i = 0; i < c.m; ++i) {
    if (g.b_dtype == DType::kI8) {
      const int8_t* w = reinterpret_cast<const int8_t*>(wr);
      uint32_t acc = 0;  // wrapping int32 accumulation
      if (g.a_dtype == DType::kI8) {
        const int8_t* x = static_cast<const int8_t*>(g.a) + i * g.lda;
        for (int64_t p = 0; p < k; ++p) acc += uint32_t(int32_t(x[p]) * int32_t(w[p]));
      } else {
        const uint8_t* x = static_cast<const uint8_t*>(g.a) + i * g.lda;
        for (int64_t p = 0; p < k; ++p) acc += uint32_t(int32_t(x[p]) * int32_t(w[p]));
      }
      store_i(c, i, n0, int32_t(acc));
    } else if (g.b_dtype == DType::kBF16) {
      const bf16* w = reinterpret_cast<const bf16*>(wr);
      const bf16* x = static_cast<const bf16*>(g.a) + i * g.lda;
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p) acc += bf16_to_f32(x[p]) * bf16_to_f32(w[p]);
      store_f(c, i, n0, acc);
    } else {
      const float* w = reinterpret_cast<const float*>(wr);
      const float* x = static_cast<const float*>(g.a) + i * g.lda;
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p) acc += x[p] * w[p];
      store_f(c, i, n0, acc);
    }
  }
}

// ---- Selection and packing. ----
enum class Kind {
  kBf16Dp,
  kBf16Widen,
  kF32,
  kI8Signed,
  kI8SignedSums,
  kI8Unsigned,
  kAvx2F32,
  kAvx2Bf16,
  kAvx2I8,
  kPortable
};

bool is_avx2(Kind kind) {
  return kind == Kind::kAvx2F32 || kind == Kind::kAvx2Bf16 || kind == Kind::kAvx2I8;
}
Avx2Kind avx2_kind(Kind kind) {
  return kind == Kind::kAvx2F32 ? Avx2Kind::kF32
         : kind == Kind::kAvx2Bf16 ? Avx2Kind::kBf16
                                   : Avx2Kind::kI8;
}

// Rows per group: R * M * A accumulators must stay in registers next to the W and x
// vectors.
constexpr int rows_for(int m) {
  return m <= 4 ? 4 : 2;
}
// Accumulators per (row, activation) pair: at least 4 independent chains in all.
constexpr int accs_for(int m) {
  return std::max(1, 4 / (m * rows_for(m)));
}

template <int M>
Kernels pick_m(Kind kind) {
  constexpr int R = rows_for(M), A = accs_for(M);
  switch (kind) {
    case Kind::kBf16Dp:
      return {&bf16_dp_rows<M, R, A>, &bf16_dp_rows<M, 1, A>, R};
    case Kind::kBf16Widen:
      return {&bf16_widen_rows<M, R, A>, &bf16_widen_rows<M, 1, A>, R};
    case Kind::kF32:
      return {&f32_rows<M, R, A>, &f32_rows<M, 1, A>, R};
    case Kind::kI8Signed:
      return {&i8_vnni_rows<M, R, A, 1>, &i8_vnni_rows<M, 1, A, 1>, R};
    case Kind::kI8SignedSums:
      return {&i8_vnni_rows<M, R, A, 2>, &i8_vnni_rows<M, 1, A, 2>, R};
    case Kind::kI8Unsigned:
      return {&i8_vnni_rows<M, R, A, 0>, &i8_vnni_rows<M, 1, A, 0>, R};
    case Kind::kAvx2F32:
    case Kind::kAvx2Bf16:
    case Kind::kAvx2I8:
    case Kind::kPortable:
      break;
  }
  return {&portable_row, &portable_row, 1};
}

Kernels pick(Kind kind, int m) {
  if (is_avx2(kind)) return pick_avx2(avx2_kind(kind), m);
  return pick_for_rows(m, [&](auto rows) { return pick_m<decltype(rows)::value>(kind); });
}

Kind select_kind(const GemmArgs& g) {
  const CpuFeatures& f = cpu_features();
  if (g_isa == GemvIsa::kPortable) return Kind::kPortable;
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl;
  if (g_isa == GemvIsa::kAvx2 || !avx512) {
    if (!f.avx2 || !f.fma) return Kind::kPortable;
    return g.b_dtype == DType::kF32    ? Kind::kAvx2F32
           : g.b_dtype == DType::kBF16 ? Kind::kAvx2Bf16
                                       : Kind::kAvx2I8;
  }
  const bool ext = g_isa == GemvIsa::kAuto;
  switch (g.b_dtype) {
    case DType::kBF16:
      return ext && f.avx512_bf16 ? Kind::kBf16Dp : Kind::kBf16Widen;
    case DType::kF32:
      return Kind::kF32;
    default:
      if (!ext || !f.avx512_vnni) return Kind::kPortable;
      if (g.a_dtype != DType::kI8) return Kind::kI8Unsigned;
      return g.b_sums != nullptr ? Kind::kI8SignedSums : Kind::kI8Signed;
  }
}

int64_t round_up(int64_t v, int64_t to) {
  return (v + to - 1) / to * to;
}

// Packs x [m, k] (row stride lda) into the zero-padded layout the kernel expects.
// Returns the packed row stride in elements; fills `buf`.
int64_t pack_x(const GemmArgs& g, Kind kind, int64_t m, AlignedBuffer<unsigned char>& buf) {
  const int64_t k = g.k;
  if (kind == Kind::kPortable) return k;  // reads x in place
  if (is_avx2(kind)) return pack_avx2(g, avx2_kind(kind), m, buf);
  const int64_t kpad = round_up(k, kind == Kind::kF32                                  ? 16
                                   : kind == Kind::kBf16Dp || kind == Kind::kBf16Widen ? 32
                                                                                       : 64);
  const size_t esize = kind == Kind::kBf16Dp                            ? 2
                       : kind == Kind::kF32 || kind == Kind::kBf16Widen ? 4
                                                                        : 1;
  const size_t bytes = size_t(m * kpad) * esize;
  if (buf.size() < bytes) buf = AlignedBuffer<unsigned char>(bytes);
  std::memset(buf.data(), 0, bytes);
  for (int64_t i = 0; i < m; ++i) {
    unsigned char* dst = buf.data() + size_t(i * kpad) * esize;
    const unsigned char* src =
        static_cast<const unsigned char*>(g.a) + size_t(i * g.lda) * dtype_size(g.a_dtype);
    switch (kind) {
      case Kind::kBf16Dp:
      case Kind::kF32:
        std::memcpy(dst, src, size_t(k) * esize);
        break;
      case Kind::kBf16Widen: {
        const bf16* s = reinterpret_cast<const bf16*>(src);
        float* d = reinterpret_cast<float*>(dst);
        for (int64_t p = 0; p < k; ++p) {
          const int64_t chunk = p / 32 * 32, e = p % 32;
          d[chunk + (e % 2) * 16 + e / 2] = bf16_to_f32(s[p]);
        }
        break;
      }
      case Kind::kI8Signed:
      case Kind::kI8SignedSums:
        for (int64_t p = 0; p < k; ++p) dst[p] = uint8_t(src[p] ^ 0x80u);
        break;
      case Kind::kI8Unsigned:
        std::memcpy(dst, src, size_t(k));
        break;
      case Kind::kAvx2F32:
      case Kind::kAvx2Bf16:
      case Kind::kAvx2I8:
      case Kind::kPortable:
        break;
    }
  }
  return kpad;
}

bool env_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("HYPERION_GEMV");
    return !(env && std::strcmp(env, "0") == 0);
  }();
  return enabled;
}

void gemv_block(const GemmArgs& g);  // m <= kGemvMaxM rows, one pass over W

}  // namespace

void set_gemv_isa_for_testing(GemvIsa isa) {
  g_isa = isa;
}

bool gemv_applies(const GemmArgs& g) {
  if (g.batch != 1 || g.trans_a != Trans::kN || g.trans_b != Trans::kT) return false;
  if (g.m < 1 || g.n < 1 || g.k < 1) return false;
  const bool f32 = g.a_dtype == DType::kF32 && g.b_dtype == DType::kF32 && g.c_dtype == DType::kF32;
  const bool bf16 = g.a_dtype == DType::kBF16 && g.b_dtype == DType::kBF16 &&
                    (g.c_dtype == DType::kF32 || g.c_dtype == DType::kBF16);
  const bool int8 =
      (g.a_dtype == DType::kI8 || g.a_dtype == DType::kU8) && g.b_dtype == DType::kI8 &&
      (g.c_dtype == DType::kF32 || g.c_dtype == DType::kBF16 || g.c_dtype == DType::kI32);
  if (g.m > gemv_max_rows(g)) return false;
  return (f32 || bf16 || int8) && env_enabled();
}

int64_t gemv_max_rows(const GemmArgs& g) {
  // bf16 does M dot products per W element with one dpbf16ps each: from M = 5 on it
  // measured no faster than AMX tiles (kernels/amx_bf16_gemm.h), which then take over, or
  // without AMX the batch GEMM (kernels/batch_gemm.h), which also takes int8 past 8 rows.
  // Neither runs without AVX-512; there the AVX2 kernels take decode batches too: int8
  // up to kGemvMaxMAvx2 rows, in blocks of kGemvMaxM (each block one pass over W; the
  // widened int8 GEMM was 2-5x slower at these M), f32 and bf16 up to kGemvMaxM (past
  // it the widened f32 GEMM was faster: docs/PERFORMANCE.md).
  if (is_avx2(select_kind(g))) return g.b_dtype == DType::kI8 ? kGemvMaxMAvx2 : kGemvMaxM;
  return g.b_dtype == DType::kBF16 ? kGemvMaxMBf16 : kGemvMaxM;
}

void gemv(const GemmArgs& g) {
  if (g.m <= kGemvMaxM) {
    gemv_block(g);
    return;
  }
  const size_t as = dtype_size(g.a_dtype), cs = dtype_size(g.c_dtype);
  for (int64_t r0 = 0; r0 < g.m; r0 += kGemvMaxM) {
    GemmArgs b = g;
    b.m = std::min(kGemvMaxM, g.m - r0);
    b.a = static_cast<const unsigned char*>(g.a) + size_t(r0 * g.lda) * as;
    b.c = static_cast<unsigned char*>(g.c) + size_t(r0 * g.ldc) * cs;
    if (g.a_scale != nullptr) b.a_scale = g.a_scale + r0;
    gemv_block(b);
  }
}

namespace {

void gemv_block(const GemmArgs& g) {
  const Kind kind = select_kind(g);
  Ctx c;
  c.g = &g;
  c.m = int(g.m);
  c.k = g.k;
  c.w = static_cast<const unsigned char*>(g.b);
  c.ldb_bytes = g.ldb * int64_t(dtype_size(g.b_dtype));
  for (int i = 0; i < c.m; ++i) c.row_scale[i] = g.alpha * (g.a_scale ? g.a_scale[i] : 1.0f);
  thread_local AlignedBuffer<unsigned char> xbuf;
  c.kpad = pack_x(g, kind, c.m, xbuf);
  c.x = xbuf.data();
  const Kernels kern = pick(kind, c.m);
  const int64_t rows = kern.rows, n = g.n;
  const int64_t groups = (n + rows - 1) / rows;
  // At least ~64 KiB of W per chunk, so small GEMMs do not pay for a parallel region.
  const int64_t group_bytes = rows * g.k * int64_t(dtype_size(g.b_dtype));
  const int64_t grain =
      std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(group_bytes, 1));
  parallel_chunks(groups, grain, [&](int64_t g0, int64_t g1) {
    const int64_t row_end = std::min(n, g1 * rows);
    for (int64_t gi = g0; gi < g1; ++gi) {
      const int64_t n0 = gi * rows;
      if (n0 + rows <= n) {
        int64_t pf0 = n0 + kPrefetchGroups * rows;
        // Nothing ahead in this block: re-touch our own rows instead.
        if (pf0 + rows > row_end) pf0 = n0;
        kern.group(c, n0, pf0);
      } else {
        for (int64_t r = n0; r < n; ++r) kern.single(c, r, r);
      }
    }
  });
}

}  // namespace

}  // namespace hyperion::detail
