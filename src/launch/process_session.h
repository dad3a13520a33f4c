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

// The polite stop: `sig` to the processes that do the work, sparing those that only wait
// on them: shells with children in the session, and the leader when `spare_leader`
// (mpirun, which on SIGTERM tears the whole job down at once). A training rank can then
// finish its step and save before anything kills it. Returns how many were signalled.
int signal_session_workers(pid_t sid, int sig, bool spare_leader);

// When process `pid` started, in clock ticks after boot (/proc/PID/stat field 22); 0 when
// there is no such process.
uint64_t process_start_ticks(pid_t pid);
// This boot's id (/proc/sys/kernel/random/boot_id); "" when unreadable.
std::string current_boot_id();

// Whether session leader `sid`, recorded at spawn as started at `start_ticks` in boot
// `boot_id` (`started`: the wall-clock start, for records without ticks), is still that
// process: same boot and same start time. A pid read back from a file after the recording
// process is gone may since have been reused by any process (after a reboot, certainly).
bool is_recorded_process(pid_t sid, uint64_t start_ticks, const std::string& boot_id,
                         double started);

// A fresh random token for a session, given to its processes in the environment
// (kSessionTokenEnv) and kept in its record, so that its members are known for its own
// once the leader is gone (a pid number alone may since belong to another session).
inline constexpr const char* kSessionTokenEnv = "HYPERION_SESSION_TOKEN";
std::string new_session_token();

// The live processes of session `sid` whose environment holds kSessionTokenEnv=`token`.
std::vector<pid_t> session_processes_with_token(pid_t sid, const std::string& token);

// signal_session for a session read back from a record: while is_recorded_process holds,
// every process of the session. When the leader has exited (its ranks or children may
// live on, orphaned), those of the session that carry the record's `token` in their
// environment, in the recorded boot. Otherwise nothing is signalled and 0 is returned.
int signal_recorded_session(pid_t sid, uint64_t start_ticks, const std::string& boot_id,
                            double started, int sig, const std::string& token = "");

// Makes this process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER), so
// a rank whose mpirun died is reparented here, not to init, and is reaped here.
void become_subreaper();

}  // namespace hyperion::launch
