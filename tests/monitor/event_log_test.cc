#include "monitor/event_log.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"

namespace hyperion::monitor {
namespace {

std::vector<nlohmann::json> lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string l;
  while (std::getline(in, l)) out.push_back(nlohmann::json::parse(l));
  return out;
}

TEST(EventLog, AppendsOneJsonLinePerEventAndCountsAttempts) {
  const std::string dir = testing::TempDir() + "event_log_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    EventLog log(dir, true);
    EXPECT_TRUE(log.was_empty());
    EXPECT_EQ(log.previous_attempts(), 0);
    log.write("process_start", "\"attempt\":1");
    log.write("step_end", "\"step\":3,\"data_wait_s\":0.25");
    EventLog other_rank(dir, false);
    other_rank.write("step_end", "\"step\":99");  // not the writer: dropped
    other_rank.write_any_rank("hang", "\"rank\":1");
  }
  auto l = lines(dir + "/events.jsonl");
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0]["event"], "process_start");
  EXPECT_EQ(l[0]["pid"], ::getpid());
  EXPECT_EQ(l[1]["step"], 3);
  EXPECT_DOUBLE_EQ(l[1]["data_wait_s"].get<double>(), 0.25);
  EXPECT_EQ(l[2]["event"], "hang");
  EXPECT_GE(l[1]["time"].get<double>(), l[0]["time"].get<double>());
  EventLog again(dir, true);
  EXPECT_FALSE(again.was_empty());
  EXPECT_EQ(again.previous_attempts(), 1);
}

TEST(EventLog, LaunchTimeIsThisProcesssStart) {
  const double launch = process_launch_time(), now = unix_time();
  EXPECT_LE(launch, now);
  EXPECT_GT(launch, now - 24 * 3600.0);  // a test process is younger than a day
}

// A process started now says so to the clock tick (10 ms), not to /proc/stat's whole
// seconds of boot time: a restarted rank must not seem to start before its predecessor
// died.
TEST(EventLog, LaunchTimeOfANewProcessIsToTheTick) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const double before = unix_time();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const double t[2] = {process_launch_time(), unix_time()};
    const bool ok = ::write(fds[1], t, sizeof t) == static_cast<ssize_t>(sizeof t);
    ::_exit(ok ? 0 : 1);
  }
  ::close(fds[1]);
  double t[2] = {0, 0};
  const ssize_t n = ::read(fds[0], t, sizeof t);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_EQ(n, static_cast<ssize_t>(sizeof t));
  EXPECT_GE(t[0], before - 0.02);  // one tick each way for rounding
  EXPECT_LE(t[0], t[1]);
}

TEST(EventLog, UnopenableFileNamesIt) {
  const std::string file = testing::TempDir() + "event_log_file_" + std::to_string(::getpid());
  std::ofstream(file) << "x";
  try {
    EventLog log(file + "/sub", true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyperion::monitor
