// libFuzzer: structured output's readers on hostile input, the texts a request may send:
// GBNF grammars, JSON schemas and regular expressions. Each is read, lowered, compiled
// for a small vocabulary, and its matcher walked a few steps; the only allowed failure is
// a GrammarError (the server's 400). A crash, a hang, a sanitizer report or a huge
// allocation is a finding.
//
// The first byte picks the reader (GBNF, schema, regex, schema pattern); the rest is the
// text.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/grammar/gbnf.h"
#include "text/grammar/json_schema_gbnf.h"
#include "text/grammar/matcher.h"
#include "text/grammar/regex_gbnf.h"
#include "text/grammar/token_vocabulary.h"

namespace {

using namespace hyperion::text;

// Tokens across the structural characters of JSON and GBNF, digits, letters, partial and
// whole UTF-8 characters, and one special token (empty bytes) that ends a text.
std::shared_ptr<const TokenVocabulary> vocabulary() {
  std::vector<std::string> t = {"\"", "{", "}", "[", "]", ",", ":", " ", "\n", "\\", "-", ".",
                                "0", "1", "9", "a", "e", "z", "A", "@", "true", "null", "\":",
                                "\",", "\"}", "12", "ab", "\xC3", "\xA9", "\xC3\xA9",
                                "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", ""};
  const auto n = static_cast<int32_t>(t.size());
  return std::make_shared<TokenVocabulary>(std::move(t), n, std::vector<int32_t>{n - 1});
}

void walk(const std::string& gbnf, const std::shared_ptr<const TokenVocabulary>& vocab,
          const uint8_t* picks, size_t n_picks) {
  auto compiled = CompiledGrammar::compile(parse_gbnf(gbnf), vocab);
  GrammarMatcher m(compiled);
  std::vector<uint64_t> mask(vocab->mask_words());
  for (size_t step = 0; step < 8 && !m.finished(); ++step) {
    if (!m.fill_mask(mask.data())) break;
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < vocab->size(); ++t)
      if ((mask[static_cast<size_t>(t) / 64] >> (t % 64)) & 1) allowed.push_back(t);
    const int32_t pick = allowed[(n_picks ? picks[step % n_picks] : 0) % allowed.size()];
    // What the mask allows, the matcher must take.
    if (!m.accept(pick)) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const auto vocab = vocabulary();
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  // (the last bytes double as the walk's choices)
  const uint8_t* picks = data + 1 + (size - 1) / 2;
  const size_t n_picks = (size - 1) - (size - 1) / 2;
  try {
    std::string gbnf;
    switch (data[0] % 4) {
      case 0:
        gbnf = text;
        break;
      case 1: {
        const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
        if (schema.is_discarded()) return 0;
        gbnf = json_schema_to_gbnf(schema);
        break;
      }
      case 2:
        gbnf = "root ::= ";
        gbnf.append(regex_to_gbnf(text)).append("\n");
        break;
      default:
        gbnf = "root ::= \"\\\"\" s \"\\\"\"\n";
        gbnf.append("s ::= ").append(schema_pattern_to_gbnf(text)).append("\n");
        break;
    }
    walk(gbnf, vocab, picks, n_picks);
  } catch (const GrammarError&) {
    // refused with a message: the server's 400
  }
  return 0;
}
