#include "base/error.h"

#include <cerrno>
#include <cstring>

namespace hyperion {

void throw_error(std::string message) {
  throw Error(message);
}

void throw_usage_error(std::string message) {
  throw UsageError(message);
}

std::string os_error_text(int err) {
  switch (err) {
    case ENOSPC:
      return "disk full (no space left on device)";
    case EDQUOT:
      return "disk quota exceeded";
    case EROFS:
      return "read-only file system";
    case EACCES:
    case EPERM:
      return fmt::format("permission denied ({})", std::strerror(err));
    default:
      return std::strerror(err);
  }
}

}  // namespace hyperion
