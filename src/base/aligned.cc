#include "base/aligned.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include <cstdlib>

#include "base/error.h"

namespace hyperion {

namespace {

constexpr size_t kHuge = size_t{2} << 20;

void* plain_aligned_malloc(size_t bytes, size_t alignment) {
  size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  if (rounded == 0) rounded = alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  HYP_CHECK(p != nullptr, "aligned_malloc: out of memory allocating {} bytes", bytes);
  return p;
}

// 2 MiB aligned, whole huge pages, advised to transparent huge pages before first touch.
void* huge_aligned_malloc(size_t bytes) {
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = plain_aligned_malloc(rounded, kHuge);
  // Advice only: without transparent huge pages the memory works the same, with 4 KiB pages.
  (void)madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

}  // namespace

void* aligned_malloc(size_t bytes, size_t alignment) {
  HYP_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0,
            "aligned_malloc: alignment {} is not a power of two", alignment);
  if (bytes >= kHugePageMinBytes && alignment <= kHuge) return huge_aligned_malloc(bytes);
  return plain_aligned_malloc(bytes, alignment);
}

void* huge_page_malloc(size_t bytes) {
  if (bytes < kHuge) return aligned_malloc(bytes);
  return huge_aligned_malloc(bytes);
}

void aligned_free(void* ptr) {
  std::free(ptr);
}

void release_pages(void* ptr, size_t bytes, bool zero) {
  if (bytes == 0) return;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(ptr), e = b + bytes;
  const uintptr_t pb = (b + page - 1) / page * page, pe = e / page * page;
  if (pb >= pe) {
    if (zero) std::memset(ptr, 0, bytes);
    return;
  }
  if (zero) {
    std::memset(ptr, 0, pb - b);
    std::memset(reinterpret_cast<void*>(pe), 0, e - pe);
  }
  // Anonymous private memory: the pages come back zero-filled on the next touch.
  if (madvise(reinterpret_cast<void*>(pb), pe - pb, MADV_DONTNEED) != 0 && zero)
    std::memset(reinterpret_cast<void*>(pb), 0, pe - pb);
}

}  // namespace hyperion
