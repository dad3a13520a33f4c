// Sets of Unicode code points as sorted inclusive ranges, and UTF-8 encoding: what the
// grammar reader (gbnf.cc) and the regular-expression reader (regex_syntax.cc) share.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/utf8.h"

namespace hyperion::text {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code points, inclusive

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

Ranges normalize(Ranges r);                          // sorted, overlaps merged
Ranges without_surrogates(const Ranges& r);          // U+D800-U+DFFF left out
Ranges complement(const Ranges& r);                  // every scalar value not in r (normalized)
Ranges intersect(const Ranges& a, const Ranges& b);  // both normalized
bool contains(const Ranges& r, uint32_t c);
using ::hyperion::append_utf8;  // (base/utf8.h)

}  // namespace hyperion::text
