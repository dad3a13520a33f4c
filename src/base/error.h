// Error type and checks. Every failure hyperion reports carries a message that names
// what is at fault (file, key, op and shapes) so the user can act on it.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace hyperion {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// The command was invoked wrongly (unknown flag, command or config key, a missing or
// malformed argument): the CLI exits with status 2, as shells and argparse do, rather
// than 1 for a failure at run time.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(message) {}
};

[[noreturn]] void throw_error(std::string message);
[[noreturn]] void throw_usage_error(std::string message);

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw_error(fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void usage_fail(fmt::format_string<Args...> format, Args&&... args) {
  throw_usage_error(fmt::format(format, std::forward<Args>(args)...));
}

// What an OS error number means for the user: strerror's text, with the environment
// problems that are not hyperion's fault named as such ("disk full", "read-only file
// system", "permission denied").
std::string os_error_text(int err);

}  // namespace hyperion

// HYP_CHECK(cond, "fmt", args...): throws hyperion::Error with the formatted message.
#define HYP_CHECK(cond, ...)                    \
  do {                                          \
    if (!(cond)) ::hyperion::fail(__VA_ARGS__); \
  } while (0)

// HYP_USAGE_CHECK(cond, "fmt", args...): throws hyperion::UsageError (exit status 2).
#define HYP_USAGE_CHECK(cond, ...)                    \
  do {                                                \
    if (!(cond)) ::hyperion::usage_fail(__VA_ARGS__); \
  } while (0)
