#include "base/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace hyperion {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("HYPERION_LOG");
  if (env == nullptr) return LogLevel::kInfo;
  std::string v(env);
  if (v == "debug") return LogLevel::kDebug;
  if (v == "warn") return LogLevel::kWarn;
  if (v == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

}  // namespace

LogLevel log_level() {
  return static_cast<LogLevel>(level_storage().load(std::memory_order_relaxed));
}
void set_log_level(LogLevel level) {
  level_storage().store(static_cast<int>(level));
}

void log_write(LogLevel level, std::string_view message) {
  static std::mutex mutex;
  static const auto start = std::chrono::steady_clock::now();
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "[%9.3f %s] %.*s\n", t, kNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace hyperion
