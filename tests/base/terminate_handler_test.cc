// An exception nothing can catch (thrown in a worker thread or an OpenMP region) ends the
// process through the terminate handler: out of memory is the named error with exit 1,
// anything else is named as an internal error and aborts.
#include "base/terminate_handler.h"

#include <gtest/gtest.h>

#include <csignal>
#include <new>
#include <stdexcept>
#include <thread>

#include "base/threads.h"

namespace hyperion {
namespace {

TEST(TerminateHandler, OutOfMemoryInAThreadIsANamedErrorWithExit1) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_terminate_handler();
        std::thread([] { throw std::bad_alloc(); }).join();
      },
      ::testing::ExitedWithCode(1), "hyperion: error: out of memory");
}

TEST(TerminateHandler, OutOfMemoryInAParallelRegionIsANamedErrorWithExit1) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_terminate_handler();
        set_num_threads(2);
        // Every worker throws, so the region never returns whatever the team size.
        parallel_chunks(2, 1, [](int64_t, int64_t) { throw std::bad_alloc(); });
        std::thread([] { throw std::bad_alloc(); }).join();  // a team of one ran inline
      },
      ::testing::ExitedWithCode(1), "hyperion: error: out of memory");
}

TEST(TerminateHandler, AnyOtherUncaughtExceptionIsNamedAndAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_terminate_handler();
        std::thread([] { throw std::runtime_error("a broken invariant"); }).join();
      },
      ::testing::KilledBySignal(SIGABRT),
      "internal error: uncaught exception: a broken invariant");
}

}  // namespace
}  // namespace hyperion
