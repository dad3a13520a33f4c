#include <gtest/gtest.h>

#include "base/arena.h"
#include "base/error.h"

namespace hyperion {
namespace {

TEST(Arena, AllocationsAreAlignedAndReleasedByMark) {
  Arena arena(4096, "test arena");
  void* a = arena.allocate(10);
  EXPECT_TRUE(is_aligned(a));
  size_t m = arena.mark();
  void* b = arena.allocate(100, 128);
  EXPECT_TRUE(is_aligned(b, 128));
  EXPECT_GE(arena.used(), 110u);
  arena.release(m);
  EXPECT_EQ(arena.used(), m);
  EXPECT_EQ(arena.allocate(100, 128), b);  // same bytes handed out again
  EXPECT_GE(arena.high_water(), 110u);
  arena.reset();
  EXPECT_EQ(arena.used(), 0u);
}

TEST(Arena, OverflowNamesArenaAndSizes) {
  Arena arena(256, "activations");
  arena.allocate(200);
  try {
    arena.allocate(100);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("100"), std::string::npos) << msg;
    EXPECT_NE(msg.find("256"), std::string::npos) << msg;
  }
}

TEST(Arena, RejectsBadAlignment) {
  Arena arena(256);
  EXPECT_THROW(arena.allocate(8, 3), Error);
  EXPECT_THROW(arena.release(1000), Error);
}

}  // namespace
}  // namespace hyperion
