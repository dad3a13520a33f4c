// An AMX int8 GEMM with the dequantisation fused into its epilogue, for quantised
// training (model/quantized_matmul.h):
//
//   C[m, n] = float(sum_k A[m, k] B[k, n]) * a_scale[m] * b_scale[n] (+ beta * C[m, n])
//
// A is int8 row-major [m, k] (activations or gradients, lda >= k); B is int8 pre-packed
// in AMX's VNNI layout (pack_b_nk / pack_b_kn: a weight is packed once per training
// pass); C is f32 or bf16 (round to nearest even). The int32 sums are exact, and the
// epilogue computes the same f32 expression as kernels/gemm.h's scaled path
// (sum * (1 * a_scale) * b_scale + 0 + beta * C), so the two agree bit for bit.
//
// Why our own: oneDNN 2.6 runs plain-layout int8 matmuls at a quarter of the AMX int8
// peak here and cannot fuse a per-row scale (a binary post-op or output scales send it
// to its reference kernel), so its scaled results take a second pass over C in memory;
// this kernel keeps 32 x 32 blocks of sums in tiles and scales them while they are in
// L1. Needs AMX-INT8 (Sapphire Rapids and later) and k % 64 == 0; callers fall back to
// kernels/gemm.h otherwise (amx_int8_gemm_applies).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace hyperion {

// Whether this CPU runs the kernel (AMX-INT8 with the OS permission granted).
bool amx_int8_available();
// Whether the kernel takes a GEMM with this reduction length (a multiple of 64).
inline bool amx_int8_gemm_applies(int64_t k) {
  return k > 0 && k % 64 == 0;
}

// Bytes of a packed B of k x n (k rounded up to 64, n to 32).
int64_t amx_packed_b_bytes(int64_t k, int64_t n);
// Packs B given as [n, k] row-major (op(B) = B^T: a weight W [out, in] for y = x W^T).
void amx_pack_b_nk(const int8_t* b, int64_t n, int64_t k, int8_t* packed);
// Packs B given as [k, n] row-major (a weight W [out, in] for dx = dy W: k = out).
void amx_pack_b_kn(const int8_t* b, int64_t k, int64_t n, int8_t* packed);

// C (c_dtype kF32 or kBF16, leading dimension ldc) as above; a_scale [m], b_scale [n].
// Rows run in parallel (base/threads.h).
void amx_int8_gemm(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda,
                   const int8_t* packed_b, const float* a_scale, const float* b_scale, void* c,
                   DType c_dtype, int64_t ldc, float beta);

}  // namespace hyperion
