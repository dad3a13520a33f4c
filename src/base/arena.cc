#include "base/arena.h"

#include <cstdint>

#include "base/error.h"

namespace hyperion {

Arena::Arena(size_t capacity_bytes, const char* name)
    : block_(capacity_bytes), capacity_(capacity_bytes), name_(name) {}

void* Arena::allocate(size_t bytes, size_t alignment) {
  HYP_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0 && alignment <= 4096,
            "{}: alignment {} must be a power of two <= 4096", name_, alignment);
  // The block itself is 64-byte aligned; align the offset relative to its address.
  uintptr_t base = reinterpret_cast<uintptr_t>(block_.data());
  uintptr_t start = (base + used_ + alignment - 1) & ~(uintptr_t(alignment) - 1);
  size_t offset = start - base;
  HYP_CHECK(offset <= capacity_ && bytes <= capacity_ - offset,
            "{}: out of memory: requested {} bytes with {} of {} bytes used", name_, bytes, used_,
            capacity_);
  used_ = offset + bytes;
  if (used_ > high_water_) high_water_ = used_;
  return block_.data() + offset;
}

void Arena::release(size_t mark) {
  HYP_CHECK(mark <= used_, "{}: release to mark {} beyond used {}", name_, mark, used_);
  used_ = mark;
}

}  // namespace hyperion
