// The local supervisor (launch/local_supervisor.h) driven in-process, one tick() at a
// time, on a cluster in a temporary directory; and `hyperion cluster supervise` (the real
// detached process) for its shutdown on signals.
#include "launch/local_supervisor.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "base/log.h"
#include "launch/cluster_store.h"
#include "launch/process_session.h"

namespace hyperion::launch {
namespace {

namespace fs = std::filesystem;
using testing_util::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int occurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++n;
  return n;
}

template <typename Fn>
bool eventually(Fn&& fn, double seconds = 60) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (fn()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return fn();
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Warnings reach stderr for the length of a test (another test may have raised the level).
struct WarningsShown {
  LogLevel saved = log_level();
  WarningsShown() {
    if (saved > LogLevel::kWarn) set_log_level(LogLevel::kWarn);
  }
  ~WarningsShown() { set_log_level(saved); }
};

// A one-core local cluster "dev" under a temporary directory, with no supervisor process:
// the tests construct LocalSupervisor themselves.
struct Cluster {
  TempDir tmp;
  ClusterStore store{tmp.file("clusters")};
  Cluster() {
    ClusterSpec c;
    c.name = "dev";
    c.cores = 1;
    c.created = wall_now();
    store.save_cluster(c);
  }
  void submit(const std::string& name, const std::string& command, double grace_s = 30) const {
    WorkloadSpec w;
    w.name = name;
    w.cluster = "dev";
    w.command = command;
    w.workdir = tmp.path.string();
    w.grace_s = grace_s;
    w.created = wall_now();
    w.sequence = store.next_sequence("dev");
    store.save_spec(w);
  }
  WorkloadState state(const std::string& name) const {
    try {
      return store.load_status("dev", name).state;
    } catch (const Error&) {
      return WorkloadState::kQueued;
    }
  }
};

// Replaces a file with new content as a new file (another inode), like an editor or an
// atomic writer would.
void replace_file(const std::string& path, const std::string& content) {
  testing_util::write_bytes(path + ".new", content);
  fs::rename(path + ".new", path);
}

// A workload whose files cannot be read is skipped with a warning: once per version of
// its files, not on every poll (10 a second, for as long as the file stays damaged).
TEST(LocalSupervisor, DamagedWorkloadFilesAreWarnedOncePerVersion) {
  WarningsShown shown;
  Cluster cl;
  const std::string dir = cl.store.workload_dir("dev", "broken");
  fs::create_directories(dir);
  testing_util::write_bytes(dir + "/spec.json", "{\"name\": ");
  LocalSupervisor sup(cl.store, "dev");

  testing::internal::CaptureStderr();
  for (int i = 0; i < 20; ++i) sup.tick();
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(occurrences(err, "skipped"), 1) << err;
  EXPECT_NE(err.find("workload broken skipped"), std::string::npos) << err;

  // Damaged differently: one warning more, then quiet again.
  replace_file(dir + "/spec.json", "not json at all");
  testing::internal::CaptureStderr();
  for (int i = 0; i < 20; ++i) sup.tick();
  err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(occurrences(err, "skipped"), 1) << err;

  // A good spec with a damaged status.json: skipped too (never started), warned once.
  cl.submit("broken", "true");
  testing_util::write_bytes(dir + "/status.json", "{\"state\": ");
  testing::internal::CaptureStderr();
  for (int i = 0; i < 20; ++i) sup.tick();
  err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(occurrences(err, "skipped"), 1) << err;
  EXPECT_NE(err.find("status.json"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(cl.store.output_log("dev", "broken")));

  // Repaired (the status removed): it runs.
  fs::remove(dir + "/status.json");
  EXPECT_TRUE(eventually([&] {
    sup.tick();
    return cl.state("broken") == WorkloadState::kSucceeded;
  }));
}

// A supervisor that finds a workload "running" under a supervisor that is gone stops that
// attempt, but only while the recorded pid is still that attempt's process: a pid reused
// by an unrelated process, or recorded before a reboot, is left alone.
TEST(LocalSupervisor, RunningRecordOfAnotherProcessIsNotSignalled) {
  WarningsShown shown;
  Cluster cl;
  SpawnOptions o;
  o.argv = {"sleep", "30"};
  o.log_path = cl.tmp.file("bystander.log");
  const pid_t bystander = spawn_session(o);
  ASSERT_GT(bystander, 0);
  const uint64_t ticks = process_start_ticks(bystander);
  ASSERT_GT(ticks, 0u);
  struct Record {
    const char* workload;
    uint64_t ticks;
    std::string boot_id;
    double started;
  };
  const std::vector<Record> records = {
      {"reused", ticks + 1, current_boot_id(), wall_now()},  // same pid, other process
      {"rebooted", ticks, "other-boot", wall_now()},          // recorded in another boot
      {"legacy", 0, "", wall_now() - 3600},  // no ticks recorded; started an hour ago
  };
  for (const Record& r : records) {
    cl.submit(r.workload, "true");
    WorkloadStatus s;
    s.state = WorkloadState::kRunning;
    s.attempts = 1;
    s.pid = bystander;
    s.pid_start_ticks = r.ticks;
    s.boot_id = r.boot_id;
    s.started = r.started;
    s.cpus = {0};
    cl.store.save_status("dev", r.workload, s);
  }
  LocalSupervisor sup(cl.store, "dev");
  testing::internal::CaptureStderr();
  sup.tick();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(occurrences(err, fmt::format("pid {} is no longer its process; not signalled",
                                         bystander)),
            3)
      << err;
  int status = 0;
  EXPECT_EQ(waitpid(bystander, &status, WNOHANG), 0) << "the unrelated process was killed";
  EXPECT_EQ(::kill(bystander, 0), 0);
  // The workloads themselves are requeued and run again.
  for (const Record& r : records)
    EXPECT_TRUE(eventually([&] {
      sup.tick();
      return cl.state(r.workload) == WorkloadState::kSucceeded;
    })) << r.workload;
  EXPECT_EQ(waitpid(bystander, &status, WNOHANG), 0) << "the unrelated process was killed";
  ::kill(bystander, SIGKILL);
  EXPECT_EQ(waitpid(bystander, &status, 0), bystander);
}

// The counterpart: a recorded attempt that is still its process (by its start ticks, or,
// for a record without them, by its wall-clock start) is killed, and the workload requeued.
TEST(LocalSupervisor, RunningRecordOfItsOwnProcessIsStopped) {
  Cluster cl;
  std::vector<pid_t> attempts;
  for (const char* name : {"recorded", "legacy"}) {
    SpawnOptions o;
    o.argv = {"sleep", "30"};
    o.log_path = cl.tmp.file(std::string(name) + ".log");
    const pid_t pid = spawn_session(o);
    ASSERT_GT(pid, 0);
    attempts.push_back(pid);
    cl.submit(name, "true");
    WorkloadStatus s;
    s.state = WorkloadState::kRunning;
    s.attempts = 1;
    s.pid = pid;
    const bool legacy = std::string(name) == "legacy";
    s.pid_start_ticks = legacy ? 0 : process_start_ticks(pid);
    s.boot_id = legacy ? "" : current_boot_id();
    s.started = wall_now();
    s.cpus = {0};
    cl.store.save_status("dev", name, s);
  }
  LocalSupervisor sup(cl.store, "dev");
  sup.tick();
  for (pid_t pid : attempts) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status));
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
  }
  for (const char* name : {"recorded", "legacy"})
    EXPECT_TRUE(eventually([&] {
      sup.tick();
      return cl.state(name) == WorkloadState::kSucceeded;
    })) << name;
}

// `hyperion cluster supervise` on SIGTERM stops its workloads politely (SIGTERM, SIGKILL
// after the grace period); a second SIGTERM kills them at once instead of waiting out a
// grace period of an hour.
TEST(LocalSupervisor, SecondSignalKillsEveryWorkloadAtOnce) {
  Cluster cl;
  cl.submit("stubborn", "trap '' TERM; sleep 300 & wait", 3600);
  SpawnOptions o;
  o.argv = {HYPERION_CLI_PATH, "cluster", "supervise", "--cluster", "dev"};
  o.env = {{"HYPERION_HOME", cl.tmp.path.string()}, {"HYPERION_LOG", "info"}};
  o.log_path = cl.store.cluster_dir("dev") + "/supervisor.log";
  const pid_t sup = spawn_session(o);
  ASSERT_GT(sup, 0);
  pid_t sid = 0;
  bool exited = false;
  int status = 0;
  const auto supervisor_exited = [&] {
    if (!exited && waitpid(sup, &status, WNOHANG) == sup) exited = true;
    return exited;
  };
  EXPECT_TRUE(eventually([&] {
    try {
      const WorkloadStatus s = cl.store.load_status("dev", "stubborn");
      if (s.state == WorkloadState::kRunning && s.pid > 0) sid = static_cast<pid_t>(s.pid);
    } catch (const Error&) {
    }
    return sid > 0 || supervisor_exited();
  })) << slurp(o.log_path);
  EXPECT_GT(sid, 0) << slurp(o.log_path);
  if (sid > 0 && !exited) {
    const std::string output = cl.store.output_log("dev", "stubborn");
    EXPECT_TRUE(eventually([&] { return session_processes(sid).size() >= 2; }));
    ::kill(sup, SIGTERM);
    EXPECT_TRUE(eventually([&] {
      return slurp(output).find("sending SIGTERM (deleted)") != std::string::npos;
    })) << slurp(output);
    // The workload ignores SIGTERM: the supervisor now waits out its grace period.
    EXPECT_FALSE(supervisor_exited()) << slurp(o.log_path);
    EXPECT_FALSE(session_processes(sid).empty());
    ::kill(sup, SIGTERM);
    EXPECT_TRUE(eventually(supervisor_exited, 120)) << slurp(o.log_path);
    EXPECT_NE(slurp(o.log_path).find("second signal"), std::string::npos) << slurp(o.log_path);
    EXPECT_TRUE(eventually([&] { return session_processes(sid).empty(); }));
    EXPECT_EQ(cl.state("stubborn"), WorkloadState::kDeleted);
  }
  if (!supervisor_exited()) {
    ::kill(sup, SIGKILL);
    waitpid(sup, &status, 0);
  } else {
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  if (sid > 0) signal_session(sid, SIGKILL);
}

}  // namespace
}  // namespace hyperion::launch
