// Internal to kernels/block_quant.cc: the quantised activation row the dot products
// read, and the per-instruction-set kernels (block_dot_avx512.cc, block_dot_avx2.cc).
#pragma once

#include <cstdint>

#include "kernels/block_quant.h"

namespace hyperion::block_impl {

// One quantised activation row of k values, laid out as
//   int8 qs[k] | f32 d[k / block] | int16 sums[k / group]
// block = 32 (Q4_0, Q8_0) or 256 (K formats): x ~= d * qs, d = absmax / 127;
// group = 32 (Q4_0, Q8_0) or 16 (K formats): sums of qs over each group (exact).
inline int64_t act_block(BlockType t) {
  return t == BlockType::kQ4_0 || t == BlockType::kQ8_0 ? 32 : 256;
}
inline int64_t act_group(BlockType t) {
  return t == BlockType::kQ4_0 || t == BlockType::kQ8_0 ? 32 : 16;
}

struct ActRow {
  const int8_t* qs;
  const float* d;
  const int16_t* sums;
};
inline ActRow act_row(BlockType t, const void* row, int64_t k) {
  const auto* p = static_cast<const unsigned char*>(row);
  ActRow a;
  a.qs = reinterpret_cast<const int8_t*>(p);
  a.d = reinterpret_cast<const float*>(p + k);
  a.sums = reinterpret_cast<const int16_t*>(p + k + (k / act_block(t)) * 4);
  return a;
}

// Dots one weight row (k values in blocks) with m (1..kBlockDotMaxRows) activation rows:
// out[i] = w . act[i].
using RowDotFn = void (*)(const unsigned char* w, int64_t k, const ActRow* act, int m,
                          float* out);

// The kernels of one instruction set, by BlockType (null: that format falls back to the
// portable code).
struct DotKernels {
  RowDotFn fn[5] = {};
};
DotKernels avx512_vnni_kernels();  // needs AVX512F/BW/VL + VNNI
DotKernels avx2_kernels();         // needs AVX2 + FMA + F16C

// Half to float without the library call (the kernels' hot loops).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((man & 0x400) == 0) {
        man <<= 1;
        --exp;
      }
      man &= 0x3FF;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t load_u16(const unsigned char* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
}

}  // namespace hyperion::block_impl
