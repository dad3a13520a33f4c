// Minimal leveled logging to stderr. Level from HYPERION_LOG (debug, info, warn, error).
#pragma once

#include <fmt/format.h>

#include <map>
#include <string>
#include <string_view>

namespace hyperion {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_write(LogLevel level, std::string_view message);
// Multi-process runs: every line also goes to `path` (appended, flushed per line), is
// tagged "[rank R]", and reaches stderr only at `stderr_level` or above (rank 0 keeps
// info on stderr; the other ranks only warnings and errors). Empty path: no file.
void set_log_rank(int rank, const std::string& path, LogLevel stderr_level);

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kDebug)
    log_write(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kInfo)
    log_write(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kWarn)
    log_write(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  log_write(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}

// For a polling loop that meets the same problem on every pass (a corrupt file, a full
// disk): log it once, and again only when it changes, never once per pass. Not
// thread-safe (one per loop).
class OncePerChange {
 public:
  // True the first time `key` is seen in `state`, and whenever its state has changed.
  bool operator()(const std::string& key, const std::string& state) {
    auto [it, fresh] = last_.try_emplace(key, state);
    if (fresh) return true;
    if (it->second == state) return false;
    it->second = state;
    return true;
  }
  // The problem has gone: the next occurrence is logged again.
  void forget(const std::string& key) { last_.erase(key); }

 private:
  std::map<std::string, std::string> last_;
};

}  // namespace hyperion
