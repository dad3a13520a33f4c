#include "text/hf_text_ops.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "base/error.h"
#include "text/nfc_quick_check.h"

namespace hyperion::text {

const char* const kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// PCRE2 match data is per call (it is not thread-safe); one per thread is kept.
struct MatchData {
  pcre2_match_data* md = pcre2_match_data_create(16, nullptr);
  ~MatchData() { pcre2_match_data_free(md); }
};

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) : where_(where) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("{}: invalid regex '{}' at offset {}: {}", where, pattern, offset,
         reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
  code_ = code;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool Regex::next_match(std::string_view text, size_t from, size_t* begin, size_t* end) const {
  thread_local MatchData data;
  if (from > text.size()) return false;
  // The text was checked as UTF-8 once, before the pipeline (text/hf_tokenizer.cc).
  const int rc =
      pcre2_match(static_cast<const pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(text.data()),
                  text.size(), from, PCRE2_NO_UTF_CHECK, data.md, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    fail("{}: regex match failed on a text of {} bytes: {}", where_, text.size(),
         reinterpret_cast<const char*>(msg));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.md);
  *begin = ov[0], *end = ov[1];
  return true;
}

namespace {

// s = prefix + s (not std::string::insert(0, ...): GCC 12's -Wrestrict misfires on it).
void prepend(std::string& s, std::string_view prefix) {
  std::string out;
  out.reserve(prefix.size() + s.size());
  out.append(prefix).append(s);
  s = std::move(out);
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

}  // namespace

void replace_all(std::string& text, std::string_view from, std::string_view to,
                 const Regex* regex, size_t max_bytes) {
  auto too_long = [&](size_t bytes) {
    fail("tokenizer: a Replace step would make {} bytes of a {}-byte text, more than the {} "
         "allowed",
         bytes, text.size(), max_bytes);
  };
  if (regex != nullptr) {
    std::vector<std::pair<size_t, size_t>> hits;
    size_t bytes = text.size();
    regex->for_each_match(text, [&](size_t b, size_t e) {
      hits.emplace_back(b, e);
      bytes = bytes - (e - b) + to.size();
      if (bytes > max_bytes) too_long(bytes);
    });
    if (hits.empty()) return;
    std::string out;
    out.reserve(bytes);
    size_t last = 0;
    for (const auto& [b, e] : hits) {
      out.append(text, last, b - last).append(to);
      last = e;
    }
    out.append(text, last);
    text = std::move(out);
    return;
  }
  if (from.empty()) return;
  size_t count = 0;
  for (size_t hit, pos = 0; (hit = text.find(from, pos)) != std::string::npos;
       pos = hit + from.size())
    ++count;
  if (count == 0) return;
  const size_t bytes = text.size() - count * from.size() + count * to.size();
  if (bytes > max_bytes) too_long(bytes);
  std::string out;
  out.reserve(bytes);
  size_t pos = 0;
  for (size_t hit; (hit = text.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(text, pos, hit - pos);
    out += to;
  }
  out.append(text, pos);
  text = std::move(out);
}

TextGrowth replace_growth(size_t from_bytes, size_t to_bytes, bool regex) {
  TextGrowth g;
  if (regex) {
    g.then(1.0 + double(to_bytes), double(to_bytes));  // to_bytes before every character, and at the end
  } else if (from_bytes > 0) {
    g.then(std::max(1.0, double(to_bytes) / double(from_bytes)), 0.0);
  }
  return g;
}

TextGrowth normalizer_growth(const std::vector<NormalizerOp>& ops) {
  using K = NormalizerOp::Kind;
  TextGrowth g;
  for (const NormalizerOp& op : ops) {
    switch (op.kind) {
      // UTF-8 bytes, by the Unicode standard's bounds on normalisation: canonical forms
      // at most 3-fold, compatibility forms 11-fold (U+FDFA); lowercasing at most 1.5-fold.
      case K::kNfc:
      case K::kNfd:
        g.then(3.0, 0.0);
        break;
      case K::kNfkc:
      case K::kNfkd:
        g.then(11.0, 0.0);
        break;
      case K::kLowercase:
        g.then(2.0, 0.0);
        break;
      case K::kReplace: {
        const TextGrowth r = replace_growth(op.pattern.size(), op.content.size(), op.regex != nullptr);
        g.then(r.factor, r.extra);
        break;
      }
      case K::kPrepend:
        g.then(1.0, double(op.content.size()));
        break;
      case K::kStrip:
        break;
    }
  }
  return g;
}

namespace {

// Decodes the code point at s[i] (valid UTF-8) and its length.
uint32_t code_point_at(std::string_view s, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return *len = 1, c;
  const size_t n = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  uint32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n && i + k < s.size(); ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}

bool is_unicode_space(uint32_t cp) {
  // Rust's char::is_whitespace: the White_Space property.
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string strip(const std::string& text, bool left, bool right) {
  size_t b = 0, e = text.size(), len = 0;
  if (left)
    while (b < e && is_unicode_space(code_point_at(text, b, &len))) b += len;
  if (right) {
    while (e > b) {
      size_t s = e - 1;
      while (s > b && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
      if (!is_unicode_space(code_point_at(text, s, &len))) break;
      e = s;
    }
  }
  return text.substr(b, e - b);
}

std::string lowercase(const std::string& text) {
  if (is_ascii(text)) {
    std::string out = text;
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return out;
  }
  std::string out;
  for (size_t i = 0, len = 0; i < text.size(); i += len) {
    const auto cp = static_cast<utf8proc_int32_t>(code_point_at(text, i, &len));
    utf8proc_uint8_t buf[4];
    const utf8proc_ssize_t n = utf8proc_encode_char(utf8proc_tolower(cp), buf);
    out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

std::string normalize(const std::vector<NormalizerOp>& ops, std::string text,
                      size_t max_bytes) {
  using K = NormalizerOp::Kind;
  const size_t input = text.size();
  auto check = [&] {
    if (text.size() > max_bytes)
      fail("tokenizer: normalizing a {}-byte text made {} bytes, more than the {} allowed", input,
           text.size(), max_bytes);
  };
  for (const NormalizerOp& op : ops) {
    switch (op.kind) {
      case K::kNfc:
        text = to_nfc(std::move(text));
        break;
      case K::kNfd:
        if (!is_ascii(text)) text = utf8proc_normalize(text, UTF8PROC_DECOMPOSE);
        break;
      case K::kNfkc:
        if (!is_ascii(text)) text = utf8proc_normalize(text, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
        break;
      case K::kNfkd:
        if (!is_ascii(text)) text = utf8proc_normalize(text, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
        break;
      case K::kLowercase:
        text = lowercase(text);
        break;
      case K::kReplace:
        replace_all(text, op.pattern, op.content, op.regex.get(), max_bytes);
        break;
      case K::kPrepend:
        if (!text.empty()) prepend(text, op.content);
        break;
      case K::kStrip:
        text = strip(text, op.strip_left, op.strip_right);
        break;
    }
    check();
  }
  return text;
}

namespace {

// A view into the input or into text a pre-tokenizer rewrote.
struct Piece {
  std::string_view text;
  bool at_start;  // begins at offset 0 of the input
};

// Receives the pieces one pre-tokenizer makes, for the next (as WordSink).
class PieceSink {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cv_t<F>, PieceSink>)  // copies copy (see WordSink)
  PieceSink(F& f)  // NOLINT: made from any callable
      : object_(&f), call_([](void* o, const Piece& p) { (*static_cast<F*>(o))(p); }) {}
  void operator()(const Piece& p) const { call_(object_, p); }

 private:
  void* object_;
  void (*call_)(void*, const Piece&);
};

// Groups the gaps and matches of a split, in order, by the delimiter behaviour, as the
// `tokenizers` library's split does over its list of them; sends each non-empty group on.
// At most one group waits for the span after it.
class SpanGrouper {
 public:
  using B = PreTokenizerOp::Behavior;
  SpanGrouper(const Piece& piece, B behavior, PieceSink out)
      : piece_(piece), behavior_(behavior), out_(out) {}

  void span(size_t begin, size_t end, bool is_match) {
    switch (behavior_) {
      case B::kRemoved:
        if (!is_match) emit(begin, end);
        break;
      case B::kIsolated:
        emit(begin, end);
        break;
      case B::kMergedWithPrevious:  // a match joins the gap before it
        if (is_match && !previous_match_ && pending_) {
          end_ = end;
        } else {
          flush();
          hold(begin, end);
        }
        break;
      case B::kMergedWithNext:  // a match joins the gap after it
        if (pending_ && previous_match_ && !is_match) {
          end_ = end;
          flush();
        } else {
          flush();
          if (is_match) {
            hold(begin, end);
          } else {
            emit(begin, end);
          }
        }
        break;
      case B::kContiguous:  // runs of matches, and of gaps, are one piece each
        if (pending_ && is_match == previous_match_) {
          end_ = end;
        } else {
          flush();
          hold(begin, end);
        }
        break;
    }
    previous_match_ = is_match;
  }
  void finish() { flush(); }

 private:
  void emit(size_t b, size_t e) {
    if (e > b) out_({piece_.text.substr(b, e - b), piece_.at_start && b == 0});
  }
  void hold(size_t b, size_t e) { pending_ = true, begin_ = b, end_ = e; }
  void flush() {
    if (pending_) emit(begin_, end_);
    pending_ = false;
  }

  const Piece& piece_;
  B behavior_;
  PieceSink out_;
  bool pending_ = false, previous_match_ = false;
  size_t begin_ = 0, end_ = 0;
};

// Gaps and matches covering the piece, as the `tokenizers` library's find_matches: `find`
// calls its argument with each match [b, e) in order.
template <typename FindFn>
void split(const Piece& piece, bool invert, PreTokenizerOp::Behavior behavior, PieceSink out,
           FindFn&& find) {
  SpanGrouper group(piece, behavior, out);
  size_t prev = 0;
  find([&](size_t b, size_t e) {
    if (b > prev) group.span(prev, b, invert);
    group.span(b, e, !invert);
    prev = e;
  });
  if (prev < piece.text.size()) group.span(prev, piece.text.size(), invert);
  group.finish();
}

void split_literal(const Piece& piece, std::string_view lit, bool invert,
                   PreTokenizerOp::Behavior behavior, PieceSink out) {
  const std::string_view t = piece.text;
  split(piece, invert, behavior, out, [&](auto&& emit) {
    if (lit.empty()) return;
    for (size_t pos = 0, hit; (hit = t.find(lit, pos)) != std::string::npos; pos = hit + lit.size())
      emit(hit, hit + lit.size());
  });
}

void split_regex(const Piece& piece, const Regex& re, bool invert,
                 PreTokenizerOp::Behavior behavior, PieceSink out) {
  split(piece, invert, behavior, out, [&](auto&& emit) { re.for_each_match(piece.text, emit); });
}

void split_by_char_class(const Piece& piece, bool (*is_member)(uint32_t),
                         PreTokenizerOp::Behavior behavior, PieceSink out) {
  const std::string_view t = piece.text;
  split(piece, false, behavior, out, [&](auto&& emit) {
    for (size_t i = 0, len = 0; i < t.size(); i += len)
      if (is_member(code_point_at(t, i, &len))) emit(i, i + len);
  });
}

bool is_numeric(uint32_t cp) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp)) >= UTF8PROC_CATEGORY_ND &&
         utf8proc_category(static_cast<utf8proc_int32_t>(cp)) <= UTF8PROC_CATEGORY_NO;
}

// One pre-tokenizer on one piece; the pieces it makes go to `out`. Text it rewrites lives
// in a local string, alive while `out` runs.
void apply_op(const PreTokenizerOp& op, Piece p, PieceSink out) {
  using K = PreTokenizerOp::Kind;
  using B = PreTokenizerOp::Behavior;
  switch (op.kind) {
    case K::kSplit:
      if (op.regex) {
        split_regex(p, *op.regex, op.invert, op.behavior, out);
      } else {
        split_literal(p, op.pattern, op.invert, op.behavior, out);
      }
      break;
    case K::kByteLevel: {
      std::string spaced;
      if (op.add_prefix_space && !p.text.empty() && p.text[0] != ' ') {
        spaced.reserve(p.text.size() + 1);
        spaced.append(" ").append(p.text);
        p.text = spaced;
      }
      if (op.regex) {
        split_regex(p, *op.regex, false, B::kIsolated, out);
      } else {
        out(p);
      }
      break;
    }
    case K::kMetaspace: {
      std::string text(p.text);
      replace_all(text, " ", op.replacement);
      const bool starts = text.compare(0, op.replacement.size(), op.replacement) == 0;
      const bool add = op.prepend == PreTokenizerOp::Prepend::kAlways ||
                       (op.prepend == PreTokenizerOp::Prepend::kFirst && p.at_start);
      if (add && !starts && !text.empty()) prepend(text, op.replacement);
      p.text = text;
      if (op.split) {
        split_literal(p, op.replacement, false, B::kMergedWithNext, out);
      } else {
        out(p);
      }
      break;
    }
    case K::kDigits:
      split_by_char_class(p, is_numeric, op.individual_digits ? B::kIsolated : B::kContiguous,
                          out);
      break;
    case K::kWhitespace:
      split_regex(p, *op.regex, true, B::kRemoved, out);
      break;
    case K::kWhitespaceSplit:
      split_by_char_class(p, is_unicode_space, B::kRemoved, out);
      break;
  }
}

// Pre-tokenizers [k, end) on one piece, depth first: each piece a step makes goes through
// the remaining steps before the step makes its next one.
void run_ops(const std::vector<PreTokenizerOp>& ops, size_t k, const Piece& p, WordSink sink) {
  if (k == ops.size()) {
    if (!p.text.empty()) sink(p.text);
    return;
  }
  auto next = [&](const Piece& q) { run_ops(ops, k + 1, q, sink); };
  apply_op(ops[k], p, PieceSink(next));
}

}  // namespace

void pre_tokenize(const std::vector<PreTokenizerOp>& ops, std::string_view text, bool at_start,
                  WordSink sink) {
  if (text.empty()) return;
  run_ops(ops, 0, Piece{text, at_start}, sink);
}

}  // namespace hyperion::text
