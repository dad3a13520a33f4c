#include "base/thread_governor.h"

#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "base/log.h"
#include "base/threads.h"

namespace hyperion {
namespace {

constexpr int64_t kWindowNs = 200'000'000;      // between two looks
constexpr int64_t kFirstProbeNs = 2'000'000'000;  // a thread more after this long calm
constexpr int64_t kMaxProbeNs = 32'000'000'000;
constexpr double kShrinkAbove = 0.15;  // share of runnable time spent waiting for a CPU
constexpr double kGrowBelow = 0.05;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Per thread: the time on a CPU and the time runnable but waiting for one
// (/proc/PID/task/TID/schedstat: "run_ns wait_ns timeslices"). Empty when the kernel
// does not provide it.
using ThreadTimes = std::unordered_map<long, std::pair<uint64_t, uint64_t>>;
ThreadTimes read_schedstats() {
  ThreadTimes out;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return out;
  char path[64];
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::snprintf(path, sizeof path, "/proc/self/task/%.20s/schedstat", e->d_name);
    std::FILE* f = std::fopen(path, "r");
    if (f == nullptr) continue;  // the thread has just exited
    unsigned long long r = 0, w = 0;
    if (std::fscanf(f, "%llu %llu", &r, &w) == 2) out[std::atol(e->d_name)] = {r, w};
    std::fclose(f);
  }
  ::closedir(dir);
  return out;
}

struct Governor {
  std::mutex mu;
  bool disabled = false;
  int configured = 0;  // the most threads it may use
  int last_set = 0;    // the count it set; another means someone reconfigured the pool
  int64_t last_ns = 0;
  ThreadTimes last;  // per thread, at last_ns
  int64_t probe_at_ns = 0, backoff_ns = kFirstProbeNs;
  bool probing = false;
  bool told = false;
};

Governor& governor() {
  static Governor* g = [] {
    auto* gov = new Governor();
    const char* env = std::getenv("HYPERION_ADAPT_THREADS");
    gov->disabled = env != nullptr && std::strcmp(env, "0") == 0;
    return gov;
  }();
  return *g;
}

}  // namespace

void adapt_threads_to_contention() {
  Governor& g = governor();
  if (g.disabled) return;
  std::unique_lock<std::mutex> lock(g.mu, std::try_to_lock);
  if (!lock.owns_lock()) return;
  const int64_t now = now_ns();
  if (g.last_ns != 0 && now - g.last_ns < kWindowNs) return;
  const int team = num_threads();
  if (team != g.last_set) {  // first call, or set_num_threads since: its count is the cap
    g.configured = team;
    g.last_set = team;
    g.probing = false;
    g.backoff_ns = kFirstProbeNs;
  }
  ThreadTimes times = read_schedstats();
  if (times.empty()) {
    g.disabled = true;
    return;
  }
  // Over the threads alive at both looks (a worker that exited since takes its times away).
  double d_run = 0, d_wait = 0;
  for (const auto& [tid, t] : times)
    if (const auto it = g.last.find(tid); it != g.last.end()) {
      d_run += static_cast<double>(t.first - it->second.first);
      d_wait += static_cast<double>(t.second - it->second.second);
    }
  const bool first = g.last_ns == 0;
  const double window = static_cast<double>(now - g.last_ns);
  g.last_ns = now;
  g.last = std::move(times);
  if (first || g.configured <= 1) return;
  // A window in which the threads hardly ran (waiting for requests, for I/O) says nothing.
  if (d_run + d_wait < 0.25 * window) return;
  const double waiting = d_wait / (d_run + d_wait);
  int next = team;
  if (waiting > kShrinkAbove && team > 1) {
    next = std::min(team - 1, std::max(1, static_cast<int>(std::lround(team * (1 - waiting)))));
    if (g.probing) g.backoff_ns = std::min(2 * g.backoff_ns, kMaxProbeNs);
    g.probing = false;
    g.probe_at_ns = now + g.backoff_ns;
  } else if (waiting < kGrowBelow) {
    if (g.probing) {  // the last try held
      g.probing = false;
      g.backoff_ns = kFirstProbeNs;
      g.probe_at_ns = now + g.backoff_ns;
    } else if (team < g.configured && now >= g.probe_at_ns) {
      next = team + 1;
      g.probing = true;
    }
  }
  if (next == team) return;
  set_num_threads(next);
  g.last_set = next;
  if (!g.told && next < team) {
    g.told = true;
    log_info(
        "threads: this process's threads waited for a CPU {:.0f}% of their runnable time "
        "(other processes on its cores, or more threads than cores): {} now, back up to {} "
        "when the cores are free (HYPERION_ADAPT_THREADS=0 keeps the count)",
        100 * waiting, next, g.configured);
  } else {
    log_debug("threads: {:.0f}% of runnable time waiting for a CPU: {} -> {} threads",
              100 * waiting, team, next);
  }
}

}  // namespace hyperion
