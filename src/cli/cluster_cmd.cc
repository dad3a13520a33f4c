// `hyperion cluster create|delete|list|describe` (issue 18; docs/ORCHESTRATION.md): named
// clusters that workloads run on. The local backend's cluster is a pool of this
// machine's cores with a detached supervisor (launch/local_supervisor.h); its state is on
// disk (launch/cluster_store.h), so every command works from any shell.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/threads.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "launch/cluster_store.h"
#include "launch/local_supervisor.h"
#include "launch/process_session.h"

namespace hyperion::cli {

namespace {

constexpr const char* kStateDetails =
    "Cluster state lives in $HYPERION_HOME/clusters (else $XDG_STATE_HOME/hyperion/clusters, "
    "else ~/.local/state/hyperion/clusters). docs/ORCHESTRATION.md shows both backends end "
    "to end.";

std::string self_exe() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

// Workloads of a cluster by state, and the cores the running ones hold.
struct ClusterUsage {
  std::map<std::string, int> by_state;
  int cores_used = 0;
  std::vector<std::pair<launch::WorkloadSpec, launch::WorkloadStatus>> workloads;
};

ClusterUsage usage_of(const launch::ClusterStore& store, const std::string& cluster) {
  ClusterUsage u;
  for (const std::string& w : store.workloads(cluster)) {
    try {
      launch::WorkloadSpec spec = store.load_spec(cluster, w);
      launch::WorkloadStatus st = store.load_status(cluster, w);
      ++u.by_state[launch::state_name(st.state)];
      u.cores_used += static_cast<int>(st.cpus.size());
      u.workloads.emplace_back(std::move(spec), std::move(st));
    } catch (const Error&) {
      ++u.by_state["unreadable"];
    }
  }
  return u;
}

nlohmann::json cluster_json(const launch::ClusterStore& store, const launch::ClusterSpec& c) {
  nlohmann::json j = launch::to_json(c);
  const ClusterUsage u = usage_of(store, c.name);
  j["supervisor_running"] =
      c.backend == launch::Backend::kLocal && launch::supervisor_alive(store, c.name);
  j["cores_used"] = u.cores_used;
  j["workloads"] = u.by_state;
  j["state_dir"] = store.cluster_dir(c.name);
  return j;
}

}  // namespace

const CommandSpec kClusterCreateSpec = {
    "cluster create",
    "",
    "create a named cluster: a pool of this machine's cores (local) or a Slurm partition",
    {{"cluster", "NAME", "the cluster's name (lowercase letters, digits, '-'; at most 40)"},
     {"backend", "B", "local (default) or slurm"},
     {"cores", "N", "local: cores in the pool (default: all of this machine's)"},
     {"json", "", "print the cluster as one JSON object"}},
    std::string("The local backend starts a supervisor process that owns the cluster's "
                "workloads and keeps running after this command returns. ") +
        kStateDetails,
    "cluster create --cluster dev --backend local --cores 2"};

const CommandSpec kClusterDeleteSpec = {
    "cluster delete",
    "",
    "delete a cluster: stop its workloads (SIGTERM, then SIGKILL) and its supervisor",
    {{"cluster", "NAME", "the cluster"}},
    kStateDetails,
    "cluster delete --cluster dev"};

const CommandSpec kClusterListSpec = {
    "cluster list",
    "",
    "list clusters with their backend, cores and workloads by state",
    {{"json", "", "print a JSON array"}},
    kStateDetails,
    "cluster list --json"};

const CommandSpec kClusterDescribeSpec = {
    "cluster describe",
    "",
    "a cluster's backend, resources, supervisor and workloads",
    {{"cluster", "NAME", "the cluster"}, {"json", "", "print one JSON object"}},
    kStateDetails,
    "cluster describe --cluster dev"};

const CommandSpec kClusterSuperviseSpec = {
    "cluster supervise",
    "",
    "(internal) the local backend's supervisor; cluster create starts it detached",
    {{"cluster", "NAME", "the cluster"}},
    "Runs until SIGTERM (cluster delete), then stops every workload. A second supervisor of "
    "the same cluster exits at once.",
    "cluster supervise --cluster dev"};

int cmd_cluster_create(const Args& args) {
  const Flags f(kClusterCreateSpec, args);
  const std::string name = f.get("cluster");
  launch::check_name("cluster", name);
  const launch::Backend backend = launch::parse_backend(f.get("backend", "local"));
  launch::ClusterStore store;
  if (store.cluster_exists(name)) {
    const launch::ClusterSpec old = store.load_cluster(name);
    usage_fail(
        "cluster '{}' exists ({} backend, {} cores, in {}); delete it first with "
        "hyperion cluster delete --cluster {}",
        name, launch::backend_name(old.backend), old.cores, store.cluster_dir(name), name);
  }
  HYP_USAGE_CHECK(backend == launch::Backend::kLocal,
                  "cluster create --backend slurm: not available in this build yet; use "
                  "--backend local");
  launch::ClusterSpec c;
  c.name = name;
  c.backend = backend;
  const int machine = hardware_cores();
  const int64_t cores = f.integer("cores", machine);
  HYP_USAGE_CHECK(cores >= 1 && cores <= machine,
                  "--cores must be between 1 and this machine's {} cores, got {}", machine, cores);
  c.cores = static_cast<int>(cores);
  c.created =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  store.save_cluster(c);
  launch::start_supervisor(store, name, self_exe());
  if (f.has("json")) {
    std::printf("%s\n", cluster_json(store, c).dump().c_str());
    return 0;
  }
  std::printf("cluster %s: local, %d cores (0-%d), supervisor running; state in %s\n", name.c_str(),
              c.cores, c.cores - 1, store.cluster_dir(name).c_str());
  return 0;
}

int cmd_cluster_delete(const Args& args) {
  const Flags f(kClusterDeleteSpec, args);
  const std::string name = f.get("cluster");
  launch::check_name("cluster", name);
  launch::ClusterStore store;
  const launch::ClusterSpec c = store.load_cluster(name);
  double grace = 0;
  for (const std::string& w : store.workloads(name)) try {
      grace = std::max(grace, store.load_spec(name, w).grace_s);
    } catch (const Error&) {
    }
  if (launch::supervisor_alive(store, name)) {
    // The supervisor stops every workload (SIGTERM, SIGKILL after its grace period).
    HYP_CHECK(launch::stop_supervisor(store, name, grace + 30),
              "cluster {}: the supervisor did not stop within {} s; see {}/supervisor.log", name,
              grace + 30, store.cluster_dir(name));
  } else {
    // No supervisor: whatever it left running is stopped here.
    for (const std::string& w : store.workloads(name)) try {
        const launch::WorkloadStatus st = store.load_status(name, w);
        if (st.pid > 0) launch::signal_session(static_cast<pid_t>(st.pid), SIGKILL);
      } catch (const Error&) {
      }
  }
  store.remove_cluster(name);
  std::printf("cluster %s deleted (%s)\n", name.c_str(), launch::backend_name(c.backend));
  return 0;
}

int cmd_cluster_list(const Args& args) {
  const Flags f(kClusterListSpec, args);
  launch::ClusterStore store;
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& name : store.clusters()) try {
      all.push_back(cluster_json(store, store.load_cluster(name)));
    } catch (const Error& e) {
      all.push_back({{"name", name}, {"error", e.what()}});
    }
  if (f.has("json")) {
    std::printf("%s\n", all.dump().c_str());
    return 0;
  }
  if (all.empty()) {
    std::printf("no clusters (in %s); hyperion cluster create --cluster NAME\n",
                store.root().c_str());
    return 0;
  }
  std::printf("%-24s %-8s %-7s %-10s %s\n", "CLUSTER", "BACKEND", "CORES", "SUPERVISOR",
              "WORKLOADS");
  for (const auto& c : all) {
    if (c.contains("error")) {
      std::printf("%-24s %s\n", c["name"].get<std::string>().c_str(),
                  c["error"].get<std::string>().c_str());
      continue;
    }
    std::string states;
    for (const auto& [k, v] : c["workloads"].items())
      states += fmt::format("{}{} {}", states.empty() ? "" : ", ", v.get<int>(), k);
    std::printf("%-24s %-8s %-7s %-10s %s\n", c["name"].get<std::string>().c_str(),
                c["backend"].get<std::string>().c_str(),
                fmt::format("{}/{}", c["cores_used"].get<int>(), c["cores"].get<int>()).c_str(),
                c["supervisor_running"].get<bool>() ? "running" : "stopped",
                states.empty() ? "none" : states.c_str());
  }
  return 0;
}

int cmd_cluster_describe(const Args& args) {
  const Flags f(kClusterDescribeSpec, args);
  const std::string name = f.get("cluster");
  launch::check_name("cluster", name);
  launch::ClusterStore store;
  const launch::ClusterSpec c = store.load_cluster(name);
  nlohmann::json j = cluster_json(store, c);
  const ClusterUsage u = usage_of(store, name);
  nlohmann::json ws = nlohmann::json::array();
  for (const auto& [spec, st] : u.workloads) ws.push_back(launch::status_json(spec, c.backend, st));
  j["workload_list"] = ws;
  if (f.has("json")) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::string out = fmt::format(
      "cluster     {}\nbackend     {}\ncores       {} ({} in use)\nsupervisor  {}\nstate dir   "
      "{}\n",
      name, launch::backend_name(c.backend), c.cores, u.cores_used,
      j["supervisor_running"].get<bool>() ? "running"
                                          : "not running (started again by the next "
                                            "workload create)",
      store.cluster_dir(name));
  out += fmt::format("workloads   {}\n", u.workloads.size());
  for (const auto& [spec, st] : u.workloads)
    out += fmt::format("  {:<24} {:<10} {:<6} {} rank(s) x {} core(s)  {}\n", spec.name,
                       launch::state_name(st.state), launch::priority_name(spec.priority),
                       spec.nproc, spec.cores_per_rank, st.reason);
  std::fputs(out.c_str(), stdout);
  return 0;
}

int cmd_cluster_supervise(const Args& args) {
  const Flags f(kClusterSuperviseSpec, args);
  const std::string name = f.get("cluster");
  launch::check_name("cluster", name);
  launch::ClusterStore store;
  store.load_cluster(name);
  if (!launch::run_local_supervisor(store, name)) {
    std::fprintf(stderr, "cluster %s: a supervisor is already running\n", name.c_str());
    return 0;
  }
  return 0;
}

}  // namespace hyperion::cli
