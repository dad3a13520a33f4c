#include "text/grammar/regex_syntax.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "base/utf8.h"

namespace hyperion::text::regex {

bool nullable(const Node& n) {
  switch (n.kind) {
    case Node::kSet:
      return false;
    case Node::kSeq:
      return std::all_of(n.kids.begin(), n.kids.end(), nullable);
    case Node::kAlt:
      return std::any_of(n.kids.begin(), n.kids.end(), nullable);
    case Node::kRepeat:
      return n.min == 0 || nullable(n.kids[0]);
    default:
      return true;
  }
}

void regex_error(size_t offset, const std::string& message) {
  throw GrammarError(fmt::format("offset {}", offset), message);
}

namespace {

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMA-262 WhiteSpace and LineTerminator.
const Ranges kSpace = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                       {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                       {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
// What `.` matches: all but the line terminators.
const Ranges kDot = complement({{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}});

Node set_node(Ranges r) {
  Node n{Node::kSet};
  n.set = std::move(r);
  return n;
}

class RegexParser {
 public:
  explicit RegexParser(std::string_view p) : s_(p) {}

  Node parse() {
    if (s_.size() > GrammarLimits::kMaxSourceBytes)
      throw GrammarError("", fmt::format("the pattern is {} bytes, over the limit of {}", s_.size(),
                                         GrammarLimits::kMaxSourceBytes));
    const size_t bad = utf8_invalid_at(s_);
    if (bad != std::string_view::npos) error(bad, "invalid UTF-8");
    Node n = parse_alt(0);
    if (p_ < s_.size()) error(p_, "unbalanced ')': no '(' opens it");  // parse_alt stops only there
    return n;
  }

  [[noreturn]] static void error(size_t at, const std::string& what) { regex_error(at, what); }

 private:
  bool at_end() const { return p_ >= s_.size(); }
  char peek(size_t k = 0) const { return p_ + k < s_.size() ? s_[p_ + k] : '\0'; }

  Node parse_alt(int depth) {
    Node alt{Node::kAlt};
    alt.kids.push_back(parse_seq(depth));
    while (!at_end() && peek() == '|') {
      ++p_;
      alt.kids.push_back(parse_seq(depth));
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  Node parse_seq(int depth) {
    Node seq{Node::kSeq};
    while (!at_end() && peek() != '|' && peek() != ')') {
      Node atom = parse_atom(depth);
      parse_quantifier(atom);
      seq.kids.push_back(std::move(atom));
    }
    return seq.kids.size() == 1 ? std::move(seq.kids[0]) : seq;
  }

  Node parse_atom(int depth) {
    const size_t at = p_;
    const char c = peek();
    switch (c) {
      case '(':
        return parse_group(depth);
      case '[':
        return set_node(parse_class());
      case '.':
        ++p_;
        return set_node(kDot);
      case '^':
      case '$': {
        ++p_;
        Node n{c == '^' ? Node::kStart : Node::kEnd};
        n.offset = at;
        return n;
      }
      case '*':
      case '+':
      case '?':
      case '{':
        error(at, fmt::format("quantifier '{}' with nothing to repeat", c));
      case '\\': {
        auto [set, single] = parse_escape(false);
        (void)single;
        return set_node(std::move(set));
      }
      default: {
        const uint32_t cp = next_code_point();
        return set_node({{cp, cp}});
      }
    }
  }

  Node parse_group(int depth) {
    const size_t at = p_;
    ++p_;
    if (depth + 1 > kMaxGroupNesting)
      error(at, fmt::format("groups nest deeper than {}", kMaxGroupNesting));
    if (peek() == '?') {
      const std::string_view rest = s_.substr(p_);
      if (rest.substr(0, 2) == "?:") {
        p_ += 2;
      } else if (rest.substr(0, 2) == "?=" || rest.substr(0, 2) == "?!" ||
                 rest.substr(0, 3) == "?<=" || rest.substr(0, 3) == "?<!") {
        error(at, "lookaround assertions are not supported");
      } else if (rest.substr(0, 2) == "?<" || rest.substr(0, 3) == "?P<") {
        const size_t close = s_.find('>', p_);
        if (close == std::string_view::npos) error(at, "a group name with no closing '>'");
        p_ = close + 1;
      } else {
        error(at, "unsupported group syntax '(?' (only (?: ) and (?<name> ) are supported)");
      }
    }
    Node inner = parse_alt(depth + 1);
    if (at_end() || peek() != ')') error(at, "unbalanced '(': no ')' closes it");
    ++p_;
    return inner;
  }

  void parse_quantifier(Node& atom) {
    if (at_end()) return;
    const size_t at = p_;
    int lo = 0, hi = 0;
    switch (peek()) {
      case '*':
        lo = 0, hi = -1, ++p_;
        break;
      case '+':
        lo = 1, hi = -1, ++p_;
        break;
      case '?':
        lo = 0, hi = 1, ++p_;
        break;
      case '{':
        parse_braces(lo, hi);
        break;
      default:
        return;
    }
    if (atom.kind == Node::kStart || atom.kind == Node::kEnd)
      error(at, "a quantifier on an anchor (nothing to repeat)");
    if (peek() == '?') ++p_;  // lazy: the same language
    if (!at_end() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{'))
      error(p_, "a quantifier cannot follow another quantifier");
    Node rep{Node::kRepeat};
    rep.min = lo, rep.max = hi;
    rep.kids.push_back(std::move(atom));
    atom = std::move(rep);
  }

  // {m} {m,} {m,n}
  void parse_braces(int& lo, int& hi) {
    const size_t at = p_;
    ++p_;
    auto number = [&]() -> std::optional<int> {
      const size_t b = p_;
      int64_t v = 0;
      while (!at_end() && peek() >= '0' && peek() <= '9') {
        v = std::min<int64_t>(v * 10 + (peek() - '0'), int64_t{1} << 40);
        ++p_;
      }
      if (p_ == b) return std::nullopt;
      if (v > GrammarLimits::kMaxRepeat)
        error(b, fmt::format("a repetition count over {}", GrammarLimits::kMaxRepeat));
      return static_cast<int>(v);
    };
    const auto m = number();
    bool ok = m.has_value();
    std::optional<int> n = m;
    if (ok && peek() == ',') {
      ++p_;
      n = number();
      if (!n) n = -1;
    }
    if (!ok || peek() != '}')
      error(at, "a '{' that does not start a quantifier {m}, {m,} or {m,n} (escape it as \\{)");
    ++p_;
    lo = *m, hi = *n;
    if (hi >= 0 && hi < lo) error(at, fmt::format("quantifier {{{},{}}}: max below min", lo, hi));
  }

  // [...] as its code points.
  Ranges parse_class() {
    const size_t at = p_;
    ++p_;
    bool negated = false;
    if (peek() == '^') negated = true, ++p_;
    Ranges r;
    for (;;) {
      if (at_end()) error(at, "unbalanced '[': no ']' closes the class");
      if (peek() == ']') break;
      const size_t item_at = p_;
      auto [lo_set, lo_single] = class_atom();
      if (peek() == '-' && p_ + 1 < s_.size() && s_[p_ + 1] != ']') {
        ++p_;
        auto [hi_set, hi_single] = class_atom();
        if (!lo_single || !hi_single) error(item_at, "a class range whose end is a class escape");
        if (hi_set[0].first < lo_set[0].first)
          error(item_at, fmt::format("class range out of order (U+{:04X}-U+{:04X})",
                                     lo_set[0].first, hi_set[0].first));
        r.emplace_back(lo_set[0].first, hi_set[0].first);
      } else {
        r.insert(r.end(), lo_set.begin(), lo_set.end());
      }
    }
    ++p_;
    r = without_surrogates(normalize(std::move(r)));
    if (negated) r = complement(r);
    if (r.empty()) error(at, "a character class that matches nothing");
    return r;
  }

  std::pair<Ranges, bool> class_atom() {
    if (peek() == '\\') return parse_escape(true);
    const uint32_t cp = next_code_point();
    return {{{cp, cp}}, true};
  }

  // After a '\': the set it denotes and whether that is one character.
  std::pair<Ranges, bool> parse_escape(bool in_class) {
    const size_t at = p_;
    if (p_ + 1 >= s_.size()) error(at, "a '\\' at the end of the pattern");
    const char e = s_[p_ + 1];
    p_ += 2;
    auto one = [](uint32_t c) { return std::pair<Ranges, bool>{{{c, c}}, true}; };
    auto set = [](const Ranges& r) { return std::pair<Ranges, bool>{r, false}; };
    switch (e) {
      case 'd':
        return set(kDigit);
      case 'D':
        return set(complement(kDigit));
      case 'w':
        return set(kWord);
      case 'W':
        return set(complement(kWord));
      case 's':
        return set(kSpace);
      case 'S':
        return set(complement(kSpace));
      case 'n':
        return one('\n');
      case 't':
        return one('\t');
      case 'r':
        return one('\r');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case 'b':
        if (in_class) return one('\b');
        error(at, "word boundaries (\\b) are not supported");
      case 'B':
        error(at, "word boundaries (\\B) are not supported");
      case '0':
        if (peek() >= '0' && peek() <= '9') error(at, "octal escapes are not supported");
        return one(0);
      case 'x':
        return one(hex(2, at));
      case 'u':
        return one(unicode_escape(at));
      case 'c': {
        const char l = peek();
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z')))
          error(at, "\\c must be followed by a letter");
        ++p_;
        return one(static_cast<uint32_t>(l) % 32);
      }
      case 'k':
        error(at, "backreferences (\\k<name>) are not supported");
      case 'p':
      case 'P':
        error(at, "Unicode property escapes are not supported");
      default:
        break;
    }
    if (e >= '1' && e <= '9') error(at, "backreferences are not supported");
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
      error(at, fmt::format("unknown escape '\\{}'", e));
    p_ = at + 1;  // an identity escape: the character itself (UTF-8 included)
    const uint32_t cp = next_code_point();
    return one(cp);
  }

  uint32_t hex(int digits, size_t at) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const int d = hex_digit(peek());
      if (at_end() || d < 0) error(at, fmt::format("expected {} hex digits in the escape", digits));
      v = v * 16 + static_cast<uint32_t>(d);
      ++p_;
    }
    return v;
  }
  static int hex_digit(char h) {
    if (h >= '0' && h <= '9') return h - '0';
    if (h >= 'a' && h <= 'f') return h - 'a' + 10;
    if (h >= 'A' && h <= 'F') return h - 'A' + 10;
    return -1;
  }

  // \uHHHH (a UTF-16 surrogate pair \uD83D\uDE00 is one character) or \u{H...}.
  uint32_t unicode_escape(size_t at) {
    uint32_t v = 0;
    if (peek() == '{') {
      ++p_;
      int n = 0;
      while (!at_end() && hex_digit(peek()) >= 0 && n < 8)
        v = v * 16 + static_cast<uint32_t>(hex_digit(peek())), ++p_, ++n;
      if (n == 0 || peek() != '}') error(at, "expected hex digits and '}' in \\u{...}");
      ++p_;
    } else {
      v = hex(4, at);
      if (v >= 0xD800 && v <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
        const size_t save = p_;
        p_ += 2;
        const uint32_t lo = hex(4, save);
        if (lo >= 0xDC00 && lo <= 0xDFFF) return 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
        p_ = save;
      }
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
      error(at, fmt::format("\\u escape U+{:X} is not a Unicode scalar value", v));
    return v;
  }

  // The code point at p_ (the pattern is valid UTF-8: checked first).
  uint32_t next_code_point() {
    const auto c = static_cast<unsigned char>(s_[p_]);
    const int len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s_[p_ + static_cast<size_t>(k)]) & 0x3F);
    p_ += static_cast<size_t>(len);
    return cp;
  }

  std::string_view s_;
  size_t p_ = 0;
};

}  // namespace

Node parse_regex(std::string_view pattern) {
  return RegexParser(pattern).parse();
}

}  // namespace hyperion::text::regex
