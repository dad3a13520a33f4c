// Regular expressions as GBNF (text/grammar/gbnf.h): the `regex` structured-output
// request, and JSON Schema's `pattern` keyword (through json_schema_gbnf.h).
//
// The dialect is ECMA-262's (JSON Schema names it), without flags:
//   literals (UTF-8), escapes \d \D \w \W \s \S \n \t \r \f \v \0 \xHH \uHHHH \u{H...}
//   (UTF-16 surrogate pairs joined) \cX and every escaped non-alphanumeric character;
//   classes [...] [^...] with ranges, the same escapes and \d \w \s (and their negations)
//   inside, \b (backspace) inside; `.` (any character but the line terminators \n \r
//   U+2028 U+2029, as in ECMA-262); groups ( ) (?: ) (?<name> ) (?P<name> ); alternation |;
//   quantifiers * + ? {m} {m,} {m,n} and their lazy forms (same language); ^ at the start
//   and $ at the end of a top-level alternative.
//   \d is [0-9], \w [A-Za-z0-9_], \s ECMA-262's white space and line terminators.
// Refused (GrammarError "offset N", N the byte offset in the pattern): backreferences
// (\1, \k<name>), lookaround, \b \B outside classes, Unicode property escapes, anchors
// anywhere else, unknown letter escapes, a '{' that does not start a quantifier,
// unbalanced ( ) or [ ], a quantifier with nothing to repeat (or on another quantifier),
// {m,n} with m > n or over GrammarLimits::kMaxRepeat, groups nesting deeper than
// GrammarLimits::kMaxNesting / 2 (the grammar written around them takes some of the
// parser's nesting), invalid UTF-8, a class that matches nothing ([]), a pattern over
// GrammarLimits::kMaxSourceBytes.
//
// Where the matched text lives (RegexTarget):
//   kText: the expression matches the characters themselves.
//   kJsonStringContent: it matches their spelling inside a JSON string (between the
//     quotes): `"` as \", `\` as \\, the control characters \b \f \n \r \t as those short
//     escapes and the others as \u00XX (hex digits of either case); every other character
//     as itself. So the regex `a"` matches the JSON text `a\"`, and `.` or a negated
//     class never lets a raw quote, backslash or control character through. Other
//     spellings of the same character (\/, \u0041) are not matched (except in the
//     padding of an unanchored search, which takes any JSON string content): narrower
//     than JSON, never invalid.
#pragma once

#include <string>
#include <string_view>

#include "text/grammar/grammar_error.h"

namespace hyperion::text {

enum class RegexTarget { kText, kJsonStringContent };

// One GBNF expression matching exactly the strings `pattern` fully matches (as if
// anchored ^...$). Throws GrammarError("offset N", ...) for what is not supported.
std::string regex_to_gbnf(std::string_view pattern, RegexTarget target = RegexTarget::kText);

// JSON Schema's `pattern` is not anchored (ECMA-262 search semantics: "abc" matches any
// string containing abc). The expression for strings containing a match: a top-level
// alternative that starts with ^ is anchored at the start, one that ends with $ at the
// end, and an unanchored side is padded with any characters. By default it spells the
// content of a JSON string (kJsonStringContent), which is what a schema needs.
std::string schema_pattern_to_gbnf(std::string_view pattern,
                                   RegexTarget target = RegexTarget::kJsonStringContent);

}  // namespace hyperion::text
