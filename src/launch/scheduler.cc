#include "launch/scheduler.h"

#include <algorithm>

#include <fmt/format.h>

namespace hyperion::launch {

namespace {

std::string holders(const std::vector<RunningWork>& running) {
  std::string out;
  for (const RunningWork& r : running)
    out += fmt::format("{}{} ({}, {} cores{})", out.empty() ? "" : ", ", r.name,
                       priority_name(r.priority), r.cpus.size(), r.stopping ? ", stopping" : "");
  return out;
}

}  // namespace

SchedulePlan schedule(int capacity, const std::vector<RunningWork>& running,
                      std::vector<WaitingWork> waiting) {
  SchedulePlan plan;
  std::vector<bool> used(static_cast<size_t>(std::max(capacity, 0)), false);
  int stopping_cores = 0;
  for (const RunningWork& r : running) {
    for (int c : r.cpus)
      if (c >= 0 && c < capacity) used[static_cast<size_t>(c)] = true;
    if (r.stopping) stopping_cores += static_cast<int>(r.cpus.size());
  }
  auto free_count = [&] { return static_cast<int>(std::count(used.begin(), used.end(), false)); };

  std::stable_sort(waiting.begin(), waiting.end(), [](const WaitingWork& a, const WaitingWork& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.sequence < b.sequence;
  });
  bool blocked = false;
  int position = 0;
  for (const WaitingWork& w : waiting) {
    if (!blocked && w.cores <= free_count()) {
      SchedulePlan::Start s{w.id, {}};
      for (int c = 0; c < capacity && static_cast<int>(s.cpus.size()) < w.cores; ++c)
        if (!used[static_cast<size_t>(c)]) {
          used[static_cast<size_t>(c)] = true;
          s.cpus.push_back(c);
        }
      plan.starts.push_back(std::move(s));
      continue;
    }
    ++position;
    if (blocked) {
      plan.waits.push_back({w.id, position,
                            fmt::format("queued behind {} waiting workload(s) of equal or higher "
                                        "priority",
                                        position - 1)});
      continue;
    }
    blocked = true;
    const int free = free_count();
    if (free + stopping_cores >= w.cores) {
      plan.waits.push_back({w.id, position,
                            fmt::format("waiting for {} cores: {} free, {} more when the stopping "
                                        "workloads exit ({})",
                                        w.cores, free, stopping_cores, holders(running))});
      continue;
    }
    // Victims: lower priority, lowest first, then the most recently started.
    std::vector<const RunningWork*> candidates;
    for (const RunningWork& r : running)
      if (!r.stopping && r.priority < w.priority) candidates.push_back(&r);
    std::sort(candidates.begin(), candidates.end(), [](const RunningWork* a, const RunningWork* b) {
      if (a->priority != b->priority) return a->priority < b->priority;
      return a->started > b->started;
    });
    int reachable = free + stopping_cores;
    std::vector<int> victims;
    std::string victim_names;
    for (const RunningWork* r : candidates) {
      if (reachable >= w.cores) break;
      reachable += static_cast<int>(r->cpus.size());
      victims.push_back(r->id);
      victim_names += (victim_names.empty() ? "" : ", ") + r->name;
    }
    if (reachable >= w.cores) {
      plan.preempt.insert(plan.preempt.end(), victims.begin(), victims.end());
      plan.waits.push_back({w.id, position,
                            fmt::format("waiting for {} cores: preempting lower-priority {}",
                                        w.cores, victim_names)});
    } else {
      plan.waits.push_back({w.id, position,
                            fmt::format("waiting for {} cores: {} of {} free; held by {}", w.cores,
                                        free, capacity, holders(running))});
    }
  }
  return plan;
}

}  // namespace hyperion::launch
