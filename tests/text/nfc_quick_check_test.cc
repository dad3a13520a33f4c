// to_nfc normalizes only the stretches around characters that may change; its result must
// be utf8proc's NFC of the whole text, on text built to hit every case: combining marks in
// and out of order, precomposed letters, singletons and composition exclusions, Hangul
// jamo that compose into syllables, kana with voicing marks, two starters that compose
// (Oriya), characters past U+FFFF.
#include <gtest/gtest.h>

#include <utf8proc.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "text/nfc_quick_check.h"

namespace hyperion::text {
namespace {

std::string utf8(uint32_t cp) {
  utf8proc_uint8_t b[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), b);
  return std::string(reinterpret_cast<const char*>(b), static_cast<size_t>(n));
}

std::string whole_nfc(const std::string& s) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

const std::vector<uint32_t> kTricky = {
    'a', 'e', 'A', ' ', '.',
    0x0300, 0x0301, 0x0308, 0x0323, 0x0345,  // combining marks (classes 230, 220, 240)
    0x0334, 0x05B0, 0x0E38,                  // marks that compose with nothing
    0x00E9, 0x00C5, 0x1E69,                  // precomposed: stay
    0x212B, 0x2126, 0x0344, 0x0958, 0x2ADC,  // singletons, a non-starter, exclusions
    0x1100, 0x1161, 0x11A8, 0xAC00, 0xAC01,  // Hangul L, V, T; LV and LVT syllables
    0x304B, 0x3099, 0x304C, 0x30AB,          // か, voicing mark, が, カ
    0x0B47, 0x0B3E, 0x0B57, 0x0B4B,          // Oriya: two starters that compose
    0x4E2D, 0x0627, 0x0915, 0x094D, 0x0937,  // CJK, Arabic, Devanagari with virama
    0x1F600, 0x1F44D, 0x1F3FD, 0x200D,       // emoji, skin tone, ZWJ
    0x1D15E, 0x1D157, 0x1D165,               // musical symbols: an excluded decomposition
    0xFB01, 0xFF26,                          // compatibility only: NFC keeps them
};

TEST(NfcQuickCheck, EqualsNormalizingTheWholeText) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20000; ++trial) {
    std::string s;
    const size_t n = 1 + rng() % 12;
    for (size_t i = 0; i < n; ++i) {
      // Mostly plain characters, as real text: stretches to normalize sit between them.
      const uint32_t cp = rng() % 3 == 0 ? kTricky[rng() % kTricky.size()]
                                         : static_cast<uint32_t>('a' + rng() % 26);
      s += utf8(cp);
    }
    const std::string expected = whole_nfc(s);
    ASSERT_EQ(to_nfc(s), expected) << "text " << s;
    if (is_certainly_nfc(s)) {
      ASSERT_EQ(expected, s) << "called NFC but is not: " << s;
    }
  }
}

TEST(NfcQuickCheck, RealTextInAnyScriptIsNfcAlready) {
  for (const char* s : {"日本語のテキストです。東京は日本の首都です。", "한국어 텍스트입니다. 안녕하세요!",
                        "مرحبا بالعالم!", "नमस्ते दुनिया! यह हिंदी में एक वाक्य है।",
                        "naïve façade jalapeño Über Straße", "Αλφα βήτα — Привет, мир!",
                        "😀 👍🏽 🇯🇵 ❤️ 👨‍👩‍👧‍👦", "ﬁ ﬂ ① ２ Ｆｕｌｌｗｉｄｔｈ"}) {
    EXPECT_TRUE(is_certainly_nfc(s)) << s;
    EXPECT_EQ(to_nfc(s), s);
  }
  // Decomposed forms, a singleton, a Hangul jamo sequence, marks out of order: not NFC,
  // and normalized.
  for (const std::string& s :
       {std::string("cafe\xCC\x81"), utf8(0x212B), utf8(0x1100) + utf8(0x1161),
        utf8(0x304B) + utf8(0x3099), utf8(0x61) + utf8(0x0301) + utf8(0x0323)}) {
    EXPECT_FALSE(is_certainly_nfc(s)) << s;
    EXPECT_EQ(to_nfc(s), whole_nfc(s));
    EXPECT_NE(to_nfc(s), s);
  }
  EXPECT_EQ(to_nfc(""), "");
}

}  // namespace
}  // namespace hyperion::text
