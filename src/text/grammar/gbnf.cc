#include "text/grammar/gbnf.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>

#include "text/grammar/code_points.h"
#include "text/grammar/grammar_stacks.h"

namespace hyperion::text {

namespace {

struct Expr {
  enum Kind { kSeq, kAlt, kLiteral, kClass, kRef, kToken, kTokenText, kRepeat };
  Kind kind = kSeq;
  std::string text;  // kLiteral: the bytes; kRef: the name; kTokenText: the token's text
  Ranges ranges;     // kClass, sorted and merged
  int32_t token = 0;
  int min = 0, max = 0;  // kRepeat; max -1: unbounded
  size_t offset = 0;     // where it starts in the source
  std::vector<Expr> kids;
};

Expr make(Expr::Kind kind) {
  Expr e;
  e.kind = kind;
  return e;
}

using ByteRun = std::vector<std::pair<uint8_t, uint8_t>>;  // one byte range per position

// The UTF-8 encodings of the code points [lo, hi] as runs of byte ranges: the range is
// split until every run's positions vary independently (the split regex engines use).
void utf8_runs(uint32_t lo, uint32_t hi, std::vector<ByteRun>& out) {
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  for (uint32_t end : kLengthEnds) {  // one encoded length at a time
    if (lo <= end && hi > end) {
      utf8_runs(lo, end, out);
      utf8_runs(end + 1, hi, out);
      return;
    }
  }
  for (int i = 1; i < 4; ++i) {  // continuation bytes must span their full range
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_runs(lo, lo | m, out);
        utf8_runs((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_runs(lo, (hi & ~m) - 1, out);
        utf8_runs(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  ByteRun run;
  for (size_t k = 0; k < a.size(); ++k)
    run.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  out.push_back(std::move(run));
}

// ---------------------------------------------------------------------------------------
// The parser.

class Parser {
 public:
  explicit Parser(std::string_view src) : s_(src) {}

  std::vector<std::pair<std::string, Expr>> parse() {
    std::vector<std::pair<std::string, Expr>> rules;
    skip_space();
    while (p_ < s_.size()) {
      const size_t at = p_;
      std::string name = parse_name();
      if (name.empty()) error(at, "expected a rule name");
      skip_space();
      if (s_.substr(p_, 3) != "::=") error(p_, fmt::format("expected '::=' after '{}'", name));
      p_ += 3;
      Expr e = parse_alternatives(0);
      if (p_ < s_.size() && s_[p_] == ')') error(p_, "unbalanced ')'");
      rules.emplace_back(std::move(name), std::move(e));
      skip_space();
    }
    return rules;
  }

  [[noreturn]] void error(size_t at, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n')
        ++line, col = 1;
      else
        ++col;
    }
    throw GrammarError(fmt::format("line {}, column {}", line, col), what);
  }
  std::string where(size_t at) const {
    try {
      error(at, "");
    } catch (const GrammarError& e) {
      return e.where;
    }
  }

 private:
  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
  }
  void skip_space() {
    while (p_ < s_.size()) {
      const char c = s_[p_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++p_;
      } else if (c == '#') {
        while (p_ < s_.size() && s_[p_] != '\n') ++p_;
      } else {
        break;
      }
    }
  }
  std::string parse_name() {
    const size_t b = p_;
    while (p_ < s_.size() && name_char(s_[p_])) ++p_;
    return std::string(s_.substr(b, p_ - b));
  }
  // Whether a rule definition (`name ::=`) starts at p_.
  bool at_definition() const {
    size_t q = p_;
    while (q < s_.size() && name_char(s_[q])) ++q;
    if (q == p_) return false;
    while (q < s_.size() && (s_[q] == ' ' || s_[q] == '\t' || s_[q] == '\n' || s_[q] == '\r'))
      ++q;
    return s_.substr(q, 3) == "::=";
  }

  Expr parse_alternatives(int depth) {
    if (depth > GrammarLimits::kMaxNesting)
      error(p_, fmt::format("groups nest deeper than {}", GrammarLimits::kMaxNesting));
    Expr alt = make(Expr::kAlt);
    alt.offset = p_;
    alt.kids.push_back(parse_sequence(depth));
    while (p_ < s_.size() && s_[p_] == '|') {
      ++p_;
      alt.kids.push_back(parse_sequence(depth));
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  Expr parse_sequence(int depth) {
    Expr seq = make(Expr::kSeq);
    seq.offset = p_;
    for (;;) {
      skip_space();
      if (p_ >= s_.size()) break;
      const char c = s_[p_];
      if (c == '|' || c == ')') break;
      if (name_char(c) && at_definition()) break;
      Expr item = parse_primary(depth);
      parse_postfix(item);
      seq.kids.push_back(std::move(item));
    }
    return seq.kids.size() == 1 ? std::move(seq.kids[0]) : seq;
  }

  void parse_postfix(Expr& item) {
    for (;;) {
      if (p_ >= s_.size()) return;
      const char c = s_[p_];
      int lo = 0, hi = 0;
      const size_t at = p_;
      if (c == '*') {
        lo = 0, hi = -1, ++p_;
      } else if (c == '+') {
        lo = 1, hi = -1, ++p_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++p_;
      } else if (c == '{') {
        ++p_;
        lo = parse_count();
        hi = lo;
        if (p_ < s_.size() && s_[p_] == ',') {
          ++p_;
          skip_blanks();
          hi = p_ < s_.size() && s_[p_] == '}' ? -1 : parse_count();
        }
        skip_blanks();
        if (p_ >= s_.size() || s_[p_] != '}') error(p_, "expected '}' closing a repetition");
        ++p_;
        if (hi >= 0 && hi < lo) error(at, fmt::format("repetition {{{},{}}}: max below min", lo, hi));
      } else {
        return;
      }
      Expr rep = make(Expr::kRepeat);
      rep.offset = at;
      rep.min = lo, rep.max = hi;
      rep.kids.push_back(std::move(item));
      item = std::move(rep);
    }
  }
  void skip_blanks() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\t')) ++p_;
  }
  int parse_count() {
    skip_blanks();
    const size_t b = p_;
    int64_t v = 0;
    while (p_ < s_.size() && s_[p_] >= '0' && s_[p_] <= '9') {
      v = v * 10 + (s_[p_] - '0');
      if (v > GrammarLimits::kMaxRepeat)
        error(b, fmt::format("a repetition count over {}", GrammarLimits::kMaxRepeat));
      ++p_;
    }
    if (p_ == b) error(b, "expected a number in a repetition");
    skip_blanks();
    return static_cast<int>(v);
  }

  Expr parse_primary(int depth) {
    const size_t at = p_;
    const char c = s_[p_];
    if (c == '"') {
      Expr lit = make(Expr::kLiteral);
      lit.offset = at;
      ++p_;
      for (;;) {
        if (p_ >= s_.size()) error(at, "unterminated string literal");
        if (s_[p_] == '"') break;
        append_utf8(lit.text, parse_char(true));
      }
      ++p_;
      return lit;
    }
    if (c == '[') return parse_class();
    if (c == '.') {
      ++p_;
      Expr any = make(Expr::kClass);
      any.offset = at;
      any.ranges = without_surrogates({{0, kMaxCodePoint}});
      return any;
    }
    if (c == '(') {
      ++p_;
      Expr inner = parse_alternatives(depth + 1);
      skip_space();
      if (p_ >= s_.size() || s_[p_] != ')') error(at, "unbalanced '(': no ')' closes it");
      ++p_;
      if (inner.kind == Expr::kSeq && inner.kids.empty()) inner.offset = at;
      return inner;
    }
    if (c == '<') return parse_token();
    if (name_char(c)) {
      Expr ref = make(Expr::kRef);
      ref.offset = at;
      ref.text = parse_name();
      return ref;
    }
    error(at, fmt::format("unexpected '{}'", c == '\0' ? std::string("\\0") : std::string(1, c)));
  }

  Expr parse_token() {
    const size_t at = p_;
    const size_t close = s_.find('>', p_ + 1);
    if (close == std::string_view::npos) error(at, "unterminated token reference '<'");
    const std::string_view inner = s_.substr(p_ + 1, close - p_ - 1);
    p_ = close + 1;
    if (inner.size() >= 3 && inner.front() == '[' && inner.back() == ']' &&
        std::all_of(inner.begin() + 1, inner.end() - 1, [](char d) { return d >= '0' && d <= '9'; })) {
      Expr t = make(Expr::kToken);
      t.offset = at;
      if (inner.size() > 12) error(at, "token id out of range");
      t.token = static_cast<int32_t>(std::stol(std::string(inner.substr(1, inner.size() - 2))));
      return t;
    }
    if (inner.empty()) error(at, "empty token reference '<>'");
    Expr t = make(Expr::kTokenText);
    t.offset = at;
    t.text.reserve(inner.size() + 2);
    t.text.append("<").append(inner).append(">");
    return t;
  }

  Expr parse_class() {
    const size_t at = p_;
    ++p_;
    bool negated = false;
    if (p_ < s_.size() && s_[p_] == '^') negated = true, ++p_;
    Ranges r;
    for (;;) {
      if (p_ >= s_.size()) error(at, "unterminated character class '['");
      if (s_[p_] == ']') break;
      const uint32_t lo = parse_char(false);
      uint32_t hi = lo;
      if (p_ + 1 < s_.size() && s_[p_] == '-' && s_[p_ + 1] != ']') {
        ++p_;
        hi = parse_char(false);
        if (hi < lo) error(at, fmt::format("character range out of order (U+{:04X}-U+{:04X})", lo, hi));
      }
      r.emplace_back(lo, hi);
    }
    ++p_;
    Expr cls = make(Expr::kClass);
    cls.offset = at;
    cls.ranges = normalize(std::move(r));
    if (negated) cls.ranges = complement(cls.ranges);
    cls.ranges = without_surrogates(cls.ranges);
    if (cls.ranges.empty()) error(at, "a character class that matches nothing");
    return cls;
  }

  // One character of a literal or class: an escape or one UTF-8 code point.
  uint32_t parse_char(bool in_literal) {
    const size_t at = p_;
    const auto c = static_cast<unsigned char>(s_[p_]);
    if (c == '\\') {
      if (p_ + 1 >= s_.size()) error(at, "a '\\' at the end of the grammar");
      const char e = s_[p_ + 1];
      p_ += 2;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': return '\\';
        case '"': return '"';
        case 'x': return parse_hex(2, at);
        case 'u': return parse_hex(4, at);
        case 'U': return parse_hex(8, at);
        default:
          if (!in_literal && (e == ']' || e == '[' || e == '-' || e == '^')) return static_cast<uint32_t>(e);
          error(at, fmt::format("unknown escape '\\{}'", e));
      }
    }
    if (c < 0x80) {
      ++p_;
      return c;
    }
    const int len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
    if (len == 0 || p_ + static_cast<size_t>(len) > s_.size()) error(at, "invalid UTF-8");
    uint32_t cp = c & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s_[p_ + static_cast<size_t>(k)]);
      if ((b & 0xC0) != 0x80) error(at, "invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > kMaxCodePoint)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      error(at, "invalid UTF-8");
    p_ += static_cast<size_t>(len);
    return cp;
  }
  uint32_t parse_hex(int digits, size_t at) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (p_ >= s_.size()) error(at, "a hex escape cut short");
      const char h = s_[p_];
      int d = -1;
      if (h >= '0' && h <= '9') d = h - '0';
      if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
      if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
      if (d < 0) error(at, fmt::format("expected {} hex digits in the escape", digits));
      v = v * 16 + static_cast<uint32_t>(d);
      ++p_;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
      error(at, fmt::format("escape U+{:X} is not a Unicode scalar value", v));
    return v;
  }

  std::string_view s_;
  size_t p_ = 0;
};

// ---------------------------------------------------------------------------------------
// Lowering.

using Run = std::vector<GrammarElement>;

class Lowerer {
 public:
  Lowerer(Grammar& g, const Parser& parser) : g_(g), parser_(parser) {}

  void lower(std::vector<std::pair<std::string, Expr>>& rules) {
    for (auto& [name, e] : rules) {
      if (ids_.count(name))
        parser_.error(e.offset, fmt::format("rule '{}' is defined twice", name));
      ids_[name] = new_rule(name);
    }
    const auto root = ids_.find("root");
    if (root == ids_.end()) throw GrammarError("", "the grammar has no 'root' rule");
    g_.root = root->second;
    for (auto& [name, e] : rules) {
      base_ = name;
      lower_rule(ids_[name], e);
    }
  }

  std::vector<std::vector<Run>> alts;  // per rule

 private:
  int32_t new_rule(std::string name) {
    if (g_.rule_names.size() >= GrammarLimits::kMaxRules)
      throw GrammarError("", fmt::format("the grammar needs more than {} rules", GrammarLimits::kMaxRules));
    g_.rule_names.push_back(std::move(name));
    alts.emplace_back();
    return static_cast<int32_t>(g_.rule_names.size() - 1);
  }
  // (Named with a character GBNF names cannot hold, so never one of the grammar's own.)
  int32_t helper_rule() { return new_rule(fmt::format("{}#{}", base_, ++helpers_)); }
  void count(size_t n) {
    elements_ += n;
    if (elements_ > GrammarLimits::kMaxElements)
      throw GrammarError("", fmt::format("the grammar needs more than {} elements", GrammarLimits::kMaxElements));
  }
  void add_alt(int32_t rule, Run run) {
    count(run.size() + 1);
    alts[static_cast<size_t>(rule)].push_back(std::move(run));
  }

  void lower_rule(int32_t id, const Expr& e) {
    if (e.kind == Expr::kAlt) {
      for (const Expr& k : e.kids) {
        Run run;
        emit(k, run);
        add_alt(id, std::move(run));
      }
    } else {
      Run run;
      emit(e, run);
      add_alt(id, std::move(run));
    }
  }

  // The unit rule of each repeated terminal (kind, value).
  std::map<std::pair<int, int32_t>, int32_t> terminal_units_;

  int32_t byte_set(const ByteSet& s) {
    const auto it = sets_.find(s.words);
    if (it != sets_.end()) return it->second;
    g_.byte_sets.push_back(s);
    const auto id = static_cast<int32_t>(g_.byte_sets.size() - 1);
    sets_[s.words] = id;
    return id;
  }

  GrammarElement class_element(const Ranges& ranges) {
    const auto cached = classes_.find(ranges);
    if (cached != classes_.end()) return cached->second;
    std::vector<ByteRun> runs;
    for (const auto& [lo, hi] : ranges) utf8_runs(lo, hi, runs);
    ByteSet single;
    bool any_single = false, any_multi = false;
    for (const ByteRun& r : runs) {
      if (r.size() == 1)
        single.add_range(r[0].first, r[0].second), any_single = true;
      else
        any_multi = true;
    }
    GrammarElement out{GrammarElement::kBytes, 0};
    if (!any_multi) {
      out.value = byte_set(single);
    } else {
      const int32_t rule = helper_rule();
      if (any_single) add_alt(rule, {{GrammarElement::kBytes, byte_set(single)}});
      for (const ByteRun& r : runs) {
        if (r.size() == 1) continue;
        Run run;
        for (const auto& [lo, hi] : r) {
          ByteSet s;
          s.add_range(lo, hi);
          run.push_back({GrammarElement::kBytes, byte_set(s)});
        }
        add_alt(rule, std::move(run));
      }
      out = {GrammarElement::kRule, rule};
    }
    classes_[ranges] = out;
    return out;
  }

  void emit(const Expr& e, Run& run) {
    switch (e.kind) {
      case Expr::kSeq:
        for (const Expr& k : e.kids) emit(k, run);
        return;
      case Expr::kAlt: {
        const int32_t rule = helper_rule();
        lower_rule(rule, e);
        run.push_back({GrammarElement::kRule, rule});
        return;
      }
      case Expr::kLiteral:
        for (const char c : e.text) {
          ByteSet s;
          s.add(static_cast<uint8_t>(c));
          run.push_back({GrammarElement::kBytes, byte_set(s)});
        }
        count(e.text.size());
        return;
      case Expr::kClass:
        run.push_back(class_element(e.ranges));
        return;
      case Expr::kRef: {
        const auto it = ids_.find(e.text);
        if (it == ids_.end()) parser_.error(e.offset, fmt::format("undefined rule '{}'", e.text));
        run.push_back({GrammarElement::kRule, it->second});
        return;
      }
      case Expr::kToken:
        run.push_back({GrammarElement::kToken, e.token});
        return;
      case Expr::kTokenText:
        g_.token_texts.push_back(e.text);
        run.push_back({GrammarElement::kTokenText, static_cast<int32_t>(g_.token_texts.size() - 1)});
        return;
      case Expr::kRepeat: {
        Run unit_run;
        emit(e.kids[0], unit_run);
        if (unit_run.empty()) return;  // ""* is ""
        GrammarElement unit = unit_run[0];
        // A terminal repeated more than once ([0-9]{0,15}, [ \t]{0,20}, [a-z]+) is a
        // chain of a one-element rule too, one rule per terminal for the whole grammar:
        // unrolled, each copy is a terminal of its own, and the matcher precomputes a
        // walk of the vocabulary for every one of them (a decimal bound's digits made
        // hundreds); as chains of one unit, a single walk serves them all. (A unit shared
        // by several chains is fine: leaving one is decided by the nearest chain place
        // on the stack, as for a named rule such as a JSON string's `char`.)
        const bool repeated = e.max > 1 || (e.max < 0 && e.min > 0);
        if (unit_run.size() == 1 && repeated && unit.kind != GrammarElement::kRule) {
          const auto [it, fresh] = terminal_units_.emplace(std::make_pair(unit.kind, unit.value), 0);
          if (fresh) {
            it->second = helper_rule();
            add_alt(it->second, {unit});
          }
          unit = {GrammarElement::kRule, it->second};
        } else if (unit_run.size() > 1) {
          const int32_t rule = helper_rule();
          add_alt(rule, std::move(unit_run));
          unit = {GrammarElement::kRule, rule};
        }
        if (unit.kind == GrammarElement::kRule && e.max != 0) {
          emit_chain(unit.value, e.min, e.max, run);
          return;
        }
        count(static_cast<size_t>(e.min));
        for (int k = 0; k < e.min; ++k) run.push_back(unit);
        if (e.max < 0) {  // R ::= unit R | ()
          const int32_t rule = helper_rule();
          add_alt(rule, {unit, {GrammarElement::kRule, rule}});
          add_alt(rule, {});
          run.push_back({GrammarElement::kRule, rule});
        } else if (e.max > e.min) {  // R_k ::= unit R_(k-1) | ()
          int32_t prev = -1;
          for (int k = 0; k < e.max - e.min; ++k) {
            const int32_t rule = helper_rule();
            Run body{unit};
            if (prev >= 0) body.push_back({GrammarElement::kRule, prev});
            add_alt(rule, std::move(body));
            add_alt(rule, {});
            prev = rule;
          }
          run.push_back({GrammarElement::kRule, prev});
        }
        return;
      }
    }
  }

  // A repetition of rule `unit` as a chain in which the unit is always called from the
  // same place of a chain rule, with the entries still allowed after it as that place's
  // level (GrammarStacks counts entries through it: text/grammar/grammar_stacks.h):
  //   x{m,n}: R_k ::= x R_(k-1) (| () when k <= n - m), k = n..1, R_0 ::= () (its own);
  //   x{m,}:  M_j ::= x M_(j-1), j = m..1, M_0 = L ::= x L | ().
  void emit_chain(int32_t unit, int min, int max, Run& run) {
    const GrammarElement u{GrammarElement::kRule, unit};
    int32_t prev = -1;
    if (max < 0) {
      prev = helper_rule();
      add_alt(prev, {u, {GrammarElement::kRule, prev}});
      add_alt(prev, {});
      chains.push_back({prev, kUnboundedLevel, unit});
      for (int j = 0; j < min; ++j) {
        const int32_t rule = helper_rule();
        add_alt(rule, {u, {GrammarElement::kRule, prev}});
        chains.push_back({rule, kUnboundedLevel, unit});
        prev = rule;
      }
    } else {
      // (Its own empty rule: a shared one would return to every chain, and the matcher
      // could not tell where leaving this one goes.)
      prev = helper_rule();
      add_alt(prev, {});
      for (int k = 1; k <= max; ++k) {
        const int32_t rule = helper_rule();
        add_alt(rule, {u, {GrammarElement::kRule, prev}});
        if (k <= max - min) add_alt(rule, {});
        chains.push_back({rule, k - 1, unit});
        prev = rule;
      }
    }
    run.push_back({GrammarElement::kRule, prev});
  }

 public:
  struct ChainRule {
    int32_t rule, level, unit;  // the first alternative's second element returns at `level`
  };
  std::vector<ChainRule> chains;

 private:
  Grammar& g_;
  const Parser& parser_;
  std::map<std::string, int32_t> ids_;
  std::map<std::array<uint64_t, 4>, int32_t> sets_;
  std::map<Ranges, GrammarElement> classes_;
  std::string base_;
  int helpers_ = 0;
  size_t elements_ = 0;
};

// Refuses left recursion and rules that can never end.
void check(const Grammar& g) {
  const auto rules = static_cast<size_t>(g.rule_count());
  auto alts_of = [&](size_t r) {
    return std::make_pair(g.rule_alt_begin[r], g.rule_alt_begin[r + 1]);
  };
  std::vector<uint8_t> nullable(rules, 0);  // per rule: derives the empty text
  std::vector<uint8_t> productive(rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules; ++r) {
      const auto [b, e] = alts_of(r);
      for (int32_t k = b; k < e; ++k) {
        bool null = true, prod = true;
        for (size_t p = static_cast<size_t>(g.alt_starts[static_cast<size_t>(k)]);
             g.elements[p].kind != GrammarElement::kEnd; ++p) {
          const GrammarElement& el = g.elements[p];
          if (el.kind == GrammarElement::kRule) {
            null = null && nullable[static_cast<size_t>(el.value)];
            prod = prod && productive[static_cast<size_t>(el.value)];
          } else {
            null = false;
          }
        }
        if (null && !nullable[r]) nullable[r] = 1, changed = true;
        if (prod && !productive[r]) productive[r] = 1, changed = true;
      }
    }
  }
  // Left recursion: a cycle through rule references each preceded only by nullable ones.
  std::vector<uint8_t> color(rules, 0);  // 0 new, 1 on the path, 2 done
  std::vector<int32_t> path;
  auto visit = [&](auto&& self, size_t r) -> void {
    color[r] = 1;
    path.push_back(static_cast<int32_t>(r));
    const auto [b, e] = alts_of(r);
    for (int32_t k = b; k < e; ++k) {
      for (size_t p = static_cast<size_t>(g.alt_starts[static_cast<size_t>(k)]);; ++p) {
        const GrammarElement& el = g.elements[p];
        if (el.kind != GrammarElement::kRule) break;
        const auto s = static_cast<size_t>(el.value);
        if (color[s] == 1) {
          std::string cycle;
          auto from = std::find(path.begin(), path.end(), static_cast<int32_t>(s));
          for (auto it = from; it != path.end(); ++it) cycle += g.rule_names[static_cast<size_t>(*it)] + " -> ";
          cycle += g.rule_names[s];
          throw GrammarError("rule '" + g.rule_names[s] + "'",
                             "left recursion (" + cycle + "): a rule may not reach itself before "
                             "reading a character");
        }
        if (color[s] == 0) self(self, s);
        if (!nullable[s]) break;
      }
    }
    path.pop_back();
    color[r] = 2;
  };
  for (size_t r = 0; r < rules; ++r)
    if (color[r] == 0) visit(visit, r);
  // Rules reachable from root that can never end.
  std::vector<uint8_t> seen(rules, 0);
  std::vector<size_t> todo{static_cast<size_t>(g.root)};
  seen[static_cast<size_t>(g.root)] = 1;
  while (!todo.empty()) {
    const size_t r = todo.back();
    todo.pop_back();
    if (!productive[r])
      throw GrammarError("rule '" + g.rule_names[r] + "'",
                         "can never end: every alternative recurses without a way out");
    const auto [b, e] = alts_of(r);
    for (int32_t k = b; k < e; ++k)
      for (size_t p = static_cast<size_t>(g.alt_starts[static_cast<size_t>(k)]);
           g.elements[p].kind != GrammarElement::kEnd; ++p)
        if (g.elements[p].kind == GrammarElement::kRule && !seen[static_cast<size_t>(g.elements[p].value)]) {
          seen[static_cast<size_t>(g.elements[p].value)] = 1;
          todo.push_back(static_cast<size_t>(g.elements[p].value));
        }
  }
}

}  // namespace

Grammar parse_gbnf(std::string_view source) {
  if (source.size() > GrammarLimits::kMaxSourceBytes)
    throw GrammarError("", fmt::format("the grammar is {} bytes, over the limit of {}", source.size(),
                                       GrammarLimits::kMaxSourceBytes));
  Parser parser(source);
  auto rules = parser.parse();
  Grammar g;
  Lowerer lowerer(g, parser);
  lowerer.lower(rules);
  const size_t n = lowerer.alts.size();
  g.rule_alt_begin.reserve(n + 1);
  for (size_t r = 0; r < n; ++r) {
    g.rule_alt_begin.push_back(static_cast<int32_t>(g.alt_starts.size()));
    for (Run& run : lowerer.alts[r]) {
      g.alt_starts.push_back(static_cast<int32_t>(g.elements.size()));
      g.elements.insert(g.elements.end(), run.begin(), run.end());
      g.elements.push_back({GrammarElement::kEnd, 0});
      g.rule_of.resize(g.elements.size(), static_cast<int32_t>(r));
    }
  }
  g.rule_alt_begin.push_back(static_cast<int32_t>(g.alt_starts.size()));
  // One trailing kEnd so that pos + 1 is always a valid index.
  g.elements.push_back({GrammarElement::kEnd, 0});
  g.rule_of.push_back(g.root);
  // Lazy rules and their alternatives by first byte.
  g.lazy.assign(n, 0);
  g.lazy_begin.assign(n, -1);
  for (size_t r = 0; r < n; ++r) {
    const int32_t b = g.rule_alt_begin[r], e = g.rule_alt_begin[r + 1];
    bool lazy = e - b >= 2;
    for (int32_t k = b; k < e && lazy; ++k)
      lazy = g.elements[static_cast<size_t>(g.alt_starts[static_cast<size_t>(k)])].kind == GrammarElement::kBytes;
    if (!lazy) continue;
    g.lazy[r] = 1;
    g.lazy_begin[r] = static_cast<int32_t>(g.alt_by_byte_begin.size());
    for (int byte = 0; byte < 256; ++byte) {
      g.alt_by_byte_begin.push_back(static_cast<int32_t>(g.alt_by_byte.size()));
      for (int32_t k = b; k < e; ++k) {
        const GrammarElement& first = g.elements[static_cast<size_t>(g.alt_starts[static_cast<size_t>(k)])];
        if (g.byte_sets[static_cast<size_t>(first.value)].has(static_cast<uint8_t>(byte))) g.alt_by_byte.push_back(k);
      }
    }
  }
  g.alt_by_byte_begin.push_back(static_cast<int32_t>(g.alt_by_byte.size()));
  g.chain_level.assign(g.elements.size(), -1);
  g.chain_unit.assign(g.elements.size(), -1);
  for (const auto& c : lowerer.chains) {
    const auto at = static_cast<size_t>(g.alt_starts[static_cast<size_t>(g.rule_alt_begin[static_cast<size_t>(c.rule)])]) + 1;
    g.chain_level[at] = c.level;
    g.chain_unit[at] = c.unit;
  }
  check(g);
  return g;
}

bool grammar_accepts(const Grammar& g, std::string_view text) {
  GrammarStacks stacks(g);
  std::vector<int32_t> tops, next;
  stacks.start(tops);
  for (const char c : text) {
    if (tops.empty()) return false;
    next.clear();
    stacks.reset_flags();
    stacks.advance_byte(tops.data(), tops.size(), static_cast<uint8_t>(c), next);
    std::swap(tops, next);
  }
  return stacks.end;
}

std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02X}", c);
    else out += static_cast<char>(c);
  }
  return out + "\"";
}

}  // namespace hyperion::text
