// A context-free grammar over bytes, read from GBNF (llama.cpp's grammar format), the
// form every structured-output request is compiled to: a JSON schema, a regular
// expression and a list of choices are first written as GBNF text
// (text/grammar/json_schema_gbnf.h, regex_gbnf.h), then read here.
//
// The dialect:
//   name ::= expression      names [a-zA-Z0-9_-]+; a rule runs until the next `name ::=`;
//                            `root` is where a text starts
//   a | b                    alternatives
//   a b                      sequence
//   "text"                   a literal, escapes \\ \" \n \r \t \xHH \uHHHH \UHHHHHHHH
//   [a-z_] [^"\\]            a character class of code points (same escapes, and \] \[ \- \^)
//   .                        any character (a code point as valid UTF-8)
//   ( expression )           grouping
//   x* x+ x? x{m} x{m,} x{m,n}
//   <[123]>                  the token with id 123 (a special token: never matched by text)
//   <|python_tag|> <tool_call>   the token whose text this is, found through the tokenizer
//                            when the grammar is compiled for a vocabulary
//   # comment                to the end of the line
//
// Lowered for matching: every rule becomes alternatives of element runs, each run ended by
// kEnd and laid end to end in one array; a terminal is a set of bytes (a character class
// becomes the UTF-8 byte sequences of its code point ranges, as a regex engine's UTF-8
// automaton does) or a token. Groups, classes of several byte lengths and repetitions
// become helper rules: x* of a terminal is `R ::= x R | ()`; any other repetition of more
// than one x is a chain of a unit rule (below; a repeated terminal gets one unit rule for
// the whole grammar); the matcher runs a rule reference in tail position without a frame,
// so a repetition's length costs no stack.
//
// Refused at parse (GrammarError naming line and column, or the rule): a syntax error, a
// reference to an undefined rule, no `root`, left recursion (a rule that can reach itself
// before reading a byte: the matcher would never stop expanding it), a rule reachable from
// root that can never end (recursion without a way out, such as a JSON schema's object
// that requires itself), sizes over GrammarLimits.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/grammar/grammar_error.h"

namespace hyperion::text {

// 256 bits: bit b set when byte b is allowed.
struct ByteSet {
  std::array<uint64_t, 4> words{};
  bool has(uint8_t b) const { return (words[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { words[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  bool operator==(const ByteSet& o) const { return words == o.words; }
};

struct GrammarElement {
  enum Kind : uint8_t { kEnd, kBytes, kRule, kToken, kTokenText };
  Kind kind = kEnd;
  // kBytes: index into Grammar::byte_sets; kRule: rule id; kToken: token id;
  // kTokenText: index into Grammar::token_texts (resolved to kToken by the matcher).
  int32_t value = 0;
};

inline constexpr int32_t kUnboundedLevel = 1 << 30;
// A lazy rule's top position (negative: not an element index), and back.
inline int32_t lazy_pos(int32_t rule) { return -2 - rule; }
inline int32_t lazy_rule_of(int32_t pos) { return -2 - pos; }

struct Grammar {
  // Every alternative of every rule: a run of elements ended by kEnd, end to end.
  std::vector<GrammarElement> elements;
  // Rule r's alternatives begin at elements[alt_starts[k]] for k in
  // [rule_alt_begin[r], rule_alt_begin[r + 1]).
  std::vector<int32_t> rule_alt_begin;
  std::vector<int32_t> alt_starts;
  std::vector<int32_t> rule_of;  // element index -> the rule whose alternative holds it
  std::vector<ByteSet> byte_sets;
  std::vector<std::string> token_texts;  // <text> tokens, by kTokenText value
  // Names as written; helper rules are named after their rule ("value#3").
  std::vector<std::string> rule_names;
  int32_t root = 0;
  // Repetitions of a rule (x{m,n}, x*, x+ where x is a rule or a group) are chains whose
  // unit is always called from the second element's place of a chain rule; at that
  // return position, chain_unit is the unit's rule and chain_level how many more units
  // the chain may still take (kUnboundedLevel: any number). -1 elsewhere.
  std::vector<int32_t> chain_level, chain_unit;
  // A rule of two or more alternatives that each start with a byte set (a character
  // class of several UTF-8 lengths, a choice of literals) is one top until a byte picks
  // its alternatives (GrammarStacks keeps it as StackNode::pos = lazy_pos(rule)), instead
  // of one top per alternative: a JSON string's character is then 2 tops, not 10.
  std::vector<uint8_t> lazy;  // per rule
  // Per lazy rule: for each byte, the alternatives (indices into alt_starts) whose first
  // byte set holds it: alt_by_byte[lazy_begin[r] + b] .. [lazy_begin[r] + b + 1].
  std::vector<int32_t> lazy_begin, alt_by_byte_begin, alt_by_byte;

  int32_t rule_count() const { return static_cast<int32_t>(rule_names.size()); }
};

// Reads GBNF `source` (see above). Throws GrammarError.
Grammar parse_gbnf(std::string_view source);

// Whether `text` as a whole is a sentence of the grammar (tokens aside: a <token> element
// never matches text). For tests and tools; the decoder uses text/grammar/matcher.h.
bool grammar_accepts(const Grammar& g, std::string_view text);

// A GBNF string literal for `text` ("..." with the escapes above).
std::string gbnf_literal(std::string_view text);

}  // namespace hyperion::text
