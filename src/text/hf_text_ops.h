// The text stages of a Hugging Face tokenizer.json before the model sees a word:
// normalizers (NFC/NFD/NFKC/NFKD, Lowercase, Replace, Prepend, Strip) and pre-tokenizers
// (Split, ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit), with the semantics of
// the `tokenizers` library. Regular expressions run on PCRE2 in UTF + Unicode-property
// mode (\p{L}, \p{N}, \s as Unicode classes), JIT-compiled.
//
// Byte-level pre-tokenizers never map text to the GPT-2 byte alphabet here: the BPE model
// keys a byte-level vocabulary by raw bytes (text/bpe_model.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace hyperion::text {

// A compiled PCRE2 pattern (UTF, UCP, JIT). Thread-safe to use.
class Regex {
 public:
  // Throws hyperion::Error "<where>: invalid regex '<pattern>': <reason>".
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Calls fn(begin, end) for each non-overlapping match in `text`, left to right (an
  // empty match advances by one character). `text` must be valid UTF-8.
  template <typename Fn>
  void for_each_match(std::string_view text, Fn&& fn) const {
    size_t pos = 0, b = 0, e = 0;
    while (next_match(text, pos, &b, &e)) {
      fn(b, e);
      pos = e > b ? e : e + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      if (pos > text.size()) break;
    }
  }

 private:
  bool next_match(std::string_view text, size_t from, size_t* begin, size_t* end) const;
  void* code_ = nullptr;  // pcre2_code_8
  std::string where_;
};

// Replaces every occurrence of `from` (a literal; nothing when empty), or every match of
// `regex` when it is given, by `to`. Shared by the Replace normalizer and decoder. The
// result's length is counted first: one longer than max_bytes throws (an Error naming the
// sizes) before anything is built.
void replace_all(std::string& text, std::string_view from, std::string_view to,
                 const Regex* regex = nullptr, size_t max_bytes = SIZE_MAX);

// Expansion bombs: a chain of text steps (normalizers, decoders) turns n bytes into at
// most factor * n + extra. A tokenizer.json whose chain could grow a text more than
// kMaxTextGrowth-fold (or add more than kMaxTextExtra bytes) is refused at load (forty
// Replace "a" -> "aa" grow it 2^40-fold); a real one grows it at most about 33-fold (NFKC
// then a space to U+2581). At run time normalize() stops a text at kRunTextGrowth times
// its size plus kMaxTextExtra, whatever the chain.
struct TextGrowth {
  double factor = 1.0;
  double extra = 0.0;
  void then(double f, double e) {  // another step after this one
    factor *= f;
    extra = extra * f + e;
  }
};
inline constexpr double kMaxTextGrowth = 256.0;
inline constexpr double kMaxTextExtra = 64 << 10;
inline constexpr size_t kRunTextGrowth = 64;
// One Replace step: a literal `from` of f bytes by t bytes; a regex may match an empty
// string, so it may insert its replacement between any two characters.
TextGrowth replace_growth(size_t from_bytes, size_t to_bytes, bool regex);

struct NormalizerOp {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kReplace, kPrepend, kStrip };
  Kind kind;
  std::string pattern;           // Replace: the literal (when regex is null)
  std::shared_ptr<Regex> regex;  // Replace with a Regex pattern
  std::string content;           // Replace's replacement; Prepend's prefix
  bool strip_left = false, strip_right = false;
};

// The most a normalizer chain can grow a text (see TextGrowth).
TextGrowth normalizer_growth(const std::vector<NormalizerOp>& ops);

// Applies the ops in order; a step whose output would pass max_bytes throws an Error
// naming the sizes.
std::string normalize(const std::vector<NormalizerOp>& ops, std::string text,
                      size_t max_bytes = SIZE_MAX);

struct PreTokenizerOp {
  enum class Kind { kSplit, kByteLevel, kMetaspace, kDigits, kWhitespace, kWhitespaceSplit };
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  enum class Prepend { kAlways, kFirst, kNever };
  Kind kind;
  // Split
  std::string pattern;           // a literal (when regex is null)
  std::shared_ptr<Regex> regex;  // Split's Regex pattern; ByteLevel's use_regex; Whitespace
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  // ByteLevel
  bool add_prefix_space = false;
  // Metaspace
  std::string replacement = "\xE2\x96\x81";  // U+2581
  Prepend prepend = Prepend::kAlways;
  bool split = true;
  // Digits
  bool individual_digits = false;
};

// Receives each word of a text in turn; the view lives until the call returns.
class WordSink {
 public:
  // Refers to `f`, which must outlive the sink. Not for copies: a WordSink copies as a
  // plain value (a template taking one would refer to the copied-from sink instead).
  template <class F>
    requires(!std::is_same_v<std::remove_cv_t<F>, WordSink>)
  WordSink(F& f)  // NOLINT: made from any callable, as std::function_ref
      : object_(&f), call_([](void* o, std::string_view w) { (*static_cast<F*>(o))(w); }) {}
  void operator()(std::string_view word) const { call_(object_, word); }

 private:
  void* object_;
  void (*call_)(void*, std::string_view);
};

// Splits `text` (one segment between added tokens; `at_start` when it begins the input)
// into the words the model encodes, handed to `sink` in order. Each word goes through
// every pre-tokenizer before the next is split off, so no list of all the words is ever
// built: a text's encoding touches memory for its ids, not for its words (on a virtual
// machine each fresh page costs a fault: building the lists was half the time to encode
// a 256 KB text once).
void pre_tokenize(const std::vector<PreTokenizerOp>& ops, std::string_view text, bool at_start,
                  WordSink sink);

// The GPT-2 split regex that ByteLevel's use_regex applies.
extern const char* const kGpt2SplitPattern;

}  // namespace hyperion::text
