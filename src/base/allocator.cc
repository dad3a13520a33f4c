#include "base/allocator.h"

#include "base/aligned.h"

namespace hyperion {

const char* device_name(Device d) {
  return d == Device::kCuda ? "cuda" : "host";
}

void Allocator::count(int64_t delta) {
  const int64_t now = in_use_.fetch_add(delta, std::memory_order_relaxed) + delta;
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void* HostAllocator::allocate(size_t bytes) {
  void* p = aligned_malloc(bytes);  // throws hyperion::Error naming the size
  count(static_cast<int64_t>(bytes));
  return p;
}

void HostAllocator::deallocate(void* ptr, size_t bytes) {
  aligned_free(ptr);
  count(-static_cast<int64_t>(bytes));
}

Allocator& host_allocator() {
  static HostAllocator host;
  return host;
}

}  // namespace hyperion
