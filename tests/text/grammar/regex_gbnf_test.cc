// Regular expressions as GBNF: the text written, every refusal with its offset, and the
// language of the grammar (text/grammar/gbnf.h) against std::regex's ECMAScript engine on
// random strings: full matches (regex_to_gbnf), searches (schema_pattern_to_gbnf), and
// the JSON-string spelling of both.

// GCC 12 with ASan at -O2 reports std::function members inside libstdc++'s <regex>
// automaton as maybe uninitialized (a false positive in the library's inlined code, not in
// this file's): off for this test, which builds thousands of std::regex patterns.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "text/grammar/regex_gbnf.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "text/grammar/gbnf.h"

namespace hyperion::text {
namespace {

Grammar grammar_of(const std::string& expression) {
  return parse_gbnf("root ::= " + expression + "\n");
}

// What regex_to_gbnf refuses `pattern` with ("offset N: message"), or "" when it does not.
std::string refusal(std::string_view pattern) {
  try {
    regex_to_gbnf(pattern);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

// The JSON spelling of `s` without its quotes (nlohmann's: short escapes, \u00xx).
std::string json_content(const std::string& s) {
  const std::string quoted = nlohmann::json(s).dump();
  return quoted.substr(1, quoted.size() - 2);
}

std::vector<std::string> random_strings(const std::string& alphabet, size_t count, size_t max_len,
                                        uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out{""};
  for (size_t i = 0; i < count; ++i) {
    std::string s;
    const size_t len = rng() % (max_len + 1);
    for (size_t k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    out.push_back(s);
  }
  return out;
}

TEST(RegexGbnf, WritesCompactDeterministicGbnf) {
  EXPECT_EQ(regex_to_gbnf("abc"), "\"abc\"");
  EXPECT_EQ(regex_to_gbnf("a(b|c)*d"), "\"a\" (\"b\" | \"c\")* \"d\"");
  EXPECT_EQ(regex_to_gbnf("[a-z0-9_]+x?"), "[0-9_a-z]+ \"x\"?");
  EXPECT_EQ(regex_to_gbnf("\\d{2,4}-\\d{3}"), "[0-9]{2,4} \"-\" [0-9]{3}");
  EXPECT_EQ(regex_to_gbnf("^(?:ab){2,}$"), "\"ab\"{2,}");
  EXPECT_EQ(regex_to_gbnf("(?<year>\\d{4})"), "[0-9]{4}");
  EXPECT_EQ(regex_to_gbnf("a*?b+?c??d{1,2}?"), "\"a\"* \"b\"+ \"c\"? \"d\"{1,2}");
  EXPECT_EQ(regex_to_gbnf("."), "[^\\x0A\\x0D\\u2028\\u2029]");
  EXPECT_EQ(regex_to_gbnf("[^\"\\\\]"), "[^\\\"\\\\]");
  EXPECT_EQ(regex_to_gbnf("\\u00e9\\u{1F600}\\uD83D\\uDE00é"), "\"é😀😀é\"");
  EXPECT_EQ(regex_to_gbnf("a|"), "\"a\"?");
  EXPECT_EQ(regex_to_gbnf("ab+|"), "(\"a\" \"b\"+)?");
  // x* over an x that may be empty repeats x without its empty string (the grammar's
  // lowering of x* needs an x that reads something).
  EXPECT_EQ(regex_to_gbnf("(a?b?)*c"), "(\"a\" \"b\"? | \"b\")* \"c\"");
  EXPECT_EQ(regex_to_gbnf("(a*|b?)+"), "(\"a\"+ | \"b\")*");
  EXPECT_EQ(regex_to_gbnf("(()|(a{0}))*"), "\"\"");
  EXPECT_EQ(regex_to_gbnf(""), "\"\"");
  EXPECT_EQ(regex_to_gbnf("()"), "\"\"");
  EXPECT_EQ(regex_to_gbnf("[\\]\\-^]"), "[\\-\\]\\^]");
  EXPECT_EQ(regex_to_gbnf("\\x41\\n\\t\\0"), "\"A\\n\\t\\x00\"");
  // The JSON spelling: a quote is \" in the text; `.` never lets a raw quote or control through.
  EXPECT_EQ(regex_to_gbnf("a\"\\\\", RegexTarget::kJsonStringContent), "\"a\\\\\\\"\\\\\\\\\"");
  EXPECT_EQ(schema_pattern_to_gbnf("^ab$"), "\"ab\"");
  EXPECT_EQ(schema_pattern_to_gbnf("^[a-z]+", RegexTarget::kText), "[a-z] .*");
  EXPECT_EQ(schema_pattern_to_gbnf("x*", RegexTarget::kText), ".*");
}

TEST(RegexGbnf, RefusesWhatItDoesNotSupportNamingTheOffset) {
  struct Case {
    const char* pattern;
    const char* where;
    const char* message;
  };
  const Case cases[] = {
      {"ab(c", "offset 2", "unbalanced '('"},
      {"abc)", "offset 3", "unbalanced ')'"},
      {"a[bc", "offset 1", "unbalanced '['"},
      {"*a", "offset 0", "nothing to repeat"},
      {"a|+", "offset 2", "nothing to repeat"},
      {"(a)\\1", "offset 3", "backreferences"},
      {"(?<n>a)\\k<n>", "offset 7", "backreferences"},
      {"a(?=b)", "offset 1", "lookaround"},
      {"a(?!b)", "offset 1", "lookaround"},
      {"(?<=a)b", "offset 0", "lookaround"},
      {"(?<!a)b", "offset 0", "lookaround"},
      {"(?i)a", "offset 0", "unsupported group"},
      {"a\\bc", "offset 1", "word boundaries"},
      {"a\\B", "offset 1", "word boundaries"},
      {"a^b", "offset 1", "anchor '^'"},
      {"a$b", "offset 1", "anchor '$'"},
      {"(a|^b)c", "offset 3", "anchor '^'"},
      {"^*", "offset 1", "quantifier on an anchor"},
      {"a{3,2}", "offset 1", "max below min"},
      {"a{10001}", "offset 2", "repetition count over 10000"},
      {"a{1,99999999999}", "offset 4", "repetition count over 10000"},
      {"a{,3}", "offset 1", "does not start a quantifier"},
      {"a{x}", "offset 1", "does not start a quantifier"},
      {"a**", "offset 2", "cannot follow another quantifier"},
      {"a{2}{3}", "offset 4", "cannot follow another quantifier"},
      {"[z-a]", "offset 1", "out of order"},
      {"[\\d-z]", "offset 1", "class escape"},
      {"[]", "offset 0", "matches nothing"},
      {"[^\\s\\S]", "offset 0", "matches nothing"},
      {"\\p{L}", "offset 0", "property escapes"},
      {"\\q", "offset 0", "unknown escape"},
      {"\\x4", "offset 0", "hex digits"},
      {"\\uD800", "offset 0", "not a Unicode scalar value"},
      {"\\u{110000}", "offset 0", "not a Unicode scalar value"},
      {"\\01", "offset 0", "octal"},
      {"\\c1", "offset 0", "letter"},
      {"ab\\", "offset 2", "end of the pattern"},
      {"ab\xC3(", "offset 2", "invalid UTF-8"},
      {"a\xFF", "offset 1", "invalid UTF-8"},
  };
  for (const Case& c : cases) {
    const std::string got = refusal(c.pattern);
    EXPECT_EQ(got.rfind(std::string(c.where) + ": ", 0), 0u) << c.pattern << " -> " << got;
    EXPECT_NE(got.find(c.message), std::string::npos) << c.pattern << " -> " << got;
  }
  // Nesting: deep groups are refused, not a stack overflow.
  EXPECT_NE(refusal(std::string(100000, '(')).find("nest deeper"), std::string::npos);
  EXPECT_EQ(refusal(std::string(100, '(') + "a" + std::string(100, ')')), "");
  // The schema form refuses the same way.
  EXPECT_THROW(schema_pattern_to_gbnf("a(?=b)"), GrammarError);
}

TEST(RegexGbnf, AcceptsWhatTheRegexMatches) {
  struct Case {
    const char* pattern;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      {"\\d{3}-\\d{4}", {"555-1234"}, {"555-123", "5551234", "555-12345", "a55-1234"}},
      {"[A-Z][a-z]*( [A-Z][a-z]*)*", {"Ada", "Ada Lovelace"}, {"ada", "Ada ", "Ada  Lovelace"}},
      {"\\w+@\\w+\\.(com|org)", {"a_1@b.com", "x@y.org"}, {"a@b.net", "@b.com", "a@b.co"}},
      {"\\s*x\\s*", {"x", " \t\nx\r\n", "\u00a0x\u3000"}, {"y", " x y"}},
      {"[^\\d\\s]+", {"abc", "é!"}, {"a1", "a b", ""}},
      {"\\D\\W\\S", {"a-b", "x!y"}, {"1-b", "aab", "a- "}},
      {".+", {"a", "é😀"}, {"", "a\nb", "a\rb", "\u2028"}},
      {"[.]\\.", {".."}, {"a.", ".a"}},
      {"caf\u00e9|\\u00e9t\\u00e9", {"café", "été"}, {"cafe", "ete"}},
      {"[\\u00e0-\\u00ff]{2}", {"àÿ"}, {"à", "aà"}},
      {"\\cJ\\v\\f", {"\n\v\f"}, {"cJ"}},
      {"[\\b]", {"\b"}, {"b"}},
      {"a{0}b", {"b"}, {"ab"}},
      {"(a|b){2}(c|)", {"ab", "bac"}, {"a", "abcc"}},
      {"[-a]+[a-]", {"--", "a-a"}, {"a"}},
      {"\\/\\-\\\"\\{\\}\\[\\]\\(\\)\\|\\^\\$\\*\\+\\?\\.", {"/-\"{}[]()|^$*+?."}, {""}},
  };
  for (const Case& c : cases) {
    const Grammar g = grammar_of(regex_to_gbnf(c.pattern));
    for (const std::string& s : c.yes)
      EXPECT_TRUE(grammar_accepts(g, s)) << c.pattern << " should match " << s;
    for (const std::string& s : c.no)
      EXPECT_FALSE(grammar_accepts(g, s)) << c.pattern << " should not match " << s;
  }
}

// Patterns over a small alphabet, checked against std::regex on every short string.
const std::vector<std::string> kPatterns = {
    "a*b",      "(a|b)*c", "a{2,3}",        "[ab]+c?",      "(ab|a)(bc|c)", "[^a]*",
    "a.c",      "(a|)b",   "((a|b)c){1,2}", "a+?b",         "(?:ab)*",      "[a-c]{0,2}b{1,}",
    "b(a|c)+b", ".*a.*",   "[^b-c]?a{1,}",  "(a(b(c)?)?)?", "a|bc|",        "(a|ab)(c|bcd)?",
    "\\w\\W?",  "[\\s-]a", "(?:c)\\-?",     "c{0,1}b{2}",   "[a\\-c]+",     "(.)(.)?a",
};

TEST(RegexGbnf, FullMatchesAgreeWithStdRegex) {
  const std::vector<std::string> texts = random_strings("abc -\n", 1500, 7, 1);
  for (const std::string& p : kPatterns) {
    const Grammar g = grammar_of(regex_to_gbnf(p));
    const std::regex re(p, std::regex::ECMAScript);
    for (const std::string& s : texts)
      ASSERT_EQ(grammar_accepts(g, s), std::regex_match(s, re)) << "/" << p << "/ on '" << s << "'";
  }
}

TEST(RegexGbnf, SchemaPatternsSearchAsEcmaScriptDoes) {
  std::vector<std::string> patterns = kPatterns;
  for (const char* p : {"^a", "b$", "^ab$", "^a|b$", "^(a|b)c", "c+", "^$", "a{2}", "^a+b*$|c"})
    patterns.emplace_back(p);
  const std::vector<std::string> texts = random_strings("abc-", 1200, 7, 2);
  for (const std::string& p : patterns) {
    const Grammar g = grammar_of(schema_pattern_to_gbnf(p, RegexTarget::kText));
    const std::regex re(p, std::regex::ECMAScript);
    for (const std::string& s : texts)
      ASSERT_EQ(grammar_accepts(g, s), std::regex_search(s, re))
          << "/" << p << "/ searched in '" << s << "'";
  }
}

// Random patterns from regex syntax soup: every one is refused with a GrammarError or
// written as GBNF that parses, and wherever std::regex compiles it too, both agree on
// full matches and on searches. (std::regex takes some patterns refused here, such as
// anchors mid-pattern or a quantifier after a quantifier; the converse is rare.)
TEST(RegexGbnf, RandomPatternsAgreeWithStdRegex) {
  const std::string soup = "ab()[]{}|*+?^$\\-.,0123dwsDWS:";
  const std::vector<std::string> texts = random_strings("ab-1 ,", 60, 5, 6);
  std::mt19937 rng(7);
  int compared = 0;
  for (int i = 0; i < 10000; ++i) {
    std::string p;
    for (size_t n = rng() % 9; n > 0; --n) p += soup[rng() % soup.size()];
    std::optional<std::regex> re;
    try {
      re.emplace(p, std::regex::ECMAScript);
    } catch (const std::regex_error&) {
    }
    for (const bool search : {false, true}) {
      std::string expression;
      try {
        expression = search ? schema_pattern_to_gbnf(p, RegexTarget::kText) : regex_to_gbnf(p);
      } catch (const GrammarError&) {
        continue;
      }
      const Grammar g = grammar_of(expression);
      if (!re) continue;
      ++compared;
      for (const std::string& t : texts) {
        const bool want = search ? std::regex_search(t, *re) : std::regex_match(t, *re);
        ASSERT_EQ(grammar_accepts(g, t), want) << (search ? "searching /" : "matching /") << p
                                               << "/ on '" << t << "' as " << expression;
      }
    }
  }
  EXPECT_GT(compared, 7000);
}

// In a JSON string, the grammar matches the escaped spelling of exactly the strings the
// regex matches, and never a raw quote, backslash or control character.
TEST(RegexGbnf, JsonStringSpellingAgreesWithTheDecodedText) {
  const std::vector<std::string> patterns = {
      "a\"b",       "[^a]*",     ".*",  "[\\\\\"]+", "\\n|\\t", "[\\x00-\\x1f]+",
      "[^\"]*",     "(a|\\\\)+", "\\s", "[^\\n]",    "a.?\"",   "[\\x01\\x1F\\u007f]",
      "\\x08\\f\\r"};
  std::string alphabet = "a\"\\\n\t\b\f\r";
  alphabet += '\x01';
  alphabet += '\x1f';
  alphabet += '\x7f';
  const std::vector<std::string> texts = random_strings(alphabet, 1500, 5, 3);
  for (const std::string& p : patterns) {
    const Grammar full = grammar_of(regex_to_gbnf(p, RegexTarget::kJsonStringContent));
    const Grammar search = grammar_of(schema_pattern_to_gbnf(p));
    const std::regex re(p, std::regex::ECMAScript);
    for (const std::string& s : texts) {
      const std::string spelled = json_content(s);
      ASSERT_EQ(grammar_accepts(full, spelled), std::regex_match(s, re))
          << "/" << p << "/ on " << spelled;
      ASSERT_EQ(grammar_accepts(search, spelled), std::regex_search(s, re))
          << "/" << p << "/ in " << spelled;
      // Read as the spelling itself: what is not a JSON string's content is never accepted.
      if (!nlohmann::json::accept("\"" + s + "\"")) {
        ASSERT_FALSE(grammar_accepts(full, s)) << "/" << p << "/ let '" << s << "' through";
        ASSERT_FALSE(grammar_accepts(search, s)) << "/" << p << "/ let '" << s << "' through";
      }
    }
  }
  // Controls without a short escape: \u00XX in either hex case.
  const Grammar g = grammar_of(regex_to_gbnf("[\\x1f\\x0b]", RegexTarget::kJsonStringContent));
  for (const char* s : {"\\u001f", "\\u001F", "\\u000b", "\\u000B"})
    EXPECT_TRUE(grammar_accepts(g, s)) << s;
  for (const char* s : {"\\u001g", "\\u0020", "\x1f"}) EXPECT_FALSE(grammar_accepts(g, s)) << s;
}

TEST(RegexGbnf, UnanchoredSearchStaysCheapToMatch) {
  // "[a-z]+" searched is "[a-z]" (any text may follow), and searching for one character
  // is (others)* C any*: one parse however long the text.
  EXPECT_EQ(schema_pattern_to_gbnf("[b-y]+\\d*", RegexTarget::kText), "[^b-y]* [b-y] .*");
  const Grammar g = grammar_of(schema_pattern_to_gbnf("[a-z]+\\d*"));
  EXPECT_TRUE(grammar_accepts(g, std::string(20000, 'x')));
  EXPECT_TRUE(grammar_accepts(g, std::string(20000, '1') + "x"));
  EXPECT_FALSE(grammar_accepts(g, std::string(20000, '1')));
}

}  // namespace
}  // namespace hyperion::text
