// argmax_rows (kernels/argmax.h semantics): one block per row; each thread keeps its
// best (value, index) over a strided pass, then the block merges them, ties to the lower
// index, -1 for a row holding a NaN or nothing above -inf.
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ bool better(float v, int32_t i, float bv, int32_t bi) {
  return bi < 0 || v > bv || (v == bv && i < bi);
}

__global__ void argmax_rows_kernel(const float* x, int64_t n, int32_t* out) {
  __shared__ float sv[kThreads];
  __shared__ int32_t si[kThreads];
  __shared__ int nan;
  if (threadIdx.x == 0) nan = 0;
  __syncthreads();
  const float* row = x + blockIdx.x * n;
  float bv = -INFINITY;
  int32_t bi = -1;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = row[j];
    if (v != v) nan = 1;  // any thread's store of 1 is the same
    if (v > -INFINITY && better(v, static_cast<int32_t>(j), bv, bi)) {
      bv = v;
      bi = static_cast<int32_t>(j);
    }
  }
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) {
      const float v = sv[threadIdx.x + w];
      const int32_t i = si[threadIdx.x + w];
      if (i >= 0 && better(v, i, sv[threadIdx.x], si[threadIdx.x])) {
        sv[threadIdx.x] = v;
        si[threadIdx.x] = i;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = nan ? -1 : si[0];
}

}  // namespace

void argmax_rows(cudaStream_t s, const float* x, int64_t rows, int64_t n, int32_t* out) {
  if (rows == 0) return;
  argmax_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, n, out);
}

}  // namespace hyperion::cuda
