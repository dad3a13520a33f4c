// utf8_invalid_at and append_utf8 (base/utf8.h) against the rules of RFC 3629.
#include "base/utf8.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>

namespace hyperion {
namespace {

TEST(Utf8, ValidText) {
  for (const std::string& s : {std::string(), std::string("plain"), std::string("caf\xC3\xA9"),
                              std::string("\xE2\x82\xAC 5"), std::string("\xF0\x9F\x98\x80"),
                              std::string("\xF4\x8F\xBF\xBF"), std::string("a\0b", 3)})
    EXPECT_EQ(utf8_invalid_at(s), std::string_view::npos) << s;
}

TEST(Utf8, InvalidTextNamesTheFirstBadByte) {
  struct Case {
    std::string text;
    size_t at;
  };
  for (const Case& c : std::initializer_list<Case>{
           {"ab\xFF", 2},                  // never in UTF-8
           {"\x80", 0},                    // a lone continuation byte
           {"x\xC3", 1},                   // truncated
           {"\xC3(", 0},                   // not a continuation
           {"\xC0\xAF", 0},                // overlong '/'
           {"\xE0\x80\xAF", 0},            // overlong
           {"ok\xED\xA0\x80", 2},          // a surrogate (U+D800)
           {"\xF4\x90\x80\x80", 0},        // above U+10FFFF
           {"caf\xC3\xA9\xE9t\xE9", 5}})  // Latin-1 after valid UTF-8
    EXPECT_EQ(utf8_invalid_at(c.text), c.at) << c.text;
}

TEST(Utf8, AppendEncodesKnownCodePoints) {
  struct Case {
    uint32_t cp;
    std::string bytes;
  };
  for (const Case& c : std::initializer_list<Case>{{0x00, std::string("\0", 1)},
                                                  {0x41, "A"},
                                                  {0x7F, "\x7F"},
                                                  {0x80, "\xC2\x80"},
                                                  {0xE9, "\xC3\xA9"},
                                                  {0x7FF, "\xDF\xBF"},
                                                  {0x800, "\xE0\xA0\x80"},
                                                  {0x20AC, "\xE2\x82\xAC"},
                                                  {0xFFFF, "\xEF\xBF\xBF"},
                                                  {0x10000, "\xF0\x90\x80\x80"},
                                                  {0x1F600, "\xF0\x9F\x98\x80"},
                                                  {0x10FFFF, "\xF4\x8F\xBF\xBF"}}) {
    std::string out = "x";  // appends, never overwrites
    append_utf8(out, c.cp);
    EXPECT_EQ(out, std::string("x").append(c.bytes)) << std::hex << c.cp;
  }
}

// Every scalar value encodes to valid UTF-8 of the shortest length, and decoding the bytes
// by hand gives the code point back.
TEST(Utf8, AppendRoundTripsEveryScalarValue) {
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string out;
    append_utf8(out, cp);
    const size_t want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    ASSERT_EQ(out.size(), want) << std::hex << cp;
    ASSERT_EQ(utf8_invalid_at(out), std::string_view::npos) << std::hex << cp;
    const auto* b = reinterpret_cast<const unsigned char*>(out.data());
    uint32_t back = want == 1 ? b[0] : b[0] & (0x7F >> want);
    for (size_t k = 1; k < want; ++k) back = (back << 6) | (b[k] & 0x3F);
    ASSERT_EQ(back, cp);
  }
}

}  // namespace
}  // namespace hyperion
