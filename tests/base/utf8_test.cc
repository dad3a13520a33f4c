// utf8_invalid_at (base/utf8.h) against the rules of RFC 3629.
#include "base/utf8.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace hyperion
