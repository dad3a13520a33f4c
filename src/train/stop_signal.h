// A training process asked to stop (SIGTERM from a scheduler's preemption or delete,
// SIGINT from Ctrl-C) finishes its current step, saves a checkpoint and exits with
// 128 + the signal, so the same command resumes where it stopped rather than at the last
// periodic checkpoint. The trainer installs the handlers for the length of a run
// (StopSignalScope); the ranks of a job agree on the step through the step's all-reduce.
// A second signal stops the process at once, and a stop still unfinished after 60 s (a
// step blocked on a dead peer) ends by SIGALRM.
#pragma once

namespace hyperion {

class StopSignalScope {
 public:
  StopSignalScope();   // installs SIGTERM and SIGINT handlers that only record the signal
  ~StopSignalScope();  // restores the previous handlers
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;
};

// The signal received since the scope began (SIGTERM or SIGINT), or 0.
int stop_signal_received();

}  // namespace hyperion
