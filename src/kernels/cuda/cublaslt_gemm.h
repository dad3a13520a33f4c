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

#include "kernels/gemm.h"

namespace hyperion::cuda {

// cuBLASLt's name (cudaDataType) for a dtype, or -1 for one it has no GEMM type for.
int cuda_data_type(DType dtype);

class CublasLt {
 public:
  // Opens the library and creates a handle; on failure returns false and says why.
  bool open(std::string* why);
  ~CublasLt();
  // Queues C = alpha op(A) op(B) + beta C (a checked GemmArgs; bias and scales are the
  // caller's) on `stream`, with `workspace` of `workspace_bytes` (device memory). Throws
  // hyperion::Error naming the shape on a cuBLASLt error or when no algorithm fits.
  // The descriptors and the algorithm cuBLASLt's heuristic picks are made once per
  // shape (dtypes, transposes, sizes, leading dimensions, batch strides, workspace) and
  // kept: the search costs tens of microseconds, more than a decode step's small GEMM.
  void matmul(const GemmArgs& g, cudaStream_t stream, void* workspace, size_t workspace_bytes);

 private:
  void* lib_ = nullptr;
  void* handle_ = nullptr;
  void* plans_ = nullptr;  // the shapes' plans (the .cc's PlanCache); left to the OS at exit
};

}  // namespace hyperion::cuda
