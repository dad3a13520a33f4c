#include "launch/process_session.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "../test_files.h"
#include "base/error.h"

namespace hyperion::launch {
namespace {

using testing_util::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

template <typename Fn>
bool eventually(Fn&& fn, double seconds = 20) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (fn()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return fn();
}

// A session holds the leader, its children and a grandchild that moved to a process
// group of its own (as Open MPI's ranks do); signal_session reaches every one.
TEST(ProcessSession, EnvAffinityLogAndEveryMemberSignalled) {
  TempDir tmp;
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c",
            "echo \"FOO=$FOO\"; grep Cpus_allowed_list /proc/self/status; pwd; "
            "python3 -c 'import os, time; os.setpgid(0, 0); time.sleep(100)' & sleep 100"};
  o.env = {{"FOO", "bar baz"}};
  o.workdir = tmp.path.string();
  o.log_path = tmp.file("out.log");
  o.cpus = {0};
  const pid_t pid = spawn_session(o);
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(eventually([&] { return session_processes(pid).size() >= 3; }))
      << session_processes(pid).size();
  EXPECT_TRUE(
      eventually([&] { return slurp(o.log_path).find(tmp.path.string()) != std::string::npos; }));
  const std::string log = slurp(o.log_path);
  EXPECT_NE(log.find("FOO=bar baz"), std::string::npos) << log;
  EXPECT_NE(log.find("Cpus_allowed_list:\t0\n"), std::string::npos) << log;
  EXPECT_EQ(getsid(pid), pid);
  EXPECT_GE(signal_session(pid, SIGKILL), 3);
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(eventually([&] { return session_processes(pid).empty(); }));
}

// A descriptor of the caller (here a pipe without O_CLOEXEC, in real life a lock a shell
// holds) is not inherited by the session.
TEST(ProcessSession, CallersDescriptorsAreNotInherited) {
  TempDir tmp;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "ls /proc/$$/fd | tr '\\n' ' '"};
  o.log_path = tmp.file("out.log");
  const pid_t pid = spawn_session(o);
  int status = 0;
  waitpid(pid, &status, 0);
  ::close(fds[0]);
  ::close(fds[1]);
  // fmt rather than `" " + ...` chains: GCC 12 -Wrestrict misfires on those.
  const std::string listed = fmt::format(" {}", slurp(o.log_path));
  EXPECT_NE(listed.find(" 2 "), std::string::npos) << listed;
  EXPECT_EQ(listed.find(fmt::format(" {} ", fds[0])), std::string::npos) << listed;
  EXPECT_EQ(listed.find(fmt::format(" {} ", fds[1])), std::string::npos) << listed;
}

TEST(ProcessSession, BadWorkdirOrCommandExits127WithAReason) {
  TempDir tmp;
  SpawnOptions o;
  o.argv = {"/bin/true"};
  o.workdir = tmp.file("missing");
  o.log_path = tmp.file("out.log");
  int status = 0;
  pid_t pid = spawn_session(o);
  waitpid(pid, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 127);
  EXPECT_NE(slurp(o.log_path).find("cannot enter the working directory: " + o.workdir),
            std::string::npos);
  o.workdir.clear();
  o.argv = {"/nonexistent/program"};
  pid = spawn_session(o);
  waitpid(pid, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 127);
  EXPECT_NE(slurp(o.log_path).find("cannot run: /nonexistent/program"), std::string::npos);
  o.log_path = tmp.file("no/such/dir/log");
  testing_util::expect_error([&] { spawn_session(o); }, {o.log_path});
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A pid read back from a status file is signalled only while it is still the process that
// was recorded: same boot, same start time (issue 18's supervisor restarts; pid reuse).
TEST(ProcessSession, RecordedProcessIsMatchedByBootAndStartTime) {
  TempDir tmp;
  SpawnOptions o;
  o.argv = {"sleep", "30"};
  o.log_path = tmp.file("out.log");
  const pid_t pid = spawn_session(o);
  ASSERT_GT(pid, 0);
  // The child calls setsid() after spawn_session returns here; on a loaded machine it may
  // not have yet, and its session would have no member to signal.
  for (int i = 0; i < 1000 && ::getsid(pid) != pid; ++i) ::usleep(10 * 1000);
  ASSERT_EQ(::getsid(pid), pid);
  const uint64_t ticks = process_start_ticks(pid);
  const std::string boot = current_boot_id();
  EXPECT_GT(ticks, 0u);
  EXPECT_FALSE(boot.empty());
  EXPECT_TRUE(is_recorded_process(pid, ticks, boot, 0));
  EXPECT_FALSE(is_recorded_process(pid, ticks + 1, boot, 0));  // the pid was reused
  EXPECT_FALSE(is_recorded_process(pid, ticks, "other-boot", 0));  // recorded before a reboot
  EXPECT_FALSE(is_recorded_process(0, ticks, boot, 0));
  // A record from before the ticks were kept: the wall-clock start decides.
  EXPECT_TRUE(is_recorded_process(pid, 0, "", wall_now()));
  EXPECT_FALSE(is_recorded_process(pid, 0, "", wall_now() - 3600));
  EXPECT_FALSE(is_recorded_process(pid, 0, "", 0));
  // Another process's identity: nothing is signalled and the child lives on.
  int status = 0;
  EXPECT_EQ(signal_recorded_session(pid, ticks + 1, boot, 0, SIGKILL), 0);
  EXPECT_EQ(signal_recorded_session(pid, ticks, "other-boot", 0, SIGKILL), 0);
  EXPECT_EQ(signal_recorded_session(pid, 0, "", wall_now() - 3600, SIGKILL), 0);
  EXPECT_EQ(::kill(pid, 0), 0);
  EXPECT_EQ(waitpid(pid, &status, WNOHANG), 0);
  // Its own identity: killed.
  EXPECT_GE(signal_recorded_session(pid, ticks, boot, 0, SIGKILL), 1);
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  // Reaped: no such process any more, so no record matches it.
  EXPECT_EQ(process_start_ticks(pid), 0u);
  EXPECT_FALSE(is_recorded_process(pid, ticks, boot, 0));
  EXPECT_EQ(signal_recorded_session(pid, ticks, boot, 0, SIGKILL), 0);
  EXPECT_EQ(process_start_ticks(0), 0u);
}

// A key given twice in SpawnOptions::env (the supervisor's defaults, then the workload's
// --env): the child sees the later value only, also over one it would inherit.
TEST(ProcessSession, DuplicateEnvKeyPassesTheLaterValueOnly) {
  TempDir tmp;
  ASSERT_EQ(::setenv("HYP_TEST_INHERITED", "parent", 1), 0);
  SpawnOptions o;
  o.argv = {"/usr/bin/env"};
  o.env = {{"HYP_TEST_DUP", "a"},
           {"HYP_TEST_INHERITED", "first"},
           {"HYP_TEST_DUP", "b"},
           {"HYP_TEST_INHERITED", "second"}};
  o.log_path = tmp.file("out.log");
  const pid_t pid = spawn_session(o);
  ::unsetenv("HYP_TEST_INHERITED");
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::string listed = fmt::format("\n{}", slurp(o.log_path));
  const auto count = [&](const std::string& needle) {
    int n = 0;
    for (size_t at = listed.find(needle); at != std::string::npos;
         at = listed.find(needle, at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(count("\nHYP_TEST_DUP="), 1) << listed;
  EXPECT_EQ(count("\nHYP_TEST_DUP=b\n"), 1) << listed;
  EXPECT_EQ(count("\nHYP_TEST_INHERITED="), 1) << listed;
  EXPECT_EQ(count("\nHYP_TEST_INHERITED=second\n"), 1) << listed;
}

// A session whose leader has exited while its children live on (a shell that started a
// job in the background, mpirun killed before its ranks): read back from a record, its
// members are found by the token in their environment, and only they are signalled.
TEST(ProcessSession, ASessionWhoseLeaderExitedIsSignalledByItsToken) {
  TempDir tmp;
  SpawnOptions o;
  const std::string token = new_session_token();
  EXPECT_EQ(token.size(), 32u);
  EXPECT_NE(token, new_session_token());
  o.argv = {"/bin/sh", "-c", "sleep 100 & echo started"};
  o.env = {{kSessionTokenEnv, token}};
  o.log_path = tmp.file("out.log");
  const pid_t pid = spawn_session(o);
  ASSERT_GT(pid, 0);
  for (int i = 0; i < 1000 && ::getsid(pid) != pid; ++i) ::usleep(10 * 1000);
  const uint64_t ticks = process_start_ticks(pid);
  const std::string boot = current_boot_id();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);  // the leader is gone
  ASSERT_TRUE(eventually([&] { return session_processes(pid).size() == 1; }))
      << session_processes(pid).size();
  EXPECT_EQ(session_processes_with_token(pid, token), session_processes(pid));
  // Without the token, with another one, or from another boot: nothing is signalled.
  EXPECT_EQ(signal_recorded_session(pid, ticks, boot, 0, SIGKILL), 0);
  EXPECT_EQ(signal_recorded_session(pid, ticks, boot, 0, SIGKILL, new_session_token()), 0);
  EXPECT_EQ(signal_recorded_session(pid, ticks, "other-boot", 0, SIGKILL, token), 0);
  EXPECT_EQ(session_processes(pid).size(), 1u);
  // With it: the orphan is killed.
  EXPECT_EQ(signal_recorded_session(pid, ticks, boot, 0, SIGKILL, token), 1);
  EXPECT_TRUE(eventually([&] { return session_processes(pid).empty(); }));
}

}  // namespace
}  // namespace hyperion::launch
