#include "base/error.h"

namespace hyperion {

void throw_error(std::string message) {
  throw Error(std::move(message));
}

}  // namespace hyperion
