#include "train/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace hyperion {

namespace {

std::atomic<int> g_signal{0};
unsigned g_grace_s = 60;
struct sigaction g_old_term, g_old_int, g_old_alrm;

void say(const char* text) {
  size_t n = 0;
  while (text[n] != '\0') ++n;
  (void)!::write(2, text, n);
}

// Async-signal-safe only: an atomic, alarm, write, signal, raise.
void on_stop(int sig) {
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) {
    // The first: the run stops after its step and saves. A stop that has not ended
    // within the grace period (a step blocked on a dead peer) ends by SIGALRM.
    ::alarm(g_grace_s);
    return;
  }
  // The second: now, as the signal's default action (exit status 128 + the signal).
  say("hyperion: second stop signal: stopping now, without saving\n");
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

StopSignalScope::StopSignalScope(unsigned grace_s) {
  g_signal.store(0);
  g_grace_s = grace_s;
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &sa, &g_old_term);
  ::sigaction(SIGINT, &sa, &g_old_int);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGALRM, &dfl, &g_old_alrm);  // the grace alarm ends the process
}

StopSignalScope::~StopSignalScope() {
  ::alarm(0);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGALRM, &g_old_alrm, nullptr);
}

int stop_signal_received() {
  return g_signal.load();
}

void stop_signal_saving() {
  ::alarm(0);
}

}  // namespace hyperion
