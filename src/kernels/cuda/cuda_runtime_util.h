// Host-side helpers of the CUDA backend: turning CUDA errors into hyperion::Error, the
// device allocator, and a growable device scratch buffer.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "base/allocator.h"

namespace hyperion::cuda {

// Throws hyperion::Error "cuda: <what>: <CUDA's error name and text>".
[[noreturn]] void fail_cuda(cudaError_t error, const char* what);
inline void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) fail_cuda(error, what);
}

// Device memory from cudaMalloc (256-byte aligned, so every kAlignment contract holds).
// Out of memory is an Error naming the size and what the device has free.
class CudaAllocator final : public Allocator {
 public:
  Device device() const override { return Device::kCuda; }
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
};

// Device scratch that only grows. Ops on the backend's one stream use it in stream order,
// so one op's scratch may be reused by the next without a wait; growing synchronises
// (cudaFree waits for the device), so no queued kernel still reads the old buffer.
class DeviceScratch {
 public:
  explicit DeviceScratch(Allocator& alloc) : alloc_(&alloc) {}
  void* get(size_t bytes);

 private:
  Allocator* alloc_;
  DeviceBuffer buf_;
};

}  // namespace hyperion::cuda
