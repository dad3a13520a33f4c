#include "monitor/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "base/line_reader.h"

namespace hyperion::monitor {

double unix_time() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(now).count()) *
         1e-6;
}

double process_launch_time() {
  // Field 22 of /proc/self/stat: start time in clock ticks after boot (CLOCK_BOOTTIME).
  // It is turned into Unix time through the current boot-time clock, not /proc/stat's
  // "btime", which is whole seconds: a restarted process could otherwise seem to start
  // up to a second before its predecessor died. The command name (field 2) may hold
  // spaces and parentheses, so fields are counted after its last ')'.
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (!std::getline(stat, line)) return unix_time();
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return unix_time();
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  unsigned long long start_ticks = 0;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) start_ticks = std::strtoull(field.c_str(), nullptr, 10);
  const long ticks = sysconf(_SC_CLK_TCK);
  timespec boot{};
  if (start_ticks == 0 || ticks <= 0 || clock_gettime(CLOCK_BOOTTIME, &boot) != 0)
    return unix_time();
  const double now = unix_time();
  const double since_boot =
      static_cast<double>(boot.tv_sec) + 1e-9 * static_cast<double>(boot.tv_nsec);
  const double age = since_boot - static_cast<double>(start_ticks) / double(ticks);
  return now - std::max(0.0, age);
}

EventLog::EventLog(const std::string& run_dir, bool writer)
    : path_(run_dir + "/events.jsonl"), writer_(writer) {
  if (std::filesystem::exists(path_)) {
    // Streamed in bounded memory: a log grown huge, or a corrupt line of any length,
    // costs no more than 1 MiB here.
    LineReader in(path_, 1 << 20);
    std::string_view line;
    for (LineReader::Status st; (st = in.next(line)) != LineReader::Status::kEnd;) {
      if (st == LineReader::Status::kTooLong || !line.empty()) was_empty_ = false;
      if (line.find("\"event\":\"process_start\"") != std::string_view::npos) ++previous_attempts_;
    }
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  HYP_CHECK(fd_ >= 0, "event log {}: cannot open for appending: {}", path_, std::strerror(errno));
}

EventLog::~EventLog() {
  if (fd_ >= 0) ::close(fd_);
}

void EventLog::write(std::string_view kind, std::string_view fields) {
  if (writer_) append(unix_time(), kind, fields);
}

void EventLog::write_at(double time, std::string_view kind, std::string_view fields) {
  if (writer_) append(time, kind, fields);
}

void EventLog::write_any_rank(std::string_view kind, std::string_view fields) {
  append(unix_time(), kind, fields);
}

void EventLog::append(double time, std::string_view kind, std::string_view fields) {
  std::string line =
      fmt::format("{{\"time\":{:.6f},\"event\":\"{}\",\"pid\":{}{}{}}}\n", time, kind,
                  static_cast<long>(::getpid()), fields.empty() ? "" : ",", fields);
  // One write() per line: O_APPEND makes it land whole after every earlier line.
  const ssize_t n = ::write(fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size()) && !warned_.exchange(true)) {
    log_warn("event log {}: write failed ({}); goodput for this run will be incomplete", path_,
             n < 0 ? std::strerror(errno) : "short write");
  }
}

}  // namespace hyperion::monitor
