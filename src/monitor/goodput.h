// Goodput of a training job from its event log (monitor/run_files.h), the accounting of
// ml-goodput-measurement: the job's wall time from the first process's launch to the last
// event, split into productive step time and badput by kind.
//
//   productive          step time (less its data waits) of steps whose progress was kept
//   program_startup     process launch (the OS's start time) to its process_start event
//   initialization      process_start to init_done, less checkpoint restore
//   data_loading        data waits inside kept steps
//   checkpoint_save     training-thread time blocked in checkpoint saves
//   checkpoint_restore  restore_start to restore_end
//   wasted_progress     steps a disruption lost: those after the step the next process
//                       restored, and the step running when the process died
//   recovery            from a disrupted process's last event to the next process's launch
//   other               the rest (evaluation, samples, logging)
//
// goodput = productive / total; the kinds and productive sum to total.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace hyperion::monitor {

struct GoodputReport {
  double total_s = 0;
  double productive_s = 0;
  double goodput = 0;                    // productive_s / total_s
  std::map<std::string, double> badput;  // seconds by kind (every kind present, maybe 0)
  int processes = 0;                     // attempts seen (restarts = processes - 1)
  int disruptions = 0;                   // processes that ended without process_end/job_end
  long long steps_kept = 0, steps_lost = 0;
  bool finished = false;  // a job_end was seen
};

// The badput kinds in report order.
const std::vector<std::string>& badput_kinds();

// Reads RUN_DIR/events.jsonl (or a path to the file itself). Throws hyperion::Error naming
// the file and line for a truncated line, a line that is not a JSON object with "time" and
// "event", an unknown kind, or time going backwards; and naming the file when it is
// missing or holds no job_start.
GoodputReport compute_goodput(const std::string& run_dir_or_file);

// {"goodput": f, "total_s": s, "productive_s": s, "badput": {"<kind>": {"seconds": s,
//  "fraction": f}, ...}, "processes": n, "disruptions": n, "steps_kept": n, "steps_lost": n,
//  "finished": b}
std::string goodput_json(const GoodputReport& r);

}  // namespace hyperion::monitor
