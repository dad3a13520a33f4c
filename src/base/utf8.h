// UTF-8 validity (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), for
// text a user gives that must be valid before any work starts (a prompt), and the one
// UTF-8 encoder the tokenizers, the template engine and the grammar readers share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace hyperion {

// The offset of the first byte that does not start a valid UTF-8 sequence, or npos when
// all of `text` is valid.
size_t utf8_invalid_at(std::string_view text);

// Appends code point `cp` (at most U+10FFFF) as 1 to 4 UTF-8 bytes. It does not check for
// surrogates: callers that take code points from users exclude them first.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace hyperion
