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

[[noreturn]] void throw_error(std::string message);

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw_error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace hyperion

// HYP_CHECK(cond, "fmt", args...): throws hyperion::Error with the formatted message.
#define HYP_CHECK(cond, ...)                    \
  do {                                          \
    if (!(cond)) ::hyperion::fail(__VA_ARGS__); \
  } while (0)
