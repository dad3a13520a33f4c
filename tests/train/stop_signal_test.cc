// SIGTERM to a training process (issue 18: a scheduler's preemption or delete): it
// finishes the step, saves a checkpoint there, exits with 143, and the same command
// resumes from that step and ends exactly where an unbroken run ends.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "../cli/cli_test_util.h"
#include "train/stop_signal.h"
#include "train_test_util.h"

extern char** environ;

namespace hyperion {
namespace {

std::vector<nlohmann::json> metrics(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line, nullptr, false));
  return out;
}

std::vector<std::string> train_args(const std::string& root, const std::string& run) {
  std::vector<std::string> args = {HYPERION_CLI_PATH, "--threads", "1", "train"};
  for (const std::string& o : testing_util::small_run_overrides(root, run, "float32", 1500))
    args.push_back(o);
  args.insert(args.end(), {"checkpoint_period=100000", "sample_count=0", "eval_batches=1"});
  return args;
}

TEST(StopSignal, SigtermSavesWhereItStoppedAndTheSameCommandResumes) {
  const std::string root = testing_util::process_temp_root("stop_signal");
  std::vector<std::string> args = train_args(root, "stopped");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, (root + "/stopped.out").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  // Past a few steps, well before the end (1500 steps; no periodic checkpoint).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (metrics(root + "/stopped").size() < 20 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  std::stringstream out;
  out << std::ifstream(root + "/stopped.out").rdbuf();
  ASSERT_TRUE(WIFEXITED(status)) << out.str();
  EXPECT_EQ(WEXITSTATUS(status), 143) << out.str();
  const std::vector<nlohmann::json> before = metrics(root + "/stopped");
  ASSERT_FALSE(before.empty());
  const int64_t stopped_at = before.back()["step"].get<int64_t>();
  EXPECT_LT(stopped_at, 1500);
  EXPECT_NE(out.str().find("stopping after step " + std::to_string(stopped_at) + " on SIGTERM"),
            std::string::npos)
      << out.str();
  EXPECT_TRUE(std::filesystem::exists(root + "/stopped/checkpoints/" + std::to_string(stopped_at)))
      << out.str();

  // The same command resumes there and ends where an unbroken run ends.
  std::string cmd;
  for (const std::string& a : train_args(root, "stopped")) cmd += " " + a;
  const testing_util::CliResult resumed = testing_util::run_shell(cmd + " 2>&1");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("checkpoints/" + std::to_string(stopped_at) + " at step " +
                             std::to_string(stopped_at)),
            std::string::npos)
      << resumed.out;
  cmd.clear();
  for (const std::string& a : train_args(root, "unbroken")) cmd += " " + a;
  const testing_util::CliResult unbroken = testing_util::run_shell(cmd + " 2>&1");
  ASSERT_EQ(unbroken.code, 0) << unbroken.out;
  EXPECT_EQ(metrics(root + "/stopped").back()["loss"], metrics(root + "/unbroken").back()["loss"]);
}

// The mechanism alone, in a child process: the first signal is recorded, the second ends
// the process by that signal; and a stop left unfinished ends by SIGALRM after the grace.
int run_child(const std::function<void()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(StopSignalScope, TheSecondSignalStopsAtOnce) {
  for (const int sig : {SIGINT, SIGTERM}) {
    const int status = run_child([sig] {
      StopSignalScope scope;
      ::raise(sig);
      if (stop_signal_received() != sig) ::_exit(3);  // the first is only recorded
      ::raise(sig);
      ::_exit(4);  // not reached: the second ends the process
    });
    ASSERT_TRUE(WIFSIGNALED(status)) << "signal " << sig << " status " << status;
    EXPECT_EQ(WTERMSIG(status), sig);
  }
}

TEST(StopSignalScope, AStopUnfinishedAfterTheGracePeriodEndsBySigalrm) {
  const int status = run_child([] {
    StopSignalScope scope(1);
    ::raise(SIGTERM);
    for (;;) ::pause();  // a step blocked on a dead peer
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGALRM);
}

TEST(StopSignalScope, ASaveIsNotCutByTheGraceAlarm) {
  const int status = run_child([] {
    StopSignalScope scope(1);
    ::raise(SIGTERM);
    stop_signal_saving();  // the step ended: a long save follows
    ::sleep(2);
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(StopSignalScope, NoAlarmWithoutASignal) {
  const int status = run_child([] {
    {
      StopSignalScope scope(1);
    }
    ::sleep(2);  // past the grace period: no alarm was armed
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(StopSignalScope, ASecondSignalDuringASaveRemovesTheUnfinishedCheckpoint) {
  const std::string root = testing_util::process_temp_root("stop_signal_saving");
  const std::string tmp = root + "/checkpoints/.tmp-7-123";
  const int status = run_child([&] {
    std::filesystem::create_directories(tmp);
    for (int i = 0; i < 300; ++i)  // more entries than one getdents64 buffer holds
      std::ofstream(tmp + "/part-" + std::to_string(i) + ".safetensors") << "half-written";
    StopSignalScope scope(60);
    ::raise(SIGTERM);  // the first: stop after the step, then save
    const SavingDirectory saving(tmp);
    ::raise(SIGTERM);  // the second, during the save: ends the process now
    ::_exit(0);        // not reached
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_FALSE(std::filesystem::exists(tmp));
  EXPECT_TRUE(std::filesystem::exists(root + "/checkpoints"));  // only the save's own
  // A second signal outside a save removes nothing.
  std::filesystem::create_directories(tmp);
  const int after = run_child([&] {
    StopSignalScope scope(60);
    { const SavingDirectory saving(tmp); }
    ::raise(SIGTERM);
    ::raise(SIGTERM);
    ::_exit(0);
  });
  ASSERT_TRUE(WIFSIGNALED(after)) << after;
  EXPECT_TRUE(std::filesystem::exists(tmp));
}

}  // namespace
}  // namespace hyperion
