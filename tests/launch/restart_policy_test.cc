#include "launch/restart_policy.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace hyperion::launch {
namespace {

ExitInfo exited(int code) {
  return {code, 0};
}

TEST(RestartPolicy, SystemFailuresAreSignals42And128To255) {
  EXPECT_TRUE(is_system_failure(42));
  EXPECT_TRUE(is_system_failure(128));
  EXPECT_TRUE(is_system_failure(137));
  EXPECT_TRUE(is_system_failure(255));
  EXPECT_FALSE(is_system_failure(1));
  EXPECT_FALSE(is_system_failure(2));
  EXPECT_FALSE(is_system_failure(127));
}

TEST(RestartPolicy, RestartsSystemFailuresUpToTheLimit) {
  const ExitInfo killed{137, SIGKILL};
  RestartDecision d = decide_restart(killed, 0, 2, {});
  EXPECT_TRUE(d.restart);
  EXPECT_EQ(d.reason, "killed by SIGKILL (137): a system failure; restart 1 of 2");
  d = decide_restart(exited(42), 1, 2, {});
  EXPECT_TRUE(d.restart);
  d = decide_restart(exited(137), 2, 2, {});
  EXPECT_FALSE(d.restart);
  EXPECT_NE(d.reason.find("restarted 2 of 2 times (--max-restarts 2)"), std::string::npos)
      << d.reason;
  EXPECT_NE(d.reason.find("a rank killed by SIGKILL"), std::string::npos) << d.reason;
}

TEST(RestartPolicy, UserErrorsOnlyWhenListed) {
  RestartDecision d = decide_restart(exited(1), 0, 5, {});
  EXPECT_FALSE(d.restart);
  EXPECT_NE(d.reason.find("exit code 1: a user error, not restarted"), std::string::npos)
      << d.reason;
  EXPECT_NE(d.reason.find("--restart-on-exit-codes 1"), std::string::npos);
  d = decide_restart(exited(1), 0, 5, {3, 1});
  EXPECT_TRUE(d.restart);
  EXPECT_EQ(decide_restart(exited(0), 0, 5, {}).restart, false);
}

TEST(RestartPolicy, ExitInfoFromRealProcesses) {
  const pid_t a = fork();
  if (a == 0) _exit(3);
  int status = 0;
  waitpid(a, &status, 0);
  EXPECT_EQ(ExitInfo::from_wait_status(status).code, 3);
  const pid_t b = fork();
  if (b == 0) {
    pause();
    _exit(0);
  }
  kill(b, SIGKILL);
  waitpid(b, &status, 0);
  const ExitInfo k = ExitInfo::from_wait_status(status);
  EXPECT_EQ(k.signal, SIGKILL);
  EXPECT_EQ(k.code, 137);
  EXPECT_EQ(k.describe(), "killed by SIGKILL (137)");
}

}  // namespace
}  // namespace hyperion::launch
