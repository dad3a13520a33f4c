#include "launch/slurm_backend.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "launch/restart_policy.h"
#include "launch/run_command.h"

namespace hyperion::launch::slurm {

namespace {

using nlohmann::json;

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string slurm_conf() {
  const char* c = std::getenv("SLURM_CONF");
  return c && *c ? c : "/etc/slurm/slurm.conf";
}

// Runs a Slurm command; throws naming it and what it printed when it fails.
std::string slurm(const std::vector<std::string>& argv, const char* what) {
  const CommandResult r = run_command(argv, 60);
  HYP_CHECK(r.ok(), "slurm: {} failed ({}; exit code {}): {} (SLURM_CONF={})", what,
            command_line(argv), r.exit_code, r.err.empty() ? r.out : r.err, slurm_conf());
  return r.out;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// `scontrol show ... -o`: one line of Key=Value words.
std::map<std::string, std::string> key_values(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq != std::string::npos) out[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return out;
}

bool partition_exists(const std::string& p) {
  return run_command({"scontrol", "show", "partition", p, "-o"}, 30).ok();
}

std::string partition_of(const ClusterSpec& c, Priority p) {
  if (p == Priority::kLow && !c.partition_low.empty()) return c.partition_low;
  if (p == Priority::kHigh && !c.partition_high.empty()) return c.partition_high;
  return c.partition;
}

std::vector<std::string> partitions(const ClusterSpec& c) {
  std::vector<std::string> out = {c.partition};
  if (!c.partition_low.empty()) out.push_back(c.partition_low);
  if (!c.partition_high.empty()) out.push_back(c.partition_high);
  return out;
}

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

struct JobView {
  bool in_queue = false;  // squeue lists it
  std::string state, reason;
  int restarts = 0;
  std::map<std::string, std::string> fields;  // scontrol show job
};

JobView view_job(const std::string& id) {
  JobView v;
  const CommandResult q = run_command({"squeue", "-h", "-j", id, "-o", "%T|%r"}, 30);
  if (q.ok() && !trim(q.out).empty()) {
    const std::string line = trim(q.out);
    v.in_queue = true;
    v.state = line.substr(0, line.find('|'));
    v.reason = line.find('|') == std::string::npos ? "" : line.substr(line.find('|') + 1);
  }
  const CommandResult s = run_command({"scontrol", "show", "job", id, "-o"}, 30);
  if (s.ok()) {
    v.fields = key_values(s.out);
    v.restarts = std::atoi(v.fields["Restarts"].c_str());
    if (v.state.empty()) v.state = v.fields["JobState"];
    if (v.reason.empty()) v.reason = v.fields["Reason"];
  }
  return v;
}

int queue_position(const ClusterSpec& c, const std::string& id) {
  const CommandResult q = run_command(
      {"squeue", "-h", "-t", "PD", "-p", joined(partitions(c), ","), "-o", "%i", "--sort=-p,i"},
      30);
  if (!q.ok()) return 0;
  std::istringstream in(q.out);
  std::string line;
  int pos = 0;
  while (std::getline(in, line)) {
    ++pos;
    if (trim(line) == id) return pos;
  }
  return 0;
}

}  // namespace

std::string explain_pending_reason(const std::string& reason) {
  static const std::map<std::string, std::string> k = {
      {"Resources", "the CPUs or nodes it needs are in use"},
      {"Priority", "jobs of higher priority are ahead of it"},
      {"BeginTime", "requeued; Slurm holds it briefly before it may start again"},
      {"PartitionDown", "its partition is down"},
      {"PartitionInactive", "its partition is inactive"},
      {"ReqNodeNotAvail", "the nodes it needs are not available (down, drained or reserved)"},
      {"Dependency", "it waits for another job"},
      {"JobHeldUser", "held by its user (scontrol release)"},
      {"JobHeldAdmin", "held by an administrator"},
      {"None", "Slurm has not scheduled it yet"}};
  const auto it = k.find(reason);
  return it == k.end() ? "Slurm's reason: " + reason : it->second + " (Slurm: " + reason + ")";
}

void check_reachable() {
  slurm({"sinfo", "-h", "-o", "%P"}, "sinfo (is slurmctld running and SLURM_CONF right?)");
}

void setup_partitions(ClusterSpec& c, const std::string& partition, const std::string& nodes) {
  if (!partition.empty()) {
    HYP_USAGE_CHECK(partition_exists(partition),
                    "--partition {}: no such Slurm partition (sinfo lists them); leave "
                    "--partition out to create partitions named after the cluster",
                    partition);
    c.partition = partition;
    if (partition_exists(partition + "-low")) c.partition_low = partition + "-low";
    if (partition_exists(partition + "-high")) c.partition_high = partition + "-high";
    return;
  }
  const std::vector<std::pair<std::string, int>> tiers = {
      {c.name + "-low", 1}, {c.name, 2}, {c.name + "-high", 3}};
  for (const auto& [name, tier] : tiers) {
    HYP_USAGE_CHECK(!partition_exists(name),
                    "Slurm partition {} exists already; pass --partition {} to use it", name, name);
  }
  for (const auto& [name, tier] : tiers) {
    try {
      slurm({"scontrol", "create", "PartitionName=" + name, "Nodes=" + nodes,
             "PriorityTier=" + std::to_string(tier), "PreemptMode=REQUEUE", "State=UP",
             "MaxTime=INFINITE"},
            "creating a partition (needs a Slurm administrator)");
    } catch (const Error&) {
      delete_partitions(c);  // the ones made so far
      throw;
    }
    c.created_partitions.push_back(name);
  }
  c.partition_low = c.name + "-low";
  c.partition = c.name;
  c.partition_high = c.name + "-high";
}

void delete_partitions(const ClusterSpec& c) {
  for (const std::string& p : c.created_partitions) {
    const CommandResult r = run_command({"scontrol", "delete", "PartitionName=" + p}, 30);
    if (!r.ok()) log_warn("slurm: cannot delete partition {}: {}", p, trim(r.err));
  }
}

json describe(const ClusterSpec& c) {
  json nodes = json::array();
  const std::string out = slurm(
      {"sinfo", "-h", "-N", "-p", joined(partitions(c), ","), "-o", "%N|%c|%C|%T|%P"}, "sinfo");
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string x;
    while (std::getline(ss, x, '|')) f.push_back(x);
    if (f.size() < 5) continue;
    nodes.push_back({{"node", f[0]},
                     {"cpus", std::atoi(f[1].c_str())},
                     {"cpus_alloc_idle_other_total", f[2]},
                     {"state", f[3]},
                     {"partition", f[4]}});
  }
  const std::string config = run_command({"scontrol", "show", "config"}, 30).out;
  const bool preempts = config.find("preempt/partition_prio") != std::string::npos;
  return {{"partitions", partitions(c)},
          {"nodes", nodes},
          {"preemption", preempts && !c.partition_low.empty()},
          {"slurm_conf", slurm_conf()}};
}

void submit(const ClusterStore& store, const ClusterSpec& c, const WorkloadSpec& w,
            const std::string& self_exe) {
  const std::string dir = store.workload_dir(c.name, w.name);
  std::vector<std::string> argv = {
      "sbatch",
      "--parsable",
      "--job-name=hyperion-" + c.name + "-" + w.name,
      "--partition=" + partition_of(c, w.priority),
      "--ntasks=" + std::to_string(w.nproc),
      "--cpus-per-task=" + std::to_string(w.cores_per_rank),
      "--output=" + store.output_log(c.name, w.name),
      "--open-mode=append",
      "--requeue",
      "--chdir=" + w.workdir,
      "--export=ALL,HYPERION_HOME=" + std::filesystem::path(store.root()).parent_path().string()};
  if (w.nodes > 0) argv.push_back("--nodes=" + std::to_string(w.nodes));
  // One partition for all priorities: order them with --nice (no preemption).
  if (c.partition_low.empty() && w.priority != Priority::kHigh)
    argv.push_back(w.priority == Priority::kLow ? "--nice=200" : "--nice=100");
  argv.push_back("--wrap=exec '" + self_exe + "' workload exec --cluster " + c.name +
                 " --workload " + w.name);
  const std::string id = trim(slurm(argv, "sbatch"));
  WorkloadStatus s;
  s.slurm_job_id = id.substr(0, id.find(';'));
  s.reason = "submitted to Slurm as job " + s.slurm_job_id;
  store.save_status(c.name, w.name, s);
}

WorkloadStatus live_status(const ClusterStore& store, const ClusterSpec& c, const WorkloadSpec& w) {
  WorkloadStatus s = store.load_status(c.name, w.name);
  if (s.slurm_job_id.empty() || s.state == WorkloadState::kDeleted) return s;
  const JobView v = view_job(s.slurm_job_id);
  s.queue_position = 0;
  if (v.in_queue && v.state == "PENDING") {
    const bool requeued = v.restarts > s.preemptions || s.attempts > 0;
    // `workload exec` left it restarting when the attempt ended with a host of the
    // allocation lost: Slurm requeued it for that, not for a higher priority.
    const bool host_lost = requeued && s.state == WorkloadState::kRestarting;
    s.state = host_lost  ? WorkloadState::kRestarting
              : requeued ? WorkloadState::kPreempted
                         : WorkloadState::kQueued;
    s.queue_position = queue_position(c, s.slurm_job_id);
    const char* why = host_lost  ? "a host was lost; requeued by Slurm onto hosts that answer; "
                      : requeued ? "preempted and requeued by Slurm; "
                                 : "";
    s.reason =
        fmt::format("{}job {} pending: {}", why, s.slurm_job_id, explain_pending_reason(v.reason));
    return s;
  }
  if (v.in_queue) {
    if (s.state != WorkloadState::kRestarting) s.state = WorkloadState::kRunning;
    if (s.reason.empty() || s.attempts == 0)
      s.reason = fmt::format("job {} {}", s.slurm_job_id, v.state);
    return s;
  }
  if (is_final(s.state)) return s;
  // Gone from the queue without a final status from `workload exec`.
  const std::string state = v.fields.count("JobState") ? v.fields.at("JobState") : "unknown";
  if (state == "COMPLETED") {
    s.state = WorkloadState::kSucceeded;
    s.reason = "succeeded";
    return s;
  }
  s.state = WorkloadState::kFailed;
  s.reason = fmt::format("Slurm ended job {}: JobState={} Reason={} ExitCode={}", s.slurm_job_id,
                         state, v.reason.empty() ? "?" : v.reason,
                         v.fields.count("ExitCode") ? v.fields.at("ExitCode") : "?");
  return s;
}

void delete_workload(const ClusterStore& store, const ClusterSpec& c, const WorkloadSpec& w,
                     double grace_s) {
  WorkloadStatus s = store.load_status(c.name, w.name);
  if (!s.slurm_job_id.empty()) {
    const std::string& id = s.slurm_job_id;
    auto gone = [&] {
      const CommandResult q = run_command({"squeue", "-h", "-j", id, "-o", "%T"}, 30);
      return !q.ok() || trim(q.out).empty();
    };
    // First SIGTERM to the batch script and every step, as the grace period allows.
    run_command({"scancel", "--full", "--signal=TERM", id}, 30);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    while (!gone() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!gone()) {
      slurm({"scancel", id}, "scancel");  // Slurm's SIGTERM, KillWait, SIGKILL
      const auto hard = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (!gone() && std::chrono::steady_clock::now() < hard)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      HYP_CHECK(gone(), "workload {}: Slurm job {} still listed 120 s after scancel", w.name, id);
    }
  }
  s = store.load_status(c.name, w.name);
  s.state = WorkloadState::kDeleted;
  s.reason =
      s.slurm_job_id.empty() ? "deleted" : "deleted; Slurm job " + s.slurm_job_id + " cancelled";
  s.ended = now_s();
  store.save_status(c.name, w.name, s);
}

namespace {

std::atomic<bool> g_terminated{false};
void on_term(int) {
  g_terminated.store(true);
}

void say(const std::string& path, const std::string& w, const std::string& line) {
  std::ofstream(path, std::ios::app) << "== hyperion workload " << w << ": " << line << '\n';
}

}  // namespace

namespace {

// Kills the job's remaining job steps (not the batch script) and waits until Slurm lists
// none, up to 20 s; false when some are still listed (their host does not answer: Slurm
// ends them once it marks the host down).
bool reap_steps(const std::string& job, const std::string& log, const std::string& name) {
  if (job.empty()) return true;
  auto steps = [&] {
    std::vector<std::string> out;
    const CommandResult q = run_command({"squeue", "-h", "-s", "-j", job, "-o", "%i"}, 30);
    std::istringstream in(q.out);
    std::string id;
    while (in >> id) {
      const size_t dot = id.find('.');
      // "3.0", "3.1": srun steps; "3.batch" and "3.extern" are the job's own.
      if (dot != std::string::npos && std::isdigit(static_cast<unsigned char>(id[dot + 1])))
        out.push_back(id);
    }
    return out;
  };
  std::vector<std::string> left = steps();
  if (left.empty()) return true;
  say(log, name, fmt::format("{} step(s) of the last attempt still running: SIGKILL", left.size()));
  for (const std::string& step : left) run_command({"scancel", "--signal=KILL", step}, 30);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!(left = steps()).empty() && !g_terminated.load() &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  return left.empty();
}

// After a failed attempt in an allocation of several hosts: starts one task on each host
// (srun ... true; --overlap, so a step still dying does not hold it back) and returns
// srun's complaint when one does not answer in 30 s (its slurmd killed, stopped or cut
// off), or "" when all do. A restart in place would only fail on that host again.
std::string unanswering_hosts() {
  const char* n = std::getenv("SLURM_JOB_NUM_NODES");
  const int nodes = n ? std::atoi(n) : 1;
  if (nodes <= 1) return "";
  const std::string k = std::to_string(nodes);
  const CommandResult r = run_command({"srun", "--overlap", "--nodes=" + k, "--ntasks=" + k,
                                       "--ntasks-per-node=1", "--kill-on-bad-exit=1", "true"},
                                      30);
  if (r.ok()) return "";
  std::string what = trim(r.err.empty() ? r.out : r.err);  // "(killed after 30 s)" if hung
  if (what.empty()) what = "exit " + std::to_string(r.exit_code);
  if (what.size() > 400) what = what.substr(0, 400) + "...";
  return what;
}

// Seconds after which slurmctld marks a silent node down (scontrol show config), 300
// when it cannot be read.
int slurmd_timeout_s() {
  const CommandResult r = run_command({"scontrol", "show", "config"}, 30);
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SlurmdTimeout", 0) == 0) {
      const size_t eq = line.find('=');
      if (eq != std::string::npos) return std::max(1, std::atoi(line.c_str() + eq + 1));
    }
  }
  return 300;
}

}  // namespace

int exec_in_allocation(const ClusterStore& store, const ClusterSpec& c, const std::string& name) {
  const WorkloadSpec w = store.load_spec(c.name, name);
  WorkloadStatus s = store.load_status(c.name, name);
  const std::string log = store.output_log(c.name, name);
  struct sigaction sa {};
  sa.sa_handler = on_term;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  const char* job = std::getenv("SLURM_JOB_ID");
  if (job) s.slurm_job_id = job;
  const char* restart_count = std::getenv("SLURM_RESTART_COUNT");
  const int requeues = restart_count ? std::atoi(restart_count) : 0;
  if (requeues > s.preemptions) {
    s.preemptions = requeues;
    say(log, name,
        fmt::format("requeued by Slurm ({} time(s)): preempted or its node failed", requeues));
  }
  for (;;) {
    ++s.attempts;
    s.state = WorkloadState::kRunning;
    s.started = now_s();
    const char* nodelist = std::getenv("SLURM_JOB_NODELIST");
    s.reason = fmt::format("running attempt {} as a step of Slurm job {}{}", s.attempts,
                           s.slurm_job_id, nodelist ? std::string(" on ") + nodelist : "");
    s.updated = now_s();
    store.save_status(c.name, name, s);
    std::vector<std::string> argv = {"srun", "--ntasks=" + std::to_string(w.nproc),
                                     "--cpus-per-task=" + std::to_string(w.cores_per_rank),
                                     "--kill-on-bad-exit=1"};
    if (w.nodes > 0) argv.push_back("--nodes=" + std::to_string(w.nodes));
    if (w.nproc > 1) argv.push_back("--mpi=pmix");
    argv.insert(argv.end(), {"/bin/sh", "-c", w.command});
    say(log, name,
        fmt::format("attempt {} starting (Slurm job {}, {} rank(s)): {}", s.attempts,
                    s.slurm_job_id, w.nproc, w.command));
    ::setenv("HYPERION_THREADS", std::to_string(w.cores_per_rank).c_str(), 1);
    ::setenv("OMP_NUM_THREADS", std::to_string(w.cores_per_rank).c_str(), 1);
    ::setenv("HYPERION_ATTEMPT", std::to_string(s.attempts).c_str(), 1);
    for (const auto& [k, v] : w.env) ::setenv(k.c_str(), v.c_str(), 1);
    std::fflush(stdout);
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execvp("srun", args.data());
      std::fprintf(stderr, "hyperion: cannot run srun\n");
      ::_exit(127);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    const ExitInfo exit = ExitInfo::from_wait_status(status);
    // srun can return before its step's processes are gone (it stops waiting after a
    // while); a rank still finishing would hold the run directory against the next
    // attempt. Every step of this job is over now: SIGKILL what is left, wait for it.
    const bool reaped = reap_steps(s.slurm_job_id, log, name);
    s.has_exit = true;
    s.last_exit_code = exit.code;
    s.ended = now_s();
    s.last_log_lines = tail_lines(log, 20);
    if (g_terminated.load()) {
      // Cancelled or preempted: Slurm decides what comes next (requeue or the end).
      s.reason =
          fmt::format("attempt {} stopped by SIGTERM from Slurm ({})", s.attempts, exit.describe());
      say(log, name, s.reason);
      store.save_status(c.name, name, s);
      return 143;
    }
    if (exit.code == 0) {
      s.state = WorkloadState::kSucceeded;
      s.reason = "succeeded (exit code 0)";
      say(log, name, fmt::format("attempt {} ended: {}", s.attempts, s.reason));
      store.save_status(c.name, name, s);
      return 0;
    }
    // A host of the allocation lost (killed, stopped, cut off): Slurm marks it down after
    // SlurmdTimeout and requeues the job (--requeue) onto hosts that answer; this process
    // then gets SIGTERM. Wait for that, whatever the restart policy says (the machine
    // failed, as in a preemption), rather than restart onto the lost host.
    if (is_system_failure(exit.code)) {
      std::string lost = unanswering_hosts();
      if (!lost.empty() && !reaped) lost += "; its tasks there did not end 20 s after SIGKILL";
      if (!lost.empty()) {
        const int wait_s = 2 * slurmd_timeout_s() + 30;
        say(log, name,
            fmt::format("attempt {} ended: {}; a host of the allocation does not answer ({}): "
                        "waiting up to {} s for Slurm to mark it down and requeue the job on "
                        "hosts that answer, not restarting here",
                        s.attempts, exit.describe(), lost, wait_s));
        s.state = WorkloadState::kRestarting;
        s.reason = "a host of the allocation does not answer; waiting for Slurm to requeue the job";
        store.save_status(c.name, name, s);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
        while (!g_terminated.load() && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        if (g_terminated.load()) {
          s.reason =
              fmt::format("attempt {} ended by a lost host; Slurm requeues the job", s.attempts);
          say(log, name, s.reason);
          store.save_status(c.name, name, s);
          return 143;
        }
        say(log, name, "Slurm did not requeue the job; the restart policy decides");
        reap_steps(s.slurm_job_id, log, name);  // the old step, if its host came back
      }
    }
    const RestartDecision d =
        decide_restart(exit, s.restarts, w.max_restarts, w.restart_on_exit_codes);
    s.reason = d.reason;
    say(log, name, fmt::format("attempt {} ended: {}", s.attempts, d.reason));
    if (!d.restart) {
      s.state = WorkloadState::kFailed;
      store.save_status(c.name, name, s);
      return exit.code == 0 ? 1 : exit.code;
    }
    ++s.restarts;
    s.state = WorkloadState::kRestarting;
    store.save_status(c.name, name, s);
  }
}

}  // namespace hyperion::launch::slurm
