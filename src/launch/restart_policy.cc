#include "launch/restart_policy.h"

#include <sys/wait.h>

#include <algorithm>
#include <csignal>
#include <cstring>

#include <fmt/format.h>

#include "base/exit_codes.h"

namespace hyperion::launch {

ExitInfo ExitInfo::from_wait_status(int status) {
  ExitInfo e;
  if (WIFSIGNALED(status)) {
    e.signal = WTERMSIG(status);
    e.code = 128 + e.signal;
  } else if (WIFEXITED(status)) {
    e.code = WEXITSTATUS(status);
  }
  return e;
}

std::string ExitInfo::describe() const {
  if (signal != 0) {
    const char* name = sigabbrev_np(signal);
    return fmt::format("killed by SIG{} ({})", name ? name : std::to_string(signal), code);
  }
  if (code > 128 && code < 128 + 65) {
    const char* name = sigabbrev_np(code - 128);
    if (name) return fmt::format("exit code {} (a rank killed by SIG{})", code, name);
  }
  return fmt::format("exit code {}", code);
}

bool is_system_failure(int exit_code) {
  return exit_code == kExitSystemFailure || (exit_code >= 128 && exit_code <= 255);
}

RestartDecision decide_restart(const ExitInfo& exit, int restarts, int max_restarts,
                               const std::vector<int>& restart_on_exit_codes) {
  const std::string what = exit.describe();
  if (exit.code == 0 && exit.signal == 0) return {false, "succeeded"};
  const bool listed = std::find(restart_on_exit_codes.begin(), restart_on_exit_codes.end(),
                                exit.code) != restart_on_exit_codes.end();
  const bool system = exit.signal != 0 || is_system_failure(exit.code);
  if (!system && !listed)
    return {false, fmt::format("{}: a user error, not restarted (system failures are signals, "
                               "42 and 128-255; --restart-on-exit-codes {} would restart it)",
                               what, exit.code)};
  const char* kind = system ? "a system failure" : "listed in --restart-on-exit-codes";
  if (restarts >= max_restarts)
    return {false, fmt::format("{}: {}, but the workload has been restarted {} of {} times "
                               "(--max-restarts {})",
                               what, kind, restarts, max_restarts, max_restarts)};
  return {true, fmt::format("{}: {}; restart {} of {}", what, kind, restarts + 1, max_restarts)};
}

}  // namespace hyperion::launch
