// llama.cpp's block quantisation formats (GGUF's Q4_0, Q8_0, Q4_K, Q5_K, Q6_K), and the
// matmul that computes on them directly: the weights stay in their blocks, the
// activations are quantised per block to int8, and every block's dot product is an
// integer dot product (AVX512-VNNI vpdpbusd, AVX2 vpmaddubsw) scaled once per block.
//
// The block layouts, as ggml lays them out (little-endian, packed, f16 = IEEE half):
//   Q4_0  32 values, 18 bytes  { f16 d; u8 qs[16]; }
//         x[j] = d * ((qs[j] & 15) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8)
//   Q8_0  32 values, 34 bytes  { f16 d; i8 qs[32]; }             x[j] = d * qs[j]
//   Q4_K  256 values, 144 bytes { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; }
//         8 sub-blocks of 32, each with a 6-bit scale sc and a 6-bit min m packed in
//         `scales` (k_scale_min below); x = d * sc * q - dmin * m, q in [0, 15].
//         In each 64 values c: qs[32c + l] holds value 64c + l (low nibble, sub-block 2c)
//         and value 64c + 32 + l (high nibble, sub-block 2c + 1).
//   Q5_K  256 values, 176 bytes { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }
//         as Q4_K with a fifth bit: value 64c + l gets bit 2c of qh[l] as 16, value
//         64c + 32 + l bit 2c + 1; q in [0, 31].
//   Q6_K  256 values, 210 bytes { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; }
//         16 groups of 16 with an int8 scale; x = d * scales[g] * (q - 32), q in [0, 63].
//         In each half h (128 values, ql + 64h, qh + 32h), for l < 32:
//           value 128h + l      = (ql[l] & 15)      | ((qh[l] >> 0) & 3) << 4
//           value 128h + 32 + l = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4
//           value 128h + 64 + l = (ql[l] >> 4)      | ((qh[l] >> 4) & 3) << 4
//           value 128h + 96 + l = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4
//
// Activations (hyperion's own, internal format; never written to a file): one int8 row
// per activation row, quantised per 32 values (Q4_0, Q8_0) or per 256 (the K formats),
// each block with an f32 scale (absmax / 127, round to nearest) and, for the K formats,
// the sums of each 16 values (the min and offset corrections).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/aligned.h"
#include "tensor/tensor.h"

namespace hyperion {

enum class BlockType : uint8_t { kQ4_0, kQ8_0, kQ4_K, kQ5_K, kQ6_K };

struct BlockFormat {
  BlockType type;
  const char* name;    // "q4_0", "q8_0", "q4_K", "q5_K", "q6_K" (ggml's spelling)
  uint32_t ggml_type;  // ggml's type id: 2, 8, 12, 13, 14
  int64_t values;      // per block: 32 or 256
  size_t bytes;        // per block: 18, 34, 144, 176, 210
};
const BlockFormat& block_format(BlockType t);
// The format with ggml type id `ggml_type`, or null.
const BlockFormat* block_format_of_ggml(uint32_t ggml_type);
// The format named `name` (case-insensitive: "q4_k" = "q4_K"), or null.
const BlockFormat* block_format_named(std::string_view name);

// Bytes of `n` values (n a multiple of the block's values; checked).
size_t block_bytes(BlockType t, int64_t n);

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block's `scales`.
inline void k_scale_min(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = uint8_t((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *m = uint8_t((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// ---- Reference (scalar) code: the definition the fast paths are tested against.

// n values (a multiple of the block's values) from blocks to f32.
void dequantize_blocks_reference(BlockType t, const void* src, float* dst, int64_t n);

// Quantises n f32 values (a multiple of the block's values) into blocks, choosing each
// block's scales to minimise the squared error (kernels/block_quantizer.cc). Deterministic.
// Non-finite input is refused (throws): a block has no way to hold it.
void quantize_blocks(BlockType t, const float* src, void* dst, int64_t n);

// ---- Activations.

// Bytes of one activation row of k values for weights of type t.
size_t block_act_row_bytes(BlockType t, int64_t k);
// Quantises one activation row x[k] (f32 or bf16) for weights of type t.
void quantize_block_activations(BlockType t, const void* x, DType xd, int64_t k, void* dst);
// The dot product of one weight row (k values in blocks of t) and one quantised
// activation row, in plain scalar code.
float block_dot_reference(BlockType t, const void* w, const void* act, int64_t k);

// ---- The matmul.

// y[m, n] = x[m, k] W^T + beta * y, W [n, k] given as n rows of k values in blocks of t
// (row r at w + r * block_bytes(t, k)); x f32 or bf16 (row stride k), y f32 or bf16 (row
// stride n). k must be a multiple of the block's values. Up to kBlockDotMaxRows rows of
// x quantise and dot on the blocks (each weight block unpacked once for all rows);
// more rows dequantise tiles of W to bf16 for the GEMM (prefill). Parallel over W's
// rows on the thread pool; the result does not depend on the thread count.
inline constexpr int64_t kBlockDotMaxRows = 8;
void block_matmul(BlockType t, int64_t m, int64_t n, int64_t k, const void* x, DType xd,
                  const void* w, void* y, DType yd, float beta = 0.0f);

// Rows r0..r0+rows of W to bf16 [rows, k] (the prefill tiles; also the embedding lookup).
void dequantize_block_rows(BlockType t, const void* w, int64_t k, int64_t r0, int64_t rows,
                           void* dst, DType dst_dtype);

// The embedding lookup of a table held in blocks: out[i, :] = scale * table[tokens[i], :]
// in f32, table [vocab, dim]. An id outside [0, vocab) is refused naming it.
void block_embedding_forward(BlockType t, const void* table, int64_t vocab, int64_t dim,
                             const int32_t* tokens, int64_t n, float* out, float scale);

// Test hook: the instruction set the dot products may use (kAuto: the best this CPU
// has). Not thread-safe; tests set it and restore kAuto.
enum class BlockIsa { kAuto, kAvx512Vnni, kAvx2, kPortable };
void set_block_isa_for_testing(BlockIsa isa);
// The instruction set block_matmul uses now ("avx512-vnni", "avx2", "portable").
const char* block_isa_name();

}  // namespace hyperion
