#include "cli/mpirun_supervisor.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "base/exit_codes.h"
#include "base/log.h"
#include "monitor/event_log.h"
#include "train/rank_heartbeat.h"

namespace hyperion::cli {

namespace {

volatile sig_atomic_t g_child = 0;
constexpr double kAbortGraceS = 10.0;

// Async-signal-safe: a stop for the job goes to mpirun, which passes it to every rank
// (each saves and stops, as under a single-host mpirun).
void forward(int sig) {
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), sig);
}

}  // namespace

int supervise_mpirun(const std::vector<std::string>& cmd, const std::string& launch_dir,
                     int world) {
  std::error_code ec;
  std::filesystem::create_directories(launch_dir, ec);
  HYP_CHECK(!ec, "train --hosts: cannot make the launch directory {}: {}", launch_dir,
            ec.message());
  ::setenv(kLaunchDirEnv, launch_dir.c_str(), 1);
  std::vector<std::string> args = cmd;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  struct sigaction sa {}, old_int {}, old_term {};
  sa.sa_handler = forward;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr,
                 "hyperion: train: cannot run mpirun (%s); install openmpi-bin (scripts/setup.sh)\n",
                 std::strerror(errno));
    std::_Exit(127);
  }
  HYP_CHECK(pid > 0, "train --hosts: fork failed: {}", std::strerror(errno));
  g_child = pid;
  int status = 0;
  // mpirun normally ends the job within seconds of a rank's MPI_Abort; a host that is
  // stopped or cut off never acknowledges, and mpirun would wait for it forever. So once
  // a rank has aborted, mpirun has kAbortGraceS seconds, then is killed (SIGKILL: Open
  // MPI 4.1's mpirun can crash on SIGTERM in that state). The job's end is bounded by
  // collective_timeout_s + 3 s (the aborting rank's diagnosis) + kAbortGraceS.
  double aborted_at = 0;
  bool killed = false;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    ::usleep(200 * 1000);
    const double now = monitor::unix_time();
    if (aborted_at == 0) {
      if (std::filesystem::exists(launch_dir + "/" + kAbortedMarker, ec)) aborted_at = now;
    } else if (!killed && now - aborted_at > kAbortGraceS) {
      log_error(
          "train: mpirun has not ended the job {:.0f} s after a rank aborted it (a host that "
          "does not answer); killing mpirun",
          kAbortGraceS);
      ::kill(pid, SIGKILL);
      killed = true;
    }
  }
  g_child = 0;
  const double ended = monitor::unix_time();
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  // Killed here: a host did not answer the abort, a system failure (restartable), not
  // "stopped by a signal".
  int code = killed              ? kExitSystemFailure
             : WIFEXITED(status) ? WEXITSTATUS(status)
                                 : 128 + WTERMSIG(status);
  if (code != 0) {
    const std::string lost = diagnose_lost_ranks(read_rank_status(launch_dir), world, ended);
    if (!lost.empty()) {
      log_error("train: the job ended (mpirun exit status {}): {}", code, lost);
      // Ranks gone with their host, and none ended the job itself: the machine failed,
      // not the job. When a rank did abort (an error it met, or a peer it found dead),
      // its own exit code stands: mpirun passes it on.
      if (!std::filesystem::exists(launch_dir + "/" + kAbortedMarker, ec))
        code = kExitSystemFailure;
    }
  }
  std::filesystem::remove_all(launch_dir, ec);
  std::filesystem::remove(std::filesystem::path(launch_dir).parent_path(), ec);  // if empty
  return code;
}

}  // namespace hyperion::cli
