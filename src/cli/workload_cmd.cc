// `hyperion workload create|list|delete|status|logs` (issue 18; docs/ORCHESTRATION.md):
// commands run on a cluster with ranks, priorities and a restart policy. They write
// requests into the cluster's state directory (launch/cluster_store.h) and read the
// supervisor's answers from it.
#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "launch/cluster_store.h"
#include "launch/local_supervisor.h"
#include "launch/slurm_backend.h"

namespace hyperion::cli {

namespace {

constexpr const char* kWorkloadDetails =
    "States (status --json \"state\"): queued, running, restarting, preempted, succeeded, "
    "failed, deleted. docs/ORCHESTRATION.md has the restart policy and the JSON keys.";

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Target {
  launch::ClusterStore store;
  launch::ClusterSpec cluster;
  std::string workload;
};

Target target(const Flags& f, bool need_workload) {
  const std::string cluster = f.get("cluster");
  launch::check_name("cluster", cluster);
  Target t{launch::ClusterStore(), {}, {}};
  t.cluster = t.store.load_cluster(cluster);
  if (need_workload) {
    t.workload = f.get("workload");
    launch::check_name("workload", t.workload);
  }
  return t;
}

// The supervisor must be up for anything to happen: a machine restart or a kill stops it.
void ensure_supervisor(const Target& t) {
  if (t.cluster.backend != launch::Backend::kLocal ||
      launch::supervisor_alive(t.store, t.cluster.name))
    return;
  log_warn("cluster {}: its supervisor was not running (see {}/supervisor.log); starting it",
           t.cluster.name, t.store.cluster_dir(t.cluster.name));
  launch::start_supervisor(t.store, t.cluster.name,
                           std::filesystem::read_symlink("/proc/self/exe").string());
}

launch::WorkloadStatus current_status(const Target& t, const launch::WorkloadSpec& w) {
  return t.cluster.backend == launch::Backend::kSlurm
             ? launch::slurm::live_status(t.store, t.cluster, w)
             : t.store.load_status(t.cluster.name, w.name);
}

std::vector<int> parse_exit_codes(const std::vector<std::string>& items) {
  std::vector<int> out;
  for (const std::string& item : items) {
    const double v = parse_number(item, "--restart-on-exit-codes");
    HYP_USAGE_CHECK(v >= 1 && v <= 255 && v == static_cast<int>(v),
                    "--restart-on-exit-codes: '{}' is not an exit code (1-255)", item);
    out.push_back(static_cast<int>(v));
  }
  return out;
}

std::string status_text(const nlohmann::json& j) {
  std::string out =
      fmt::format("workload    {}\ncluster     {} ({})\nstate       {}\nreason      {}\n",
                  j["workload"].get<std::string>(), j["cluster"].get<std::string>(),
                  j["backend"].get<std::string>(), j["state"].get<std::string>(),
                  j["reason"].get<std::string>());
  if (j["queue_position"].get<int>() > 0)
    out += fmt::format("queue       position {}\n", j["queue_position"].get<int>());
  const int nodes = j.value("nodes", 0);
  out += fmt::format("resources   {} rank(s){}, {} core(s), priority {}\n", j["nproc"].get<int>(),
                     nodes > 0 ? fmt::format(" on {} host(s)", nodes) : "", j["cores"].get<int>(),
                     j["priority"].get<std::string>());
  out += fmt::format("restarts    {} of {} (preemptions {}, attempts {})\n",
                     j["restarts"].get<int>(), j["max_restarts"].get<int>(),
                     j["preemptions"].get<int>(), j["attempts"].get<int>());
  if (!j["last_exit_code"].is_null())
    out += fmt::format("last exit   {}\n", j["last_exit_code"].get<int>());
  if (!j["last_log_lines"].empty()) {
    out += "last output before it:\n";
    for (const auto& l : j["last_log_lines"]) out += "  " + l.get<std::string>() + "\n";
  }
  return out;
}

}  // namespace

const CommandSpec kWorkloadCreateSpec = {
    "workload create",
    "",
    "run a command on a cluster, with ranks, a priority and a restart policy",
    {{"cluster", "NAME", "the cluster"},
     {"workload", "NAME", "the workload's name (lowercase letters, digits, '-'; at most 40)"},
     {"command", "CMD", "the command, run by /bin/sh -c in this directory"},
     {"nproc", "N", "ranks (default 1): mpirun starts N copies of the command"},
     {"cores-per-rank", "N", "cores each rank gets (default 1; HYPERION_THREADS)"},
     {"nodes", "N", "slurm: spread the ranks over N hosts (default: as Slurm packs them)"},
     {"priority", "P", "low, medium (default) or high; high preempts lower"},
     {"max-restarts", "K", "restarts after system failures (default 0)"},
     {"restart-on-exit-codes", "C,..", "user-error exit codes to restart anyway (e.g. 1)"},
     {"env", "K=V", "an environment variable for the command", true},
     {"grace-seconds", "S", "SIGTERM to SIGKILL on delete and preemption (default 30)"},
     {"json", "", "print the workload's status as JSON"}},
    std::string("Restart policy: a system failure (killed by a signal, exit code 42 or "
                "128-255) restarts the workload up to --max-restarts times; a user error "
                "(exit 1 and other codes) does not, unless listed. A training command resumes "
                "from its run directory's last checkpoint by itself. ") +
        kWorkloadDetails,
    "workload create --cluster dev --workload llama --nproc 2 --max-restarts 3 --command "
    "\"hyperion train llama-25m run_name=llama\""};

const CommandSpec kWorkloadListSpec = {
    "workload list",
    "",
    "list a cluster's workloads with state, restarts and reason",
    {{"cluster", "NAME", "the cluster"}, {"json", "", "print a JSON array of statuses"}},
    kWorkloadDetails,
    "workload list --cluster dev --json"};

const CommandSpec kWorkloadDeleteSpec = {
    "workload delete",
    "",
    "stop a workload (SIGTERM, then SIGKILL after the grace period) and mark it deleted",
    {{"cluster", "NAME", "the cluster"},
     {"workload", "NAME", "the workload"},
     {"grace-seconds", "S", "override the workload's grace period"},
     {"no-wait", "", "return once the request is made"}},
    kWorkloadDetails,
    "workload delete --cluster dev --workload llama"};

const CommandSpec kWorkloadStatusSpec = {
    "workload status",
    "",
    "why a workload is where it is: state, queue position, restarts, last exit and output",
    {{"cluster", "NAME", "the cluster"},
     {"workload", "NAME", "the workload"},
     {"json", "",
      "print one JSON object (keys workload, cluster, backend, state, restarts, "
      "last_exit_code, reason, ...)"}},
    kWorkloadDetails,
    "workload status --cluster dev --workload llama --json"};

const CommandSpec kWorkloadLogsSpec = {
    "workload logs",
    "",
    "a workload's output across all its attempts",
    {{"cluster", "NAME", "the cluster"},
     {"workload", "NAME", "the workload"},
     {"follow", "", "keep printing until the workload succeeds, fails or is deleted"}},
    "Each attempt's start and end are marked by lines beginning '== hyperion workload'.",
    "workload logs --cluster dev --workload llama --follow"};

const CommandSpec kWorkloadExecSpec = {
    "workload exec",
    "",
    "(internal) runs a workload's attempts inside its Slurm batch job",
    {{"cluster", "NAME", "the cluster"}, {"workload", "NAME", "the workload"}},
    "The batch script that workload create submits runs this: each attempt is a job step "
    "(srun), and the restart policy is applied between attempts.",
    "workload exec --cluster hpc --workload llama"};

int cmd_workload_exec(const Args& args) {
  const Flags f(kWorkloadExecSpec, args);
  Target t = target(f, true);
  HYP_USAGE_CHECK(t.cluster.backend == launch::Backend::kSlurm,
                  "workload exec runs inside a Slurm batch job; cluster {} is local",
                  t.cluster.name);
  return launch::slurm::exec_in_allocation(t.store, t.cluster, t.workload);
}

int cmd_workload_create(const Args& args) {
  const Flags f(kWorkloadCreateSpec, args);
  Target t = target(f, true);
  launch::WorkloadSpec w;
  w.name = t.workload;
  w.cluster = t.cluster.name;
  w.command = f.require("command");
  HYP_USAGE_CHECK(w.command.find_first_not_of(" \t") != std::string::npos, "--command is empty");
  w.workdir = std::filesystem::current_path().string();
  const int64_t nproc = f.integer("nproc", 1), cpr = f.integer("cores-per-rank", 1);
  HYP_USAGE_CHECK(nproc >= 1 && nproc <= 4096, "--nproc must be between 1 and 4096, got {}", nproc);
  HYP_USAGE_CHECK(cpr >= 1 && cpr <= 4096, "--cores-per-rank must be between 1 and 4096, got {}",
                  cpr);
  w.nproc = static_cast<int>(nproc);
  w.cores_per_rank = static_cast<int>(cpr);
  if (f.has("nodes")) {
    const int64_t nodes = f.integer("nodes", 1);
    HYP_USAGE_CHECK(t.cluster.backend == launch::Backend::kSlurm,
                    "--nodes: cluster {} is a local cluster (one host); --nodes needs a Slurm "
                    "cluster",
                    t.cluster.name);
    HYP_USAGE_CHECK(nodes >= 1 && nodes <= w.nproc,
                    "--nodes must be between 1 and --nproc ({}), got {}", w.nproc, nodes);
    w.nodes = static_cast<int>(nodes);
  }
  HYP_USAGE_CHECK(t.cluster.backend != launch::Backend::kLocal || w.cores() <= t.cluster.cores,
                  "workload {} needs {} cores ({} ranks x {}), but cluster {} has {}", w.name,
                  w.cores(), w.nproc, w.cores_per_rank, t.cluster.name, t.cluster.cores);
  w.priority = launch::parse_priority(f.get("priority", "medium"));
  const int64_t restarts = f.integer("max-restarts", 0);
  HYP_USAGE_CHECK(restarts >= 0 && restarts <= 1000000, "--max-restarts must be >= 0, got {}",
                  restarts);
  w.max_restarts = static_cast<int>(restarts);
  if (f.has("restart-on-exit-codes"))
    w.restart_on_exit_codes = parse_exit_codes(f.list("restart-on-exit-codes"));
  for (const std::string& kv : f.all("env")) {
    const size_t eq = kv.find('=');
    HYP_USAGE_CHECK(eq != std::string::npos && eq > 0, "--env '{}': expected KEY=VALUE", kv);
    const std::string key = kv.substr(0, eq);
    HYP_USAGE_CHECK(key.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                          "0123456789_") == std::string::npos &&
                        !std::isdigit(static_cast<unsigned char>(key[0])),
                    "--env '{}': '{}' is not a variable name (letters, digits, _)", kv, key);
    for (const auto& [k, v] : w.env)
      HYP_USAGE_CHECK(k != key, "--env: {} is given twice ('{}' and '{}')", key, k + "=" + v, kv);
    w.env.emplace_back(key, kv.substr(eq + 1));
  }
  w.grace_s = f.number("grace-seconds", 30);
  HYP_USAGE_CHECK(w.grace_s >= 0 && w.grace_s <= 86400,
                  "--grace-seconds must be between 0 and 86400, got {}", w.grace_s);
  if (t.store.workload_exists(w.cluster, w.name)) {
    const launch::WorkloadStatus old = current_status(t, t.store.load_spec(w.cluster, w.name));
    HYP_USAGE_CHECK(launch::is_final(old.state),
                    "workload {} exists in cluster {} and is {}; delete it first (hyperion "
                    "workload delete --cluster {} --workload {})",
                    w.name, w.cluster, launch::state_name(old.state), w.cluster, w.name);
    t.store.remove_workload(w.cluster, w.name);  // a finished one is replaced
  }
  w.created = now_s();
  w.sequence = t.store.next_sequence(w.cluster);
  t.store.save_spec(w);
  if (t.cluster.backend == launch::Backend::kSlurm) {
    try {
      launch::slurm::submit(t.store, t.cluster, w,
                            std::filesystem::read_symlink("/proc/self/exe").string());
    } catch (const Error&) {
      t.store.remove_workload(w.cluster, w.name);  // nothing was submitted
      throw;
    }
  }
  ensure_supervisor(t);
  const nlohmann::json j = launch::status_json(w, t.cluster.backend, current_status(t, w));
  if (f.has("json"))
    print_json(j, -1);
  else
    std::printf(
        "workload %s submitted to cluster %s (%d rank(s) x %d core(s), priority %s, "
        "max restarts %d)\n",
        w.name.c_str(), w.cluster.c_str(), w.nproc, w.cores_per_rank,
        launch::priority_name(w.priority), w.max_restarts);
  return 0;
}

int cmd_workload_list(const Args& args) {
  const Flags f(kWorkloadListSpec, args);
  Target t = target(f, false);
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& name : t.store.workloads(t.cluster.name)) try {
      const launch::WorkloadSpec w = t.store.load_spec(t.cluster.name, name);
      all.push_back(launch::status_json(w, t.cluster.backend, current_status(t, w)));
    } catch (const Error& e) {
      all.push_back({{"workload", name}, {"cluster", t.cluster.name}, {"error", e.what()}});
    }
  if (f.has("json")) {
    print_json(all, -1);
    return 0;
  }
  if (all.empty()) {
    std::printf("no workloads in cluster %s\n", t.cluster.name.c_str());
    return 0;
  }
  std::printf("%-24s %-10s %-6s %-5s %-8s %-5s %s\n", "WORKLOAD", "STATE", "PRIO", "RANKS",
              "RESTARTS", "EXIT", "REASON");
  for (const auto& j : all) {
    if (j.contains("error")) {
      std::printf("%-24s %s\n", j["workload"].get<std::string>().c_str(),
                  j["error"].get<std::string>().c_str());
      continue;
    }
    std::printf("%-24s %-10s %-6s %-5d %-8d %-5s %s\n", j["workload"].get<std::string>().c_str(),
                j["state"].get<std::string>().c_str(), j["priority"].get<std::string>().c_str(),
                j["nproc"].get<int>(), j["restarts"].get<int>(),
                j["last_exit_code"].is_null()
                    ? "-"
                    : std::to_string(j["last_exit_code"].get<int>()).c_str(),
                j["reason"].get<std::string>().c_str());
  }
  return 0;
}

int cmd_workload_delete(const Args& args) {
  const Flags f(kWorkloadDeleteSpec, args);
  Target t = target(f, true);
  const launch::WorkloadSpec w = t.store.load_spec(t.cluster.name, t.workload);
  const double grace = f.number("grace-seconds", w.grace_s);
  HYP_USAGE_CHECK(grace >= 0 && grace <= 86400,
                  "--grace-seconds must be between 0 and 86400, got {}", grace);
  if (t.cluster.backend == launch::Backend::kSlurm) {
    launch::slurm::delete_workload(t.store, t.cluster, w, grace);
    std::printf("workload %s deleted: %s\n", t.workload.c_str(),
                t.store.load_status(t.cluster.name, t.workload).reason.c_str());
    return 0;
  }
  t.store.request_delete(t.cluster.name, t.workload, grace);
  ensure_supervisor(t);
  if (f.has("no-wait")) {
    std::printf("workload %s: delete requested\n", t.workload.c_str());
    return 0;
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(grace + 30);
  for (;;) {
    const launch::WorkloadStatus st = t.store.load_status(t.cluster.name, t.workload);
    if (st.state == launch::WorkloadState::kDeleted) {
      std::printf("workload %s deleted: %s\n", t.workload.c_str(), st.reason.c_str());
      return 0;
    }
    HYP_CHECK(std::chrono::steady_clock::now() < deadline,
              "workload {}: still {} {} s after the delete request; see hyperion workload "
              "status --cluster {} --workload {}",
              t.workload, launch::state_name(st.state), grace + 30, t.cluster.name, t.workload);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

int cmd_workload_status(const Args& args) {
  const Flags f(kWorkloadStatusSpec, args);
  Target t = target(f, true);
  const launch::WorkloadSpec w = t.store.load_spec(t.cluster.name, t.workload);
  const nlohmann::json j = launch::status_json(w, t.cluster.backend, current_status(t, w));
  if (f.has("json"))
    print_json(j, -1);
  else
    std::fputs(status_text(j).c_str(), stdout);
  return 0;
}

int cmd_workload_logs(const Args& args) {
  const Flags f(kWorkloadLogsSpec, args);
  Target t = target(f, true);
  const launch::WorkloadSpec w = t.store.load_spec(t.cluster.name, t.workload);
  const std::string path = t.store.output_log(t.cluster.name, t.workload);
  std::ifstream in;
  std::streamoff offset = 0;
  const bool follow = f.has("follow");
  for (;;) {
    // Read what is there; with --follow, stop once the workload is final and drained.
    const bool final_before = launch::is_final(current_status(t, w).state);
    in.open(path, std::ios::binary);
    if (in) {
      in.seekg(offset);
      std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      offset += static_cast<std::streamoff>(chunk.size());
      std::fwrite(chunk.data(), 1, chunk.size(), stdout);
      std::fflush(stdout);
    }
    in.close();
    in.clear();
    if (!follow || final_before) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace hyperion::cli
