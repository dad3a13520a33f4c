// UTF-8 validity (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), for
// text a user gives that must be valid before any work starts (a prompt).
#pragma once

#include <cstddef>
#include <string_view>

namespace hyperion {

// The offset of the first byte that does not start a valid UTF-8 sequence, or npos when
// all of `text` is valid.
size_t utf8_invalid_at(std::string_view text);

}  // namespace hyperion
