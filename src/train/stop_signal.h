// A training process asked to stop (SIGTERM from a scheduler's preemption or delete,
// SIGINT from Ctrl-C) finishes its current step, saves a checkpoint and exits with
// 128 + the signal, so the same command resumes where it stopped rather than at the last
// periodic checkpoint. The trainer installs the handlers for the length of a run
// (StopSignalScope); the ranks of a job agree on the step through the step's all-reduce.
// A second signal stops the process at once (by that signal's default action: exit
// status 128 + the signal, no save; a checkpoint half-written is removed first,
// SavingDirectory), and a stop still unfinished `grace_s` (60 s) after
// the first signal (a step blocked on a dead peer) ends by SIGALRM, unless the stop has
// reached its save (stop_signal_saving).
#pragma once

#include <string>

namespace hyperion {

class StopSignalScope {
 public:
  // Installs SIGTERM and SIGINT handlers: the first signal is recorded (and arms the
  // alarm), the second ends the process.
  explicit StopSignalScope(unsigned grace_s = 60);
  ~StopSignalScope();  // restores the previous handlers
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;
};

// The signal received since the scope began (SIGTERM or SIGINT), or 0.
int stop_signal_received();

// The stop has reached its save (the step it waited for has finished): the grace alarm
// is disarmed, so a save longer than the grace period (gigabytes on a slow disk) is not
// killed half-way. (A save blocked on a dead peer ends by the collective timeout.) A
// second signal still stops the process at once.
void stop_signal_saving();

// While one lives, `dir` is a checkpoint being written (checkpoints/.tmp-*): a second
// signal removes it (its files, then the directory, with async-signal-safe calls) before
// the process ends, so an interrupted save leaves nothing half-written behind. One at a
// time; a path longer than PATH_MAX is not registered (the next run removes it).
class SavingDirectory {
 public:
  explicit SavingDirectory(const std::string& dir);
  ~SavingDirectory();
  SavingDirectory(const SavingDirectory&) = delete;
  SavingDirectory& operator=(const SavingDirectory&) = delete;
};

}  // namespace hyperion
