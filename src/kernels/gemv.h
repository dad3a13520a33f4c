// Internal (not public API): the decode-shaped GEMM path behind hyperion::gemm.
//
// Decode multiplies a few activation rows by a large weight matrix stored as Hugging Face
// does, W [N, K] row-major (Trans::kT for B):
//
//   C[m, n] = alpha * a_scale[m] * b_scale[n] * (x[m, :] . W[n, :]) + bias[n] + beta * C[m, n]
//
// with M = 1..kGemvMaxM. That is a matrix-vector product bound by reading W once, which
// oneDNN 2.6 does at about half the memory bandwidth. This path splits N across the
// threads (each streams its own contiguous block of W rows) and dots a group of W rows
// with every activation row in one pass over K: AVX512-BF16 dpbf16ps for bf16, AVX-512
// FMA for f32 (and for bf16 without AVX512-BF16, widening to f32), AVX512-VNNI dpbusd for
// int8; on CPUs without AVX-512, AVX2 FMA for f32 and bf16 (widened) and vpmaddwd for int8
// (widened to int16, exact; gemv_avx2.cc); a portable scalar path otherwise.
//
// Every output element is one accumulation chain over K whose order depends only on K
// and the instruction set, never on the thread count or the row grouping, so results are
// bitwise identical for any number of threads.
#pragma once

#include <cstdint>

#include "kernels/gemm.h"

namespace hyperion::detail {

inline constexpr int64_t kGemvMaxM = 8;      // f32 and int8; rows of one pass over W
inline constexpr int64_t kGemvMaxMBf16 = 4;  // bf16: AMX tiles or batch_gemm.h beyond
inline constexpr int64_t kGemvMaxMAvx2 = 64;  // int8 on the AVX2 kernels (blocks of 8)

// True when `g` (already validated, m, n, k > 0) has the decode shape this path handles:
// batch 1, A not transposed, B transposed, m <= gemv_max_rows(g), a supported dtype
// combination, and the path is not disabled by HYPERION_GEMV=0 (read once).
bool gemv_applies(const GemmArgs& g);

// The most rows gemv_applies takes for g's dtypes on this CPU: kGemvMaxM (f32, int8) or
// kGemvMaxMBf16 (bf16) with AVX-512; on the AVX2 kernels, where no AMX or batch GEMM
// takes decode batches, kGemvMaxMAvx2 for int8 and kGemvMaxM for f32 and bf16.
int64_t gemv_max_rows(const GemmArgs& g);

// Runs the decode path. Precondition: the shape and dtype conditions of gemv_applies(g),
// except the row limit: more than kGemvMaxM rows run in blocks of kGemvMaxM, each block
// one pass over W (tests run every path up to 8 rows and more).
void gemv(const GemmArgs& g);

// Test hook: which instruction set gemv() may use. kAvx512 restricts it to AVX-512F/BW
// (no AVX512-BF16 / VNNI: bf16 widens to f32, int8 goes portable); kAvx2 runs the AVX2
// kernels (as on a CPU without AVX-512; portable where the CPU lacks AVX2 + FMA);
// kPortable forces the scalar path. Not thread-safe; tests set it and restore kAuto.
enum class GemvIsa { kAuto, kAvx512, kAvx2, kPortable };
void set_gemv_isa_for_testing(GemvIsa isa);

}  // namespace hyperion::detail
