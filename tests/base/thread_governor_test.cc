// The team under contention: two threads confined to one CPU wait half their runnable
// time for it, and the governor shrinks the team to the one core it actually gets. (No
// timing is asserted: the loop runs until the team shrinks, up to a bound.)
#include "base/thread_governor.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>

#include "base/threads.h"

namespace hyperion {
namespace {

TEST(ThreadGovernor, ATeamWaitingForItsCpusShrinksToTheCoresItGets) {
  cpu_set_t all;
  ASSERT_EQ(::sched_getaffinity(0, sizeof all, &all), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &one);
      break;
    }
  const int before = num_threads();
  set_num_threads(2);
  // Every thread of the process, the OpenMP workers made from now on included.
  ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
  release_thread_pool();  // workers made before inherit the old mask: start afresh
  std::atomic<double> sink{0};
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (num_threads() == 2 && std::chrono::steady_clock::now() < end) {
    adapt_threads_to_contention();
    parallel_chunks(2, 1, [&](int64_t, int64_t) {
      double x = 0;
      for (int i = 0; i < 2'000'000; ++i) x += 1e-9 * i;
      sink = sink + x;
    });
  }
  EXPECT_EQ(num_threads(), 1);
  ASSERT_EQ(::sched_setaffinity(0, sizeof all, &all), 0);
  release_thread_pool();
  set_num_threads(before);
}

}  // namespace
}  // namespace hyperion
