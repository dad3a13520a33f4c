#include "launch/local_supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "dist/mpirun_command.h"
#include "launch/process_session.h"
#include "launch/restart_policy.h"
#include "launch/scheduler.h"

namespace hyperion::launch {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string utc(double t) {
  const time_t s = static_cast<time_t>(t);
  std::tm tm{};
  gmtime_r(&s, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (int c : cpus) {
    if (!out.empty()) out += ',';
    out += std::to_string(c);
  }
  return out;
}

bool is_waiting(WorkloadState s) {
  return s == WorkloadState::kQueued || s == WorkloadState::kRestarting ||
         s == WorkloadState::kPreempted;
}

}  // namespace

LocalSupervisor::LocalSupervisor(ClusterStore store, std::string cluster)
    : store_(std::move(store)),
      cluster_(std::move(cluster)),
      spec_(store_.load_cluster(cluster_)) {}

void LocalSupervisor::log_line(const Entry& e, const std::string& line) {
  std::ofstream out(store_.output_log(cluster_, e.spec.name), std::ios::app);
  out << "== hyperion workload " << e.spec.name << ": " << line << '\n';
}

void LocalSupervisor::save(Entry& e) {
  WorkloadStatus key = e.status;
  key.updated = 0;  // changes on every save: not a change in itself
  const std::string now = to_json(key).dump();
  if (now == e.saved) return;
  e.status.updated = now_s();
  try {
    store_.save_status(cluster_, e.spec.name, e.status);
    e.saved = now;
    warned_.forget("save " + e.spec.name);
  } catch (const Error& err) {
    if (warned_("save " + e.spec.name, err.what())) log_warn("supervisor: {}", err.what());
  }
}

void LocalSupervisor::refresh() {
  const std::vector<std::string> names = store_.workloads(cluster_);
  for (const std::string& name : names) {
    // A spec.json written anew (the same name submitted again after it finished) is a
    // new workload: its file identity differs.
    struct stat st {};
    const std::string spec_path = store_.workload_dir(cluster_, name) + "/spec.json";
    if (::stat(spec_path.c_str(), &st) != 0) continue;
    const std::string key =
        fmt::format("{}:{}.{}", st.st_ino, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    auto it = entries_.find(name);
    if (it != entries_.end()) {
      if (it->second.spec_key == key || it->second.status.pid > 0) continue;
      entries_.erase(it);
    }
    Entry e;
    e.spec_key = key;
    try {
      e.spec = store_.load_spec(cluster_, name);
      e.status = store_.load_status(cluster_, name);
    } catch (const Error& err) {
      // Once per version of the files, not on every poll.
      if (warned_("load " + name, key + " " + err.what()))
        log_warn("supervisor: workload {} skipped (until its files change): {}", name,
                 err.what());
      continue;
    }
    warned_.forget("load " + name);
    if (e.status.state == WorkloadState::kRunning) {
      // Running under a supervisor that is gone: its processes are not our children, so
      // they are stopped and the workload runs again (not counted as a restart).
      // Only while the recorded pid is still that process (same boot, same start time):
      // after a reboot, or once the number is reused, it is someone else's.
      if (e.status.pid > 0 &&
          signal_recorded_session(static_cast<pid_t>(e.status.pid), e.status.pid_start_ticks,
                                  e.status.boot_id, e.status.started, SIGKILL,
                                  e.status.session_token) == 0 &&
          process_start_ticks(static_cast<pid_t>(e.status.pid)) != 0)
        log_warn("supervisor: workload {}: pid {} is no longer its process; not signalled", name,
                 e.status.pid);
      e.status.state = WorkloadState::kQueued;
      e.status.pid = 0;
      e.status.cpus.clear();
      e.status.reason = "the supervisor restarted while it ran; requeued";
      log_line(e, "the supervisor restarted; attempt stopped and requeued");
    }
    if (e.status.state != WorkloadState::kQueued)
      e.exit_reason = e.status.reason.substr(0, e.status.reason.find("; now "));
    entries_.emplace(name, std::move(e));
  }
  // Directories removed by hand (or a replaced workload): forget them.
  for (auto it = entries_.begin(); it != entries_.end();) {
    const bool gone = std::find(names.begin(), names.end(), it->first) == names.end();
    if (gone && it->second.status.pid == 0)
      it = entries_.erase(it);
    else
      ++it;
  }
}

void LocalSupervisor::reap() {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    for (auto& [name, e] : entries_)
      if (e.status.pid == pid) {
        on_exit(e, status);
        break;
      }
    // Other pids: orphaned ranks of a session (we are their subreaper); nothing to do.
  }
}

void LocalSupervisor::on_exit(Entry& e, int wait_status) {
  const pid_t sid = static_cast<pid_t>(e.status.pid);
  // The attempt is over: nothing of it may outlive its leader.
  signal_session(sid, SIGKILL);
  const ExitInfo exit = ExitInfo::from_wait_status(wait_status);
  e.status.last_log_lines = tail_lines(store_.output_log(cluster_, e.spec.name), 20);
  e.status.has_exit = true;
  e.status.last_exit_code = exit.code;
  e.status.pid = 0;
  e.status.cpus.clear();
  e.status.ended = now_s();
  const Stopping why = e.stopping;
  e.stopping = Stopping::kNo;
  e.killed = false;
  if (why == Stopping::kDelete || why == Stopping::kShutdown) {
    e.status.state = WorkloadState::kDeleted;
    e.status.reason =
        fmt::format("deleted; attempt {} stopped ({})", e.status.attempts, exit.describe());
  } else if (why == Stopping::kPreempt) {
    e.status.state = WorkloadState::kPreempted;
    ++e.status.preemptions;
    e.status.reason = fmt::format("preempted by higher-priority {} ({}); requeued", e.preempted_by,
                                  exit.describe());
  } else if (exit.code == 0 && exit.signal == 0) {
    e.status.state = WorkloadState::kSucceeded;
    e.status.reason = "succeeded (exit code 0)";
  } else {
    const RestartDecision d =
        decide_restart(exit, e.status.restarts, e.spec.max_restarts, e.spec.restart_on_exit_codes);
    e.status.reason = d.reason;
    if (d.restart) {
      e.status.state = WorkloadState::kRestarting;
      ++e.status.restarts;
    } else {
      e.status.state = WorkloadState::kFailed;
    }
  }
  e.exit_reason = e.status.reason;
  log_line(e, fmt::format("attempt {} ended at {}: {}", e.status.attempts, utc(e.status.ended),
                          e.status.reason));
  save(e);
}

void LocalSupervisor::stop(Entry& e, Stopping why, double grace_s) {
  e.stopping = why;
  e.stop_deadline = now_s() + grace_s;
  // SIGTERM to the workers (not the shells and mpirun that wait on them), so a training
  // can save; SIGKILL to everything after the grace period.
  signal_session_workers(static_cast<pid_t>(e.status.pid), SIGTERM, e.spec.nproc > 1);
  log_line(e, fmt::format("sending SIGTERM ({}); SIGKILL to every process in {} s",
                          why == Stopping::kPreempt ? "preempted" : "deleted", grace_s));
}

void LocalSupervisor::handle_deletes() {
  for (auto& [name, e] : entries_) {
    if (e.status.state == WorkloadState::kDeleted) continue;
    const std::optional<double> grace = store_.delete_requested(cluster_, name);
    if (!grace) continue;
    if (e.status.pid > 0) {
      if (e.stopping != Stopping::kDelete) stop(e, Stopping::kDelete, *grace);
      continue;
    }
    e.status.state = WorkloadState::kDeleted;
    e.status.queue_position = 0;
    e.status.reason = e.status.attempts == 0 ? "deleted before it started" : "deleted";
    log_line(e, e.status.reason);
    save(e);
  }
}

void LocalSupervisor::enforce_deadlines() {
  const double now = now_s();
  for (auto& [name, e] : entries_)
    if (e.stopping != Stopping::kNo && !e.killed && now >= e.stop_deadline && e.status.pid > 0) {
      e.killed = true;
      signal_session(static_cast<pid_t>(e.status.pid), SIGKILL);
      log_line(e, "grace period over: SIGKILL to every process");
    }
}

void LocalSupervisor::plan_and_launch() {
  std::vector<RunningWork> running;
  std::vector<WaitingWork> waiting;
  std::vector<Entry*> by_id;
  for (auto& [name, e] : entries_) {
    const int id = static_cast<int>(by_id.size());
    by_id.push_back(&e);
    if (e.status.pid > 0)
      running.push_back({id, name, e.spec.priority, e.status.cpus, e.status.started,
                         e.stopping != Stopping::kNo});
    else if (is_waiting(e.status.state))
      waiting.push_back({id, name, e.spec.priority, e.spec.cores(), e.spec.sequence});
  }
  const SchedulePlan plan = schedule(spec_.cores, running, waiting);
  for (int id : plan.preempt) {
    Entry& victim = *by_id[static_cast<size_t>(id)];
    // The waiting workload this makes room for: the first one the plan keeps waiting.
    victim.preempted_by = plan.waits.empty()
                              ? std::string("work")
                              : by_id[static_cast<size_t>(plan.waits.front().id)]->spec.name;
    stop(victim, Stopping::kPreempt, victim.spec.grace_s);
  }
  for (const SchedulePlan::Wait& w : plan.waits) {
    Entry& e = *by_id[static_cast<size_t>(w.id)];
    e.status.queue_position = w.position;
    // Why it stopped (a failure, a preemption) stays in front of why it waits.
    e.status.reason = e.status.state == WorkloadState::kQueued || e.exit_reason.empty()
                          ? w.reason
                          : e.exit_reason + "; now " + w.reason;
    save(e);
  }
  for (const SchedulePlan::Start& s : plan.starts)
    launch(*by_id[static_cast<size_t>(s.id)], s.cpus);
}

void LocalSupervisor::launch(Entry& e, const std::vector<int>& cpus) {
  const WorkloadSpec& w = e.spec;
  SpawnOptions o;
  const std::vector<std::string> shell = {"/bin/sh", "-c", w.command};
  if (w.nproc > 1) {
    dist::MpirunOptions m;
    m.nproc = w.nproc;
    m.threads_per_rank = w.cores_per_rank;
    m.allow_root = ::geteuid() == 0;
    m.bind_to_cores = false;  // the session's affinity confines the ranks to `cpus`
    o.argv = dist::mpirun_command(m, static_cast<int>(cpus.size()), shell);
  } else {
    o.argv = shell;
  }
  // When a rank dies, mpirun by default waits 1 s between its SIGTERM and SIGKILL to the
  // other ranks before it exits: a second added to every restart. Deletes and
  // preemptions signal every process of the session directly, so nothing needs it.
  o.env = {{"OMPI_MCA_odls_base_sigkill_timeout", "0"},
           {"HYPERION_THREADS", std::to_string(w.cores_per_rank)},
           {"OMP_NUM_THREADS", std::to_string(w.cores_per_rank)},
           {"HYPERION_CLUSTER", cluster_},
           {"HYPERION_WORKLOAD", w.name},
           {"HYPERION_ATTEMPT", std::to_string(e.status.attempts + 1)}};
  o.env.insert(o.env.end(), w.env.begin(), w.env.end());
  // Last, so a workload's --env cannot replace it.
  const std::string token = new_session_token();
  o.env.emplace_back(kSessionTokenEnv, token);
  o.workdir = w.workdir;
  o.log_path = store_.output_log(cluster_, w.name);
  o.cpus = cpus;
  ++e.status.attempts;
  log_line(e,
           fmt::format("attempt {} starting at {} on cores {} ({} rank{}): {}", e.status.attempts,
                       utc(now_s()), cpu_list(cpus), w.nproc, w.nproc == 1 ? "" : "s", w.command));
  try {
    e.status.pid = spawn_session(o);
    e.status.pid_start_ticks = process_start_ticks(static_cast<pid_t>(e.status.pid));
    e.status.boot_id = current_boot_id();
    e.status.session_token = token;
  } catch (const Error& err) {
    e.status.state = WorkloadState::kFailed;
    e.status.reason = fmt::format("could not start: {}", err.what());
    log_line(e, e.status.reason);
    save(e);
    return;
  }
  e.status.state = WorkloadState::kRunning;
  e.status.cpus = cpus;
  e.status.started = now_s();
  e.status.queue_position = 0;
  e.status.reason =
      fmt::format("running attempt {} on cores {}", e.status.attempts, cpu_list(cpus));
  save(e);
}

void LocalSupervisor::tick() {
  reap();
  refresh();
  handle_deletes();
  enforce_deadlines();
  plan_and_launch();
}

void LocalSupervisor::shutdown(const std::atomic<int>& signals) {
  for (auto& [name, e] : entries_)
    if (e.status.pid > 0 && e.stopping == Stopping::kNo)
      stop(e, Stopping::kShutdown, e.spec.grace_s);
  bool forced = false;
  for (;;) {
    if (!forced && signals.load() >= 2) {
      forced = true;
      log_warn("supervisor: second signal: killing every workload now");
      for (auto& [name, e] : entries_)
        if (e.status.pid > 0) e.stop_deadline = 0;
    }
    reap();
    enforce_deadlines();
    bool any = false;
    for (auto& [name, e] : entries_) any = any || e.status.pid > 0;
    if (!any) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& [name, e] : entries_)
    if (!is_final(e.status.state)) {
      e.status.state = WorkloadState::kDeleted;
      e.status.reason = "deleted with its cluster";
      save(e);
    }
}

void LocalSupervisor::run(const std::atomic<int>& signals, double poll_s) {
  become_subreaper();
  log_info("supervisor: cluster {} ({} cores), pid {}", cluster_, spec_.cores, ::getpid());
  while (signals.load() == 0) {
    try {
      tick();
      warned_.forget("tick");
    } catch (const std::exception& e) {
      if (warned_("tick", e.what())) log_warn("supervisor: {}", e.what());
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_s));
  }
  log_info("supervisor: stopping every workload of cluster {} (a second signal kills them now)",
           cluster_);
  shutdown(signals);
}

namespace {

std::atomic<int> g_signals{0};
void on_stop_signal(int) {
  g_signals.fetch_add(1);
}

std::string lock_path(const ClusterStore& store, const std::string& cluster) {
  return store.cluster_dir(cluster) + "/supervisor.lock";
}

}  // namespace

bool run_local_supervisor(const ClusterStore& store, const std::string& cluster) {
  const std::string path = lock_path(store, cluster);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  HYP_CHECK(fd >= 0, "supervisor: cannot open {}: {}", path, std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return false;
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  (void)!::ftruncate(fd, 0);
  (void)!::pwrite(fd, pid.data(), pid.size(), 0);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  LocalSupervisor sup(store, cluster);
  sup.run(g_signals);
  ::close(fd);  // releases the lock
  return true;
}

bool supervisor_alive(const ClusterStore& store, const std::string& cluster) {
  const int fd = ::open(lock_path(store, cluster).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
  ::close(fd);
  return held;
}

void start_supervisor(const ClusterStore& store, const std::string& cluster,
                      const std::string& self_exe) {
  SpawnOptions o;
  o.argv = {self_exe, "cluster", "supervise", "--cluster", cluster};
  o.env = {{"HYPERION_HOME", std::filesystem::path(store.root()).parent_path().string()}};
  o.workdir.assign(1, '/');  // (not `= "/"`: GCC 12 -Wrestrict false positive)
  o.log_path = store.cluster_dir(cluster) + "/supervisor.log";
  // A session of its own: the shell that ran `cluster create` can close.
  const pid_t pid = spawn_session(o);
  for (int i = 0; i < 200; ++i) {
    if (supervisor_alive(store, cluster)) return;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  fail("cluster {}: the supervisor did not start; see {}", cluster, o.log_path);
}

bool stop_supervisor(const ClusterStore& store, const std::string& cluster, double timeout_s) {
  std::ifstream in(lock_path(store, cluster));
  long pid = 0;
  in >> pid;
  if (pid > 0 && supervisor_alive(store, cluster)) ::kill(static_cast<pid_t>(pid), SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (supervisor_alive(store, cluster)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

}  // namespace hyperion::launch
