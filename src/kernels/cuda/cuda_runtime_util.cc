#include "kernels/cuda/cuda_runtime_util.h"

#include <cstring>

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
  frees_.fetch_add(1, std::memory_order_relaxed);
  count(-static_cast<int64_t>(bytes));
}

std::atomic<uint64_t> CudaAllocator::frees_{0};

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

PinnedStage::~PinnedStage() {
  // The backend lives until the process exits, when the driver may be gone: left to the OS.
}

bool PinnedStage::upload(const void* src, void* dst, size_t bytes, cudaStream_t stream) {
  if (bytes > kHalfBytes || failed_) return false;
  if (buf_ == nullptr) {
    void* p = nullptr;
    if (cudaMallocHost(&p, 2 * kHalfBytes) != cudaSuccess ||
        cudaEventCreateWithFlags(&done_[0], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&done_[1], cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();  // pageable copies still work: fall back to them
      failed_ = true;
      return false;
    }
    buf_ = static_cast<unsigned char*>(p);
  }
  const size_t rounded = (bytes + 63) & ~size_t{63};
  if (used_ + rounded > kHalfBytes) {
    check_cuda(cudaEventRecord(done_[half_], stream), "pinned upload");
    pending_[half_] = true;
    half_ ^= 1;
    used_ = 0;
    if (pending_[half_]) check_cuda(cudaEventSynchronize(done_[half_]), "pinned upload");
    pending_[half_] = false;
  }
  unsigned char* at = buf_ + static_cast<size_t>(half_) * kHalfBytes + used_;
  std::memcpy(at, src, bytes);
  used_ += rounded;
  check_cuda(cudaMemcpyAsync(dst, at, bytes, cudaMemcpyHostToDevice, stream), "upload");
  return true;
}

}  // namespace hyperion::cuda
