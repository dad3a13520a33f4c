// The matmul on llama.cpp's block quantisation formats (GGUF's Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q4_K, Q5_K, Q6_K) that computes on them directly: the weights stay in their blocks, the
// activations are quantised per block to int8, and every block's dot product is an
// integer dot product (AVX512-VNNI vpdpbusd, AVX2 vpmaddubsw) scaled once per block.
//
// The formats and their bit layouts: tensor/block_formats.h.
//
// Activations (hyperion's own, internal format; never written to a file): one int8 row
// per activation row, quantised per 32 values (the 32-value formats) or per 256 (the K
// formats), each block with an f32 scale (absmax / 127, round to nearest) and the sums of
// each 32 (16 for the K formats) values: the min and offset corrections.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/aligned.h"
#include "tensor/block_formats.h"
#include "tensor/tensor.h"

namespace hyperion {

// Quantises n f32 values (a multiple of the block's values) into blocks, choosing each
// block's scales to minimise the squared error (kernels/block_quantizer.cc). Deterministic.
// Non-finite input is refused (throws): a block has no way to hold it. Q4_0, Q8_0 and the K
// formats (the types `hyperion convert --quant` writes); the others are refused.
void quantize_blocks(BlockType t, const float* src, void* dst, int64_t n);

// ---- Activations.

// Bytes of one activation row of k values for weights of type t (a multiple of 64, so rows
// placed one after another keep their f32 scales aligned).
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
