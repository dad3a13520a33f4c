#include "train/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace hyperion {

namespace {

std::atomic<int> g_signal{0};
struct sigaction g_old_term, g_old_int;

void on_stop(int sig) {
  g_signal.store(sig);
}

}  // namespace

StopSignalScope::StopSignalScope() {
  g_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &sa, &g_old_term);
  ::sigaction(SIGINT, &sa, &g_old_int);
}

StopSignalScope::~StopSignalScope() {
  ::alarm(0);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  ::sigaction(SIGINT, &g_old_int, nullptr);
}

int stop_signal_received() {
  return g_signal.load();
}

}  // namespace hyperion
