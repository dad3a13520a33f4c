// A `hyperion serve` process for the CLI tests: started on a free port (read back from
// its log), stopped with SIGTERM at the end.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace hyperion::testing_util {

// A server process on a free port; stops it (SIGTERM) at the end.
class ServerProcess {
 public:
  ServerProcess(const std::string& checkpoint, const std::vector<std::string>& keys,
                const std::string& log) {
    pid_ = fork();
    if (pid_ == 0) {
      std::FILE* f = std::freopen(log.c_str(), "w", stderr);
      (void)f;
      std::vector<std::string> args = {HYPERION_CLI_PATH, "--threads", "1", "serve",
                                       checkpoint,        "--port",    "0"};
      args.insert(args.end(), keys.begin(), keys.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    // The log names the bound port once the server listens (bounded wait).
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      std::ifstream in(log);
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      const size_t at = text.find("http://127.0.0.1:");
      if (at != std::string::npos) port_ = std::atoi(text.c_str() + at + 17);
      int status = 0;
      if (port_ == 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        ADD_FAILURE() << "server exited: " << text;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  // SIGTERM and the exit code.
  int stop() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  int port() const { return port_; }
  // Sends `sig` without waiting; then wait() for the raw wait status.
  void signal(int sig) const { kill(pid_, sig); }
  int wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace hyperion::testing_util
