// The local backend's supervisor (issue 18): one process per cluster, started by
// `hyperion cluster create` and detached from it, that owns the cluster's workloads. It
// polls the cluster's directory (launch/cluster_store.h) a few times a second: starts
// what the scheduler (launch/scheduler.h) lets start, each attempt in a session of its
// own on the cores it was given; reaps what ended and restarts it by the restart policy
// (launch/restart_policy.h); preempts for higher priorities; stops deleted workloads
// (SIGTERM to every process of the session, SIGKILL after the grace period); and writes
// each workload's status.json when it changes. Requests come as files, so any shell can
// make them and a supervisor that restarts picks them up.
#pragma once

#include <atomic>
#include <map>
#include <string>

#include "base/log.h"
#include "launch/cluster_store.h"
#include "launch/workload_spec.h"

namespace hyperion::launch {

class LocalSupervisor {
 public:
  LocalSupervisor(ClusterStore store, std::string cluster);
  // Polls until `signals` > 0 (SIGTERM or SIGINT received), then stops every running
  // workload (SIGTERM, SIGKILL after its grace period; at once when a second signal comes)
  // and marks it deleted.
  void run(const std::atomic<int>& signals, double poll_s = 0.1);
  // One pass (tests).
  void tick();

 private:
  enum class Stopping { kNo, kPreempt, kDelete, kShutdown };
  struct Entry {
    WorkloadSpec spec;
    WorkloadStatus status;
    std::string saved;  // the status.json last written
    Stopping stopping = Stopping::kNo;
    double stop_deadline = 0;
    bool killed = false;
    std::string preempted_by;
    std::string exit_reason;  // why the last attempt ended, in words
    std::string spec_key;     // spec.json's inode and mtime when it was read
  };

  void refresh();
  void reap();
  void on_exit(Entry& e, int wait_status);
  void handle_deletes();
  void enforce_deadlines();
  void plan_and_launch();
  void launch(Entry& e, const std::vector<int>& cpus);
  void stop(Entry& e, Stopping why, double grace_s);
  void save(Entry& e);
  void log_line(const Entry& e, const std::string& line);
  void shutdown(const std::atomic<int>& signals);

  ClusterStore store_;
  std::string cluster_;
  ClusterSpec spec_;
  std::map<std::string, Entry> entries_;
  OncePerChange warned_;  // problems met on every poll are logged once per change
};

// Entry point of `hyperion cluster supervise` (the detached process): holds the
// cluster's supervisor.lock for its lifetime; returns false at once when another
// supervisor holds it.
bool run_local_supervisor(const ClusterStore& store, const std::string& cluster);

// Is a supervisor holding `cluster`'s lock now?
bool supervisor_alive(const ClusterStore& store, const std::string& cluster);

// Starts a detached supervisor for `cluster` (`self_exe cluster supervise --cluster C`,
// in a session of its own, output to supervisor.log) and waits until it holds the lock.
// Throws naming the log when it does not come up.
void start_supervisor(const ClusterStore& store, const std::string& cluster,
                      const std::string& self_exe);

// Asks the supervisor to stop (SIGTERM to the pid in supervisor.lock) and waits for it
// to release the lock, up to `timeout_s`. Returns false on timeout.
bool stop_supervisor(const ClusterStore& store, const std::string& cluster, double timeout_s);

}  // namespace hyperion::launch
