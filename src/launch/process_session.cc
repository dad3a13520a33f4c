#include "launch/process_session.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
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
  for (const auto& [k, v] : o.env) env_strings.push_back(k + "=" + v);
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

std::vector<pid_t> session_processes(pid_t sid) {
  std::vector<pid_t> out;
  DIR* proc = ::opendir("/proc");
  if (!proc) return out;
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // Fields after the command name (which may hold spaces and ')'): state ppid pgrp session.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0, pgrp = 0, session = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %ld %ld %ld", &state, &ppid, &pgrp, &session) !=
        4)
      continue;
    if (session == sid && state != 'Z') out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
  return out;
}

int signal_session(pid_t sid, int sig) {
  int n = 0;
  for (pid_t p : session_processes(sid))
    if (::kill(p, sig) == 0) ++n;
  return n;
}

void become_subreaper() {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
}

}  // namespace hyperion::launch
