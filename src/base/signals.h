// Ending a process as a signal would have: the second SIGINT/SIGTERM of a command that
// stops gracefully on the first (serve drains, the supervisor stops its workloads, the
// trainer saves) ends it at once, with the exit status a shell reports for that signal.
#pragma once

namespace hyperion {

// Restores the signal's default action, unblocks it in this thread and raises it; when
// that does not end the process (a signal whose default is to continue), exits with
// 128 + sig. Async-signal-safe.
[[noreturn]] void die_by_signal(int sig);

}  // namespace hyperion
