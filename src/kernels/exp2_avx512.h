// 2^x on 16 floats for the attention kernels' online softmax (flash attention tiles and
// paged decode attention). Internal to src/kernels: include only from functions
// compiled for AVX-512F (the function carries its own target attribute).
#pragma once

#include <immintrin.h>

namespace hyperion::detail {

// 2^x for x <= 0 (larger x also works up to 2^127). Cephes exp2f: x = n + f with
// |f| <= 1/2, 2^f by a degree-6 polynomial (relative error ~2e-7), scaled by 2^n with
// vscalefps. Inputs are clamped at -125 so results stay normal (no denormal assists);
// anything that small is 0 to f32 precision next to the row's largest term (>= 1).
// NaN maps to 2^-125.
__attribute__((target("avx512f"))) inline __m512 exp2_avx512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-125.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace hyperion::detail
