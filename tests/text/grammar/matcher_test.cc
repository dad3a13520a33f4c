// The GBNF reader and the token-mask matcher: parse errors, the language each construct
// accepts, and every mask against a brute-force reference that tries each vocabulary
// token on the grammar's automaton, over random vocabularies and random walks.
#include "text/grammar/matcher.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "text/grammar/gbnf.h"

namespace hyperion::text {
namespace {

std::string error_of(std::string_view src) {
  try {
    parse_gbnf(src);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

TEST(Gbnf, RefusesBadGrammarsNamingWhere) {
  EXPECT_NE(error_of("root ::= \"a").find("line 1, column 10"), std::string::npos) << error_of("root ::= \"a");
  EXPECT_NE(error_of("root ::= a\n").find("undefined rule 'a'"), std::string::npos);
  EXPECT_NE(error_of("x ::= \"a\"").find("no 'root'"), std::string::npos);
  EXPECT_NE(error_of("root ::= root \"a\" | \"b\"").find("left recursion"), std::string::npos);
  EXPECT_NE(error_of("root ::= x\nx ::= y? x \"a\"\ny ::= \"b\"").find("left recursion"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= \"{\" root \"}\"").find("can never end"), std::string::npos);
  EXPECT_NE(error_of("root ::= (\"a\"").find("unbalanced '('"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{3,2}").find("max below min"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{99999}").find("repetition count"), std::string::npos);
  EXPECT_NE(error_of("root ::= [z-a]").find("out of order"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\" )").find("line 1, column 14"), std::string::npos)
      << error_of("root ::= \"a\" )");
  std::string deep = "root ::= ";
  for (int i = 0; i < 300; ++i) deep += "(";
  EXPECT_NE(error_of(deep).find("nest deeper"), std::string::npos);
}

TEST(Gbnf, AcceptsTheLanguageOfEachConstruct) {
  auto g = parse_gbnf(R"(
    # a comment
    root ::= greeting (" " name)? "!"{1,3}
    greeting ::= "hi" | "hello"
    name ::= [A-Z] [a-z]*
  )");
  for (const char* ok : {"hi!", "hello Bob!!", "hi X!!!"}) EXPECT_TRUE(grammar_accepts(g, ok)) << ok;
  for (const char* bad : {"hi", "hi!!!!", "hey!", "hi bob!", "hello Bob"})
    EXPECT_FALSE(grammar_accepts(g, bad)) << bad;
  // Classes over code points, as UTF-8, negation and escapes.
  auto u = parse_gbnf(R"(root ::= [^a\n"]+ "\u00e9" [\u4e00-\u9fff] .)");
  EXPECT_TRUE(grammar_accepts(u, "xé中\xF0\x9F\x98\x80"));
  EXPECT_TRUE(grammar_accepts(u, "\xCE\xA9\xC3\xA9\xE4\xB8\x80z"));
  EXPECT_FALSE(grammar_accepts(u, "aé中z"));
  EXPECT_FALSE(grammar_accepts(u, "xé中\xF0\x9F\x98"));  // a cut character
  EXPECT_FALSE(grammar_accepts(u, "\xED\xA0\x80\xC3\xA9\xE4\xB8\x80z"));  // a surrogate
  // Exact and open repetition counts.
  auto r = parse_gbnf(R"(root ::= "a"{2} "b"{0,2} "c"{1,} "d"*)");
  for (const char* ok : {"aac", "aabbccd", "aabcccdd"}) EXPECT_TRUE(grammar_accepts(r, ok)) << ok;
  for (const char* bad : {"ac", "aabbbc", "aab", "aaac"}) EXPECT_FALSE(grammar_accepts(r, bad)) << bad;
  // Right recursion and empty alternatives.
  auto p = parse_gbnf("root ::= \"(\" root \")\" root | \"\"");
  EXPECT_TRUE(grammar_accepts(p, "(()())()"));
  EXPECT_TRUE(grammar_accepts(p, ""));
  EXPECT_FALSE(grammar_accepts(p, "(()"));
}

TEST(Gbnf, LiteralEscapesRoundTrip) {
  const std::string text = "a\"b\\c\nd\te\x01";
  EXPECT_TRUE(grammar_accepts(parse_gbnf("root ::= " + gbnf_literal(text)), text));
}

// ---------------------------------------------------------------------------------------
// The matcher against brute force.

// Whether the automaton can read `bytes` from `tops` (a copy of the matcher's state).
bool brute_force_allows(const Grammar& g, const std::vector<int32_t>& start_tops,
                        GrammarStacks& stacks, std::string_view bytes) {
  std::vector<int32_t> tops = start_tops, next;
  const size_t mark = stacks.size();
  bool ended = false;  // the grammar's end, reached with the last byte
  for (const char c : bytes) {
    if (tops.empty()) return stacks.truncate(mark), false;
    next.clear();
    stacks.reset_flags();
    stacks.advance_byte(tops.data(), tops.size(), static_cast<uint8_t>(c), next);
    tops.swap(next);
    ended = stacks.end;
  }
  stacks.truncate(mark);
  return !tops.empty() || ended;
}

// A reference parse kept beside the matcher: the grammar's automaton fed the same tokens.
struct Reference {
  explicit Reference(const Grammar& grammar) : g(grammar), stacks(grammar) {
    stacks.start(tops);
    can_end = stacks.end;
  }
  void accept(std::string_view bytes) {
    std::vector<int32_t> next;
    for (const char c : bytes) {
      next.clear();
      stacks.reset_flags();
      stacks.advance_byte(tops.data(), tops.size(), static_cast<uint8_t>(c), next);
      tops.swap(next);
    }
    can_end = stacks.end;
  }
  const Grammar& g;
  GrammarStacks stacks;
  std::vector<int32_t> tops;
  bool can_end = false;
};

std::vector<std::string> random_vocab(std::mt19937& rng, int n) {
  static const std::vector<std::string> atoms = {
      "\"", "{", "}", "[", "]", ",", ":", " ", "\n", "a", "b", "e", "n", "u", "l", "t",
      "r", "s", "f", "0", "1", "9", "-", ".", "E", "+", "\\", "\xC3\xA9", "\xE4\xB8\xAD",
      "\xC3", "\xA9", "\xF0\x9F\x98\x80", "x", "y", "true", "null", "false", "\":", "\",",
      "\"}", "}]", "},", "\\n", "\\\""};
  std::vector<std::string> v;
  for (const auto& a : atoms) v.push_back(a);
  std::uniform_int_distribution<size_t> pick(0, atoms.size() - 1);
  std::uniform_int_distribution<int> len(1, 4);
  while (static_cast<int>(v.size()) < n) {
    std::string t;
    for (int k = len(rng); k-- > 0;) t += atoms[pick(rng)];
    v.push_back(t);
  }
  return v;
}

const char* kJsonGrammar = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ":" ws value ws ("," ws string ":" ws value ws)* )? "}"
array  ::= "[" ws ( value ws ("," ws value ws)* )? "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= "-"? ([0-9] | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
ws     ::= | " " | "\n" [ \t]{0,20}
)";

const char* kGrammars[] = {
    kJsonGrammar,
    R"(root ::= "{\"name\": \"" [a-z]{1,8} "\", \"age\": " [0-9]{1,3} "}")",
    R"(root ::= ("yes" | "no" | "y" "e"? "s"?) ("," " "? root)?)",
    R"(root ::= item ("\n" item){0,3}
       item ::= "- " ([a-z] | "\u00e9" | "\u4e2d")+ )",
    R"(root ::= "[" (x ("," x)*)? "]"  x ::= "\"" [^"]* "\"" | "null" | root)",
    // Repetitions of rules: chains with counted units, bounded, with minima, nested.
    R"(root ::= "\"" ch{0,5} "\"" ("," root)?
       ch ::= [a-z] | "\\" ["n] | "\u00e9" | "e" "\u4e2d"? )",
    R"(root ::= "[" (obj ("," obj){0,3})? "]"
       obj ::= "{" k{1,3} "}" | "{" "\"" ch{2,} "\"" "}"
       k ::= [a-c] | "n" "u"? | obj
       ch ::= [a-z0-9] | "\\" "\"" )",
    R"(root ::= s ":" s{1,2} | (s s){2}
       s ::= "\"" c{0,3} "\"" | "true"
       c ::= [^"\\] | "\\" . )",
    // Repetitions of terminals: chains of one unit rule per terminal, shared by every
    // chain of it: adjacent, nested in another chain, with minima, unbounded.
    R"(root ::= [0-9]{0,3} [0-9]{2} ("." [0-9]{1,4})? ("-" [0-9a]{1,2} [0-9]{0,2}){0,3} [a-f]+ ","? [0-9]*)",
    R"(root ::= ([0-9]{1,2} ","){0,3} [0-9]+ | "\"" [a-z]{2,} "\"" ([ \t]{0,3} "," [ \n]{1,2} "\"" [a-z]{0,4} "\"")*)",
};

TEST(GrammarMatcher, MasksEqualBruteForceOnRandomVocabulariesAndWalks) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<std::string> bytes = random_vocab(rng, 300 + 50 * trial);
    const auto n = static_cast<int32_t>(bytes.size()) + 2;
    bytes.push_back("");  // a special token
    bytes.push_back("");  // the end token
    auto vocab = std::make_shared<TokenVocabulary>(bytes, n, std::vector<int32_t>{n - 1});
    for (const char* src : kGrammars) {
      auto compiled = CompiledGrammar::compile(parse_gbnf(src), vocab);
      GrammarMatcher m(compiled);
      Reference ref(compiled->grammar());
      std::vector<uint64_t> mask(vocab->mask_words());
      std::string text;  // read so far
      for (int step = 0; step < 40; ++step) {
        m.fill_mask(mask.data());
        const int64_t count = GrammarMatcher::count(mask.data(), mask.size());
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < n; ++t) {
          bool want = false;
          if (t == n - 1)
            want = ref.can_end;
          else if (!bytes[static_cast<size_t>(t)].empty())
            want = brute_force_allows(ref.g, ref.tops, ref.stacks, bytes[static_cast<size_t>(t)]);
          const bool got = (mask[static_cast<size_t>(t) / 64] >> (t % 64)) & 1;
          ASSERT_EQ(got, want) << "grammar " << src << " step " << step << " token " << t << " '"
                               << bytes[static_cast<size_t>(t)] << "' after '" << text << "'";
          if (want) allowed.push_back(t);
        }
        ASSERT_EQ(count, static_cast<int64_t>(allowed.size()));
        if (allowed.empty()) break;
        const int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
        ASSERT_TRUE(m.accept(pick));
        if (pick == n - 1) break;
        ref.accept(bytes[static_cast<size_t>(pick)]);
        text += bytes[static_cast<size_t>(pick)];
        ASSERT_EQ(m.can_end(), ref.can_end);
      }
    }
  }
}

TEST(GrammarMatcher, RefusesTokensOutsideTheMaskAndEndsOnlyWhereTheGrammarMay) {
  std::vector<std::string> bytes = {"a", "b", "ab", "", "c"};
  auto vocab = std::make_shared<TokenVocabulary>(bytes, 5, std::vector<int32_t>{3});
  GrammarMatcher m(CompiledGrammar::compile(parse_gbnf("root ::= \"a\" \"b\"?"), vocab));
  EXPECT_FALSE(m.accept(1));
  EXPECT_FALSE(m.accept(3));  // the end, before the grammar may end
  EXPECT_TRUE(m.accept(0));
  EXPECT_TRUE(m.can_end());
  uint64_t mask = 0;
  EXPECT_TRUE(m.fill_mask(&mask));
  EXPECT_EQ(GrammarMatcher::count(&mask, 1), 2);  // "b" and the end token
  EXPECT_EQ(mask, (uint64_t{1} << 1) | (uint64_t{1} << 3));
  EXPECT_TRUE(m.accept(1));
  EXPECT_TRUE(m.finished());
  EXPECT_TRUE(m.fill_mask(&mask));
  EXPECT_EQ(GrammarMatcher::count(&mask, 1), 1);  // the end token only
}

TEST(GrammarMatcher, SpecialTokensMatchOnlyTheirTokenElements) {
  std::vector<std::string> bytes = {"<tool_call>", "x", "", "", "<"};
  auto vocab = std::make_shared<TokenVocabulary>(
      bytes, 5, std::vector<int32_t>{3}, [](std::string_view t) { return t == "<|tag|>" ? 2 : -1; });
  auto g = CompiledGrammar::compile(parse_gbnf("root ::= <|tag|> \"x\" | <[0]> \"x\""), vocab);
  GrammarMatcher m(g);
  uint64_t mask = 0;
  m.fill_mask(&mask);
  EXPECT_EQ(mask, (uint64_t{1} << 0) | (uint64_t{1} << 2));  // not "<", which only spells it
  EXPECT_TRUE(m.accept(2));
  EXPECT_TRUE(m.accept(1));
  EXPECT_TRUE(m.can_end());
  EXPECT_THROW(CompiledGrammar::compile(parse_gbnf("root ::= <nope>"), vocab), GrammarError);
  EXPECT_THROW(CompiledGrammar::compile(parse_gbnf("root ::= <[99]>"), vocab), GrammarError);
}

TEST(GrammarMatcher, TooAmbiguousGrammarsAreRefusedNotSlow) {
  // (a|a|a|...)* with nullable nesting: refused (a repetition of what may be empty).
  std::string src = "root ::= x*\nx ::= ";
  for (int i = 0; i < 12; ++i) src += "(\"a\" | \"\" | y" + std::to_string(i) + ") ";
  for (int i = 0; i < 12; ++i) src += "\ny" + std::to_string(i) + " ::= \"a\"?";
  std::vector<std::string> bytes = {"a", "aa", ""};
  auto vocab = std::make_shared<TokenVocabulary>(bytes, 3, std::vector<int32_t>{2});
  EXPECT_THROW(
      {
        auto g = CompiledGrammar::compile(parse_gbnf(src), vocab);
        GrammarMatcher m(g);
        for (int i = 0; i < 4; ++i) m.accept(0);
      },
      GrammarError);
  // Parses that multiply with every byte (each "a" may open a frame or not: 2^n stacks
  // after n bytes), met inside the compile's parallel walks of many terminals: the
  // first walk's error reaches the caller, whichever worker met it.
  std::string wide("root ::= s | z0 | z63\ns ::= \"a\" s \"b\" | \"a\" s | \"c\"");
  for (int i = 0; i < 64; ++i)
    wide.append("\nz").append(std::to_string(i)).append(" ::= \"b").append(std::to_string(i)).append("\" s");
  std::vector<std::string> runs;
  for (int i = 0; i < 300; ++i) runs.push_back(std::string(static_cast<size_t>(1 + i % 16), 'a'));
  auto big = std::make_shared<TokenVocabulary>(runs, 300, std::vector<int32_t>{});
  const Grammar parsed = parse_gbnf(wide);
  try {
    CompiledGrammar::compile(parsed, big);
    ADD_FAILURE() << "compiled";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("too ambiguous"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyperion::text
