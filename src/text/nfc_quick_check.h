// Unicode Normalization Form C without normalizing what is NFC already. utf8proc's NFC
// decomposes and recomposes every character, about 35 MB/s; real text in any script is
// nearly all NFC already, and the Qwen3 and Llama 3 tokenizers apply NFC to every text
// (it was a third of the time to encode Korean). So text is scanned with Unicode's quick
// check (UAX #15, section 9), and only the stretches around characters that might change
// are handed to utf8proc.
//
// The quick check: text is NFC when every character has NFC_QC=Yes and the combining
// marks after each starter come in canonical order. A character has NFC_QC=Yes when it
// cannot be the second half of a canonical composition (a combining mark that composes, a
// Hangul vowel or final jamo) and is its own NFC (a precomposed letter such as é or が is;
// a composition exclusion or a singleton such as U+212B ANGSTROM SIGN is not). Nothing
// composes or reorders across the place just before a starter (class 0) with NFC_QC=Yes,
// so a stretch that fails is normalized from the last such place before it to the next
// one after it. The answers for the Basic Multilingual Plane are two bitmaps built on
// first use (16 KB, a few milliseconds); other planes ask utf8proc.
#pragma once

#include <string>
#include <string_view>

namespace hyperion::text {

// True when `text` (UTF-8) passes the quick check: it is NFC already.
bool is_certainly_nfc(std::string_view text);

// NFC of `text` (UTF-8), equal to utf8proc's NFC of the whole text.
std::string to_nfc(std::string text);

// utf8proc's normalization of the whole `text` with `options` (UTF8PROC_COMPOSE,
// UTF8PROC_DECOMPOSE, UTF8PROC_COMPAT; UTF8PROC_STABLE is added). Throws on failure.
std::string utf8proc_normalize(std::string_view text, int options);

}  // namespace hyperion::text
