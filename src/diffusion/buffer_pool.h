// Float arrays for a diffusion model's activations, recycled through a process-wide pool:
// a UNet step allocates and frees hundreds of arrays of a few dozen sizes (up to ~100 MB
// at 512 x 512), and fresh memory from the system costs a page fault per 4 KB on every
// step (a fifth of the step's time before this pool). Blocks come from aligned_malloc
// (64-byte aligned, huge pages when large); freed blocks wait in the pool for the next
// request of the same size (at most kPoolBytes kept). Contents start uninitialised.
//
// On a device (a model whose parameters live there runs inside a DeviceScope), a buffer
// made on that thread comes from the device backend's allocator instead, pooled the same
// way: a GPU's cudaFree waits for the device, and a step frees hundreds of arrays. Every
// op of a backend runs on its one stream in order, so a block freed and handed out again
// is only written after the ops queued before reading it. A device buffer's elements are
// not the host's to read (the backend's ops, upload and download are the way in and out).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/tensor.h"

namespace hyperion {
class KernelBackend;
}

namespace hyperion::diffusion {

constexpr size_t kPoolBytes = size_t(8) << 30;

// While alive, FloatBuffers made on this thread live on `device` (the host: the pool of
// host memory). Scopes nest; the previous placement comes back at the end.
class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  KernelBackend* previous_;
};

class FloatBuffer {
 public:
  FloatBuffer() = default;
  explicit FloatBuffer(size_t n);  // uninitialised
  FloatBuffer(size_t n, float value);  // host only, or value 0
  FloatBuffer(const FloatBuffer& o);    // on o's device
  FloatBuffer& operator=(const FloatBuffer& o);
  FloatBuffer(FloatBuffer&& o) noexcept : data_(o.data_), size_(o.size_), backend_(o.backend_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  FloatBuffer& operator=(FloatBuffer&& o) noexcept;
  ~FloatBuffer() { release(); }

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  float* begin() { return data_; }
  float* end() { return data_ + size_; }
  const float* begin() const { return data_; }
  const float* end() const { return data_ + size_; }
  float& operator[](size_t i) { return data_[i]; }
  const float& operator[](size_t i) const { return data_[i]; }
  // Where the elements live, and the backend whose ops reach them (the host's for host
  // buffers).
  Device device() const;
  KernelBackend& backend() const;

 private:
  void release();
  float* data_ = nullptr;
  size_t size_ = 0;
  KernelBackend* backend_ = nullptr;  // null: host memory from the host pool
};

// The device this thread's new buffers go to (DeviceScope).
Device current_buffer_device();

// Bytes the pool holds for reuse (for tests and benchmarks).
size_t pooled_bytes();
// Bytes of FloatBuffers alive now, and the most alive at once since the last reset: a
// step's activation high-water mark (`bench diffusion` prints it beside the weights).
size_t live_bytes();
size_t peak_live_bytes();
void reset_peak_live_bytes();

}  // namespace hyperion::diffusion
