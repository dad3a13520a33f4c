// A watchdog that dumps every thread's stack when a training rank stops finishing steps
// (issue 17). The dump itself is monitor/stack_dump.h's.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace hyperion::monitor {

// A watchdog thread for training steps. heartbeat(step), called after every step, re-arms
// it (two relaxed atomic stores and a vDSO clock read). The clock starts at construction.
// When no heartbeat came for timeout_s, the watchdog dumps every stack with the reason
// "hang: no step finished for N s (last step S)", logs a warning naming the file, calls
// on_hang(path, last step) (path empty if the dump failed), and then either aborts the process
// (abort_on_hang: std::abort(); the crash handler, if installed, then writes its crash
// event and stderr line but no second file) or keeps watching, dumping again only after
// twice as long again without a heartbeat (timeout_s, then 2x, 4x, ... of it: a day-long
// hang leaves a dozen dumps, never a storm); a heartbeat resets the wait to timeout_s.
// timeout_s <= 0: disabled,
// no thread. The destructor stops and joins the thread promptly.
class HangWatchdog {
 public:
  HangWatchdog(double timeout_s, std::string dir, int rank, bool abort_on_hang,
               std::function<void(const std::string& path, int64_t last_step)> on_hang = {});
  ~HangWatchdog();
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;

  void heartbeat(int64_t step) {
    last_step_.store(step, std::memory_order_relaxed);
    last_beat_ns_.store(now_ns(), std::memory_order_relaxed);
  }
  bool enabled() const { return thread_.joinable(); }
  // The step of the latest heartbeat; -1 before the first.
  int64_t last_step() const { return last_step_.load(std::memory_order_relaxed); }

 private:
  static int64_t now_ns();
  void run();
  void on_timeout(int64_t silent_ns);

  const int64_t timeout_ns_;
  const std::string dir_;
  const int rank_;
  const bool abort_on_hang_;
  const std::function<void(const std::string&, int64_t)> on_hang_;
  std::atomic<int64_t> last_step_{-1};
  std::atomic<int64_t> last_beat_ns_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace hyperion::monitor
