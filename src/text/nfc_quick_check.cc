#include "text/nfc_quick_check.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>

#include "base/error.h"

namespace hyperion::text {

namespace {

// NFC_QC=Yes: the character may appear in NFC text (see the header).
bool quick_check_yes(utf8proc_int32_t cp) {
  if (cp < 0x300) return true;  // nothing below U+0300 combines with what precedes it
  if (cp >= 0x1100 && cp <= 0x11FF) return false;  // Hangul jamo compose algorithmically
  if (cp >= 0xAC00 && cp <= 0xD7A3) return true;   // into these syllables, which stay
  const utf8proc_property_t* p = utf8proc_get_property(cp);
  // utf8proc marks the second half of a composition pair with comb_index >= 0x8000.
  if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return false;
  if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) return true;  // no canonical decomposition
  // A precomposed character: NFC keeps it unless it is excluded from composition.
  utf8proc_uint8_t in[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(cp, in);
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t m =
      utf8proc_map(in, n, &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const bool same = m == n && out != nullptr && std::equal(in, in + n, out);
  std::free(out);
  return same;
}

// Per character of the Basic Multilingual Plane: NFC_QC=Yes, and combining class 0.
struct BmpTable {
  std::array<uint64_t, 1024> yes{}, starter{};
  BmpTable() {
    for (utf8proc_int32_t cp = 0; cp < 0x10000; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const uint64_t bit = uint64_t{1} << (cp & 63);
      if (quick_check_yes(cp)) yes[static_cast<size_t>(cp) >> 6] |= bit;
      if (utf8proc_get_property(cp)->combining_class == 0)
        starter[static_cast<size_t>(cp) >> 6] |= bit;
    }
  }
};

struct CharClass {
  bool yes;      // NFC_QC=Yes
  int ccc;       // canonical combining class
};

CharClass classify(uint32_t cp) {
  static const BmpTable bmp;  // thread-safe initialisation
  if (cp < 0x300) return {true, 0};
  if (cp < 0x10000) {
    const bool yes = (bmp.yes[cp >> 6] >> (cp & 63)) & 1;
    const bool starter = (bmp.starter[cp >> 6] >> (cp & 63)) & 1;
    return {yes, starter ? 0 : utf8proc_get_property(static_cast<utf8proc_int32_t>(cp))->combining_class};
  }
  // Emoji and pictographs: no canonical decompositions, nothing composes with them.
  if (cp >= 0x1F000 && cp <= 0x1FAFF) return {true, 0};
  return {quick_check_yes(static_cast<utf8proc_int32_t>(cp)),
          utf8proc_get_property(static_cast<utf8proc_int32_t>(cp))->combining_class};
}

// The code point at s[i] and its length; false past the end of a truncated sequence.
bool next_code_point(const unsigned char* s, size_t n, size_t i, uint32_t* cp, size_t* len) {
  const unsigned char c = s[i];
  if (c < 0x80) return *cp = c, *len = 1, true;
  *len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (i + *len > n) return false;
  *cp = c & (0x7F >> *len);
  for (size_t k = 1; k < *len; ++k) *cp = (*cp << 6) | (s[i + k] & 0x3F);
  return true;
}

// Scans `text` from `i`: calls on_boundary(at) before each NFC_QC=Yes starter and returns
// the offset of the first character that fails the quick check (a No or Maybe character,
// or marks out of canonical order; text.size() if none).
template <class OnBoundary>
size_t first_failure(std::string_view text, size_t i, OnBoundary&& on_boundary) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  int last_ccc = 0;
  uint32_t cp = 0;
  size_t len = 0;
  for (; i < n; i += len) {
    if (s[i] < 0x80) {
      on_boundary(i), last_ccc = 0, len = 1;
      continue;
    }
    if (!next_code_point(s, n, i, &cp, &len)) return i;
    const CharClass c = classify(cp);
    if (!c.yes || (c.ccc != 0 && c.ccc < last_ccc)) return i;
    if (c.ccc == 0) on_boundary(i);
    last_ccc = c.ccc;
  }
  return n;
}

}  // namespace

std::string utf8proc_normalize(std::string_view text, int options) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &out,
                   static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  HYP_CHECK(n >= 0, "tokenizer: Unicode normalisation failed: {}", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

bool is_certainly_nfc(std::string_view text) {
  return first_failure(text, 0, [](size_t) {}) == text.size();
}

std::string to_nfc(std::string text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  std::string out;
  size_t copied = 0;    // text[0, copied) is in out already
  size_t boundary = 0;  // where the last NFC_QC=Yes starter begins
  for (size_t i = 0;;) {
    const size_t bad = first_failure(text, i, [&](size_t at) { boundary = at; });
    if (bad == n) break;
    // A stretch to normalize: from the last boundary to the next one after `bad`.
    size_t end = bad, len = 0;
    uint32_t cp = 0;
    for (bool first = true; end < n; end += len, first = false) {
      if (!next_code_point(s, n, end, &cp, &len)) {
        end = n;
        break;
      }
      const CharClass c = classify(cp);
      if (!first && c.yes && c.ccc == 0) break;
    }
    if (out.empty()) out.reserve(n + n / 8);
    out.append(text, copied, boundary - copied);
    out += utf8proc_normalize(std::string_view(text).substr(boundary, end - boundary),
                              UTF8PROC_COMPOSE);
    copied = boundary = i = end;
    if (end == n) break;
  }
  if (copied == 0) return text;  // NFC already: no copy
  out.append(text, copied, std::string::npos);
  return out;
}

}  // namespace hyperion::text
