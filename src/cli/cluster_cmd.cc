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
#include "base/log.h"
#include "base/threads.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "launch/cluster_store.h"
#include "launch/local_supervisor.h"
#include "launch/process_session.h"
#include "launch/slurm_backend.h"

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

ClusterUsage usage_of(const launch::ClusterStore& store, const launch::ClusterSpec& c) {
  ClusterUsage u;
  for (const std::string& w : store.workloads(c.name)) {
    try {
      launch::WorkloadSpec spec = store.load_spec(c.name, w);
      launch::WorkloadStatus st = c.backend == launch::Backend::kSlurm
                                      ? launch::slurm::live_status(store, c, spec)
                                      : store.load_status(c.name, w);
      ++u.by_state[launch::state_name(st.state)];
      if (c.backend == launch::Backend::kSlurm)
        u.cores_used += st.state == launch::WorkloadState::kRunning ? spec.cores() : 0;
      else
        u.cores_used += static_cast<int>(st.cpus.size());
      u.workloads.emplace_back(std::move(spec), std::move(st));
    } catch (const Error&) {
      ++u.by_state["unreadable"];
    }
  }
  return u;
}

// CPUs of a Slurm cluster's nodes, each node once (sinfo lists it per partition).
int slurm_cpus(const nlohmann::json& described) {
  std::map<std::string, int> cpus;
  for (const auto& n : described["nodes"])
    cpus[n["node"].get<std::string>()] = n["cpus"].get<int>();
  int total = 0;
  for (const auto& [node, n] : cpus) total += n;
  return total;
}

// The cluster's summary; `usage` and (slurm) `described` as the caller already has them,
// so that Slurm is asked once per command.
nlohmann::json cluster_json(const launch::ClusterStore& store, const launch::ClusterSpec& c,
                            const ClusterUsage& u, nlohmann::json* described = nullptr) {
  nlohmann::json j = launch::to_json(c);
  if (c.backend == launch::Backend::kSlurm) try {
      nlohmann::json d = launch::slurm::describe(c);
      j["cores"] = slurm_cpus(d);  // the partitions' nodes now
      if (described) *described = std::move(d);
    } catch (const Error& e) {
      j["slurm_error"] = e.what();
    }
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
     {"partition", "P", "slurm: use this existing partition (P-low and P-high too if they exist)"},
     {"nodes", "LIST", "slurm: nodes of the partitions it creates (default ALL)"},
     {"json", "", "print the cluster as one JSON object"}},
    std::string("The local backend starts a supervisor process that owns the cluster's "
                "workloads and keeps running after this command returns. The slurm backend "
                "uses --partition, or creates NAME-low, NAME and NAME-high (priority tiers "
                "1-3, which preempt with PreemptType=preempt/partition_prio) with scontrol, "
                "which needs a Slurm administrator; SLURM_CONF is honoured. ") +
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
  // Creates in this store take turns from the check below to the save: two at once of one
  // name cannot both find it free.
  const launch::ClusterCreateLock lock(store.root());
  if (store.cluster_exists(name)) {
    const launch::ClusterSpec old = store.load_cluster(name);
    usage_fail(
        "cluster '{}' exists ({} backend, {} cores, in {}); delete it first with "
        "hyperion cluster delete --cluster {}",
        name, launch::backend_name(old.backend), old.cores, store.cluster_dir(name), name);
  }
  // A directory there that is not a cluster of ours is never adopted (`cluster delete`
  // removes the cluster's directory).
  {
    std::error_code ec;
    const std::string dir = store.cluster_dir(name);
    HYP_CHECK(!std::filesystem::exists(dir, ec) ||
                  std::filesystem::directory_iterator(dir, ec) == std::filesystem::directory_iterator(),
              "cluster '{}': {} exists and holds files that are not a hyperion cluster (no "
              "cluster.json); move them away or choose another name",
              name, dir);
  }
  launch::ClusterSpec c;
  c.name = name;
  c.backend = backend;
  c.created =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (backend == launch::Backend::kSlurm) {
    HYP_USAGE_CHECK(!f.has("cores"),
                    "--cores is for the local backend; a Slurm cluster's "
                    "resources are its partition's nodes");
    launch::slurm::check_reachable();
    launch::slurm::setup_partitions(c, f.nonempty("partition"), f.nonempty("nodes", "ALL"));
    c.cores = slurm_cpus(launch::slurm::describe(c));
    store.save_cluster(c);
  } else {
    HYP_USAGE_CHECK(!f.has("partition") && !f.has("nodes"),
                    "--partition and --nodes are for the slurm backend");
    const int machine = hardware_cores();
    const int64_t cores = f.integer("cores", machine);
    HYP_USAGE_CHECK(cores >= 1 && cores <= machine,
                    "--cores must be between 1 and this machine's {} cores, got {}", machine,
                    cores);
    c.cores = static_cast<int>(cores);
    store.save_cluster(c);
    launch::start_supervisor(store, name, self_exe());
  }
  if (f.has("json")) {
    print_json(cluster_json(store, c, usage_of(store, c)), -1);
    return 0;
  }
  if (backend == launch::Backend::kSlurm)
    std::printf("cluster %s: slurm, partitions %s%s%s (%d CPUs); state in %s\n", name.c_str(),
                c.partition_low.empty() ? "" : (c.partition_low + ", ").c_str(),
                c.partition.c_str(),
                c.partition_high.empty() ? "" : (", " + c.partition_high).c_str(), c.cores,
                store.cluster_dir(name).c_str());
  else
    std::printf("cluster %s: local, %d cores (0-%d), supervisor running; state in %s\n",
                name.c_str(), c.cores, c.cores - 1, store.cluster_dir(name).c_str());
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
  if (c.backend == launch::Backend::kSlurm) {
    for (const std::string& w : store.workloads(name)) try {
        const launch::WorkloadSpec spec = store.load_spec(name, w);
        if (!launch::is_final(launch::slurm::live_status(store, c, spec).state))
          launch::slurm::delete_workload(store, c, spec, spec.grace_s);
      } catch (const Error& e) {
        log_warn("cluster {}: workload {}: {}", name, w, e.what());
      }
    launch::slurm::delete_partitions(c);
  } else if (launch::supervisor_alive(store, name)) {
    // The supervisor stops every workload (SIGTERM, SIGKILL after its grace period).
    HYP_CHECK(launch::stop_supervisor(store, name, grace + 30),
              "cluster {}: the supervisor did not stop within {} s; see {}/supervisor.log", name,
              grace + 30, store.cluster_dir(name));
  } else {
    // No supervisor: whatever it left running is stopped here.
    for (const std::string& w : store.workloads(name)) try {
        const launch::WorkloadStatus st = store.load_status(name, w);
        if (st.pid > 0)
          launch::signal_recorded_session(static_cast<pid_t>(st.pid), st.pid_start_ticks,
                                          st.boot_id, st.started, SIGKILL, st.session_token);
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
      const launch::ClusterSpec c = store.load_cluster(name);
      all.push_back(cluster_json(store, c, usage_of(store, c)));
    } catch (const Error& e) {
      all.push_back({{"name", name}, {"error", e.what()}});
    }
  if (f.has("json")) {
    print_json(all, -1);
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
  const ClusterUsage u = usage_of(store, c);
  nlohmann::json described;
  nlohmann::json j = cluster_json(store, c, u, &described);
  nlohmann::json ws = nlohmann::json::array();
  for (const auto& [spec, st] : u.workloads) ws.push_back(launch::status_json(spec, c.backend, st));
  j["workload_list"] = ws;
  if (!described.is_null()) j["slurm"] = std::move(described);
  if (f.has("json")) {
    print_json(j, -1);
    return 0;
  }
  std::string out = fmt::format(
      "cluster     {}\nbackend     {}\ncores       {} ({} in use)\nsupervisor  {}\nstate dir   "
      "{}\n",
      name, launch::backend_name(c.backend), j["cores"].get<int>(), u.cores_used,
      c.backend == launch::Backend::kSlurm ? "none (Slurm schedules the workloads)"
      : j["supervisor_running"].get<bool>()
          ? "running"
          : "not running (started again by the next workload create)",
      store.cluster_dir(name));
  if (j.contains("slurm")) {
    const auto& sl = j["slurm"];
    out += fmt::format("partitions  {} (preemption by priority: {})\n", sl["partitions"].dump(),
                       sl["preemption"].get<bool>() ? "yes" : "no");
    for (const auto& n : sl["nodes"])
      out += fmt::format("  node {:<16} {} CPUs (alloc/idle/other/total {})  {}  partition {}\n",
                         n["node"].get<std::string>(), n["cpus"].get<int>(),
                         n["cpus_alloc_idle_other_total"].get<std::string>(),
                         n["state"].get<std::string>(), n["partition"].get<std::string>());
  }
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
