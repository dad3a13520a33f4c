// Stack dumps of every thread of a training rank (issue 17): on a crash signal, and on
// request (the hang watchdog, monitor/hang_watchdog.h). Each dump is one file,
// RUN_DIR/stacks/rank-R-<UTC YYYYmmddTHHMMSSZ>[-N].txt (monitor/run_files.h): a header
// (reason, rank, pid, time, thread count), then every thread's id, name (from
// /proc/self/task/<tid>/comm) and frames, symbolized with elfutils' libdw: demangled
// function names from the symbol tables (file-local functions included) and file:line
// where the code has debug information, with module+offset for addr2line.
//
// How every thread is reached: the dumping thread lists /proc/self/task and sends each
// other thread a real-time signal (kStackRequestSignalOffset above SIGRTMIN) whose handler
// records that thread's backtrace() and answers through a futex. A thread that blocks
// the signal, is stopped, or does not answer within 200 ms is listed as "stack
// unavailable", so one stuck thread never stops the dump. Frames end where the unwinder
// finds no unwind information (JIT code such as oneDNN's kernels).
//
// A hang dump interrupts each thread once: system calls that are not restarted
// (nanosleep, poll, epoll_wait) return EINTR in that thread, as with any signal.
#pragma once

#include <cstdint>
#include <string>

namespace hyperion::monitor {

// The real-time signal that asks a thread for its stack is SIGRTMIN + this.
inline constexpr int kStackRequestSignalOffset = 5;

// Installs handlers for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT, running on an
// alternate signal stack in the calling thread (so a stack overflow there is caught too;
// other threads' handlers run on their own stacks). On a signal the handler:
//   1. writes every thread's raw frames to <dir>/rank-<rank>-<time>.txt with
//      async-signal-safe calls only (addresses and backtrace_symbols_fd; the directory is
//      created then, so a run that never crashes has none);
//   2. under alarm(5), so a deadlock in malloc cannot hang a dying process, appends the
//      symbolized frames (libdw allocates);
//   3. prints "rank R: SIGSEGV: stacks of N threads written to PATH" to stderr and
//      appends {"time":..,"event":"crash","pid":P,"rank":R,"signal":"SIGSEGV"} to
//      `event_fd` when >= 0 (an O_APPEND descriptor the caller owns and keeps open);
//   4. restores the default action and re-raises, so the exit status (death by that
//      signal) and core dumps are unchanged.
// Idempotent: a second call replaces dir, rank and event_fd. Throws hyperion::Error when
// `dir` is too long for the handler's fixed buffer.
void install_crash_handlers(const std::string& dir, int rank, int event_fd = -1);
// Restores the handlers (and the alternate stack) that were there before the first
// install. For tests.
void uninstall_crash_handlers();

// Not for signal handlers: writes every thread's stack now, with `reason` in the header,
// and returns the file's path. Throws hyperion::Error naming the directory when it cannot
// be created or written.
std::string dump_all_stacks(const std::string& dir, int rank, const std::string& reason);

// Marks the coming SIGABRT as the hang watchdog's own (monitor/hang_watchdog.h): the
// crash handler then records the crash event and its stderr line but writes no second
// dump. Async-signal-safe.
void mark_abort_after_hang();

}  // namespace hyperion::monitor
