#include "monitor/stack_dump.h"

#include <cxxabi.h>
#include <elfutils/libdwfl.h>
#include <execinfo.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <mutex>

#include "base/error.h"
#include "base/log.h"

namespace hyperion::monitor {
namespace {

constexpr int kMaxThreads = 512;  // threads beyond are counted, not shown
constexpr int kMaxFrames = 64;
constexpr int kCaptureFrames = kMaxFrames + 16;  // room for the signal handler's frames
constexpr int kAnswerMs = 200;  // per thread; a crash dump asks threads for 3 s at most
// The crash handler symbolizes with libdw on this stack: glibc's SIGSTKSZ (8 KiB) is far
// too small for that and for the demangler's recursion.
constexpr size_t kAltStackSize = 512 * 1024;
constexpr struct {
  int number;
  const char* name;
} kCrashSignals[] = {
    {SIGSEGV, "SIGSEGV"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
    {SIGILL, "SIGILL"},   {SIGABRT, "SIGABRT"},
};
constexpr size_t kNumCrashSignals = sizeof(kCrashSignals) / sizeof(kCrashSignals[0]);

const char* signal_name(int sig) {
  for (const auto& s : kCrashSignals)
    if (s.number == sig) return s.name;
  return "signal";
}

// Async-signal-safe text: a fixed buffer and integers by hand. With fd >= 0 it goes to
// the descriptor with write() (a single write when it fits, so event lines land whole);
// with fd < 0 it is a string builder that truncates (paths).
class Text {
 public:
  explicit Text(int fd = -1) : fd_(fd) {}
  ~Text() { flush(); }
  Text(const Text&) = delete;
  Text& operator=(const Text&) = delete;
  Text& str(const char* s) {
    while (*s != 0) put(*s++);
    return *this;
  }
  Text& dec(long long v, int width = 1) {
    char t[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - static_cast<unsigned long long>(v) : v;
    do t[n++] = static_cast<char>('0' + u % 10);
    while ((u /= 10) != 0 || n < width);
    if (v < 0) t[n++] = '-';
    while (n > 0) put(t[--n]);
    return *this;
  }
  Text& hex(uint64_t v, int width = 1) {
    char t[16];
    int n = 0;
    do t[n++] = "0123456789abcdef"[v & 15];
    while ((v >>= 4) != 0 || n < width);
    str("0x");
    while (n > 0) put(t[--n]);
    return *this;
  }
  Text& ch(char c) {
    put(c);
    return *this;
  }
  void clear() { len_ = 0; }
  const char* c_str() {
    buf_[len_] = 0;
    return buf_;
  }
  void flush() {
    for (size_t off = 0; fd_ >= 0 && off < len_;) {
      const ssize_t n = ::write(fd_, buf_ + off, len_ - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        failed_ = true;
        break;
      }
      off += static_cast<size_t>(n);
    }
    if (fd_ >= 0) len_ = 0;
  }
  bool ok() const { return !failed_; }
  int fd() const { return fd_; }

 private:
  void put(char c) {
    if (len_ + 1 >= sizeof(buf_)) {
      if (fd_ < 0) return;
      flush();
    }
    buf_[len_++] = c;
  }
  int fd_;
  char buf_[PATH_MAX + 128];
  size_t len_ = 0;
  bool failed_ = false;
};

// "YYYY-mm-ddTHH:MM:SSZ" (iso) or "YYYYmmddTHHMMSSZ", without gmtime (not
// async-signal-safe): days since the epoch to a civil date (H. Hinnant's algorithm).
void put_utc(Text& out, time_t t, bool iso) {
  long long days = t / 86400, secs = t % 86400;
  if (secs < 0) secs += 86400, --days;
  days += 719468;
  const long long era = (days >= 0 ? days : days - 146096) / 146097;
  const long long doe = days - era * 146097;
  const long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const long long mp = (5 * doy + 2) / 153, month = mp < 10 ? mp + 3 : mp - 9;
  const char* date_sep = iso ? "-" : "";
  const char* time_sep = iso ? ":" : "";
  out.dec(yoe + era * 400 + (month <= 2), 4).str(date_sep).dec(month, 2).str(date_sep);
  out.dec(doy - (153 * mp + 2) / 5 + 1, 2).str("T").dec(secs / 3600, 2).str(time_sep);
  out.dec(secs / 60 % 60, 2).str(time_sep).dec(secs % 60, 2).str("Z");
}

pid_t this_tid() {
  return static_cast<pid_t>(::syscall(SYS_gettid));
}

long long monotonic_ms() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<long long>(t.tv_sec) * 1000 + t.tv_nsec / 1000000;
}

// ---- Every thread's frames ----
struct ThreadStack {
  pid_t tid;
  int frames;        // -1: unavailable (see note)
  bool exact_first;  // frame 0 is an interrupted pc, not a return address
  bool truncated;    // deeper frames were cut (kMaxFrames)
  const char* note;  // a static string or nullptr
  char name[20];
  void* pc[kMaxFrames];
};
ThreadStack g_stacks[kMaxThreads];
int g_count = 0;    // filled entries of g_stacks
int g_skipped = 0;  // threads beyond kMaxThreads

// The request channel: g_state = sequence << 2 | phase. The sequence keeps a late answer
// to an abandoned request out of the next thread's slot.
enum : int { kIdle = 0, kRequested = 1, kWriting = 2, kDone = 3 };
std::atomic<int> g_state{0};
std::atomic<pid_t> g_target{0};
std::atomic<ThreadStack*> g_slot{nullptr};
int g_request_signal = 0;
static_assert(sizeof(std::atomic<int>) == sizeof(int), "futex on std::atomic<int>");
int* futex_word() {
  return reinterpret_cast<int*>(&g_state);
}

// Keeps the frames from the interrupted pc on (dropping the signal handler's own) when
// the pc is among them.
void store_frames(ThreadStack& s, void* const* pcs, int n, uintptr_t pc) {
  int from = 0;
  for (int i = 0; i < std::min(n, 16) && pc != 0; ++i)
    if (reinterpret_cast<uintptr_t>(pcs[i]) == pc) from = i;
  s.exact_first = n > 0 && reinterpret_cast<uintptr_t>(pcs[from]) == pc;
  s.frames = std::min(n - from, kMaxFrames);
  s.truncated = n - from > kMaxFrames || n == kCaptureFrames;
  std::memcpy(s.pc, pcs + from, sizeof(void*) * static_cast<size_t>(s.frames));
}

uintptr_t interrupted_pc(void* ucontext) {
  const auto* uc = static_cast<const ucontext_t*>(ucontext);
#if defined(__x86_64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.pc);
#else
  return 0;
#endif
}

// Runs in the asked thread: its backtrace into the slot, then a futex wake.
void request_handler(int, siginfo_t*, void* ucontext) {
  const int saved_errno = errno;
  const int s = g_state.load(std::memory_order_acquire);
  if ((s & 3) == kRequested && g_target.load(std::memory_order_acquire) == this_tid()) {
    void* pcs[kCaptureFrames];
    const int n = backtrace(pcs, kCaptureFrames);
    int expected = s;
    if (g_state.compare_exchange_strong(expected, (s & ~3) | kWriting)) {
      store_frames(*g_slot.load(std::memory_order_acquire), pcs, n, interrupted_pc(ucontext));
      g_state.store((s & ~3) | kDone, std::memory_order_release);
      ::syscall(SYS_futex, futex_word(), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
    }
  }
  errno = saved_errno;
}

// Reads /proc/self/task/<tid>/<file> (small files) into buf, NUL-terminated; bytes read.
ssize_t read_task_file(pid_t tid, const char* file, char* buf, size_t size) {
  Text path;
  const int fd = ::open(path.str("/proc/self/task/").dec(tid).str("/").str(file).c_str(),
                        O_RDONLY | O_CLOEXEC);
  ssize_t got = 0;
  for (ssize_t r = 0; fd >= 0 && got + 1 < static_cast<ssize_t>(size) &&
                      (r = ::read(fd, buf + got, size - 1 - static_cast<size_t>(got))) > 0;)
    got += r;
  if (fd >= 0) ::close(fd);
  buf[got] = 0;
  return fd >= 0 ? got : -1;
}

// True when /proc says the thread blocks `sig` (SigBlk): asking it would only wait.
bool blocks_signal(pid_t tid, int sig) {
  char buf[4096];
  if (read_task_file(tid, "status", buf, sizeof(buf)) <= 0) return false;
  const char* p = std::strstr(buf, "SigBlk:");
  if (p == nullptr) return false;
  uint64_t mask = 0;
  for (p += 7; *p == ' ' || *p == '\t'; ++p) continue;
  for (; (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'); ++p)
    mask = mask << 4 | static_cast<uint64_t>(*p <= '9' ? *p - '0' : *p - 'a' + 10);
  return (mask >> (sig - 1) & 1) != 0;
}

// Asks slot.tid for its stack and waits for the answer until `deadline_ms`.
void request_stack(ThreadStack& slot, long long deadline_ms) {
  const int seq = static_cast<int>((static_cast<unsigned>(g_state.load()) & ~3U) + 4U);
  g_slot.store(&slot, std::memory_order_release);
  g_target.store(slot.tid, std::memory_order_release);
  g_state.store(seq | kRequested, std::memory_order_release);
  if (::syscall(SYS_tgkill, ::getpid(), slot.tid, g_request_signal) != 0) {
    g_state.store(seq | kIdle, std::memory_order_release);
    slot.note = errno == ESRCH ? "thread exited during the dump" : "cannot signal the thread";
    return;
  }
  for (;;) {
    int s = g_state.load(std::memory_order_acquire);
    if ((s & 3) == kDone) break;
    const long long left = deadline_ms - monotonic_ms();
    if ((s & 3) == kRequested && left <= 0) {
      if (g_state.compare_exchange_strong(s, seq | kIdle)) {
        slot.note = "stack unavailable: no answer in time (stopped, or stuck in the kernel)";
        return;
      }
      continue;  // it has started writing: wait for the end
    }
    const timespec wait{0, std::clamp(left, 1LL, 999LL) * 1000000};
    ::syscall(SYS_futex, futex_word(), FUTEX_WAIT_PRIVATE, s, &wait, nullptr, 0);
  }
  g_state.store(seq | kIdle, std::memory_order_release);
}

// Fills g_stacks: the calling thread first (its frames given), then every other thread,
// asked one at a time; threads still unasked after budget_ms are listed without frames.
void collect_stacks(void* const* self_pcs, int self_n, uintptr_t self_pc, const char* self_note,
                    long long budget_ms) {
  const pid_t self = this_tid();
  const long long end_ms = monotonic_ms() + budget_ms;
  g_count = 0;
  g_skipped = 0;
  auto add = [](pid_t tid) -> ThreadStack* {
    if (g_count == kMaxThreads) return ++g_skipped, nullptr;
    ThreadStack& s = g_stacks[g_count++];
    s.tid = tid, s.frames = -1, s.exact_first = s.truncated = false, s.note = nullptr;
    const ssize_t n = read_task_file(tid, "comm", s.name, sizeof(s.name));
    if (n > 0 && s.name[n - 1] == '\n') s.name[n - 1] = 0;
    return &s;
  };
  ThreadStack* me = add(self);
  store_frames(*me, self_pcs, self_n, self_pc);
  me->note = self_note;
  // open + getdents64 rather than opendir, which allocates.
  const int dir = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  char buf[4096];
  for (long n; dir >= 0 && (n = ::syscall(SYS_getdents64, dir, buf, sizeof(buf))) > 0;) {
    // struct linux_dirent64: u64 ino, s64 off, u16 reclen (at 16), u8 type, name (at 19).
    for (long off = 0; off < n;) {
      unsigned short reclen = 0;
      std::memcpy(&reclen, buf + off + 16, sizeof(reclen));
      pid_t tid = 0;
      for (const char* c = buf + off + 19; *c >= '0' && *c <= '9'; ++c) tid = tid * 10 + *c - '0';
      off += reclen;
      ThreadStack* s = tid <= 0 || tid == self ? nullptr : add(tid);
      if (s == nullptr) continue;
      const long long now = monotonic_ms();
      if (blocks_signal(tid, g_request_signal))
        s->note = "stack unavailable: the thread blocks the stack request signal";
      else if (now >= end_ms)
        s->note = "stack not asked: the dump's time budget was spent";
      else
        request_stack(*s, std::min(now + kAnswerMs, end_ms));
    }
  }
  if (dir >= 0) ::close(dir);
}

// ---- The dump file ----
// <dir>/rank-R-<time>[-k].txt, created exclusively (two dumps in a second get -2, -3).
int open_dump_file(const char* dir, int rank, time_t now, Text& path) {
  for (int k = 1; k < 100; ++k) {
    path.clear();
    path.str(dir).str("/rank-").dec(rank).str("-");
    put_utc(path, now, false);
    if (k > 1) path.str("-").dec(k);
    const int fd = ::open(path.str(".txt").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

// The lines after "reason: ...".
void write_header_rest(Text& w, int rank, const timespec& now) {
  w.str("rank: ").dec(rank).str("\npid: ").dec(::getpid()).str("\ntime: ");
  put_utc(w, now.tv_sec, true);
  w.str(" (unix ").dec(now.tv_sec).str(".").dec(now.tv_nsec / 1000, 6).str(")\nthreads: ");
  w.dec(g_count + g_skipped);
  if (g_skipped > 0) w.str(" (").dec(g_skipped).str(" not shown)");
  w.str("\n");
}

void write_thread_title(Text& w, const ThreadStack& s) {
  w.str("\nthread ").dec(s.tid).str(" \"").str(s.name).str("\"");
  if (s.note != nullptr && s.frames >= 0) w.str(" (").str(s.note).str(")");
  w.str("\n");
  if (s.frames < 0) w.str("  ").str(s.note != nullptr ? s.note : "stack unavailable").str("\n");
}

// Raw frames with async-signal-safe calls only (backtrace_symbols_fd does not allocate).
void write_raw(Text& w) {
  w.str("\n== frames (raw: module(exported symbol+offset)[address]) ==\n");
  for (int t = 0; t < g_count; ++t) {
    write_thread_title(w, g_stacks[t]);
    for (int i = 0; i < g_stacks[t].frames; ++i) {
      w.str("  #").dec(i).str(" ").flush();
      backtrace_symbols_fd(&g_stacks[t].pc[i], 1, w.fd());
    }
    if (g_stacks[t].truncated) w.str("  ... deeper frames not shown\n");
  }
}

// No separate debug files: libdw's standard lookup may ask debuginfod servers over the
// network, which a dying or hung process must not. The modules' own .symtab and DWARF
// are still read.
int no_separate_debuginfo(Dwfl_Module*, void**, const char*, Dwarf_Addr, const char*, const char*,
                          GElf_Word, char**) {
  return -1;
}

// One symbolized frame: function (demangled), file:line where there is debug info, and
// module+offset (what addr2line takes).
void write_frame(Text& w, Dwfl* dwfl, int i, uintptr_t addr, bool exact) {
  // A return address may lie past its call's function: look up the call instead.
  const uintptr_t at = exact ? addr : addr - 1;
  w.str("  #").dec(i, 2).str(" ").hex(addr, 12).str(" ");
  Dwfl_Module* mod = dwfl_addrmodule(dwfl, at);
  const char* fn = mod == nullptr ? nullptr : dwfl_module_addrname(mod, at);
  int status = -1;
  char* demangled = fn == nullptr ? nullptr : abi::__cxa_demangle(fn, nullptr, nullptr, &status);
  w.str(demangled != nullptr ? demangled : fn != nullptr ? fn : "??");
  std::free(demangled);
  if (mod == nullptr) {
    w.str("\n");
    return;
  }
  int line = 0;
  Dwfl_Line* src = dwfl_module_getsrc(mod, at);
  const char* file =
      src == nullptr ? nullptr : dwfl_lineinfo(src, nullptr, &line, nullptr, nullptr, nullptr);
  if (file != nullptr) w.str(" at ").str(file).str(":").dec(line);
  const char* path =
      dwfl_module_info(mod, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  const char* slash = path == nullptr ? nullptr : std::strrchr(path, '/');
  Dwarf_Addr bias = 0;
  dwfl_module_getelf(mod, &bias);
  w.str(" (").str(slash != nullptr ? slash + 1 : path != nullptr ? path : "?");
  w.str("+").hex(addr - bias).str(")\n");
}

// Symbolized frames (allocates). False when libdw cannot read this process.
bool write_symbolized(Text& w) {
  static const Dwfl_Callbacks callbacks = {dwfl_linux_proc_find_elf, no_separate_debuginfo, nullptr,
                                           nullptr};
  Dwfl* dwfl = dwfl_begin(&callbacks);
  if (dwfl == nullptr) return false;
  const bool ok =
      dwfl_linux_proc_report(dwfl, ::getpid()) == 0 && dwfl_report_end(dwfl, nullptr, nullptr) == 0;
  if (ok) w.str("\n== frames ==\n");
  for (int t = 0; ok && t < g_count; ++t) {
    write_thread_title(w, g_stacks[t]);
    for (int i = 0; i < g_stacks[t].frames; ++i)
      write_frame(w, dwfl, i, reinterpret_cast<uintptr_t>(g_stacks[t].pc[i]),
                  i == 0 && g_stacks[t].exact_first);
    if (g_stacks[t].truncated) w.str("  ... deeper frames not shown\n");
  }
  dwfl_end(dwfl);
  return ok;
}

// ---- One dump at a time: a hang dump and a crash may meet ----
std::atomic<pid_t> g_dump_owner{0};
bool try_own_dump(pid_t self, int wait_ms) {
  for (long long end = monotonic_ms() + wait_ms;;) {
    pid_t expected = 0;
    if (g_dump_owner.compare_exchange_strong(expected, self)) return true;
    if (expected == self || monotonic_ms() > end) return false;
    const timespec ms{0, 1000000};
    ::nanosleep(&ms, nullptr);
  }
}

void install_request_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    // libgcc's unwinder is loaded by backtrace()'s first call, which may allocate: now,
    // never first inside a handler.
    void* warm[2];
    backtrace(warm, 2);
    g_request_signal = SIGRTMIN + kStackRequestSignalOffset;
    struct sigaction sa {};
    sa.sa_sigaction = request_handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    struct sigaction old {};
    sigaction(g_request_signal, &sa, &old);
    if ((old.sa_flags & SA_SIGINFO) != 0 ||
        (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN))
      log_warn("stack dumps: replaced another handler of SIGRTMIN+{}", kStackRequestSignalOffset);
  });
}

// ---- The crash handler and its settings (fixed buffers: read inside the handler) ----
char g_dir[PATH_MAX];
int g_rank = 0;
int g_event_fd = -1;
bool g_installed = false;
struct sigaction g_previous[kNumCrashSignals];
stack_t g_previous_altstack{};
void* g_altstack = nullptr;
std::atomic<int> g_crash_signal{0};
std::atomic<bool> g_abort_after_hang{false};

// The default action, then the same signal again, delivered as the handler returns: the
// process dies by it, with a core dump where the default makes one.
void reraise(int sig) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  ::syscall(SYS_tgkill, ::getpid(), this_tid(), sig);
}

// alarm() ran out inside the crash handler (a deadlock): die by the original signal.
void alarm_handler(int) {
  const int sig = g_crash_signal.load();
  Text(2).str("stack dump timed out; exiting by ").str(signal_name(sig)).str("\n");
  reraise(sig);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // when this is the crashing thread
}

void write_crash_event(int sig, const timespec& now) {
  if (g_event_fd < 0) return;
  Text line(g_event_fd);  // one write() on an O_APPEND descriptor: the line lands whole
  line.str("{\"time\":").dec(now.tv_sec).str(".").dec(now.tv_nsec / 1000, 6);
  line.str(",\"event\":\"crash\",\"pid\":").dec(::getpid()).str(",\"rank\":").dec(g_rank);
  line.str(",\"signal\":\"").str(signal_name(sig)).str("\"}\n");
}

void crash_handler(int sig, siginfo_t* info, void* ucontext) {
  // A crash inside this thread's own dump: no second attempt. Another thread's dump: wait
  // for it (a hang dump ends; a crash dump ends the process).
  if (!try_own_dump(this_tid(), 10000)) {
    Text err(2);
    err.str("rank ").dec(g_rank).str(": ").str(signal_name(sig));
    err.str(" during another stack dump: no dump of its own\n");
    return reraise(sig);
  }
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  g_crash_signal.store(sig);
  if (sig == SIGABRT && g_abort_after_hang.load()) {
    Text(2).str("rank ").dec(g_rank).str(": SIGABRT after a hang (stacks dumped before)\n");
    write_crash_event(sig, now);
    return reraise(sig);
  }
  struct sigaction on_alarm {};
  on_alarm.sa_handler = alarm_handler;
  sigemptyset(&on_alarm.sa_mask);
  sigaction(SIGALRM, &on_alarm, nullptr);
  alarm(10);  // bounds the raw part too (thousands of threads, a dead disk)
  void* pcs[kCaptureFrames];
  collect_stacks(pcs, backtrace(pcs, kCaptureFrames), interrupted_pc(ucontext), "crashed", 3000);
  Text path;  // mkdir -p by hand, then the file
  for (const char* p = g_dir; *p != 0; ++p) {
    if (*p == '/' && p != g_dir) ::mkdir(path.c_str(), 0755);
    path.ch(*p);
  }
  ::mkdir(path.c_str(), 0755);
  const int fd = open_dump_file(g_dir, g_rank, now.tv_sec, path);
  {
    Text w(fd >= 0 ? fd : 2);  // no file: the stacks go to stderr
    w.str("hyperion stack dump\nreason: ").str(signal_name(sig));
    if (info != nullptr && info->si_code > 0 && sig != SIGABRT)  // a fault
      w.str(" at address ").hex(reinterpret_cast<uintptr_t>(info->si_addr));
    else if (info != nullptr && info->si_code <= 0 && info->si_pid == ::getpid())
      w.str(" raised by this process");  // abort(), raise()
    else if (info != nullptr && info->si_code <= 0)
      w.str(" sent by pid ").dec(info->si_pid);
    write_header_rest(w.str("\n"), g_rank, now);
    write_raw(w);
    w.flush();
    alarm(5);  // symbolizing allocates: a corrupted heap may deadlock
    write_symbolized(w);
    w.str("\n== end ==\n");
  }
  alarm(0);
  Text err(2);
  err.str("rank ").dec(g_rank).str(": ").str(signal_name(sig)).str(": stacks of ").dec(g_count);
  err.str(g_count == 1 ? " thread written to " : " threads written to ");
  if (fd >= 0)
    err.str(path.c_str()).str("\n");
  else
    err.str("stderr (cannot create a file in ").str(g_dir).str(")\n");
  err.flush();
  if (fd >= 0) ::close(fd);
  write_crash_event(sig, now);
  reraise(sig);
}

}  // namespace

void install_crash_handlers(const std::string& dir, int rank, int event_fd) {
  HYP_CHECK(!dir.empty() && dir.size() + 64 < sizeof(g_dir),
            "stack dumps: directory name empty or too long: '{}'", dir);
  install_request_handler();
  std::memcpy(g_dir, dir.c_str(), dir.size() + 1);
  g_rank = rank;
  g_event_fd = event_fd;
  if (!g_installed) {
    // Our alternate stack, unless the thread has a big enough one already.
    sigaltstack(nullptr, &g_previous_altstack);
    if ((g_previous_altstack.ss_flags & SS_DISABLE) != 0 ||
        g_previous_altstack.ss_size < kAltStackSize) {
      if (g_altstack == nullptr) {
        void* p = ::mmap(nullptr, kAltStackSize, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        HYP_CHECK(p != MAP_FAILED, "stack dumps: cannot map an alternate signal stack");
        g_altstack = p;
      }
      stack_t ours{};
      ours.ss_sp = g_altstack;
      ours.ss_size = kAltStackSize;
      sigaltstack(&ours, nullptr);
    }
  }
  for (size_t i = 0; i < kNumCrashSignals; ++i) {
    struct sigaction sa {};
    sa.sa_sigaction = crash_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(kCrashSignals[i].number, &sa, g_installed ? nullptr : &g_previous[i]);
  }
  g_installed = true;
}

void uninstall_crash_handlers() {
  if (!g_installed) return;
  for (size_t i = 0; i < kNumCrashSignals; ++i)
    sigaction(kCrashSignals[i].number, &g_previous[i], nullptr);
  sigaltstack(&g_previous_altstack, nullptr);
  g_installed = false;
}

std::string dump_all_stacks(const std::string& dir, int rank, const std::string& reason) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  HYP_CHECK(!ec, "stack dump: cannot create directory {}: {}", dir, ec.message());
  install_request_handler();
  while (!try_own_dump(this_tid(), 1000)) continue;
  struct Release {
    ~Release() { g_dump_owner.store(0); }
  } release;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  Text path;
  const int fd = open_dump_file(dir.c_str(), rank, now.tv_sec, path);
  HYP_CHECK(fd >= 0, "stack dump: cannot create a file in {}: {}", dir, os_error_text(errno));
  void* pcs[kCaptureFrames];
  collect_stacks(pcs, backtrace(pcs, kCaptureFrames), 0, "dumping", 10000);
  bool ok = false;
  {
    Text w(fd);
    write_header_rest(w.str("hyperion stack dump\nreason: ").str(reason.c_str()).str("\n"), rank,
                      now);
    if (!write_symbolized(w)) write_raw(w);
    w.str("\n== end ==\n").flush();
    ok = w.ok();
  }
  ok = ::close(fd) == 0 && ok;
  HYP_CHECK(ok, "stack dump: cannot write {}: {}", path.c_str(), os_error_text(errno));
  return path.c_str();
}

void mark_abort_after_hang() {
  g_abort_after_hang.store(true);
}

}  // namespace hyperion::monitor
