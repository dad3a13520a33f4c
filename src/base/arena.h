// Bump arena for activations and scratch: one aligned block, allocations are pointer
// bumps, and a whole step's worth is released at once with reset() or release(mark).
// Nothing is freed individually, so there is no per-tensor allocator traffic on hot paths.
#pragma once

#include <cstddef>

#include "base/aligned.h"

namespace hyperion {

class Arena {
 public:
  explicit Arena(size_t capacity_bytes, const char* name = "arena");

  // Returns `bytes` of uninitialised memory aligned to `alignment` (power of two, <= 4096).
  // Throws hyperion::Error naming the arena, the request and the capacity when full.
  void* allocate(size_t bytes, size_t alignment = kAlignment);
  template <typename T>
  T* allocate_array(size_t count) {
    return static_cast<T*>(
        allocate(count * sizeof(T), alignof(T) > kAlignment ? alignof(T) : kAlignment));
  }

  size_t mark() const { return used_; }
  void release(size_t mark);
  void reset() { used_ = 0; }

  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }
  size_t high_water() const { return high_water_; }

 private:
  AlignedBuffer<unsigned char> block_;
  size_t capacity_;
  size_t used_ = 0;
  size_t high_water_ = 0;
  const char* name_;
};

}  // namespace hyperion
