// Internal to kernels/block_quant.cc: the quantised activation row the dot products
// read, and the per-instruction-set kernels (block_dot_avx512.cc, block_dot_avx2.cc).
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/block_quant.h"
#include "tensor/dtype.h"

namespace hyperion::block_impl {

// One quantised activation row of k values, laid out as
//   int8 qs[k] | f32 d[k / block] | int16 sums[k / group] | int16 sums32[k / 32] (K formats)
// block = 32 (the 32-value formats) or 256 (K formats): x ~= d * qs, d = absmax / 127;
// group = 32 or 16 (K formats): sums of qs over each group (exact); the K formats also
// keep each 32 values' sum (a sub-block's: two of them are one 32-bit broadcast, the
// pair a vpmaddwd multiplies by two sub-blocks' mins at once).
inline int64_t act_block(BlockType t) {
  return block_format(t).values == 32 ? 32 : 256;
}
inline int64_t act_group(BlockType t) {
  return block_format(t).values == 32 ? 32 : 16;
}

struct ActRow {
  const int8_t* qs;
  const float* d;
  const int16_t* sums;
  const int16_t* sums32;  // K formats only
};
inline ActRow act_row(BlockType t, const void* row, int64_t k) {
  const auto* p = static_cast<const unsigned char*>(row);
  ActRow a;
  a.qs = reinterpret_cast<const int8_t*>(p);
  a.d = reinterpret_cast<const float*>(p + k);
  a.sums = reinterpret_cast<const int16_t*>(p + k + (k / act_block(t)) * 4);
  a.sums32 = a.sums + k / act_group(t);
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
  RowDotFn fn[kBlockTypes] = {};
  GroupDotFn x8[kBlockTypes] = {};
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

using block_layout::half_to_float;
using block_layout::k_quant_value;
using block_layout::k_scale_min;
using block_layout::load_u16;
using block_layout::q6_k_value;

}  // namespace hyperion::block_impl
