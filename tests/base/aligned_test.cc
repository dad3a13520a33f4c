// Aligned allocation: small blocks at the requested alignment, large ones as their own
// 2 MiB-aligned mappings on transparent huge pages; every byte writable, freed without
// error, and release_pages reading back zero.
#include "base/aligned.h"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
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

// Fraction of the pages of [p, p + bytes) resident in memory (mincore).
double resident_fraction(const unsigned char* p, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t e = reinterpret_cast<uintptr_t>(p) + bytes;
  std::vector<unsigned char> vec((e - b + page - 1) / page);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(b), e - b, vec.data()), 0);
  size_t in = 0;
  for (unsigned char v : vec) in += v & 1;
  return double(in) / double(vec.size());
}

TEST(Aligned, CommitPagesBacksTheRangeAndKeepsItsContents) {
  const size_t bytes = 10 * kMiB + 77;
  auto* p = static_cast<unsigned char*>(aligned_malloc(bytes));
  // Written bytes at both ends and in the middle; the rest was never touched.
  p[0] = 1;
  p[5 * kMiB] = 2;
  p[bytes - 1] = 3;
  EXPECT_LT(resident_fraction(p, bytes), 0.9);
  commit_pages(p, bytes);
  EXPECT_EQ(resident_fraction(p, bytes), 1.0);
  EXPECT_EQ(p[0], 1);
  EXPECT_EQ(p[5 * kMiB], 2);
  EXPECT_EQ(p[bytes - 1], 3);
  EXPECT_EQ(p[3 * kMiB + 5], 0);  // fresh memory still reads as zero
  commit_pages(p, 0);             // nothing to do
  aligned_free(p);
  // A range that starts and ends inside pages, in a block of plain (small) pages.
  auto* q = static_cast<unsigned char*>(aligned_malloc(kMiB));
  const size_t marks[] = {0, 99, 100, kMiB / 2, kMiB - 101, kMiB - 1};
  for (size_t i : marks) q[i] = 0x5A;
  commit_pages(q + 100, kMiB - 200);
  EXPECT_EQ(resident_fraction(q + 100, kMiB - 200), 1.0);
  for (size_t i : marks) EXPECT_EQ(q[i], 0x5A) << i;
  aligned_free(q);
}

TEST(Aligned, AbsurdSizesAreRefused) {
  EXPECT_THROW(aligned_malloc(SIZE_MAX - 10), Error);
  EXPECT_THROW(huge_page_malloc(SIZE_MAX - 10), Error);
}

}  // namespace
}  // namespace hyperion
