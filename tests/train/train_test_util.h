// Helpers shared by the end-to-end training tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "base/threads.h"

namespace hyperion::testing_util {

// A fresh temporary directory per test process and prefix (emptied on first use, then
// the same path): the runs of a test file share it, so the bundled corpus is prepared once.
inline std::string process_temp_root(const std::string& prefix) {
  static std::set<std::string> made;
  const std::string r = testing::TempDir() + prefix + "_" + std::to_string(::getpid());
  if (made.insert(r).second) {
    std::filesystem::remove_all(r);
    std::filesystem::create_directories(r);
  }
  return r;
}

// End-to-end training tests run single-threaded: CTest runs tests in parallel on a small
// machine, and OpenMP regions waiting on a descheduled second thread would make these
// runs slow without testing anything more (the kernel tests cover thread counts).
class ScopedSingleThread {
 public:
  ScopedSingleThread() : saved_(num_threads()) { set_num_threads(1); }
  ~ScopedSingleThread() { set_num_threads(saved_); }
  ScopedSingleThread(const ScopedSingleThread&) = delete;
  ScopedSingleThread& operator=(const ScopedSingleThread&) = delete;

 private:
  int saved_;
};

}  // namespace hyperion::testing_util
