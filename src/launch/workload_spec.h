// Clusters and workloads as plain data (issue 18; docs/ORCHESTRATION.md): what
// `hyperion cluster` and `hyperion workload` record, and the states a workload moves
// through. Stored as JSON by launch/cluster_store.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hyperion::launch {

enum class Backend { kLocal, kSlurm };
const char* backend_name(Backend b);
Backend parse_backend(const std::string& name);  // usage error naming the value

enum class Priority { kLow = 0, kMedium = 1, kHigh = 2 };
const char* priority_name(Priority p);
Priority parse_priority(const std::string& name);  // usage error naming the value

// The stable states of `workload status --json` (issue 18's interface).
enum class WorkloadState {
  kQueued,
  kRunning,
  kRestarting,
  kPreempted,
  kSucceeded,
  kFailed,
  kDeleted
};
const char* state_name(WorkloadState s);
WorkloadState parse_state(const std::string& name);  // error naming the value
bool is_final(WorkloadState s);                      // succeeded, failed, deleted

// Names of clusters and workloads: 1 to 40 of [a-z0-9-], starting with a letter and not
// ending with '-' (what Kubernetes and Slurm both accept as a name). Throws a usage error
// naming `what` ("cluster", "workload"), the name and the rule it breaks.
void check_name(const std::string& what, const std::string& name);

struct ClusterSpec {
  std::string name;
  Backend backend = Backend::kLocal;
  int cores = 0;  // local: the pool's size (cores 0..cores-1 of this machine)
  // slurm: the partitions workloads of each priority go to (low and high empty when the
  // cluster has one partition: priorities then order jobs by --nice, without
  // preemption), and those `cluster create` made (deleted with the cluster).
  std::string partition, partition_low, partition_high;
  std::vector<std::string> created_partitions;
  double created = 0;  // Unix time
};

struct WorkloadSpec {
  std::string name, cluster;
  std::string command;  // run by /bin/sh -c in `workdir`
  std::string workdir;
  int nproc = 1;  // ranks (mpirun on local, srun on slurm); 1: the command alone
  int cores_per_rank = 1;
  int nodes = 0;  // slurm: hosts the ranks spread over (--nodes); 0: as Slurm packs them
  Priority priority = Priority::kMedium;
  int max_restarts = 0;
  std::vector<int> restart_on_exit_codes;  // user errors to restart anyway
  std::vector<std::pair<std::string, std::string>> env;
  double grace_s = 30;  // SIGTERM, then SIGKILL after this long (delete, preempt)
  double created = 0;
  int64_t sequence = 0;  // submission order within the cluster
  int cores() const { return nproc * cores_per_rank; }
};

// What the supervisor (or Slurm) says of a workload now.
struct WorkloadStatus {
  WorkloadState state = WorkloadState::kQueued;
  int restarts = 0;  // relaunches after failures (not preemptions)
  int preemptions = 0;
  int attempts = 0;  // launches so far
  bool has_exit = false;
  int last_exit_code = 0;                   // 128 + N for death by signal N
  std::string reason;                       // why it is in this state, in words
  std::vector<std::string> last_log_lines;  // output before the last exit
  int64_t pid = 0;                          // session leader while running (local)
  // Which process `pid` was: its start time in clock ticks after boot (/proc/PID/stat)
  // and the boot it ran in. A pid read back from disk is signalled only while it is still
  // that process (after a reboot or a reuse of the number it is another one).
  uint64_t pid_start_ticks = 0;
  std::string boot_id;
  // In the environment of the attempt's processes (HYPERION_SESSION_TOKEN): finds them
  // once the leader is gone (launch/process_session.h).
  std::string session_token;
  std::string slurm_job_id;
  std::vector<int> cpus;  // cores it holds while running (local)
  double started = 0, ended = 0, updated = 0;
  int queue_position = 0;  // 1-based among waiting workloads; 0 when not waiting
};

}  // namespace hyperion::launch
