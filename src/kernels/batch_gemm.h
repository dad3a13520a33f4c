// Internal (not public API): the decode-batch GEMM path behind hyperion::gemm.
//
// A decode step over a batch of sequences multiplies M activation rows, one per sequence,
// by every weight W [N, K] (row-major as Hugging Face stores it, Trans::kT for B):
//
//   C[m, n] = alpha * a_scale[m] * b_scale[n] * (x[m, :] . W[n, :]) + bias[n] + beta * C[m, n]
//
// for M above the GEMV's rows (kernels/gemv.h: 4 for bf16, 8 for int8) up to
// kBatchGemmMaxM. oneDNN 2.6 ran these shapes at 30-45% of the bf16 and int8 peaks on
// Zen 5 (K = 512..1408, M = 16..64), which made its GEMMs the largest part of a batch-32
// decode step. On machines with AMX, bf16 batches with K % 32 == 0 go to AMX tiles first
// (kernels/amx_bf16_gemm.h); int8 batches come here there too.
//
// The activations (small) are packed once per call so that a vector holds one K step
// (2 bf16 or 4 int8 values) of 16 rows; each step of a W row (read in place) is broadcast
// and multiplied into that vector with dpbf16ps (AVX512-BF16) or dpbusd (AVX512-VNNI,
// activations as u8 with the excess folded out through the weight's row sums). Each lane
// accumulates one output over K: no horizontal sums. A group of 8 W rows meets 32
// activation rows at a time (16 accumulators), so the weight is read from memory once for
// up to 32 rows and from cache for the next 32 (L1 while 8 rows fit it, L2 beyond); the
// 8 x 16 tiles are transposed into C's rows on the way out. Each thread takes a contiguous block of
// W rows and prefetches the next group while it computes.
//
// The order of every output's sum depends only on K and on whether its row falls in a
// pass of two vectors of rows or of one (one keeps two chains, even and odd K steps,
// added at the end), never on the thread count: results are bitwise identical for any
// number of threads. CPUs without these instruction sets keep oneDNN.
#pragma once

#include <cstdint>

#include "kernels/gemm.h"

namespace hyperion::detail {

// Rows of A this path takes at most (a decode batch; prefill chunks go to oneDNN).
inline constexpr int64_t kBatchGemmMaxM = 64;

// True when `g` (already validated, m, n, k > 0) is a decode batch this path handles:
// batch 1, A not transposed, B transposed, more rows than the GEMV takes and at most
// kBatchGemmMaxM, and bf16 x bf16 -> f32 / bf16 on a CPU with AVX512-BF16 or int8 / u8 x
// int8 -> f32 / bf16 / int32 on one with AVX512-VNNI. HYPERION_BATCH_GEMM=0 turns it off
// (read once), for comparisons with oneDNN.
bool batch_gemm_applies(const GemmArgs& g);

// Runs g. Precondition: the dtype, layout and instruction-set conditions of
// batch_gemm_applies(g) and 1 <= m <= kBatchGemmMaxM (tests run it from m = 1).
void batch_gemm(const GemmArgs& g);

}  // namespace hyperion::detail
