// The monitoring files of a training run directory (issue 17), written by the trainer
// and read by `hyperion goodput` and `hyperion monitor`:
//
// events.jsonl   the job's event log (monitor/event_log.h). One JSON object per line:
//                {"time": <Unix seconds, float>, "event": "<kind>", "pid": <int>, ...}
//                Kinds and their extra keys:
//                  job_start            first process of the run (log was empty)
//                  process_start        "attempt" (1, 2, ... across restarts),
//                                       "launch_time" (when the OS started the process)
//                  restore_start        before reading a checkpoint
//                  restore_end          "step": the step restored
//                  init_done            set-up finished; the first step comes next
//                  step_start           "step": the step about to run (1-based)
//                  step_end             "step", "data_wait_s" (input waits inside the step)
//                  checkpoint_save_start / checkpoint_save_end   "step" (the training
//                                       thread's blocking part; async writes overlap steps)
//                  eval_start / eval_end
//                  process_end          "step": a clean stop before the last step
//                  job_end              "step": the last step finished
//                  crash                "rank", "signal": written by the crash handler
//                  hang                 "rank", "step", "path": a hang stack dump
//                Rank 0 writes every kind but crash and hang, which any rank appends.
//
// ranks.jsonl    rank 0's gather of every rank's statistics, one line per log_period
//                (monitor/rank_stats.h):
//                {"step": 20, "time": <Unix s>, "steps": 10,
//                 "ranks": [{"rank": 0, "host": "h", "<metric>_mean": ..,
//                            "<metric>_max": .., ...}, ...],
//                 "summary": {"<metric>": {"mean": .., "max": .., "top_by_mean": [r, ..],
//                             "top_by_max": [r, ..]}, ...},
//                 "stragglers": [{"rank": 1, "metric": "compute_s", "value": ..,
//                                 "median": .., "threshold": .., "periods": 2}]}
//                Metrics (over the window of `steps` steps): step_s, compute_s (step time
//                less data wait and exposed communication), data_wait_s, comm_exposed_s,
//                tokens_per_s, process_cpu (cores busy), rss_bytes.
//
// metrics.jsonl  the job's per-step metrics (train/metrics_writer.h).
// stacks/        rank-R-<UTC time>.txt stack dumps (monitor/stack_dump.h).
#pragma once

namespace hyperion::monitor {

inline constexpr const char* kEventsFile = "events.jsonl";
inline constexpr const char* kRanksFile = "ranks.jsonl";
inline constexpr const char* kMetricsFile = "metrics.jsonl";
inline constexpr const char* kStacksDir = "stacks";

}  // namespace hyperion::monitor
