// Float arrays for a diffusion model's activations, recycled through a process-wide pool:
// a UNet step allocates and frees hundreds of arrays of a few dozen sizes (up to ~100 MB
// at 512 x 512), and fresh memory from the system costs a page fault per 4 KB on every
// step (a fifth of the step's time before this pool). Blocks come from aligned_malloc
// (64-byte aligned, huge pages when large); freed blocks wait in the pool for the next
// request of the same size (at most kPoolBytes kept). Contents start uninitialised.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hyperion::diffusion {

constexpr size_t kPoolBytes = size_t(8) << 30;

class FloatBuffer {
 public:
  FloatBuffer() = default;
  explicit FloatBuffer(size_t n);  // uninitialised
  FloatBuffer(size_t n, float value);
  FloatBuffer(const FloatBuffer& o);
  FloatBuffer& operator=(const FloatBuffer& o);
  FloatBuffer(FloatBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {
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

 private:
  void release();
  float* data_ = nullptr;
  size_t size_ = 0;
};

// Bytes the pool holds for reuse (for tests and benchmarks).
size_t pooled_bytes();
// Bytes of FloatBuffers alive now, and the most alive at once since the last reset: a
// step's activation high-water mark (`bench diffusion` prints it beside the weights).
size_t live_bytes();
size_t peak_live_bytes();
void reset_peak_live_bytes();

}  // namespace hyperion::diffusion
