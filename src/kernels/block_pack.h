// The decode layout of block-quantised weights: the blocks of 8 consecutive rows
// interleaved, so that one 32-byte vector holds 4 values of each of the 8 rows and one
// vpdpbusd (AVX512-VL VNNI; vpmaddubsw + vpmaddwd on AVX2) adds 4 products to each row's
// sum at once, against 4 activation bytes broadcast to every lane. The GGUF layout puts a
// row's 32 or 256 values side by side instead, which makes every block end in a
// horizontal sum and a scalar decode of its scales; interleaved, the 8 rows' scales are one
// vector and a block's epilogue is a handful of vector operations for 8 outputs.
//
// The same bits as the file's blocks, rearranged at load (exactly: dequantising a packed
// row gives the file's values bit for bit), in about the same bytes. Per group of 8 rows
// and per block (32 values: Q4_0, Q8_0) or super-block (256: the K formats):
//   Q4_0  f16 d[8] | 4 steps x 32 B of nibbles                              144 B = 8 x 18
//   Q4_1  f16 d[8] | f16 m[8] | 4 steps x 32 B of nibbles                   160 B = 8 x 20
//   Q5_0  f16 d[8] | 4 steps x 32 B of nibbles | 32 B of fifth bits         176 B = 8 x 22
//   Q5_1  f16 d[8] | f16 m[8] | 4 steps x 32 B of nibbles | 32 B of fifth bits  192 B = 8 x 24
//   Q8_0  f16 d[8] | 8 steps x 32 B of int8                                 272 B = 8 x 34
//   Q4_K  f16 d[8] | f16 dmin[8] | u8 sc[8 sub][8] | u8 m[8 sub][8] |
//         8 sub-blocks x 4 steps x 32 B of nibbles                          1184 B (8 x 144 = 1152)
//   Q5_K  as Q4_K, each sub-block's nibbles followed by its 32 B of fifth bits  1440 B (8 x 176 = 1408)
//   Q6_K  f16 d[8] | 16 groups x { i8 sc[8] | 2 steps x 32 B of low nibbles |
//         32 B of high bit pairs }                                          1680 B = 8 x 210
// Everything a kernel reads is in the order it reads it: one sequential stream per group of
// rows, which the hardware prefetcher follows (a layout with the high bits in a region of
// their own ran Q6_K at half the bandwidth of Q4_K once the matrix left the cache).
// A step covers 8 values of each row: byte 4r + i holds value 8s + i of row r in its low
// nibble and value 8s + 4 + i in its high one (Q8_0: 4 values a step, byte 4r + i = value
// 4s + i). Fifth bits (Q5_0, Q5_1; Q5_K per sub-block j): byte 4r + i, bit 2s for the low
// nibble of step s, 2s + 1 for the high. Q6_K's high pairs: byte 4r + i of group g holds, in bits
// 0-1, 2-3, 4-5 and 6-7, the high 2 bits of the group's values i, 4 + i, 8 + i, 12 + i.
//
// Rows past the last whole group of 8 stay in the file's layout (`tail`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "base/aligned.h"
#include "kernels/block_quant.h"

namespace hyperion {

struct PackedBlocks {
  BlockType type = BlockType::kQ8_0;
  int64_t rows = 0, k = 0;
  int64_t groups = 0;        // whole groups of 8 rows, packed
  size_t block_bytes = 0;    // one group's bytes per block / super-block
  AlignedBuffer<unsigned char> data;
  const unsigned char* tail = nullptr;  // rows 8 * groups.. in the file's layout (not owned)
  bool empty() const { return rows == 0; }
};

// Bytes of one group of 8 rows for one block / super-block of `t`.
size_t packed_group_block_bytes(BlockType t);

// Packs `rows` rows of k values in the file's layout at `src` (which must outlive the
// result: the tail rows are read there). Parallel over groups.
PackedBlocks pack_blocks(BlockType t, const void* src, int64_t rows, int64_t k);

// Rows r0..r0+n of a packed matrix as f32 or bf16 [n, k], equal to the reference
// dequantisation of the file's rows bit for bit (before the bf16 rounding).
void dequantize_packed_rows(const PackedBlocks& p, int64_t r0, int64_t n, void* dst, DType dst_dtype);

// y[m, rows] = x[m, k] W^T + beta * y on the packed matrix: block_matmul's contract.
void packed_block_matmul(const PackedBlocks& p, int64_t m, const void* x, DType xd, void* y,
                         DType yd, float beta = 0.0f);
// The same for several matrices of one input (q, k and v; gate and up): x quantised once
// per activation format and all the matrices' rows in one parallel region.
void packed_block_matmul_many(std::span<const PackedBlocks* const> ps, int64_t m, const void* x,
                              DType xd, std::span<void* const> ys, DType yd, float beta = 0.0f);

}  // namespace hyperion
