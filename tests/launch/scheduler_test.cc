#include "launch/scheduler.h"

#include <gtest/gtest.h>

namespace hyperion::launch {
namespace {

RunningWork running(int id, const std::string& name, Priority p, std::vector<int> cpus,
                    double started, bool stopping = false) {
  return {id, name, p, std::move(cpus), started, stopping};
}

TEST(Scheduler, StartsWhatFitsOnTheLowestFreeCores) {
  const SchedulePlan plan =
      schedule(4, {running(0, "a", Priority::kMedium, {1}, 1)},
               {{1, "b", Priority::kMedium, 2, 2}, {2, "c", Priority::kMedium, 1, 3}});
  ASSERT_EQ(plan.starts.size(), 2u);
  EXPECT_EQ(plan.starts[0].id, 1);
  EXPECT_EQ(plan.starts[0].cpus, (std::vector<int>{0, 2}));
  EXPECT_EQ(plan.starts[1].id, 2);
  EXPECT_EQ(plan.starts[1].cpus, (std::vector<int>{3}));
  EXPECT_TRUE(plan.preempt.empty());
  EXPECT_TRUE(plan.waits.empty());
}

TEST(Scheduler, PriorityThenSubmissionOrderAndNoBackfill) {
  // 2 free cores: the high one (3 cores) is first and does not fit, so the small medium
  // one behind it waits too rather than overtaking it.
  const SchedulePlan plan =
      schedule(3, {running(0, "a", Priority::kHigh, {0}, 1)},
               {{1, "small", Priority::kMedium, 1, 1}, {2, "big", Priority::kHigh, 3, 2}});
  EXPECT_TRUE(plan.starts.empty());
  EXPECT_TRUE(plan.preempt.empty());  // a is not of lower priority
  ASSERT_EQ(plan.waits.size(), 2u);
  EXPECT_EQ(plan.waits[0].id, 2);
  EXPECT_EQ(plan.waits[0].position, 1);
  EXPECT_NE(
      plan.waits[0].reason.find("waiting for 3 cores: 2 of 3 free; held by a (high, 1 cores)"),
      std::string::npos)
      << plan.waits[0].reason;
  EXPECT_EQ(plan.waits[1].id, 1);
  EXPECT_EQ(plan.waits[1].position, 2);
  EXPECT_NE(plan.waits[1].reason.find("queued behind 1 waiting"), std::string::npos);
}

TEST(Scheduler, PreemptsLowestPriorityThenNewestJustEnough) {
  const SchedulePlan plan = schedule(
      4,
      {running(0, "low-old", Priority::kLow, {0}, 1), running(1, "low-new", Priority::kLow, {1}, 5),
       running(2, "medium", Priority::kMedium, {2, 3}, 2)},
      {{3, "urgent", Priority::kHigh, 1, 9}});
  EXPECT_TRUE(plan.starts.empty());
  EXPECT_EQ(plan.preempt, (std::vector<int>{1}));  // one core is enough: the newest low
  ASSERT_EQ(plan.waits.size(), 1u);
  EXPECT_NE(plan.waits[0].reason.find("preempting lower-priority low-new"), std::string::npos)
      << plan.waits[0].reason;
}

TEST(Scheduler, WaitsForStoppingWorkRatherThanPreemptingMore) {
  const SchedulePlan plan =
      schedule(2, {running(0, "victim", Priority::kLow, {0, 1}, 1, /*stopping=*/true)},
               {{1, "urgent", Priority::kHigh, 2, 2}});
  EXPECT_TRUE(plan.starts.empty());
  EXPECT_TRUE(plan.preempt.empty());
  ASSERT_EQ(plan.waits.size(), 1u);
  EXPECT_NE(plan.waits[0].reason.find("when the stopping workloads exit"), std::string::npos);
}

TEST(Scheduler, EqualPriorityNeverPreempts) {
  const SchedulePlan plan = schedule(1, {running(0, "first", Priority::kMedium, {0}, 1)},
                                     {{1, "second", Priority::kMedium, 1, 2}});
  EXPECT_TRUE(plan.preempt.empty());
  ASSERT_EQ(plan.waits.size(), 1u);
  EXPECT_EQ(plan.waits[0].position, 1);
}

}  // namespace
}  // namespace hyperion::launch
