// Aligned allocation: small blocks at the requested alignment, large ones as their own
// 2 MiB-aligned mappings on transparent huge pages; every byte writable, freed without
// error, and release_pages reading back zero.
#include "base/aligned.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "base/error.h"

namespace hyperion {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(Aligned, SmallAndLargeBlocksAreAlignedAndWritable) {
  for (size_t bytes : {size_t{1}, size_t{100}, kMiB, kHugePageMinBytes - 1, kHugePageMinBytes,
                       kHugePageMinBytes + 1, 9 * kMiB + 3}) {
    void* p = aligned_malloc(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(is_aligned(p)) << bytes;
    if (bytes >= kHugePageMinBytes) {
      EXPECT_TRUE(is_aligned(p, 2 * kMiB)) << bytes;
    }
    std::memset(p, 0x5A, bytes);
    EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 0x5A);
    aligned_free(p);
  }
  // A large alignment is honoured for any size.
  void* q = aligned_malloc(8 * kMiB, 4 * kMiB);
  EXPECT_TRUE(is_aligned(q, 4 * kMiB));
  aligned_free(q);
  aligned_free(nullptr);
}

TEST(Aligned, ManyLargeBlocksComeAndGo) {
  // Allocated and freed in an interleaved order, so blocks are reused and the registry
  // of mappings sees inserts and erases out of order.
  std::vector<void*> blocks;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 8; ++i) {
      blocks.push_back(aligned_malloc(kHugePageMinBytes + size_t(i) * 4096));
      static_cast<char*>(blocks.back())[0] = char(i);
    }
    for (size_t i = 0; i < blocks.size(); i += 2) aligned_free(blocks[i]);
    std::vector<void*> kept;
    for (size_t i = 1; i < blocks.size(); i += 2) kept.push_back(blocks[i]);
    blocks = kept;
  }
  for (void* p : blocks) aligned_free(p);
}

TEST(Aligned, ReleasePagesOfAHugeBlockReadsZero) {
  const size_t bytes = 6 * kMiB + 123;
  auto* p = static_cast<unsigned char*>(aligned_malloc(bytes));
  std::memset(p, 0x7F, bytes);
  release_pages(p + 1000, 3 * kMiB, /*zero=*/true);
  for (size_t i : {size_t{999}, size_t{1000}, kMiB, 3 * kMiB + 999, 3 * kMiB + 1000})
    EXPECT_EQ(p[i], i >= 1000 && i < 3 * kMiB + 1000 ? 0 : 0x7F) << i;
  aligned_free(p);
}

TEST(Aligned, AbsurdSizesAreRefused) {
  EXPECT_THROW(aligned_malloc(SIZE_MAX - 10), Error);
  EXPECT_THROW(huge_page_malloc(SIZE_MAX - 10), Error);
}

}  // namespace
}  // namespace hyperion
