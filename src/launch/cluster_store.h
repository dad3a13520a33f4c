// Where clusters and workloads live on disk (issue 18), so that every command works from
// any shell and the supervisor survives the command that started it:
//
//   <root>/<cluster>/cluster.json           ClusterSpec (written once, by cluster create)
//   <root>/<cluster>/supervisor.lock        held (flock) by the live supervisor (local)
//   <root>/<cluster>/supervisor.log         the supervisor's own log
//   <root>/<cluster>/workloads/<w>/spec.json     WorkloadSpec (written by workload create)
//   <root>/<cluster>/workloads/<w>/status.json   WorkloadStatus (written by the supervisor)
//   <root>/<cluster>/workloads/<w>/delete        a delete request (written by workload delete)
//   <root>/<cluster>/workloads/<w>/output.log    the workload's output, every attempt
//
// <root> is $HYPERION_HOME/clusters, else $XDG_STATE_HOME/hyperion/clusters, else
// ~/.local/state/hyperion/clusters. JSON files are replaced atomically (temp + rename):
// a reader sees the old or the new version, never a torn one.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launch/workload_spec.h"

namespace hyperion::launch {

std::string clusters_root();

// Serialises `cluster create` in one store: an flock on <root>/.create.lock, waited for,
// held while a create checks that its name is free and saves the cluster. The kernel
// drops it when the holder exits, however it exits. Of several creates of one name at
// once, exactly one finds the name free; the others find it taken ("exists").
class ClusterCreateLock {
 public:
  explicit ClusterCreateLock(const std::string& root);
  ~ClusterCreateLock();
  ClusterCreateLock(const ClusterCreateLock&) = delete;
  ClusterCreateLock& operator=(const ClusterCreateLock&) = delete;

 private:
  int fd_ = -1;
};

class ClusterStore {
 public:
  explicit ClusterStore(std::string root = clusters_root());

  const std::string& root() const { return root_; }
  std::string cluster_dir(const std::string& cluster) const;
  std::string workload_dir(const std::string& cluster, const std::string& workload) const;

  bool cluster_exists(const std::string& cluster) const;
  std::vector<std::string> clusters() const;  // sorted
  // Throws a usage error naming the cluster (and listing the existing ones) when missing.
  ClusterSpec load_cluster(const std::string& cluster) const;
  void save_cluster(const ClusterSpec& c) const;
  void remove_cluster(const std::string& cluster) const;

  std::vector<std::string> workloads(const std::string& cluster) const;  // sorted
  bool workload_exists(const std::string& cluster, const std::string& workload) const;
  WorkloadSpec load_spec(const std::string& cluster, const std::string& workload) const;
  void save_spec(const WorkloadSpec& w) const;
  // A workload that has no status.json yet is queued.
  WorkloadStatus load_status(const std::string& cluster, const std::string& workload) const;
  void save_status(const std::string& cluster, const std::string& workload,
                   const WorkloadStatus& s) const;
  std::string output_log(const std::string& cluster, const std::string& workload) const;
  // The next submission number of the cluster (1 + the largest so far).
  int64_t next_sequence(const std::string& cluster) const;

  // Delete requests: grace seconds before SIGKILL.
  void request_delete(const std::string& cluster, const std::string& workload,
                      double grace_s) const;
  std::optional<double> delete_requested(const std::string& cluster,
                                         const std::string& workload) const;
  // Removes a finished workload's directory (a new workload of the same name replaces it).
  void remove_workload(const std::string& cluster, const std::string& workload) const;

 private:
  std::string root_;
};

nlohmann::json to_json(const ClusterSpec& c);
nlohmann::json to_json(const WorkloadSpec& w);
// The stable interface of `workload status --json` (issue 18): workload, cluster,
// backend, state, restarts, last_exit_code, reason, and more.
nlohmann::json status_json(const WorkloadSpec& w, Backend backend, const WorkloadStatus& s);
nlohmann::json to_json(const WorkloadStatus& s);
ClusterSpec cluster_from_json(const nlohmann::json& j, const std::string& where);
WorkloadSpec spec_from_json(const nlohmann::json& j, const std::string& where);
WorkloadStatus status_from_json(const nlohmann::json& j, const std::string& where);

// The last `n` lines of a text file ("" lines dropped); empty when it cannot be read.
std::vector<std::string> tail_lines(const std::string& path, size_t n);

}  // namespace hyperion::launch
