#include "monitor/stack_dump.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "monitor/hang_watchdog.h"

namespace hyperion::monitor {
namespace {

namespace fs = std::filesystem;
using testing_util::TempDir;

// File-local on purpose: the dump must name anonymous-namespace functions too.
[[gnu::noinline]] void park_thread_for_stack_dump_test(std::atomic<int>* parked,
                                                       const std::atomic<bool>* stop) {
  parked->fetch_add(1);
  while (!stop->load()) ::usleep(1000);
}

volatile int* volatile g_null_for_stack_dump_test = nullptr;

// A real fault (not raise()), hidden from the sanitizers, which would report it first.
[[gnu::noinline]] __attribute__((no_sanitize("address", "undefined"))) void
crash_with_sigsegv_for_stack_dump_test() {
  *g_null_for_stack_dump_test = 1;
}

[[gnu::noinline]] void abort_for_stack_dump_test() {
  std::abort();
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Whether `name` is rank-R-YYYYmmddTHHMMSSZ[-N].txt (no std::regex: GCC 12 warns inside
// it under the sanitizers).
bool is_dump_name(const std::string& name, int rank) {
  const std::string prefix = "rank-" + std::to_string(rank) + "-";
  if (name.rfind(prefix, 0) != 0 || name.size() < prefix.size() + 20) return false;
  const std::string stamp = name.substr(prefix.size(), 16);
  for (size_t i = 0; i < stamp.size(); ++i) {
    const char want = i == 8 ? 'T' : i == 15 ? 'Z' : '0';
    if (want == '0' ? !std::isdigit(static_cast<unsigned char>(stamp[i])) : stamp[i] != want)
      return false;
  }
  std::string rest = name.substr(prefix.size() + 16);
  if (rest.rfind("-", 0) == 0) rest.erase(0, rest.find_first_not_of("-0123456789"));
  return rest == ".txt";
}

// The dump files of `rank` in dir.
std::vector<fs::path> dumps_of(const fs::path& dir, int rank) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (is_dump_name(e.path().filename().string(), rank)) out.push_back(e.path());
  return out;
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The symbolized part of a dump file.
std::string symbolized(const std::string& dump) {
  const size_t at = dump.find("\n== frames ==\n");
  return at == std::string::npos ? std::string() : dump.substr(at);
}

// Polls pred for up to 10 s (never a bound on how fast something must happen).
template <typename Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 1000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

struct Child {
  int status = 0;
  pid_t pid = 0;
  std::string stderr_text;
  std::string events;
};

// Forks a child that installs the crash handlers (rank 3, events to events.jsonl),
// parks 3 threads, runs `body`, and dies; returns how. Waits up to 60 s.
template <typename Body>
Child run_child(const TempDir& tmp, Body body) {
  const std::string dir = tmp.file("stacks"), events = tmp.file("events.jsonl");
  const std::string err = tmp.file("stderr.txt");
  const pid_t pid = ::fork();
  if (pid == 0) {
    const rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);  // the test needs no core files
    const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(err_fd, 2);
    const int event_fd = ::open(events.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
    try {
      install_crash_handlers(dir, 3, event_fd);
    } catch (...) {
      ::_exit(90);
    }
    std::atomic<int> parked{0};
    std::atomic<bool> stop{false};
    for (int i = 0; i < 3; ++i)
      std::thread(park_thread_for_stack_dump_test, &parked, &stop).detach();
    while (parked.load() < 3) ::usleep(1000);
    body();
    ::_exit(91);  // not reached: body dies
  }
  Child c;
  c.pid = pid;
  for (int i = 0; i < 6000 && ::waitpid(pid, &c.status, WNOHANG) == 0; ++i) ::usleep(10000);
  if (::waitpid(pid, &c.status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &c.status, 0);
    ADD_FAILURE() << "the child did not die within 60 s";
  }
  c.stderr_text = read_file(err);
  c.events = read_file(events);
  return c;
}

void expect_crash_event(const std::string& events, pid_t pid, const char* signal) {
  ASSERT_EQ(count(events, "\n"), 1u) << events;
  const auto j = nlohmann::json::parse(events);
  EXPECT_EQ(j.at("event"), "crash");
  EXPECT_EQ(j.at("pid"), pid);
  EXPECT_EQ(j.at("rank"), 3);
  EXPECT_EQ(j.at("signal"), signal);
  EXPECT_GT(j.at("time").get<double>(), 1.6e9);
}

// The crash handler symbolizes with libdw after the async-signal-safe part, which
// allocates inside a signal handler (on purpose, under alarm()): ThreadSanitizer reports
// that as "signal-unsafe call inside of a signal" and fails the child.
#if defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_TSAN() \
  GTEST_SKIP() << "ThreadSanitizer flags the crash handler's allocations (libdw) as unsafe"
#else
#define SKIP_UNDER_TSAN() (void)0
#endif

// A segfault: the child dies by SIGSEGV as it would without the handler, after writing
// one file with every thread, the crashing and the parked functions by name.
TEST(StackDump, SegfaultWritesEveryThreadAndDiesBySigsegv) {
  SKIP_UNDER_TSAN();
  TempDir tmp;
  const Child c = run_child(tmp, [] { crash_with_sigsegv_for_stack_dump_test(); });
  ASSERT_TRUE(WIFSIGNALED(c.status)) << "status " << c.status << "\n" << c.stderr_text;
  EXPECT_EQ(WTERMSIG(c.status), SIGSEGV);
  const auto files = dumps_of(tmp.file("stacks"), 3);
  ASSERT_EQ(files.size(), 1u) << c.stderr_text;
  const std::string dump = read_file(files[0]);
  EXPECT_NE(dump.find("reason: SIGSEGV at address 0x0\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("rank: 3\npid: " + std::to_string(c.pid) + "\n"), std::string::npos);
  const std::string frames = symbolized(dump);
  EXPECT_GE(count(frames, "\nthread "), 4u) << dump;  // main + 3 parked
  EXPECT_EQ(count(frames, "stack unavailable"), 0u) << dump;
  EXPECT_NE(frames.find("(crashed)"), std::string::npos) << dump;
  EXPECT_NE(frames.find("crash_with_sigsegv_for_stack_dump_test()"), std::string::npos) << dump;
  EXPECT_GE(count(frames, "(anonymous namespace)::park_thread_for_stack_dump_test("), 3u) << dump;
  // The raw, async-signal-safe part comes first and covers the same threads.
  EXPECT_LT(dump.find("== frames (raw"), dump.find("\n== frames ==\n"));
  EXPECT_NE(dump.find("\n== end ==\n"), std::string::npos);
  EXPECT_NE(c.stderr_text.find("rank 3: SIGSEGV: stacks of "), std::string::npos) << c.stderr_text;
  EXPECT_NE(c.stderr_text.find(" threads written to " + files[0].string()), std::string::npos)
      << c.stderr_text;
  expect_crash_event(c.events, c.pid, "SIGSEGV");
}

TEST(StackDump, AbortWritesOneFileAndDiesBySigabrt) {
  SKIP_UNDER_TSAN();
  TempDir tmp;
  const Child c = run_child(tmp, [] { abort_for_stack_dump_test(); });
  ASSERT_TRUE(WIFSIGNALED(c.status)) << "status " << c.status << "\n" << c.stderr_text;
  EXPECT_EQ(WTERMSIG(c.status), SIGABRT);
  const auto files = dumps_of(tmp.file("stacks"), 3);
  ASSERT_EQ(files.size(), 1u) << c.stderr_text;
  const std::string dump = read_file(files[0]);
  EXPECT_NE(dump.find("reason: SIGABRT"), std::string::npos) << dump;
  const std::string frames = symbolized(dump);
  EXPECT_GE(count(frames, "\nthread "), 4u) << dump;
  EXPECT_NE(frames.find("abort_for_stack_dump_test()"), std::string::npos) << dump;
  EXPECT_GE(count(frames, "park_thread_for_stack_dump_test("), 3u) << dump;
  expect_crash_event(c.events, c.pid, "SIGABRT");
}

[[gnu::noinline]] std::string dump_from_named_function_for_stack_dump_test(const std::string& dir) {
  std::string path = dump_all_stacks(dir, 5, "test: asked by hand");
  return path + "";  // keeps this frame (no tail call)
}

// In a running process: the file names the reason and the calling thread's frames, and a
// thread that blocks every signal is listed as unavailable without stopping the dump.
TEST(StackDump, DumpAllStacksInARunningProcess) {
  TempDir tmp;
  std::atomic<int> parked{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) threads.emplace_back(park_thread_for_stack_dump_test, &parked, &stop);
  threads.emplace_back([&] {
    pthread_setname_np(pthread_self(), "sig-blocker");
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    parked.fetch_add(1);
    while (!stop.load()) ::usleep(1000);
  });
  while (parked.load() < 3) ::usleep(1000);
  const std::string dir = tmp.file("run/stacks");  // created, parents too
  const std::string path = dump_from_named_function_for_stack_dump_test(dir);
  stop = true;
  for (auto& t : threads) t.join();
  const auto files = dumps_of(dir, 5);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].string(), path);
  const std::string dump = read_file(path);
  EXPECT_EQ(dump.rfind("hyperion stack dump\nreason: test: asked by hand\nrank: 5\npid: " +
                           std::to_string(::getpid()) + "\n",
                       0),
            0u)
      << dump;
  const std::string frames = symbolized(dump);
  EXPECT_GE(count(frames, "\nthread "), 4u) << dump;
  EXPECT_NE(frames.find("(dumping)"), std::string::npos) << dump;
  EXPECT_NE(frames.find("dump_from_named_function_for_stack_dump_test("), std::string::npos)
      << dump;
  EXPECT_GE(count(frames, "park_thread_for_stack_dump_test("), 2u) << dump;
  EXPECT_NE(frames.find("\"sig-blocker\"\n  stack unavailable: the thread blocks the stack "
                        "request signal\n"),
            std::string::npos)
      << dump;
  // A second dump in the same second gets its own file.
  const std::string again = dump_all_stacks(dir, 5, "again");
  EXPECT_NE(again, path);
  EXPECT_EQ(dumps_of(dir, 5).size(), 2u);
}

TEST(StackDump, UncreatableDirectoryThrowsNamingIt) {
  TempDir tmp;
  const std::string file = tmp.write("plain", "x");
  const std::string dir = file + "/stacks";
  testing_util::expect_error([&] { dump_all_stacks(dir, 0, "x"); }, {dir});
}

// No heartbeat: a dump within a few seconds, then one more per further timeout at most
// (never a storm), and the process goes on.
TEST(HangWatchdog, DumpsOncePerTimeoutWithoutHeartbeats) {
  TempDir tmp;
  const std::string dir = tmp.file("stacks");
  std::mutex mutex;
  std::vector<std::string> paths;
  const auto start = std::chrono::steady_clock::now();
  double elapsed_s = 0;
  {
    HangWatchdog dog(0.3, dir, 2, false, [&](const std::string& p, int64_t) {
      std::lock_guard<std::mutex> lock(mutex);
      paths.push_back(p);
    });
    EXPECT_TRUE(dog.enabled());
    dog.heartbeat(7);
    EXPECT_TRUE(eventually([&] {
      std::lock_guard<std::mutex> lock(mutex);
      return paths.size() >= 2;
    }));
    elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const std::lock_guard<std::mutex> lock(mutex);
  ASSERT_GE(paths.size(), 2u);
  // Dumps are at least one timeout apart, however slow the machine: an upper bound.
  const double after_stop =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LE(static_cast<double>(paths.size()), after_stop / 0.3 + 1) << elapsed_s;
  EXPECT_EQ(dumps_of(dir, 2).size(), paths.size());
  const std::string dump = read_file(paths[0]);
  EXPECT_NE(dump.find("reason: hang: no step finished for "), std::string::npos) << dump;
  EXPECT_NE(dump.find(" s (last step 7)\n"), std::string::npos) << dump;
}

// A long hang is dumped at timeout, 3x, 7x, 15x ... of it (each wait twice the last), not
// once per timeout: over 20 timeouts at most 5 dumps, however slow the machine (an upper
// bound), and the first two come.
TEST(HangWatchdog, RepeatedDumpsOfOneHangBackOff) {
  TempDir tmp;
  const std::string dir = tmp.file("stacks");
  std::atomic<int> dumps{0};
  const auto start = std::chrono::steady_clock::now();
  {
    HangWatchdog dog(0.1, dir, 4, false, [&](const std::string&, int64_t) { ++dumps; });
    dog.heartbeat(1);
    EXPECT_TRUE(eventually([&] { return dumps.load() >= 2; }));
    const auto until = start + std::chrono::milliseconds(2000);
    std::this_thread::sleep_until(until);
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Dumps at 0.1, 0.3, 0.7, 1.5, 3.1 s...: within `elapsed` s at most log2(elapsed/0.1 + 1).
  EXPECT_LE(dumps.load(), static_cast<int>(std::log2(elapsed / 0.1 + 1)) + 1) << elapsed;
  EXPECT_GE(dumps.load(), 2);
}

TEST(HangWatchdog, HeartbeatsKeepItQuiet) {
  TempDir tmp;
  const std::string dir = tmp.file("stacks");
  std::atomic<int> hangs{0};
  {
    // A timeout well above the heartbeat period, so a loaded machine cannot trip it.
    HangWatchdog dog(1.0, dir, 0, false, [&](const std::string&, int64_t) { ++hangs; });
    for (int step = 1; step <= 50; ++step) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      dog.heartbeat(step);
    }
  }
  EXPECT_EQ(hangs.load(), 0);
  EXPECT_FALSE(fs::exists(dir));
}

TEST(HangWatchdog, ZeroTimeoutHasNoThread) {
  TempDir tmp;
  const std::string dir = tmp.file("stacks");
  HangWatchdog dog(0, dir, 0, false,
                   [](const std::string&, int64_t) { ADD_FAILURE() << "on_hang"; });
  EXPECT_FALSE(dog.enabled());
  dog.heartbeat(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(fs::exists(dir));
}

// abort_on_hang: one hang dump, then death by SIGABRT with a crash event but no second
// file from the crash handler.
TEST(HangWatchdog, AbortOnHangDumpsOnceAndDiesBySigabrt) {
  TempDir tmp;
  const Child c = run_child(tmp, [&] {
    HangWatchdog dog(0.2, tmp.file("stacks"), 3, true);
    for (;;) ::pause();
  });
  ASSERT_TRUE(WIFSIGNALED(c.status)) << "status " << c.status << "\n" << c.stderr_text;
  EXPECT_EQ(WTERMSIG(c.status), SIGABRT);
  const auto files = dumps_of(tmp.file("stacks"), 3);
  ASSERT_EQ(files.size(), 1u) << c.stderr_text;
  const std::string dump = read_file(files[0]);
  EXPECT_NE(dump.find("reason: hang: no step finished for "), std::string::npos) << dump;
  EXPECT_GE(count(symbolized(dump), "park_thread_for_stack_dump_test("), 3u) << dump;
  EXPECT_NE(c.stderr_text.find("stacks of every thread written to " + files[0].string()),
            std::string::npos)
      << c.stderr_text;
  expect_crash_event(c.events, c.pid, "SIGABRT");
}

}  // namespace
}  // namespace hyperion::monitor
