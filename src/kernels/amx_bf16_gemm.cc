#include "kernels/amx_bf16_gemm.h"

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
#include "base/error.h"
#include "base/threads.h"
#include "kernels/amx_tiles.h"
#include "kernels/gemv.h"

namespace hyperion {
namespace {

#define HYP_AMX_BF16 \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

constexpr int64_t kTile = 16;            // rows of a tile; also f32 columns of a result tile
constexpr int64_t kKStep = 32;           // bf16 values of k per tile row (64 bytes)
constexpr int64_t kPrefetchAhead = 256;  // bytes ahead in each weight row (4 k-steps)

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

bool env_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("HYPERION_AMX_BF16");
    return !(env && std::strcmp(env, "0") == 0);
  }();
  return enabled;
}

// A^T in the tiles' pair layout, as 32-bit words: xp[q * mp + i] holds A[i][2q], A[i][2q+1]
// (zero for rows i >= m). A gather per 16 rows of one pair column.
HYP_AMX_BF16 void pack_a(const GemmArgs& g, int64_t mp, uint32_t* xp) {
  const __m512i rows =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(int(g.lda)));
  const uint16_t* a = static_cast<const uint16_t*>(g.a);
  for (int64_t i0 = 0; i0 < mp; i0 += kTile) {
    const int64_t valid = std::clamp<int64_t>(g.m - i0, 0, kTile);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
    const uint16_t* base = a + i0 * g.lda;
    for (int64_t q = 0; q < g.k / 2; ++q) {
      const __m512i v = valid == 0 ? _mm512_setzero_si512()
                                   : _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, rows,
                                                                 base + 2 * q, 2);
      _mm512_storeu_si512(xp + q * mp + i0, v);
    }
  }
}

// C[t0 + i][j0 + r] for r < rows, i < cols, from a result tile s[r][i] (C^T).
HYP_AMX_BF16 void store_tile(const GemmArgs& g, const float* s, int64_t j0, int64_t rows,
                             int64_t t0, int64_t cols) {
  const __m512i idx =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(int(kTile)));
  const __mmask16 k = static_cast<__mmask16>((1u << rows) - 1u);
  const bool scaled = g.alpha != 1.0f || g.a_scale != nullptr || g.b_scale != nullptr;
  const __m512 cs = g.b_scale ? _mm512_maskz_loadu_ps(k, g.b_scale + j0) : _mm512_set1_ps(1.0f);
  const __m512 bias = g.bias ? _mm512_maskz_loadu_ps(k, g.bias + j0) : _mm512_setzero_ps();
  const __m512 beta = _mm512_set1_ps(g.beta);
  for (int64_t i = 0; i < cols; ++i) {
    const int64_t t = t0 + i;
    __m512 v = _mm512_i32gather_ps(idx, s + i, 4);
    if (scaled) {
      const float rs = g.alpha * (g.a_scale ? g.a_scale[t] : 1.0f);
      v = _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(rs)), cs);
    }
    if (g.bias) v = _mm512_add_ps(v, bias);
    if (g.c_dtype == DType::kF32) {
      float* dst = static_cast<float*>(g.c) + t * g.ldc + j0;
      if (g.beta != 0.0f) v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(k, dst), v);
      _mm512_mask_storeu_ps(dst, k, v);
    } else {
      uint16_t* dst = static_cast<uint16_t*>(g.c) + t * g.ldc + j0;
      if (g.beta != 0.0f) {
        const __m512 old = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, dst)), 16));
        v = _mm512_fmadd_ps(beta, old, v);
      }
      _mm256_mask_storeu_epi16(dst, k, (__m256i)_mm512_cvtneps_pbh(v));
    }
  }
}

// The k loop of one block: OB x 16 weight rows (w, stride ldw bytes) times TB x 16
// columns of xp from t0, into result tiles 0..OB*TB-1 (then stored to s[OB*TB][16][16]).
// The tile intrinsics take literal tile numbers, so each blocking is spelled out:
//   3 x 1: results 0-2, A^T piece 3, weight pieces 4-6;
//   2 x 2: results 0-3 (o * 2 + b), A^T pieces 4-5, weight pieces 6-7.
template <int OB, int TB>
HYP_AMX_BF16 void block_sums(int64_t k, const char* w, int64_t ldw, const uint32_t* xp, int64_t mp,
                             int64_t t0, float* s) {
  static_assert((OB == 3 && TB == 1) || (OB == 2 && TB == 2), "the two blockings");
  const int64_t xstride = mp * 4;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  if constexpr (TB == 2) _tile_zero(3);
  for (int64_t k0 = 0; k0 < k; k0 += kKStep) {
    const char* wk = w + k0 * 2;
    if (k0 * 2 + kPrefetchAhead < k * 2)
      for (int r = 0; r < OB * kTile; ++r) _mm_prefetch(wk + r * ldw + kPrefetchAhead, _MM_HINT_T0);
    const uint32_t* xk = xp + (k0 / 2) * mp + t0;
    if constexpr (TB == 1) {
      _tile_loadd(3, xk, xstride);
      _tile_loadd(4, wk, ldw);
      _tile_loadd(5, wk + kTile * ldw, ldw);
      _tile_loadd(6, wk + 2 * kTile * ldw, ldw);
      _tile_dpbf16ps(0, 4, 3);
      _tile_dpbf16ps(1, 5, 3);
      _tile_dpbf16ps(2, 6, 3);
    } else {
      _tile_loadd(4, xk, xstride);
      _tile_loadd(5, xk + kTile, xstride);
      _tile_loadd(6, wk, ldw);
      _tile_loadd(7, wk + kTile * ldw, ldw);
      _tile_dpbf16ps(0, 6, 4);
      _tile_dpbf16ps(1, 6, 5);
      _tile_dpbf16ps(2, 7, 4);
      _tile_dpbf16ps(3, 7, 5);
    }
  }
  constexpr int64_t kStride = kTile * 4;
  _tile_stored(0, s, kStride);
  _tile_stored(1, s + kTile * kTile, kStride);
  _tile_stored(2, s + 2 * kTile * kTile, kStride);
  if constexpr (TB == 2) _tile_stored(3, s + 3 * kTile * kTile, kStride);
}

// One block: rows [j0, j0 + jrows) of C^T against columns [t0, t0 + tcols) of A^T.
template <int OB, int TB>
HYP_AMX_BF16 void block(const GemmArgs& g, const uint16_t* w, int64_t ldw, int64_t j0,
                        int64_t jrows, const uint32_t* xp, int64_t mp, int64_t t0, int64_t tcols) {
  alignas(64) float s[OB * TB * kTile * kTile];
  block_sums<OB, TB>(g.k, reinterpret_cast<const char*>(w), ldw, xp, mp, t0, s);
  for (int o = 0; o < OB; ++o)
    for (int b = 0; b < TB; ++b) {
      const int64_t rows = std::min<int64_t>(kTile, jrows - o * kTile);
      const int64_t cols = std::min<int64_t>(kTile, tcols - b * kTile);
      if (rows > 0 && cols > 0)
        store_tile(g, s + (o * TB + b) * kTile * kTile, j0 + o * kTile, rows, t0 + b * kTile, cols);
    }
}

// Weight row blocks [b0, b1) of OB x 16 rows, all of A.
template <int OB, int TB>
HYP_AMX_BF16 void run_blocks(const GemmArgs& g, int64_t b0, int64_t b1) {
  const int64_t mp = round_up(g.m, TB * kTile);
  thread_local AlignedBuffer<uint32_t> xbuf;
  thread_local AlignedBuffer<uint16_t> wpad;
  const size_t xneed = size_t(g.k / 2 * mp);
  if (xbuf.size() < xneed) xbuf = AlignedBuffer<uint32_t>(xneed);
  pack_a(g, mp, xbuf.data());
  amx_configure_full_tiles();
  const uint16_t* w = static_cast<const uint16_t*>(g.b);
  constexpr int64_t kRows = OB * kTile;
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t j0 = blk * kRows, jrows = std::min(kRows, g.n - j0);
    const uint16_t* wb = w + j0 * g.ldb;
    int64_t ldw = g.ldb * 2;
    if (jrows < kRows) {  // the last block: its rows in a zero-padded copy
      const size_t need = size_t(kRows * g.k);
      if (wpad.size() < need) wpad = AlignedBuffer<uint16_t>(need);
      std::memset(wpad.data(), 0, need * 2);
      for (int64_t r = 0; r < jrows; ++r)
        std::memcpy(wpad.data() + r * g.k, wb + r * g.ldb, size_t(g.k) * 2);
      wb = wpad.data();
      ldw = g.k * 2;
    }
    for (int64_t t0 = 0; t0 < g.m; t0 += TB * kTile)
      block<OB, TB>(g, wb, ldw, j0, jrows, xbuf.data(), mp, t0, std::min(TB * kTile, g.m - t0));
  }
  _tile_release();
}

template <int OB, int TB>
void run(const GemmArgs& g) {
  constexpr int64_t kRows = OB * kTile;
  const int64_t blocks = (g.n + kRows - 1) / kRows;
  // At least ~64 KiB of weight per thread, so small GEMMs stay on one thread.
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(1, kRows * g.k * 2));
  parallel_chunks(blocks, grain, [&](int64_t b0, int64_t b1) { run_blocks<OB, TB>(g, b0, b1); });
}

}  // namespace

bool amx_bf16_available() {
  static const bool yes = [] {
    const CpuFeatures& f = cpu_features();
    return f.amx_tile && f.amx_bf16 && f.avx512_bf16 && request_amx();
  }();
  return yes;
}

namespace {
// What the kernel itself needs (amx_bf16_gemm checks it; gemm routes only shapes that
// also pass the row range of amx_bf16_gemm_applies).
bool shape_fits(const GemmArgs& g) {
  return g.batch == 1 && g.trans_a == Trans::kN && g.trans_b == Trans::kT &&
         g.a_dtype == DType::kBF16 && g.b_dtype == DType::kBF16 &&
         (g.c_dtype == DType::kF32 || g.c_dtype == DType::kBF16) && g.m >= 1 &&
         g.m <= kAmxBf16MaxRows && g.n >= 1 && g.k >= kKStep && g.k % kKStep == 0 && g.lda >= g.k &&
         g.ldb >= g.k && g.ldc >= g.n && g.a && g.b && g.c &&
         g.lda * (kTile - 1) < (int64_t(1) << 31);  // the int32 gather index of pack_a
}
}  // namespace

bool amx_bf16_gemm_applies(const GemmArgs& g) {
  // Up to detail::kGemvMaxMBf16 rows the GEMV streams the weight as fast (and
  // HYPERION_GEMV=0 then means oneDNN, as it always did).
  return g.m > detail::kGemvMaxMBf16 && shape_fits(g) && env_enabled() && amx_bf16_available();
}

void amx_bf16_gemm(const GemmArgs& g) {
  HYP_CHECK(amx_bf16_available(), "amx_bf16_gemm: this CPU has no AMX-BF16");
  HYP_CHECK(shape_fits(g),
            "amx_bf16_gemm: needs one NT GEMM of bf16 A [m, k] and B [n, k] into f32 or bf16 C, "
            "1 <= m <= {}, k a positive multiple of {}, lda >= k, ldb >= k, ldc >= n; got m {} n "
            "{} k {} lda {} ldb {} ldc {}",
            kAmxBf16MaxRows, kKStep, g.m, g.n, g.k, g.lda, g.ldb, g.ldc);
  // Up to 16 rows: 3 x 16 weight rows per block against one A^T piece (7 tiles); more: 2 x 16
  // weight rows against 32 rows of A (8 tiles), repeated per 32 rows from L2.
  if (g.m <= kTile)
    run<3, 1>(g);
  else
    run<2, 2>(g);
}

}  // namespace hyperion
