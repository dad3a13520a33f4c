#include "kernels/cuda/cuda_runtime_util.h"

#include "base/error.h"

namespace hyperion::cuda {

void fail_cuda(cudaError_t error, const char* what) {
  fail("cuda: {}: {} ({})", what, cudaGetErrorName(error), cudaGetErrorString(error));
}

void* CudaAllocator::allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    fail("cuda allocator: cannot allocate {} bytes ({} of {} bytes free on the device): {}", bytes,
         free_bytes, total, cudaGetErrorString(e));
  }
  count(static_cast<int64_t>(bytes));
  return p;
}

void CudaAllocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  cudaFree(ptr);
  count(-static_cast<int64_t>(bytes));
}

void* DeviceScratch::get(size_t bytes) {
  if (bytes > buf_.bytes()) {
    // Grow by at least half, in 1 MiB steps, so a slowly rising need reallocates rarely.
    size_t want = bytes + buf_.bytes() / 2;
    want = (want + (1u << 20) - 1) & ~size_t((1u << 20) - 1);
    buf_ = DeviceBuffer();
    buf_ = DeviceBuffer(*alloc_, want);
  }
  return buf_.data();
}

}  // namespace hyperion::cuda
