#include "text/grammar/regex_gbnf.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "text/grammar/gbnf.h"
#include "text/grammar/regex_syntax.h"

namespace hyperion::text {

namespace {

using regex::append_utf8;
using regex::complement;
using regex::contains;
using regex::intersect;
using regex::kMaxCodePoint;
using regex::Node;
using regex::normalize;
using regex::nullable;
using regex::Ranges;

// ---------------------------------------------------------------------------------------
// Anchors: ^ may open and $ may close a top-level alternative, nothing else.

struct Branch {
  Node node;
  bool anchored_start = false, anchored_end = false;
};

void refuse_anchors(const Node& n) {
  if (n.kind == Node::kStart || n.kind == Node::kEnd)
    regex::regex_error(n.offset,
                       fmt::format("the anchor '{}' is only supported at the start or end of "
                                   "the pattern",
                                   n.kind == Node::kStart ? '^' : '$'));
  for (const Node& k : n.kids) refuse_anchors(k);
}

std::vector<Branch> top_branches(Node root) {
  std::vector<Node> alts;
  if (root.kind == Node::kAlt)
    alts = std::move(root.kids);
  else
    alts.push_back(std::move(root));
  std::vector<Branch> out;
  for (Node& a : alts) {
    Branch b;
    if (a.kind == Node::kStart || a.kind == Node::kEnd) {
      (a.kind == Node::kStart ? b.anchored_start : b.anchored_end) = true;
      a = Node{Node::kSeq};
    } else if (a.kind == Node::kSeq) {
      if (!a.kids.empty() && a.kids.front().kind == Node::kStart) {
        b.anchored_start = true;
        a.kids.erase(a.kids.begin());
      }
      if (!a.kids.empty() && a.kids.back().kind == Node::kEnd) {
        b.anchored_end = true;
        a.kids.pop_back();
      }
    }
    refuse_anchors(a);
    b.node = std::move(a);
    out.push_back(std::move(b));
  }
  return out;
}

// Reduces `n` at its unanchored end (or start) to the part that decides whether a text
// contains a match: with any text allowed beyond that end, x* there is nothing and x{m,n}
// is x{m} (so "[a-z]+" searched becomes "[a-z]"). Same language once padded, and far
// fewer ways to match it, which the matcher pays for (each is a parse kept open).
void trim(Node& n, bool at_end) {
  switch (n.kind) {
    case Node::kSeq:
      while (!n.kids.empty()) {
        Node& edge = at_end ? n.kids.back() : n.kids.front();
        trim(edge, at_end);
        if (!nullable(edge)) break;
        if (at_end)
          n.kids.pop_back();
        else
          n.kids.erase(n.kids.begin());
      }
      return;
    case Node::kAlt:
      for (Node& k : n.kids) trim(k, at_end);
      if (nullable(n)) n = Node{Node::kSeq};
      return;
    case Node::kRepeat: {
      if (nullable(n)) {
        n = Node{Node::kSeq};
        return;
      }
      Node edge = n.kids[0];
      trim(edge, at_end);
      Node seq{Node::kSeq};
      Node rest = n;
      rest.min = rest.max = n.min - 1;
      if (at_end) {
        if (rest.min > 0) seq.kids.push_back(std::move(rest));
        seq.kids.push_back(std::move(edge));
      } else {
        seq.kids.push_back(std::move(edge));
        if (rest.min > 0) seq.kids.push_back(std::move(rest));
      }
      n = std::move(seq);
      return;
    }
    default:
      return;
  }
}

size_t tree_size(const Node& n) {
  size_t size = 1;
  for (const Node& k : n.kids) size += tree_size(k);
  return size;
}

// The non-empty strings `n` matches, as a tree in `out`; false when it matches only the
// empty string. A sequence of parts that may all be empty reads something first in one
// of them: x1' x2..xn | x2' x3..xn | ... | xn'. That copies suffixes (quadratic in the
// sequence's length), so `budget` bounds the nodes copied.
bool without_empty(const Node& n, Node& out, size_t& budget) {
  if (!nullable(n)) {
    out = n;
    return true;
  }
  switch (n.kind) {
    case Node::kAlt: {
      out = Node{Node::kAlt};
      for (const Node& k : n.kids) {
        Node some;
        if (without_empty(k, some, budget)) out.kids.push_back(std::move(some));
      }
      break;
    }
    case Node::kRepeat: {
      Node some;
      if (n.max == 0 || !without_empty(n.kids[0], some, budget)) return false;
      out = Node{Node::kRepeat};
      out.min = 1, out.max = n.max;  // the empty copies add nothing
      out.kids.push_back(std::move(some));
      return true;
    }
    case Node::kSeq: {
      out = Node{Node::kAlt};
      size_t suffix = 0;  // nodes after kid i
      for (size_t i = 1; i < n.kids.size(); ++i) suffix += tree_size(n.kids[i]);
      for (size_t i = 0; i < n.kids.size(); ++i) {
        if (suffix > budget)
          throw GrammarError("", "the pattern repeats too long a sequence of optional parts");
        budget -= suffix;
        Node first;
        if (without_empty(n.kids[i], first, budget)) {
          Node seq{Node::kSeq};
          seq.kids.push_back(std::move(first));
          seq.kids.insert(seq.kids.end(), n.kids.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                          n.kids.end());
          out.kids.push_back(std::move(seq));
        }
        if (i + 1 < n.kids.size()) suffix -= tree_size(n.kids[i + 1]);
      }
      break;
    }
    default:
      return false;
  }
  if (out.kids.empty()) return false;
  if (out.kids.size() == 1) out = Node(out.kids[0]);
  return true;
}

// ---------------------------------------------------------------------------------------
// Writing GBNF.

// A class item for code point c.
void class_char(std::string& out, uint32_t c) {
  if (c == ']' || c == '[' || c == '-' || c == '^' || c == '\\' || c == '"') {
    out += '\\';
    out += static_cast<char>(c);
  } else if (c < 0x20 || c == 0x7F) {
    out += fmt::format("\\x{:02X}", c);
  } else if (c < 0x7F) {
    out += static_cast<char>(c);
  } else if (c <= 0xFFFF) {
    out += fmt::format("\\u{:04X}", c);
  } else {
    out += fmt::format("\\U{:08X}", c);
  }
}

std::string class_items(const Ranges& r) {
  std::string out;
  for (const auto& [lo, hi] : r) {
    class_char(out, lo);
    if (hi == lo) continue;
    if (hi > lo + 1) out += '-';
    class_char(out, hi);
  }
  return out;
}

// [..] or [^..], whichever is shorter; `.` for every character.
std::string class_text(const Ranges& r) {
  const Ranges rest = complement(r);
  if (rest.empty()) return ".";
  const std::string pos = class_items(r), neg = class_items(rest);
  return neg.size() < pos.size() ? "[^" + neg + "]" : "[" + pos + "]";
}

struct Text {
  std::string text;  // empty: the empty string
  int prec = 2;      // 0 alternatives, 1 sequence, 2 atom
};

std::string atom(const Text& t) {
  return t.prec < 2 ? "(" + t.text + ")" : t.text;
}

// Alternatives: a single one keeps its own precedence.
Text alternatives(const std::vector<Text>& alts) {
  if (alts.empty()) return {};
  if (alts.size() == 1) return alts[0];
  std::string s = alts[0].text;
  for (size_t i = 1; i < alts.size(); ++i) s += " | " + alts[i].text;
  return {s, 0};
}

// The JSON short escape letter of c, or 0.
char short_escape(uint32_t c) {
  switch (c) {
    case '"':
      return '"';
    case '\\':
      return '\\';
    case '\b':
      return 'b';
    case '\f':
      return 'f';
    case '\n':
      return 'n';
    case '\r':
      return 'r';
    case '\t':
      return 't';
    default:
      return 0;
  }
}

class Writer {
 public:
  explicit Writer(RegexTarget target) : json_(target == RegexTarget::kJsonStringContent) {}

  // The one way character c is written, or nullopt where there are several (the control
  // characters spelled \u00XX: either hex case).
  std::optional<std::string> spelling(uint32_t c) const {
    std::string s;
    if (!json_ || c >= 0x20) {
      if (json_ && (c == '"' || c == '\\')) s += '\\';
      append_utf8(s, c);
      return s;
    }
    if (const char e = short_escape(c)) return std::string{'\\', e};
    return std::nullopt;
  }

  Text set(const Ranges& r) const {
    if (r.size() == 1 && r[0].first == r[0].second) {
      if (auto s = spelling(r[0].first)) return {gbnf_literal(*s), 2};
    }
    if (!json_) return {class_text(r), 2};
    std::vector<std::string> alts;
    // Written as themselves: all but the controls, the quote and the backslash.
    const Ranges raw = intersect(r, {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodePoint}});
    if (!raw.empty())
      alts.push_back(raw.size() == 1 && raw[0].first == raw[0].second
                         ? gbnf_literal(*spelling(raw[0].first))
                         : class_text(raw));
    std::string shorts;
    for (const uint32_t c : {'"', '\\', '\b', '\f', '\n', '\r', '\t'})
      if (contains(r, c)) shorts += short_escape(c);
    if (shorts.size() == 1) alts.push_back(gbnf_literal(std::string{'\\', shorts[0]}));
    if (shorts.size() > 1) {
      Ranges letters;
      for (const char e : shorts) letters.emplace_back(e, e);
      alts.push_back("\"\\\\\" " + class_text(normalize(letters)));
    }
    for (uint32_t high = 0; high < 2; ++high) {  // \u000X and \u001X
      Ranges digits;
      for (uint32_t low = 0; low < 16; ++low) {
        const uint32_t c = high * 16 + low;
        if (!contains(r, c) || short_escape(c)) continue;
        const char d = "0123456789abcdef"[low];
        digits.emplace_back(d, d);
        if (low >= 10) digits.emplace_back(d - 'a' + 'A', d - 'a' + 'A');
      }
      if (!digits.empty())
        alts.push_back(gbnf_literal(fmt::format("\\u00{}", high)) + " " +
                       class_text(normalize(digits)));
    }
    // One alternative is an atom unless it is a two-part escape ("\\" [..]).
    const int single = shorts.size() > 1 || (raw.empty() && shorts.empty()) ? 1 : 2;
    std::vector<Text> texts;
    for (const std::string& a : alts) texts.push_back({a, single});
    return alternatives(texts);
  }

  Text write(const Node& n) const {
    switch (n.kind) {
      case Node::kSet:
        return set(n.set);
      case Node::kSeq:
        return sequence(n.kids);
      case Node::kAlt: {
        std::vector<Text> alts;
        bool empty = false;
        for (const Node& k : n.kids) {
          const Text t = write(k);
          if (t.text.empty()) {
            empty = true;
          } else if (std::none_of(alts.begin(), alts.end(),
                                  [&](const Text& a) { return a.text == t.text; })) {
            alts.push_back(t);
          }
        }
        Text t = alternatives(alts);
        if (empty && !t.text.empty()) t = {atom(t) + "?", 2};
        return t;
      }
      case Node::kRepeat: {
        if (n.max < 0 && nullable(n.kids[0])) {
          // An unbounded repetition of what may read nothing is one of what reads
          // something: the grammar's x* lowering needs a unit that reads (else left recursion).
          Node some;
          if (!without_empty(n.kids[0], some, budget_)) return {};
          Node rep{Node::kRepeat};
          rep.min = 0, rep.max = -1;
          rep.kids.push_back(std::move(some));
          return write(rep);
        }
        const Text k = write(n.kids[0]);
        if (k.text.empty() || n.max == 0) return {};
        if (n.min == 1 && n.max == 1) return k;
        std::string suffix;
        if (n.min == 0 && n.max < 0)
          suffix = "*";
        else if (n.min == 1 && n.max < 0)
          suffix = "+";
        else if (n.min == 0 && n.max == 1)
          suffix = "?";
        else if (n.min == n.max)
          suffix = fmt::format("{{{}}}", n.min);
        else if (n.max < 0)
          suffix = fmt::format("{{{},}}", n.min);
        else
          suffix = fmt::format("{{{},{}}}", n.min, n.max);
        return {atom(k) + suffix, 2};
      }
      default:
        return {};  // anchors are removed before writing
    }
  }

  // Adjacent characters with one spelling each become one literal.
  Text sequence(const std::vector<Node>& kids) const {
    std::vector<const Node*> flat;  // nested sequences (from groups, trimming) spliced in
    flatten(kids, flat);
    std::vector<Text> items;
    std::string run;
    auto flush = [&] {
      if (!run.empty()) items.push_back({gbnf_literal(run), 2});
      run.clear();
    };
    for (const Node* kp : flat) {
      const Node& k = *kp;
      if (k.kind == Node::kSet && k.set.size() == 1 && k.set[0].first == k.set[0].second) {
        if (auto s = spelling(k.set[0].first)) {
          run += *s;
          continue;
        }
      }
      Text t = write(k);
      if (t.text.empty()) continue;
      flush();
      items.push_back(std::move(t));
    }
    flush();
    if (items.empty()) return {};
    if (items.size() == 1) return items[0];
    std::string s = items[0].prec == 0 ? atom(items[0]) : items[0].text;
    for (size_t i = 1; i < items.size(); ++i)
      s.append(" ").append(items[i].prec == 0 ? atom(items[i]) : items[i].text);
    return {s, 1};
  }

  static void flatten(const std::vector<Node>& kids, std::vector<const Node*>& out) {
    for (const Node& k : kids) {
      if (k.kind == Node::kSeq)
        flatten(k.kids, out);
      else
        out.push_back(&k);
    }
  }

  // Any text at all: the padding of an unanchored side.
  std::string any_text() const {
    if (!json_) return ".*";
    return "([^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}))*";
  }

 private:
  bool json_;
  mutable size_t budget_ = size_t{1} << 20;  // nodes without_empty may copy, per pattern
};

}  // namespace

std::string regex_to_gbnf(std::string_view pattern, RegexTarget target) {
  std::vector<Branch> branches = top_branches(regex::parse_regex(pattern));
  const Writer w(target);
  std::vector<Text> alts;
  bool empty = false;
  for (const Branch& b : branches) {
    const Text t = w.write(b.node);
    if (t.text.empty())
      empty = true;
    else if (std::none_of(alts.begin(), alts.end(),
                          [&](const Text& a) { return a.text == t.text; }))
      alts.push_back(t);
  }
  Text t = alternatives(alts);
  if (empty) t = t.text.empty() ? Text{"\"\"", 2} : Text{atom(t) + "?", 2};
  return t.text;
}

std::string schema_pattern_to_gbnf(std::string_view pattern, RegexTarget target) {
  std::vector<Branch> branches = top_branches(regex::parse_regex(pattern));
  const Writer w(target);
  const std::string any = w.any_text();
  std::vector<std::string> alts;
  for (Branch& b : branches) {
    if (!b.anchored_start) trim(b.node, false);
    if (!b.anchored_end) trim(b.node, true);
    const Node* one = &b.node;  // the branch, when it is one character set
    while (one->kind == Node::kSeq && one->kids.size() == 1) one = &one->kids[0];
    if (!b.anchored_start && !b.anchored_end && one->kind == Node::kSet) {
      // Searching for one character: the first one in the set starts the match, so
      // (others)* C any*, one parse instead of one per character of the set seen.
      const Ranges others = complement(one->set);
      const std::string s =
          (others.empty() ? "" : atom(w.set(others)) + "* ") + atom(w.set(one->set)) + " " + any;
      if (std::find(alts.begin(), alts.end(), s) == alts.end()) alts.push_back(s);
      continue;
    }
    const Text t = w.write(b.node);
    std::string s;
    if (!b.anchored_start) s = any;
    if (!t.text.empty()) s += (s.empty() ? "" : " ") + (t.prec == 0 ? atom(t) : t.text);
    if (!b.anchored_end && !(t.text.empty() && !b.anchored_start))
      s += (s.empty() ? "" : " ") + any;
    if (s.empty()) s = "\"\"";
    if (s == any) return any;  // some branch matches every text
    if (std::find(alts.begin(), alts.end(), s) == alts.end()) alts.push_back(s);
  }
  std::string out = alts[0];
  for (size_t i = 1; i < alts.size(); ++i) out += " | " + alts[i];
  return out;
}

}  // namespace hyperion::text
