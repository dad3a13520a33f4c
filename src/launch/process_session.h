// Processes of a workload (issue 18): each attempt runs in a session of its own, so that
// every process it starts (mpirun and its ranks, which Open MPI puts in process groups
// of their own) can be found and signalled together, and none is left behind.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace hyperion::launch {

struct SpawnOptions {
  std::vector<std::string> argv;                         // argv[0] is looked up in PATH
  std::vector<std::pair<std::string, std::string>> env;  // added to this process's
  std::string workdir;
  std::string log_path;   // stdout and stderr, appended
  std::vector<int> cpus;  // CPU affinity; empty: unchanged
};

// Starts `o.argv` as the leader of a new session (setsid) and returns its pid, which is
// also the session id. When the child cannot chdir or exec, it writes why to the log and
// exits with 127. Throws hyperion::Error when fork fails or the log cannot be opened.
pid_t spawn_session(const SpawnOptions& o);

// Every live process of session `sid` (the leader included while it lives), from /proc.
std::vector<pid_t> session_processes(pid_t sid);

// Sends `sig` to every process of the session; returns how many were signalled.
int signal_session(pid_t sid, int sig);

// Makes this process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER), so
// a rank whose mpirun died is reparented here, not to init, and is reaped here.
void become_subreaper();

}  // namespace hyperion::launch
