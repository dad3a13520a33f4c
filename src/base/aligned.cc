#include "base/aligned.h"

#include <cstdlib>

#include "base/error.h"

namespace hyperion {

void* aligned_malloc(size_t bytes, size_t alignment) {
  HYP_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0,
            "aligned_malloc: alignment {} is not a power of two", alignment);
  size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  if (rounded == 0) rounded = alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  HYP_CHECK(p != nullptr, "aligned_malloc: out of memory allocating {} bytes", bytes);
  return p;
}

void aligned_free(void* ptr) {
  std::free(ptr);
}

}  // namespace hyperion
