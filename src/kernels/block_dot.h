// Internal to kernels/block_quant.cc: the quantised activation row the dot products
// read, and the per-instruction-set kernels (block_dot_avx512.cc, block_dot_avx2.cc).
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/block_quant.h"
#include "tensor/dtype.h"

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

// Dots one packed group of 8 rows (kernels/block_pack.h; `w` at its first block, nb
// blocks) with m activation rows: out[8 i + r] = row r . act[i].
using GroupDotFn = void (*)(const unsigned char* w, int64_t nb, const ActRow* act, int m, float* out);

// The kernels of one instruction set, by BlockType (null: that format falls back to the
// portable code).
struct DotKernels {
  RowDotFn fn[5] = {};
  GroupDotFn x8[5] = {};
};
DotKernels avx512_vnni_kernels();  // needs AVX512F/BW/VL + VNNI
DotKernels avx2_kernels();         // needs AVX2 + FMA + F16C

// The kernels of the instruction set in use (set_block_isa_for_testing), null for the
// portable code.
const DotKernels* active_kernels();

// Quantises m activation rows for weights of type t into thread-local buffer `slot` (0 or
// 1; valid until the next call with that slot on this thread).
void quantize_act_rows(BlockType t, int64_t m, int64_t k, const void* x, DType xd, ActRow* rows,
                       int slot = 0);

// The prefill matmul: `dequant(r0, rows, tile)` fills bf16 [rows, k] tiles of W, each
// multiplied by all of x on the GEMM.
void prefill_matmul(int64_t m, int64_t n, int64_t k, const void* x, DType xd, void* y, DType yd,
                    float beta, const std::function<void(int64_t, int64_t, bf16*)>& dequant);

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

// The integer values of the file's layouts (block_quant.h).
// Q4_K (qh null) and Q5_K: the 4-bit value of element e, plus 16 times its fifth
// bit for Q5_K.
inline int k_quant_value(const unsigned char* qs, const unsigned char* qh, int e) {
  const int c = e / 64, l = e % 32;
  const bool high = (e % 64) >= 32;
  int q = high ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 15);
  if (qh != nullptr) q += ((qh[l] >> (2 * c + (high ? 1 : 0))) & 1) << 4;
  return q;
}

inline int q6_k_value(const unsigned char* b, int e) {
  const int h = e / 128, r = e % 128, part = r / 32, l = r % 32;
  const unsigned char* ql = b + 64 * h;
  const unsigned char* qh = b + 128 + 32 * h;
  const int low = part == 0   ? (ql[l] & 15)
                  : part == 1 ? (ql[l + 32] & 15)
                  : part == 2 ? (ql[l] >> 4)
                              : (ql[l + 32] >> 4);
  return low | (((qh[l] >> (2 * part)) & 3) << 4);
}

inline uint16_t load_u16(const unsigned char* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
}

}  // namespace hyperion::block_impl
