// The matcher on random JSON schemas and real tokenizers: a byte-level BPE whose
// vocabulary has tokens that span JSON's structural characters (`"}`, `",`, `{"`, ` "`...)
// and a SentencePiece model trained on the bundled corpus (byte fallback). At every step
// of random walks the mask equals the brute-force one: every token's bytes tried on the
// grammar's automaton from the walk's state.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../bpe_tokenizer_fixture.h"
#include "../../test_files.h"
#include "text/grammar/gbnf.h"
#include "text/grammar/json_schema_gbnf.h"
#include "text/grammar/matcher.h"
#include "text/tokenizer.h"

namespace hyperion::text {
namespace {

using nlohmann::ordered_json;

// A random schema of the supported subset, at most `depth` levels of containers.
ordered_json random_schema(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  const int kind = depth > 0 ? pick(9) : 2 + pick(7);
  switch (kind) {
    case 0: {
      ordered_json props = ordered_json::object();
      ordered_json required = ordered_json::array();
      const int n = 1 + pick(3);
      for (int i = 0; i < n; ++i) {
        const std::string name(1, static_cast<char>('a' + i));
        props[name] = random_schema(rng, depth - 1);
        if (pick(2) == 0) required.push_back(name);
      }
      ordered_json o = {{"type", "object"}, {"properties", props}, {"required", required}};
      if (pick(3) != 0) o["additionalProperties"] = false;
      return o;
    }
    case 1: {
      ordered_json a = {{"type", "array"}, {"items", random_schema(rng, depth - 1)}};
      const int lo = pick(2);
      a["minItems"] = lo;
      a["maxItems"] = lo + pick(3);
      return a;
    }
    case 2: {
      ordered_json s = {{"type", "string"}};
      if (pick(3) != 0) s["maxLength"] = pick(6);
      if (pick(4) == 0) s["minLength"] = 1;
      return s;
    }
    case 3:
      return {{"enum", {"x", "yz", "\"q\"", 7, nullptr}}};
    case 4: {
      const int lo = -pick(30);
      return {{"type", "integer"}, {"minimum", lo}, {"maximum", lo + pick(200)}};
    }
    case 5:
      return {{"type", "number"}, {"exclusiveMinimum", -1.5}, {"maximum", 12.25}};
    case 6:
      return {{"type", "string"}, {"pattern", "^[ab]{1,3}(c|de)?$"}};
    case 7:
      return {{"anyOf", {{{"type", "boolean"}}, {{"type", "null"}}, {{"type", "string"}, {"format", "date"}}}}};
    default:
      return {{"type", "string"}, {"format", "uuid"}};
  }
}

// A byte-level BPE with tokens that span structural characters.
Tokenizer structural_bpe(const std::filesystem::path& dir) {
  nlohmann::json t = testing_util::bpe_tokenizer(testing_util::kLlama3Split, false, false);
  int id = 400;
  for (const char* extra : {"\"}", "\",", "{\"", " \"", "\":", "\": \"", "},", "}]", "[{", "true", "null", "false",
                            "\\\"", "\\n", "ab", "a\"", "12", "-1", ".5", "\"a", "x\"}", "  ", "\n ", "\n  \"",
                            "e\xCC\x81", "\xC3\xA9\"", "\xE4\xB8\xAD", "\xE4\xB8", "\xAD\""}) {
    std::string piece;
    for (const char c : std::string(extra)) piece += testing_util::byte_level_char(static_cast<uint8_t>(c));
    t["model"]["vocab"][piece] = id++;
  }
  testing_util::write_hf_tokenizer(dir, t, true);
  return Tokenizer::load((dir / "tokenizer.json").string());
}

// Walks `grammar` with random allowed tokens, comparing each mask to brute force.
void check_walks(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937& rng, const std::string& what) {
  const TokenVocabulary& v = g->vocab();
  for (int walk = 0; walk < 3; ++walk) {
    GrammarMatcher m(g);
    GrammarStacks ref(g->grammar());
    std::vector<int32_t> tops, next;
    ref.start(tops);
    bool can_end = ref.end;
    std::vector<uint64_t> mask(v.mask_words());
    std::string text;
    for (int step = 0; step < 60; ++step) {
      m.fill_mask(mask.data());
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < v.size(); ++t) {
        const auto& ends = v.end_ids();
        bool want = false;
        if (std::find(ends.begin(), ends.end(), t) != ends.end()) {
          want = can_end;
        } else if (!v.bytes(t).empty()) {
          std::vector<int32_t> cur = tops;
          const size_t mark = ref.size();
          bool ended = false;
          for (const char c : v.bytes(t)) {
            if (cur.empty()) {  // bytes left after the grammar ended or died
              ended = false;
              break;
            }
            next.clear();
            ref.reset_flags();
            ref.advance_byte(cur.data(), cur.size(), static_cast<uint8_t>(c), next);
            cur.swap(next);
            ended = ref.end;
          }
          ref.truncate(mark);
          want = !cur.empty() || ended;
        }
        const bool got = (mask[static_cast<size_t>(t) / 64] >> (t % 64)) & 1;
        ASSERT_EQ(got, want) << what << " token " << t << " '" << v.bytes(t) << "' after '" << text << "'";
        if (want) allowed.push_back(t);
      }
      if (allowed.empty()) break;
      const int32_t pick = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept(pick));
      const auto& ends = v.end_ids();
      if (std::find(ends.begin(), ends.end(), pick) != ends.end()) break;
      for (const char c : v.bytes(pick)) {
        next.clear();
        ref.reset_flags();
        ref.advance_byte(tops.data(), tops.size(), static_cast<uint8_t>(c), next);
        tops.swap(next);
      }
      can_end = ref.end;
      text += v.bytes(pick);
    }
  }
}

TEST(SchemaMatcher, MasksEqualBruteForceOnRandomSchemasWithRealTokenizers) {
  testing_util::TempDir dir;
  std::vector<std::pair<std::string, Tokenizer>> toks;
  toks.emplace_back("byte-level BPE", structural_bpe(dir.path));
  TokenizerTrainOptions o;
  o.vocab_size = 400;
  std::vector<std::string> docs;
  {
    std::ifstream in(std::string(HYPERION_SOURCE_DIR) + "/data/corpus/fortunes.txt");
    std::string line;
    while (docs.size() < 1500 && std::getline(in, line))
      if (line.size() > 20) docs.push_back(line + " {\"key\": [1, 2], \"name\": \"x\"}");
  }
  toks.emplace_back("SentencePiece", Tokenizer::train(docs, dir.file("sp.model"), o));
  std::mt19937 rng(53);
  for (auto& [name, tok] : toks) {
    const auto vocab = TokenVocabulary::from_tokenizer(tok, tok.vocab_size());
    for (int i = 0; i < 12; ++i) {
      const ordered_json schema = random_schema(rng, 2);
      const std::string gbnf = json_schema_to_gbnf(schema);
      check_walks(CompiledGrammar::compile(parse_gbnf(gbnf), vocab), rng, name + " " + schema.dump());
    }
  }
}

}  // namespace
}  // namespace hyperion::text
