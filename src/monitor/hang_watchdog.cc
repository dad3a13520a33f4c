#include "monitor/hang_watchdog.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>

#include "base/log.h"
#include "monitor/stack_dump.h"

namespace hyperion::monitor {

HangWatchdog::HangWatchdog(double timeout_s, std::string dir, int rank, bool abort_on_hang,
                           std::function<void(const std::string&, int64_t)> on_hang)
    : timeout_ns_(static_cast<int64_t>(timeout_s * 1e9)),
      dir_(std::move(dir)),
      rank_(rank),
      abort_on_hang_(abort_on_hang),
      on_hang_(std::move(on_hang)),
      last_beat_ns_(now_ns()) {
  if (timeout_ns_ > 0) thread_ = std::thread([this] { run(); });
}

HangWatchdog::~HangWatchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

int64_t HangWatchdog::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void HangWatchdog::run() {
  pthread_setname_np(pthread_self(), "hang-watchdog");  // as the dumps list it
  // A dump re-arms the clock, as a heartbeat does, but each further dump of the same hang
  // waits twice as long as the one before (timeout, 2x, 4x, ...): a run hung for a day
  // leaves a dozen dumps, not one per timeout.
  int64_t last_dump_ns = 0, wait_ns = timeout_ns_;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    const int64_t beat = last_beat_ns_.load(std::memory_order_relaxed);
    if (beat > last_dump_ns) wait_ns = timeout_ns_;  // progress since the last dump
    const int64_t since = std::max(beat, last_dump_ns);
    const int64_t now = now_ns();
    if (now < since + wait_ns) {
      wake_.wait_for(lock, std::chrono::nanoseconds(since + wait_ns - now));
      continue;
    }
    lock.unlock();
    on_timeout(now - beat);
    lock.lock();
    last_dump_ns = now_ns();
    wait_ns = std::min<int64_t>(wait_ns, INT64_MAX / 4) * 2;
  }
}

void HangWatchdog::on_timeout(int64_t silent_ns) {
  const int64_t step = last_step_.load(std::memory_order_relaxed);
  const std::string reason =
      fmt::format("hang: no step finished for {:.1f} s (last step {})", silent_ns * 1e-9,
                  step < 0 ? std::string("none") : std::to_string(step));
  std::string path;
  try {
    path = dump_all_stacks(dir_, rank_, reason);
    log_warn("rank {}: {}; stacks of every thread written to {}", rank_, reason, path);
  } catch (const std::exception& e) {
    log_warn("rank {}: {}; the stack dump failed: {}", rank_, reason, e.what());
  }
  if (on_hang_) {
    try {
      on_hang_(path, step);
    } catch (const std::exception& e) {
      log_warn("rank {}: hang callback failed: {}", rank_, e.what());
    }
  }
  if (abort_on_hang_) {
    log_error("rank {}: aborting after a hang (abort_on_hang)", rank_);
    mark_abort_after_hang();  // the crash handler then writes no second dump
    std::abort();
  }
}

}  // namespace hyperion::monitor
