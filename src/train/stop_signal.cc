#include "train/stop_signal.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

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

// The checkpoint being written (SavingDirectory), for the second signal to remove.
char g_saving_dir[PATH_MAX];
std::atomic<bool> g_saving{false};

// Removes the directory g_saving_dir and the files in it (a checkpoint's temp directory
// is flat) with async-signal-safe calls only: open, getdents64, unlinkat, rmdir. Entries
// removed while reading may shift the listing, so it is read again until empty (a few
// passes at most).
void remove_saving_directory() {
  if (!g_saving.load(std::memory_order_acquire)) return;
  const int fd = ::open(g_saving_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buf[8192];
  for (int pass = 0; pass < 16; ++pass) {
    bool removed = false;
    ::lseek(fd, 0, SEEK_SET);
    for (;;) {
      const ssize_t n = ::getdents64(fd, buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t at = 0; at < n;) {
        const auto* d = reinterpret_cast<const struct dirent64*>(buf + at);
        at += d->d_reclen;
        const char* name = d->d_name;
        if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
        if (::unlinkat(fd, name, 0) == 0) removed = true;
      }
    }
    if (!removed) break;
  }
  ::close(fd);
  if (::rmdir(g_saving_dir) == 0) say("hyperion: removed the unfinished checkpoint\n");
}

// Async-signal-safe only: an atomic, alarm, write, signal, raise (and the calls of
// remove_saving_directory).
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
  remove_saving_directory();
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

SavingDirectory::SavingDirectory(const std::string& dir) {
  if (dir.size() >= sizeof g_saving_dir) return;
  std::memcpy(g_saving_dir, dir.c_str(), dir.size() + 1);
  g_saving.store(true, std::memory_order_release);
}

SavingDirectory::~SavingDirectory() {
  g_saving.store(false, std::memory_order_release);
}

}  // namespace hyperion
