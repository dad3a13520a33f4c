// Host-side helpers of the CUDA backend: turning CUDA errors into hyperion::Error, the
// device allocator, and a growable device scratch buffer.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

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
  // How many device buffers were freed so far, by any CudaAllocator: a recorded step
  // (a CUDA graph) stays valid only while this has not moved, since a freed buffer may
  // have been one it points to.
  static uint64_t frees() { return frees_.load(std::memory_order_relaxed); }

 private:
  static std::atomic<uint64_t> frees_;
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

// Uploads of small host arrays (page tables, cache slots, token ids) through pinned
// memory: a copy from pageable memory may wait for the stream to drain (the driver stages
// it), which would stall the host once per op of a decode step; from pinned memory it is
// queued like a kernel. Two halves of a pinned buffer take turns: a half is refilled only
// after the copies queued from it have run (an event per half), so a source can be reused
// as soon as upload() returns. Larger copies (weights) go straight from pageable memory.
class PinnedStage {
 public:
  static constexpr size_t kHalfBytes = size_t{1} << 20;
  ~PinnedStage();
  // Queues dst <- src (bytes) on `stream`; false when bytes is over a half or no pinned
  // memory could be had (the caller copies from pageable memory then).
  bool upload(const void* src, void* dst, size_t bytes, cudaStream_t stream);

 private:
  unsigned char* buf_ = nullptr;
  bool failed_ = false;
  int half_ = 0;
  size_t used_ = 0;
  cudaEvent_t done_[2] = {nullptr, nullptr};
  bool pending_[2] = {false, false};
};

}  // namespace hyperion::cuda
