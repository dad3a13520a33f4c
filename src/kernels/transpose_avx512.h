// In-register 16 x 16 transpose of 32-bit values for the AVX-512 kernels (attention
// tiles, the batch GEMM's activation packing). Header-only and always inlined, so it
// compiles under each caller's own AVX-512 target.
#pragma once

#include <immintrin.h>

namespace hyperion::simd {

// r[i] lane j becomes r[j] lane i: 32-bit, 64-bit, then two 128-bit-lane interleaves.
// Bits are only moved, so it serves int32 data cast to float as well.
__attribute__((target("avx512f"), always_inline)) inline void transpose16x16(__m512* r) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
    u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));      // column 4L of rows i..i+3
    u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));  // column 4L + 1
    u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));  // column 4L + 2
    u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));  // column 4L + 3
  }
  for (int h = 0; h < 16; h += 8)
    for (int j = 0; j < 4; ++j) {
      t[h + j] = _mm512_shuffle_f32x4(u[h + j], u[h + j + 4], 0x88);
      t[h + j + 4] = _mm512_shuffle_f32x4(u[h + j], u[h + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
}

}  // namespace hyperion::simd
