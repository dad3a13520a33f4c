// Whether a workload that ended is run again (issue 18), as XPK decides: a system
// failure (death by a signal, exit code 42, or 128-255, which shells and mpirun use for
// a rank killed by a signal) restarts it up to --max-restarts times; a user error (any
// other non-zero code, such as 1) does not, unless --restart-on-exit-codes lists it.
#pragma once

#include <string>
#include <vector>

namespace hyperion::launch {

// How a process ended, from waitpid's status.
struct ExitInfo {
  int code = 0;    // exit code, or 128 + signal
  int signal = 0;  // the signal that killed it, 0 when it exited
  static ExitInfo from_wait_status(int status);
  std::string describe() const;  // "exit code 1", "killed by SIGKILL (137)"
};

bool is_system_failure(int exit_code);

struct RestartDecision {
  bool restart = false;
  std::string reason;  // in words, for `workload status`
};

// `restarts`: restarts already made.
RestartDecision decide_restart(const ExitInfo& exit, int restarts, int max_restarts,
                               const std::vector<int>& restart_on_exit_codes);

}  // namespace hyperion::launch
