// General matrix multiply on oneDNN (AMX / AVX512-BF16 / VNNI / AVX-512 picked at run
// time by oneDNN), with primitives cached by shape so small repeated GEMMs (decode,
// per-layer training GEMMs) never pay primitive creation again. Decode shapes (A of a few
// rows times a weight B^T) go to our own kernels instead: the GEMV (kernels/gemv.h, up to
// 4 bf16 / 8 int8 rows), AMX tiles for bf16 (kernels/amx_bf16_gemm.h) and the batch
// GEMM (kernels/batch_gemm.h, up to 64 rows; bf16 there only without AMX).
//
//   C[M, N] = alpha * a_scale[m] * b_scale[n] * (op(A) @ op(B))[m, n] + bias[n] + beta * C[m, n]
//
// op(A) is A [M, K] (Trans::kN, row-major, leading dimension lda >= K) or A^T where A is
// stored [K, M] (Trans::kT, lda >= M); likewise op(B) is B [K, N] or B^T with B [N, K].
// Training uses NT (y = x W^T with W [out, in] as Hugging Face stores it), NN (dx = dy W)
// and TN (dW = dy^T x).
//
// Supported dtype combinations (accumulation is f32, or int32 for int8):
//   A f32,  B f32,  C f32
//   A bf16, B bf16, C f32 or bf16
//   A int8 or uint8, B int8, C f32, bf16 or int32 (int32: raw sums, no scales/bias/alpha)
// a_scale (length M) and b_scale (length N) are optional f32 vectors, meant for
// dequantising int8 (per-row activation scale, per-output-channel weight scale), but
// accepted for every dtype. bias (length N, f32) is optional.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace hyperion {

enum class Trans : uint8_t { kN, kT };

struct GemmArgs {
  Trans trans_a = Trans::kN;
  Trans trans_b = Trans::kN;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  DType a_dtype = DType::kF32;
  int64_t lda = 0;
  const void* b = nullptr;
  DType b_dtype = DType::kF32;
  int64_t ldb = 0;
  void* c = nullptr;
  DType c_dtype = DType::kF32;
  int64_t ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  const float* bias = nullptr;     // [n]
  const float* a_scale = nullptr;  // [m]
  const float* b_scale = nullptr;  // [n]
  // Optional, int8 B only: b_sums[j] = sum over k of op(B)[k, j], precomputed (a weight's
  // row sums, taken once at load). Signed int8 A runs as unsigned A + 128 on VNNI's
  // u8 x s8 instruction, and these sums are its correction; without them the decode
  // kernel spends a third of its instructions recomputing them. Must be exact if given.
  const int32_t* b_sums = nullptr;
  // Batched (strided) form: `batch` independent GEMMs, operand i at base + i * stride
  // (in elements). Scales and bias are shared by every batch entry.
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// Validates the arguments (throws hyperion::Error naming "gemm" and the shapes) and runs.
void gemm(const GemmArgs& args);

// Contiguous operands (leading dimensions implied by the shapes and transposes):
// C[m, n] = op(A) @ op(B) + beta * C. The form the model and grouped GEMM call.
void gemm_contiguous(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                     DType a_dtype, const void* b, DType b_dtype, void* c, DType c_dtype,
                     float beta = 0.0f);

// The GemmArgs of gemm_contiguous (for a backend's gemm).
GemmArgs contiguous_gemm_args(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k,
                              const void* a, DType a_dtype, const void* b, DType b_dtype, void* c,
                              DType c_dtype, float beta = 0.0f);

// Convenience form on 2-D views: C = alpha * op(A) @ op(B) + beta * C (+ bias).
void gemm(const TensorView& a, Trans trans_a, const TensorView& b, Trans trans_b,
          const TensorView& c, float alpha = 1.0f, float beta = 0.0f, const float* bias = nullptr);

// Number of distinct primitives created so far, and cache hits (for tests and benches).
struct GemmCacheStats {
  int64_t primitives = 0;
  int64_t hits = 0;
};
GemmCacheStats gemm_cache_stats();
void gemm_cache_clear();

namespace ref {
// Plain triple loop in double, same contract as hyperion::gemm (for tests).
void gemm(const GemmArgs& args);
}  // namespace ref

}  // namespace hyperion
