#include "launch/process_session.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <time.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "base/error.h"

extern char** environ;

namespace hyperion::launch {

namespace {

// Writes a message with write(2) only (after fork, before exec).
void child_say(int fd, const char* a, const char* b) {
  const char* parts[] = {"hyperion: ", a, b, "\n"};
  for (const char* p : parts)
    if (p) (void)!::write(fd, p, std::strlen(p));
}

}  // namespace

pid_t spawn_session(const SpawnOptions& o) {
  HYP_CHECK(!o.argv.empty(), "spawn: empty command");
  const int log = ::open(o.log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  HYP_CHECK(log >= 0, "workload log {}: cannot open: {}", o.log_path, std::strerror(errno));
  const int null_in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Everything the child needs is built before fork: after it, only async-signal-safe
  // calls until exec.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool overridden = false;
    for (const auto& [k, v] : o.env) overridden = overridden || k == key;
    if (!overridden) env_strings.push_back(kv);
  }
  // A key given twice in o.env: the later one wins (a workload's --env over the defaults
  // set before it), as setenv would have it.
  for (size_t i = 0; i < o.env.size(); ++i) {
    bool later = false;
    for (size_t j = i + 1; j < o.env.size(); ++j) later = later || o.env[j].first == o.env[i].first;
    if (!later) env_strings.push_back(o.env[i].first + "=" + o.env[i].second);
  }
  std::vector<char*> envp, argv;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = o.argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : o.cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  sigset_t all;
  sigemptyset(&all);

  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(log);
    if (null_in >= 0) ::close(null_in);
    fail("spawn: fork failed: {}", std::strerror(err));
  }
  if (pid == 0) {
    ::setsid();
    ::sigprocmask(SIG_SETMASK, &all, nullptr);
    for (int sig = 1; sig < NSIG; ++sig)
      if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
    ::dup2(log, 1);
    ::dup2(log, 2);
    if (null_in >= 0) ::dup2(null_in, 0);
    // Nothing else of ours leaks into the workload or the supervisor: a daemon that kept
    // a caller's descriptor (a lock held by the shell that started it, a pipe a test
    // reads to its end) would hold it for its whole life.
    ::close_range(3, ~0U, 0);
    if (!o.cpus.empty() && ::sched_setaffinity(0, sizeof set, &set) != 0)
      child_say(2, "cannot set the CPU affinity: ", std::strerror(errno));
    if (!o.workdir.empty() && ::chdir(o.workdir.c_str()) != 0) {
      child_say(2, "cannot enter the working directory: ", o.workdir.c_str());
      ::_exit(127);
    }
    ::execvpe(argv[0], argv.data(), envp.data());
    child_say(2, "cannot run: ", argv[0]);
    ::_exit(127);
  }
  ::close(log);
  if (null_in >= 0) ::close(null_in);
  return pid;
}

namespace {

struct Member {
  pid_t pid, ppid;
  std::string comm;
};

std::vector<Member> session_members(pid_t sid) {
  std::vector<Member> out;
  DIR* proc = ::opendir("/proc");
  if (!proc) return out;
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // "pid (comm) state ppid pgrp session ...": comm may hold spaces and ')'.
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close < open) continue;
    char state = 0;
    long ppid = 0, pgrp = 0, session = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %ld %ld %ld", &state, &ppid, &pgrp, &session) !=
        4)
      continue;
    if (session == sid && state != 'Z')
      out.push_back({static_cast<pid_t>(pid), static_cast<pid_t>(ppid),
                     line.substr(open + 1, close - open - 1)});
  }
  ::closedir(proc);
  return out;
}

}  // namespace

std::vector<pid_t> session_processes(pid_t sid) {
  std::vector<pid_t> out;
  for (const Member& m : session_members(sid)) out.push_back(m.pid);
  return out;
}

int signal_session_workers(pid_t sid, int sig, bool spare_leader) {
  const std::vector<Member> members = session_members(sid);
  int n = 0;
  for (const Member& m : members) {
    if (spare_leader && m.pid == sid) continue;
    const bool shell = m.comm == "sh" || m.comm == "dash" || m.comm == "bash";
    bool has_children = false;
    for (const Member& c : members) has_children = has_children || c.ppid == m.pid;
    if (shell && has_children) continue;
    if (::kill(m.pid, sig) == 0) ++n;
  }
  return n;
}

int signal_session(pid_t sid, int sig) {
  int n = 0;
  for (pid_t p : session_processes(sid))
    if (::kill(p, sig) == 0) ++n;
  return n;
}

uint64_t process_start_ticks(pid_t pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return 0;
  // After "(comm)" (which may hold spaces and ')'): field 3 onwards; start time is 22.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  const char* p = line.c_str() + close + 1;
  for (int field = 3; field < 22; ++field) {
    while (*p == ' ') ++p;
    while (*p != ' ' && *p != '\0') ++p;
  }
  return std::strtoull(p, nullptr, 10);
}

std::string current_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

bool is_recorded_process(pid_t sid, uint64_t start_ticks, const std::string& boot_id,
                         double started) {
  if (sid <= 0) return false;
  const uint64_t now_ticks = process_start_ticks(sid);
  if (now_ticks == 0) return false;  // the leader is gone: nothing proves the session is it
  if (start_ticks != 0) return boot_id == current_boot_id() && now_ticks == start_ticks;
  // A record from before the ticks were kept: the leader's start, as wall-clock time,
  // within 2 s of the recorded start.
  const long hz = ::sysconf(_SC_CLK_TCK);
  timespec boot{}, real{};
  if (started <= 0 || hz <= 0 || ::clock_gettime(CLOCK_BOOTTIME, &boot) != 0 ||
      ::clock_gettime(CLOCK_REALTIME, &real) != 0)
    return false;
  const double since_boot = double(boot.tv_sec) + 1e-9 * double(boot.tv_nsec);
  const double now = double(real.tv_sec) + 1e-9 * double(real.tv_nsec);
  const double leader_started = now - (since_boot - double(now_ticks) / double(hz));
  return std::abs(leader_started - started) < 2.0;
}

std::string new_session_token() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
}

std::vector<pid_t> session_processes_with_token(pid_t sid, const std::string& token) {
  std::vector<pid_t> out;
  if (sid <= 0 || token.empty()) return out;
  const std::string want = std::string(kSessionTokenEnv) + "=" + token;
  for (const Member& m : session_members(sid)) {
    // NUL-separated KEY=VALUE entries; readable for a process of the same user.
    std::ifstream in("/proc/" + std::to_string(m.pid) + "/environ", std::ios::binary);
    std::string entry;
    while (std::getline(in, entry, '\0'))
      if (entry == want) {
        out.push_back(m.pid);
        break;
      }
  }
  return out;
}

int signal_recorded_session(pid_t sid, uint64_t start_ticks, const std::string& boot_id,
                            double started, int sig, const std::string& token) {
  if (is_recorded_process(sid, start_ticks, boot_id, started)) return signal_session(sid, sig);
  // The leader is gone (or the number is someone else's): only members that prove
  // themselves ours by the token, and never across a reboot.
  if (process_start_ticks(sid) != 0 || token.empty() || boot_id != current_boot_id()) return 0;
  int n = 0;
  for (pid_t p : session_processes_with_token(sid, token))
    if (::kill(p, sig) == 0) ++n;
  return n;
}

void become_subreaper() {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
}

}  // namespace hyperion::launch
