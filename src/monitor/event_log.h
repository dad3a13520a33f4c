// The job's event log, RUN_DIR/events.jsonl (format: monitor/run_files.h): what
// `hyperion goodput` turns into goodput and badput. One line per event, appended with a
// single write() on an O_APPEND descriptor, so lines from several processes (a crash
// handler on another rank) never interleave within a line, and a killed process keeps
// every event it wrote. Writes are not fsynced: the page cache survives the process.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace hyperion::monitor {

// Now, as Unix seconds with microseconds.
double unix_time();
// When the OS started this process (Unix seconds, to the clock tick, 10 ms; from
// /proc/self/stat and the boot-time clock), or unix_time() if /proc does not say.
double process_launch_time();

class EventLog {
 public:
  // Opens RUN_DIR/events.jsonl for appending (creating it). `writer` (rank 0) writes the
  // job's events; other ranks keep the descriptor only for their crash and hang events.
  // Throws hyperion::Error naming the file when it cannot be opened.
  EventLog(const std::string& run_dir, bool writer);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // True when the file held no event before this process opened it (a new job).
  bool was_empty() const { return was_empty_; }
  // Attempts recorded before this process (process_start lines).
  int previous_attempts() const { return previous_attempts_; }

  // Appends {"time": now, "event": kind, "pid": pid<, fields>} when writer. `fields` is
  // either empty or JSON members without braces ("\"step\":3,\"data_wait_s\":0.01").
  // An I/O error is logged once and then ignored: monitoring never stops a job.
  void write(std::string_view kind, std::string_view fields = {});
  // The same, with an explicit time (process_start's launch time goes in a field).
  void write_at(double time, std::string_view kind, std::string_view fields = {});
  // Appends even when not the writer (crash and hang events of any rank).
  void write_any_rank(std::string_view kind, std::string_view fields = {});

  // The descriptor, for the crash handler's async-signal-safe line (-1 if closed).
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  void append(double time, std::string_view kind, std::string_view fields);

  std::string path_;
  int fd_ = -1;
  bool writer_ = false;
  bool was_empty_ = true;
  int previous_attempts_ = 0;
  std::atomic<bool> warned_{false};  // the hang watchdog writes from its own thread
};

}  // namespace hyperion::monitor
