// A standard allocator for containers that grow to many MB while a file is read (a
// tokenizer's vocabulary and merges): blocks of kHugePageMinBytes or more come from
// aligned_malloc, so they sit on transparent huge pages. Why: each first touch of a 4 KB
// page is a page fault, and on a virtual machine a fault costs several microseconds; a
// 20 MB table filled once at load spent more time faulting than being filled. Smaller
// blocks come from operator new as usual.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

#include "base/aligned.h"

namespace hyperion {

template <class T>
struct LargeBlockAllocator {
  using value_type = T;
  LargeBlockAllocator() = default;
  template <class U>
  LargeBlockAllocator(const LargeBlockAllocator<U>&) {}  // NOLINT: converting, as std::allocator

  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    if (bytes >= kHugePageMinBytes) return static_cast<T*>(aligned_malloc(bytes));
    return static_cast<T*>(::operator new(bytes));
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) >= kHugePageMinBytes) {
      aligned_free(p);
    } else {
      ::operator delete(p);
    }
  }
  template <class U>
  bool operator==(const LargeBlockAllocator<U>&) const {
    return true;
  }
};

template <class T>
using LargeVector = std::vector<T, LargeBlockAllocator<T>>;

}  // namespace hyperion
