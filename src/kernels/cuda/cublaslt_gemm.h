// GEMMs on the GPU through cuBLASLt, opened at run time (dlopen of libcublasLt.so.13), so
// that a binary built with CUDA still starts where the library is absent and says so.
//
// The project's GEMMs are row-major (kernels/gemm.h); cuBLASLt is column-major, so
// C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T with the operands swapped: no
// copies. f32 x f32 and bf16 x bf16 accumulate in f32 (TF32 is never used: results
// match the host's f32 GEMM to rounding); fp8 (e4m3 / e5m2, not both e5m2) runs
// cuBLASLt's FP8 kernels, which want the "TN" layout, k and the leading dimensions
// multiples of 16: other layouts are transposed into the workspace first.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace hyperion::cuda {

// Element types, as cuBLASLt names them (cudaDataType values): filled by the backend.
struct LtMatmul {
  bool trans_a = false, trans_b = false;  // row-major, as GemmArgs
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int a_type = 0;  // cudaDataType
  int64_t lda = 0;
  const void* b = nullptr;
  int b_type = 0;
  int64_t ldb = 0;
  void* c = nullptr;
  int c_type = 0;
  int64_t ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

class CublasLt {
 public:
  // Opens the library and creates a handle; on failure returns false and says why.
  bool open(std::string* why);
  ~CublasLt();
  // Queues D = alpha op(A) op(B) + beta C on `stream`, with `workspace` of
  // `workspace_bytes` (device memory). Throws hyperion::Error naming the shape on a
  // cuBLASLt error or when no algorithm fits.
  void matmul(const LtMatmul& mm, cudaStream_t stream, void* workspace, size_t workspace_bytes);

 private:
  void* lib_ = nullptr;
  void* handle_ = nullptr;
};

}  // namespace hyperion::cuda
