// Internal to the decode GEMV (kernels/gemv.h): what every instruction set's row-group
// kernel shares (the call's context and the per-element epilogue), and the AVX2 kernels'
// entry point, which live in their own file (gemv_avx2.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "base/aligned.h"
#include "kernels/gemm.h"
#include "kernels/gemv.h"
#include "tensor/convert.h"

namespace hyperion::detail::gemv_impl {

// Everything a row-group kernel needs. x is the activation block packed once per call
// (layout per kernel, rows `kpad` elements apart, zero-padded); w points at W row 0.
struct Ctx {
  const GemmArgs* g;
  int m;
  int64_t k, kpad;
  const void* x;
  const unsigned char* w;
  int64_t ldb_bytes;
  float row_scale[kGemvMaxM];  // alpha * a_scale[m]
};

inline const unsigned char* wrow(const Ctx& c, int64_t n) {
  return c.w + n * c.ldb_bytes;
}

// Epilogue of one output element (per element, not per K step, so plain scalar code).
// Always inlined, so in the AVX-512 kernels it is compiled VEX-encoded: an out-of-line
// call ran legacy-SSE code with the zmm upper halves dirty, and that transition cost
// half of the int8 GEMV's time on Sapphire Rapids.
__attribute__((always_inline)) inline void store_f(const Ctx& c, int i, int64_t j, float sum) {
  const GemmArgs& g = *c.g;
  float v = sum * c.row_scale[i];
  if (g.b_scale) v *= g.b_scale[j];
  if (g.bias) v += g.bias[j];
  const int64_t idx = i * g.ldc + j;
  if (g.c_dtype == DType::kF32) {
    float* dst = static_cast<float*>(g.c) + idx;
    if (g.beta != 0.0f) v += g.beta * *dst;
    *dst = v;
  } else {  // bf16
    bf16* dst = static_cast<bf16*>(g.c) + idx;
    if (g.beta != 0.0f) v += g.beta * bf16_to_f32(*dst);
    *dst = f32_to_bf16(v);
  }
}

__attribute__((always_inline)) inline void store_i(const Ctx& c, int i, int64_t j, int32_t sum) {
  if (c.g->c_dtype == DType::kI32) {
    static_cast<int32_t*>(c.g->c)[i * c.g->ldc + j] = sum;
  } else {
    store_f(c, i, j, float(sum));
  }
}

using RowsFn = void (*)(const Ctx&, int64_t n0, int64_t pf0);
struct Kernels {
  RowsFn group = nullptr;   // `rows` consecutive W rows
  RowsFn single = nullptr;  // one W row (the tail of N); same per-row arithmetic
  int64_t rows = 1;
};

// pick(std::integral_constant<int, M>) for M = m (clamped to 1..kGemvMaxM): the row
// count as the compile-time M the kernels are instantiated for.
template <typename Pick>
Kernels pick_for_rows(int m, Pick&& pick) {
  const int rows = std::clamp(m, 1, int(kGemvMaxM));
  return [&]<int... I>(std::integer_sequence<int, I...>) {
    Kernels k;
    (void)((rows == I + 1 ? (k = pick(std::integral_constant<int, I + 1>{}), true) : false) || ...);
    return k;
  }(std::make_integer_sequence<int, int(kGemvMaxM)>{});
}

// AVX2 + FMA kernels (gemv_avx2.cc) for CPUs without AVX-512: f32 weights, bf16 weights
// widened to f32, int8 weights widened to int16 (vpmaddwd: exact products and sums).
enum class Avx2Kind { kF32, kBf16, kI8 };
// Packs g's m activation rows as those kernels read them (f32, or int16 for int8
// weights; [m][kpad], zero-padded) into `buf`; returns kpad.
int64_t pack_avx2(const GemmArgs& g, Avx2Kind kind, int64_t m, AlignedBuffer<unsigned char>& buf);
Kernels pick_avx2(Avx2Kind kind, int m);

}  // namespace hyperion::detail::gemv_impl
