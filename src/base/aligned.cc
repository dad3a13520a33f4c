#include "base/aligned.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "base/error.h"
#include "base/log.h"
#include "base/system_memory.h"
#include "base/threads.h"

// Linux 5.14; older headers lack the name (the call then fails and pages are touched).
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace hyperion {

namespace {

constexpr size_t kHuge = size_t{2} << 20;

void* plain_aligned_malloc(size_t bytes, size_t alignment) {
  HYP_CHECK(bytes <= SIZE_MAX - alignment, "aligned_malloc: {} bytes is too large", bytes);
  size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  if (rounded == 0) rounded = alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  HYP_CHECK(p != nullptr, "aligned_malloc: out of memory allocating {} bytes", bytes);
  return p;
}

// Huge blocks are their own anonymous mappings, not malloc's: madvise advice on memory
// malloc recycles would outlive the block (glibc serves later 4-32 MiB requests from its
// heap once its mmap threshold has grown, and small allocations would then land on huge
// pages). The registry maps each block's start to its mapped length for aligned_free.
std::mutex& huge_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<uintptr_t, size_t>& huge_blocks() {
  static auto* blocks = new std::unordered_map<uintptr_t, size_t>();  // outlives statics
  return *blocks;
}

// 2 MiB aligned, whole huge pages, advised to transparent huge pages before first touch.
void* huge_aligned_malloc(size_t bytes) {
  HYP_CHECK(bytes <= SIZE_MAX - 2 * kHuge, "aligned_malloc: {} bytes is too large", bytes);
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* raw =
      mmap(nullptr, rounded + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  HYP_CHECK(raw != MAP_FAILED, "aligned_malloc: out of memory allocating {} bytes", bytes);
  // Trim the mapping to a 2 MiB-aligned start and whole 2 MiB pages.
  const uintptr_t b = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (b + kHuge - 1) / kHuge * kHuge;
  if (start > b) munmap(raw, start - b);
  const size_t tail = (b + rounded + kHuge) - (start + rounded);
  if (tail > 0) munmap(reinterpret_cast<void*>(start + rounded), tail);
  // Advice only: without transparent huge pages the memory works the same, with 4 KiB pages.
  (void)madvise(reinterpret_cast<void*>(start), rounded, MADV_HUGEPAGE);
  std::lock_guard<std::mutex> lock(huge_mutex());
  huge_blocks()[start] = rounded;
  return reinterpret_cast<void*>(start);
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
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (p != 0 && p % kHuge == 0) {  // only a 2 MiB-aligned pointer can be a huge block
    size_t length = 0;
    {
      std::lock_guard<std::mutex> lock(huge_mutex());
      auto it = huge_blocks().find(p);
      if (it != huge_blocks().end()) {
        length = it->second;
        huge_blocks().erase(it);
      }
    }
    if (length > 0) {
      munmap(ptr, length);
      return;
    }
  }
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

void commit_pages(void* ptr, size_t bytes) {
  if (bytes == 0) return;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(ptr) / page * page;
  const uintptr_t e = reinterpret_cast<uintptr_t>(ptr) + bytes;
  const int64_t chunks = static_cast<int64_t>((e - b + kHuge - 1) / kHuge);
  std::atomic<int> failure{0};
  parallel_chunks(chunks, 1, [&](int64_t c0, int64_t c1) {
    const uintptr_t cb = b + static_cast<uintptr_t>(c0) * kHuge;
    const uintptr_t ce = std::min(e, b + static_cast<uintptr_t>(c1) * kHuge);
    if (madvise(reinterpret_cast<void*>(cb), ce - cb, MADV_POPULATE_WRITE) == 0) return;
    if (errno != EINVAL) {  // out of memory or a bad range: leave the rest to first use
      failure.store(errno);
      return;
    }
    // A kernel before 5.14 does not know the advice: touch each page. A volatile
    // read-then-write keeps the contents.
    for (uintptr_t p = std::max(cb, reinterpret_cast<uintptr_t>(ptr)); p < ce;
         p = (p / page + 1) * page) {
      volatile unsigned char* q = reinterpret_cast<volatile unsigned char*>(p);
      *q = *q;
    }
  });
  if (const int err = failure.load())
    log_warn("commit_pages: {} of memory left to be backed on first use ({})",
             format_bytes(static_cast<int64_t>(bytes)), std::strerror(err));
}

}  // namespace hyperion
