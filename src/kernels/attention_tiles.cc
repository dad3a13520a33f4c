// Tile arithmetic of the attention kernels: register-blocked AVX-512 products, the
// online-softmax step and the backward probability/gradient step, plus a portable scalar
// version of each, selected at run time.
//
// All products are "broadcast A, stream B": C[r, 16 lanes] += A(r, c) * B[c, 16 lanes],
// with an MR x NV block of C (MR rows, NV vectors of 16 columns) held in zmm registers
// for the whole contraction. With NV = 4 (64 columns) and MR = 6 that is 24
// accumulators, 4 B loads and 6 broadcasts per 24 FMAs, well within the two load ports.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/cpu.h"
#include "kernels/attention_tiles.h"
#include "kernels/exp2_avx512.h"
#include "kernels/transpose_avx512.h"

#define HYP_AVX512 __attribute__((target("avx512f")))

// GCC 12 reports the deliberately uninitialised pass-through operand
// (_mm512_undefined_ps) of max/roundscale/scalef as uninitialised once inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace hyperion::attn {
namespace {

// ---------------------------------------------------------------------------------------
// AVX-512

template <int MR, int NV, bool kRows>
HYP_AVX512 void micro(int k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                      int64_t ldc, bool accumulate) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (int kk = 0; kk < k; ++kk) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + kk * ldb + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 ar = _mm512_set1_ps(kRows ? a[r * lda + kk] : a[kk * lda + r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}

// Rows per register block: 24 accumulators for 4 vectors, at most 8 rows otherwise.
template <int NV>
inline constexpr int kMr = NV == 4 ? 6 : 8;

// Blocks of fewer than MR rows: one instantiation per row count.
template <int NV, bool kRows, int R = 1>
HYP_AVX512 void micro_tail(int rows, int k, const float* a, int64_t lda, const float* b,
                           int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if constexpr (R < kMr<NV> - 1) {
    if (rows != R) return micro_tail<NV, kRows, R + 1>(rows, k, a, lda, b, ldb, c, ldc, accumulate);
  }
  micro<R, NV, kRows>(k, a, lda, b, ldb, c, ldc, accumulate);
}

template <int NV, bool kRows>
HYP_AVX512 void panel(int m, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
                      float* c, int64_t ldc, bool accumulate, Skip skip) {
  constexpr int MR = kMr<NV>;
  // Full blocks, then the last MR + m % MR rows as two near-equal blocks (64 = 9 x 6 +
  // 5 + 5 rather than 10 x 6 + 4): small blocks have too few FMAs per load.
  int full = m / MR, rest = m % MR;
  if (rest != 0 && full > 0) {
    --full;
    rest += MR;
  }
  auto block = [&](int r, int rows) {
    int k0, k1;
    skip_range(skip, r, rows, k, &k0, &k1);
    const float* ar = kRows ? a + r * lda + k0 : a + k0 * lda + r;
    if (rows == MR)
      micro<MR, NV, kRows>(k1 - k0, ar, lda, b + k0 * ldb, ldb, c + r * ldc, ldc, accumulate);
    else
      micro_tail<NV, kRows>(rows, k1 - k0, ar, lda, b + k0 * ldb, ldb, c + r * ldc, ldc,
                            accumulate);
  };
  int r = 0;
  for (; r < full * MR; r += MR) block(r, MR);
  if (rest > MR) {
    block(r, rest / 2);
    r += rest / 2;
    rest -= rest / 2;
  }
  if (rest > 0) block(r, rest);
}

template <bool kRows>
HYP_AVX512 void gemm_avx512_t(int m, int n, int k, const float* a, int64_t lda, const float* b,
                              int64_t ldb, float* c, int64_t ldc, bool accumulate, Skip skip) {
  // 64-column panels of B stay in L1 while every row block of A streams past them.
  for (int c0 = 0; c0 < n; c0 += 64) {
    switch (std::min(4, (n - c0) / 16)) {
      case 4:
        panel<4, kRows>(m, k, a, lda, b + c0, ldb, c + c0, ldc, accumulate, skip);
        break;
      case 3:
        panel<3, kRows>(m, k, a, lda, b + c0, ldb, c + c0, ldc, accumulate, skip);
        break;
      case 2:
        panel<2, kRows>(m, k, a, lda, b + c0, ldb, c + c0, ldc, accumulate, skip);
        break;
      default:
        panel<1, kRows>(m, k, a, lda, b + c0, ldb, c + c0, ldc, accumulate, skip);
        break;
    }
  }
}

HYP_AVX512 void gemm_avx512(int m, int n, int k, const float* a, int64_t lda, bool a_rows,
                            const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
                            Skip skip) {
  if (a_rows)
    gemm_avx512_t<true>(m, n, k, a, lda, b, ldb, c, ldc, accumulate, skip);
  else
    gemm_avx512_t<false>(m, n, k, a, lda, b, ldb, c, ldc, accumulate, skip);
}

#define HYP_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl")))

HYP_AVX512BW void pack_cols_avx512(const void* src, DType dtype, int64_t row_stride, int n,
                                   int64_t d, float* dst) {
  for (int r0 = 0; r0 < kBq; r0 += 16) {
    const int rows = std::clamp(n - r0, 0, 16);
    for (int64_t c0 = 0; c0 < d; c0 += 16) {
      const int cols = static_cast<int>(std::min<int64_t>(16, d - c0));
      const __mmask16 cmask = static_cast<__mmask16>((1u << cols) - 1);
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        if (i >= rows) {
          r[i] = _mm512_setzero_ps();
        } else if (dtype == DType::kF32) {
          r[i] = _mm512_maskz_loadu_ps(cmask,
                                       static_cast<const float*>(src) + (r0 + i) * row_stride + c0);
        } else {
          const __m256i h = _mm256_maskz_loadu_epi16(
              cmask, static_cast<const bf16*>(src) + (r0 + i) * row_stride + c0);
          r[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        }
      }
      simd::transpose16x16(r);
      for (int c = 0; c < cols; ++c) _mm512_store_ps(dst + (c0 + c) * kBq + r0, r[c]);
    }
  }
}

using detail::exp2_avx512;

// Lanes l of a 16-query vector with l >= lo.
inline __mmask16 lanes_from(int64_t lo) {
  if (lo <= 0) return 0xFFFF;
  if (lo >= 16) return 0;
  return static_cast<__mmask16>(0xFFFFu << lo);
}

constexpr int kVecs = kBq / 16;

HYP_AVX512 void softmax_step_avx512(float* st, int kn, float c, const BlockMask& mask, float* m,
                                    float* l, float* o, int dp) {
  const __m512 cv = _mm512_set1_ps(c);
  __m512 mx[kVecs];
  for (int v = 0; v < kVecs; ++v) mx[v] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int j = 0; j < kn; ++j) {
    const float* row = st + j * kBq;
    if (!mask.active) {
      for (int v = 0; v < kVecs; ++v) mx[v] = _mm512_max_ps(mx[v], _mm512_load_ps(row + 16 * v));
    } else {
      const int64_t lo = j - mask.diag;  // first visible query of key j
      for (int v = 0; v < kVecs; ++v)
        mx[v] =
            _mm512_mask_max_ps(mx[v], lanes_from(lo - 16 * v), mx[v], _mm512_load_ps(row + 16 * v));
    }
  }
  __m512 mnew[kVecs], sum[kVecs];
  alignas(64) float alpha[kBq];
  for (int v = 0; v < kVecs; ++v) {
    const __m512 mold = _mm512_loadu_ps(m + 16 * v);
    // Queries with no visible key in this block keep their max (mx = -inf).
    mnew[v] = _mm512_max_ps(mold, _mm512_mul_ps(mx[v], cv));
    _mm512_store_ps(alpha + 16 * v, exp2_avx512(_mm512_sub_ps(mold, mnew[v])));
    _mm512_storeu_ps(m + 16 * v, mnew[v]);
    sum[v] = _mm512_setzero_ps();
  }
  for (int j = 0; j < kn; ++j) {
    float* row = st + j * kBq;
    const int64_t lo = j - mask.diag;
    for (int v = 0; v < kVecs; ++v) {
      __m512 p = exp2_avx512(_mm512_fmsub_ps(_mm512_load_ps(row + 16 * v), cv, mnew[v]));
      if (mask.active) p = _mm512_maskz_mov_ps(lanes_from(lo - 16 * v), p);
      _mm512_store_ps(row + 16 * v, p);
      sum[v] = _mm512_add_ps(sum[v], p);
    }
  }
  for (int v = 0; v < kVecs; ++v)
    _mm512_storeu_ps(l + 16 * v, _mm512_fmadd_ps(_mm512_loadu_ps(l + 16 * v),
                                                 _mm512_load_ps(alpha + 16 * v), sum[v]));
  for (int i = 0; i < kBq; ++i) {
    const __m512 a = _mm512_set1_ps(alpha[i]);
    float* orow = o + int64_t(i) * dp;
    for (int c0 = 0; c0 < dp; c0 += 16)
      _mm512_store_ps(orow + c0, _mm512_mul_ps(_mm512_load_ps(orow + c0), a));
  }
}

HYP_AVX512 void probs_and_grad_avx512(float* st, float* dpt, int kn, float c, float scale,
                                      const float* lse2, const float* delta,
                                      const BlockMask& mask) {
  const __m512 cv = _mm512_set1_ps(c), sv = _mm512_set1_ps(scale);
  __m512 lv[kVecs], dv[kVecs];
  for (int v = 0; v < kVecs; ++v) {
    lv[v] = _mm512_loadu_ps(lse2 + 16 * v);
    dv[v] = _mm512_loadu_ps(delta + 16 * v);
  }
  for (int j = 0; j < kn; ++j) {
    float* srow = st + j * kBq;
    float* drow = dpt + j * kBq;
    const int64_t lo = j - mask.diag;
    for (int v = 0; v < kVecs; ++v) {
      __m512 p = exp2_avx512(_mm512_fmsub_ps(_mm512_load_ps(srow + 16 * v), cv, lv[v]));
      __m512 ds =
          _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(_mm512_load_ps(drow + 16 * v), dv[v])), sv);
      if (mask.active) {
        // Masked entries may hold stale values (see scores_gemm): zero both outputs.
        const __mmask16 keep = lanes_from(lo - 16 * v);
        p = _mm512_maskz_mov_ps(keep, p);
        ds = _mm512_maskz_mov_ps(keep, ds);
      }
      _mm512_store_ps(srow + 16 * v, p);
      _mm512_store_ps(drow + 16 * v, ds);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Portable scalar versions: the same arithmetic as plain loops.

void gemm_portable(int m, int n, int k, const float* a, int64_t lda, bool a_rows, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate, Skip skip) {
  for (int r = 0; r < m; ++r) {
    float* __restrict cr = c + r * ldc;
    if (!accumulate) std::fill(cr, cr + n, 0.0f);
    int k0, k1;
    skip_range(skip, r, 1, k, &k0, &k1);
    for (int kk = k0; kk < k1; ++kk) {
      const float ar = a_rows ? a[r * lda + kk] : a[kk * lda + r];
      const float* __restrict br = b + kk * ldb;
      for (int col = 0; col < n; ++col) cr[col] += ar * br[col];
    }
  }
}

bool visible(const BlockMask& mask, int j, int i) {
  return (!mask.active || j - i <= mask.diag) && (!mask.windowed || j - i > mask.window_diag);
}

void softmax_step_portable(float* st, int kn, float c, const BlockMask& mask, float* m, float* l,
                           float* o, int dp) {
  for (int i = 0; i < kBq; ++i) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < kn; ++j)
      if (visible(mask, j, i)) mx = std::max(mx, st[j * kBq + i]);
    const float mnew = std::max(m[i], mx * c);
    const float alpha = m[i] == mnew ? 1.0f : std::exp2(m[i] - mnew);
    float sum = 0;
    for (int j = 0; j < kn; ++j) {
      float& s = st[j * kBq + i];
      s = visible(mask, j, i) ? std::exp2(s * c - mnew) : 0.0f;
      sum += s;
    }
    m[i] = mnew;
    l[i] = l[i] * alpha + sum;
    for (int col = 0; col < dp; ++col) o[int64_t(i) * dp + col] *= alpha;
  }
}

void probs_and_grad_portable(float* st, float* dpt, int kn, float c, float scale, const float* lse2,
                             const float* delta, const BlockMask& mask) {
  for (int j = 0; j < kn; ++j)
    for (int i = 0; i < kBq; ++i) {
      float& s = st[j * kBq + i];
      float& d = dpt[j * kBq + i];
      if (!visible(mask, j, i)) {
        s = d = 0.0f;  // may hold stale values (see scores_gemm)
        continue;
      }
      s = std::exp2(s * c - lse2[i]);
      d = s * (d - delta[i]) * scale;
    }
}

}  // namespace

const TileOps& avx512_tile_ops() {
  static const TileOps ops{gemm_avx512, softmax_step_avx512, probs_and_grad_avx512,
                           pack_cols_avx512};
  return ops;
}

const TileOps& portable_tile_ops() {
  static const TileOps ops{gemm_portable, softmax_step_portable, probs_and_grad_portable,
                           pack_cols};
  return ops;
}

const TileOps& tile_ops(bool force_portable) {
  const CpuFeatures& cpu = cpu_features();
  if (!force_portable && cpu.avx512f && cpu.avx512bw && cpu.avx512vl) return avx512_tile_ops();
  return portable_tile_ops();
}

}  // namespace hyperion::attn
