#include "kernels/amx_int8_gemm.h"

// GCC 12's AVX-512 intrinsic headers fill "don't care" operands from self-initialised
// _mm*_undefined_*() values, which -Wuninitialized flags once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "kernels/amx_tiles.h"

namespace hyperion {
namespace {

constexpr int64_t kKBlock = 64;  // bytes of one A tile row (and 16 packed B rows)
constexpr int64_t kBlock = 32;   // rows and columns of one 2 x 2 tile block

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

#define HYP_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512bf16")))

// The epilogue of one block: rows [r0, r0 + rows) and columns [c0, c0 + cols) from the
// int32 sums s[32][32].
HYP_AMX void store_block(const int32_t* s, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                         const float* a_scale, const float* b_scale, void* c, DType cd, int64_t ldc,
                         float beta) {
  const __m512 zero = _mm512_setzero_ps(), bv = _mm512_set1_ps(beta);
  for (int64_t i = 0; i < rows; ++i) {
    const __m512 rs = _mm512_set1_ps(1.0f * a_scale[r0 + i]);
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 k =
          cols - j >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (cols - j)) - 1u);
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_loadu_si512(s + i * kBlock + j));
      const __m512 cs = _mm512_maskz_loadu_ps(k, b_scale + c0 + j);
      __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(sum, rs), cs), zero);
      const int64_t at = (r0 + i) * ldc + c0 + j;
      if (cd == DType::kF32) {
        float* dst = static_cast<float*>(c) + at;
        if (beta != 0.0f) v = _mm512_add_ps(v, _mm512_mul_ps(bv, _mm512_maskz_loadu_ps(k, dst)));
        _mm512_mask_storeu_ps(dst, k, v);
      } else {
        uint16_t* dst = static_cast<uint16_t*>(c) + at;
        if (beta != 0.0f) {
          const __m512 old = _mm512_castsi512_ps(
              _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, dst)), 16));
          v = _mm512_add_ps(v, _mm512_mul_ps(bv, old));
        }
        _mm256_mask_storeu_epi16(dst, k, (__m256i)_mm512_cvtneps_pbh(v));
      }
    }
  }
}

// Rows [r0, r1) (a multiple of 32 apart, except at the end), columns [j0, j1) (j0 a
// multiple of 32).
HYP_AMX void gemm_rows(int64_t r0, int64_t r1, int64_t j0, int64_t j1, int64_t m, int64_t k,
                       const int8_t* a, int64_t lda, const int8_t* pb, int64_t n,
                       const float* a_scale, const float* b_scale, void* c, DType cd, int64_t ldc,
                       float beta) {
  amx_configure_full_tiles();
  const int64_t np = round_up(n, kBlock);
  const int64_t pb_stride = np * 4;  // bytes of one packed row (4 k values per column)
  alignas(64) int32_t sums[kBlock * kBlock];
  alignas(64) int8_t a_pad[kBlock * kKBlock];
  for (int64_t r = r0; r < r1; r += kBlock) {
    const int64_t rows = std::min(kBlock, m - r);
    for (int64_t j = j0; j < j1; j += kBlock) {
      const int64_t cols = std::min(kBlock, j1 - j);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kk = 0; kk < k; kk += kKBlock) {
        const int8_t* a0 = a + r * lda + kk;
        int64_t a_stride = lda;
        if (rows < kBlock) {  // a short last row block: zero-padded copy
          std::memset(a_pad, 0, sizeof(a_pad));
          for (int64_t i = 0; i < rows; ++i)
            std::memcpy(a_pad + i * kKBlock, a0 + i * lda, kKBlock);
          a0 = a_pad;
          a_stride = kKBlock;
        }
        const int8_t* b0 = pb + (kk / 4) * pb_stride + j * 4;
        _tile_loadd(4, a0, a_stride);
        _tile_loadd(5, a0 + 16 * a_stride, a_stride);
        _tile_loadd(6, b0, pb_stride);
        _tile_loadd(7, b0 + 64, pb_stride);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
      }
      _tile_stored(0, sums, kBlock * 4);
      _tile_stored(1, sums + 16, kBlock * 4);
      _tile_stored(2, sums + 16 * kBlock, kBlock * 4);
      _tile_stored(3, sums + 16 * kBlock + 16, kBlock * 4);
      store_block(sums, r, rows, j, cols, a_scale, b_scale, c, cd, ldc, beta);
    }
  }
  _tile_release();
}

}  // namespace

bool amx_int8_available() {
  static const bool yes = [] {
    const CpuFeatures& f = cpu_features();
    return f.amx_tile && f.amx_int8 && f.avx512_bf16 && request_amx();
  }();
  return yes;
}

int64_t amx_packed_b_bytes(int64_t k, int64_t n) {
  return round_up(k, kKBlock) * round_up(n, kBlock);
}

// packed[kq][j][t] = B(k = 4 kq + t, column j), zero beyond k and n.
void amx_pack_b_nk(const int8_t* b, int64_t n, int64_t k, int8_t* packed) {
  const int64_t kp = round_up(k, kKBlock), np = round_up(n, kBlock);
  std::memset(packed, 0, static_cast<size_t>(kp * np));
  // Rows of B are columns of op(B): four consecutive k of column j are contiguous.
  parallel_chunks(k / 4 + (k % 4 != 0), 16, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      int8_t* dst = packed + q * np * 4;
      const int64_t kn = std::min<int64_t>(4, k - 4 * q);
      for (int64_t j = 0; j < n; ++j) std::memcpy(dst + j * 4, b + j * k + 4 * q, size_t(kn));
    }
  });
}

namespace {
// Four source rows interleaved byte by byte, 16 columns per step (AVX-512).
HYP_AMX void interleave4_avx512(const int8_t* r0, const int8_t* r1, const int8_t* r2,
                                const int8_t* r3, int64_t n, int8_t* dst) {
  const __m512i m = _mm512_set1_epi32(0xFF);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512i a =
        _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(r0 + j))), m);
    const __m512i b =
        _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(r1 + j))), m);
    const __m512i c =
        _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(r2 + j))), m);
    const __m512i d = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(r3 + j)));
    const __m512i v =
        _mm512_or_si512(_mm512_or_si512(a, _mm512_slli_epi32(b, 8)),
                        _mm512_or_si512(_mm512_slli_epi32(c, 16), _mm512_slli_epi32(d, 24)));
    _mm512_storeu_si512(dst + j * 4, v);
  }
  for (; j < n; ++j) {
    dst[j * 4] = r0[j];
    dst[j * 4 + 1] = r1[j];
    dst[j * 4 + 2] = r2[j];
    dst[j * 4 + 3] = r3[j];
  }
}
}  // namespace

void amx_pack_b_kn(const int8_t* b, int64_t k, int64_t n, int8_t* packed) {
  const int64_t kp = round_up(k, kKBlock), np = round_up(n, kBlock);
  // Only the padding needs zeros: columns n..np of every packed row, rows past k.
  const bool wide = amx_int8_available();
  parallel_chunks(kp / 4, 16, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      int8_t* dst = packed + q * np * 4;
      std::memset(dst + n * 4, 0, static_cast<size_t>((np - n) * 4));
      if (4 * q + 3 < k && wide) {
        const int8_t* src = b + 4 * q * n;
        interleave4_avx512(src, src + n, src + 2 * n, src + 3 * n, n, dst);
        continue;
      }
      for (int64_t t = 0; t < 4; ++t) {
        const int8_t* src = 4 * q + t < k ? b + (4 * q + t) * n : nullptr;
        for (int64_t j = 0; j < n; ++j) dst[j * 4 + t] = src != nullptr ? src[j] : int8_t(0);
      }
    }
  });
}

void amx_int8_gemm(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda,
                   const int8_t* packed_b, const float* a_scale, const float* b_scale, void* c,
                   DType c_dtype, int64_t ldc, float beta) {
  HYP_CHECK(amx_int8_available(), "amx_int8_gemm: this CPU has no AMX-INT8");
  HYP_CHECK(amx_int8_gemm_applies(k), "amx_int8_gemm: k = {} is not a multiple of 64", k);
  HYP_CHECK(c_dtype == DType::kF32 || c_dtype == DType::kBF16,
            "amx_int8_gemm: output must be f32 or bf16, got {}", dtype_name(c_dtype));
  HYP_CHECK(lda >= k && ldc >= n && a_scale && b_scale, "amx_int8_gemm: bad arguments");
  if (m == 0 || n == 0) return;
  // Tasks: row blocks, each split into column ranges when there are fewer row blocks
  // than threads (decode batches are one or two row blocks: split by rows alone, one
  // thread would stream the whole weight). Every element is one tile accumulation over
  // k either way, so the split never changes a result.
  const int64_t blocks = (m + kBlock - 1) / kBlock, col_blocks = (n + kBlock - 1) / kBlock;
  const int64_t splits =
      std::min(col_blocks, std::max<int64_t>(1, (num_threads() + blocks - 1) / blocks));
  parallel_chunks(blocks * splits, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t rb = t / splits, cs = t % splits;
      const int64_t j0 = col_blocks * cs / splits * kBlock;
      const int64_t j1 = std::min(n, col_blocks * (cs + 1) / splits * kBlock);
      gemm_rows(rb * kBlock, std::min(m, (rb + 1) * kBlock), j0, j1, m, k, a, lda, packed_b, n,
                a_scale, b_scale, c, c_dtype, ldc, beta);
    }
  });
}

}  // namespace hyperion
