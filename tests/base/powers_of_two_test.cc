// The rate of a warning that may repeat every step: its 1st, 2nd, 4th, 8th... occurrence.
#include "base/powers_of_two.h"

#include <gtest/gtest.h>

#include <vector>

namespace hyperion {
namespace {

TEST(PowersOfTwo, LogsTheFirstAndEveryDoublingOfTheCount) {
  PowersOfTwo limit;
  std::vector<int64_t> logged;
  for (int i = 0; i < 1000; ++i)
    if (limit()) logged.push_back(limit.count());
  EXPECT_EQ(logged, (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}));
  EXPECT_EQ(limit.count(), 1000);
}

}  // namespace
}  // namespace hyperion
