// An AMX bf16 GEMM for decode batches: a few rows of activations times a big weight,
//
//   C[m, n] = alpha * a_scale[i] * b_scale[j] * (A B^T)[m, n] + bias[n] + beta * C[m, n]
//
// with A bf16 [m, k] (lda >= k) and B bf16 [n, k] (ldb >= k, a weight W [out, in] as
// y = x W^T reads it), C f32 or bf16. The weight is read in place, never packed: it is
// the tiles' first operand (16 weight rows x 32 k values per tile row), so the kernel
// computes C^T = B A^T, with A transposed into AMX's pair layout per call (m x k values,
// small beside the n x k weight) and each 16 x 16 block of C^T transposed on its way out.
// Every weight element is read from memory once for up to 32 rows of A (the GEMV path,
// kernels/gemv.h, takes 1-4 rows; oneDNN ran plain-layout batches of 32 and 64 rows at
// about 0.8 of this kernel's bandwidth here). Rows beyond 32 re-read each weight block
// from L2.
//
// Needs AMX-BF16 (Sapphire Rapids and later) and k % 32 == 0; gemm() routes the shapes
// it takes (amx_bf16_gemm_applies) and leaves the rest to oneDNN. Sums are f32 over
// exact bf16 products, in k order within each 32-wide step (AMX flushes denormals).
#pragma once

#include <cstdint>

#include "kernels/gemm.h"

namespace hyperion {

// Rows of A this kernel takes (it is meant for decode batches; prefill goes to oneDNN).
constexpr int64_t kAmxBf16MaxRows = 64;

// Whether this CPU runs the kernel (AMX-BF16 with the OS permission granted).
bool amx_bf16_available();

// Whether gemm(g) runs on this kernel: one NT GEMM of bf16 A and B, f32 or bf16 C, more
// rows than the GEMV takes (kernels/gemv.h) and at most kAmxBf16MaxRows, k % 32 == 0,
// lda * 15 < 2^31 (the gather index), on a CPU with AMX-BF16 (HYPERION_AMX_BF16=0 turns
// it off, for comparisons).
bool amx_bf16_gemm_applies(const GemmArgs& g);

// Runs g: any m in [1, kAmxBf16MaxRows] with the other conditions above (checked: throws
// hyperion::Error naming amx_bf16_gemm). Column blocks run in parallel (base/threads.h).
void amx_bf16_gemm(const GemmArgs& g);

}  // namespace hyperion
