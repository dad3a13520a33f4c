// The local backend's scheduling decision, as a pure function of plain data (issue 18):
// which waiting workloads start on which cores, which running ones are preempted, and
// for each waiting one its place in the queue and why it waits.
//
// Order: priority (high first), then submission order. The queue is strict: when the
// first waiting workload does not fit, nothing behind it starts (no backfill), so a big
// job is never starved by a stream of small ones. A waiting workload that does not fit
// preempts running workloads of lower priority (lowest priority first, then the most
// recently started), just enough of them to make room, and starts once they have
// stopped and given their cores back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "launch/workload_spec.h"

namespace hyperion::launch {

struct RunningWork {
  int id = 0;  // the caller's index
  std::string name;
  Priority priority = Priority::kMedium;
  std::vector<int> cpus;  // cores held until it has stopped
  double started = 0;
  bool stopping = false;  // preempted or deleted, not yet exited
};

struct WaitingWork {
  int id = 0;
  std::string name;
  Priority priority = Priority::kMedium;
  int cores = 1;
  int64_t sequence = 0;
};

struct SchedulePlan {
  struct Start {
    int id;
    std::vector<int> cpus;
  };
  struct Wait {
    int id;
    int position;  // 1-based
    std::string reason;
  };
  std::vector<Start> starts;
  std::vector<int> preempt;  // ids of running work to stop
  std::vector<Wait> waits;
};

SchedulePlan schedule(int capacity, const std::vector<RunningWork>& running,
                      std::vector<WaitingWork> waiting);

}  // namespace hyperion::launch
