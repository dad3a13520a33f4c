// A regular expression as a syntax tree: the ECMA-262 dialect regex_gbnf.h describes,
// parsed and checked (every refusal a GrammarError "offset N" naming the byte offset in
// the pattern). Character escapes and classes are resolved to sets of code points here,
// so the tree holds only sets, sequences, alternatives, repetitions and anchors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/grammar/code_points.h"
#include "text/grammar/grammar_error.h"

namespace hyperion::text::regex {

using text::kMaxCodePoint;
using text::Ranges;
// Groups may nest this deep: the GBNF written for them adds a level or two (a JSON
// spelling's alternatives, the schema rule around it) under GrammarLimits::kMaxNesting.
inline constexpr int kMaxGroupNesting = GrammarLimits::kMaxNesting / 2;

using text::append_utf8;  // (text/grammar/code_points.h)
using text::complement;
using text::contains;
using text::intersect;
using text::normalize;

struct Node {
  enum Kind { kSet, kSeq, kAlt, kRepeat, kStart, kEnd };
  explicit Node(Kind k = kSeq) : kind(k) {}
  Kind kind;
  Ranges set;              // kSet: normalized, non-empty, no surrogates
  std::vector<Node> kids;  // kSeq (empty: the empty string), kAlt, kRepeat (one)
  int min = 0, max = 0;    // kRepeat; max -1: unbounded
  size_t offset = 0;       // kStart (^), kEnd ($): where the anchor is, for errors
};

// Whether `n` matches the empty string (anchors do).
bool nullable(const Node& n);

// The tree of `pattern`; anchors stay where they were written (regex_gbnf.cc decides
// which places it accepts). Throws GrammarError.
Node parse_regex(std::string_view pattern);

[[noreturn]] void regex_error(size_t offset, const std::string& message);

}  // namespace hyperion::text::regex
