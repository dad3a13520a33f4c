// `hyperion bench grammar`: what structured output costs, without a model. Compiles a
// JSON schema (or GBNF grammar) for a tokenizer's vocabulary several times, then walks
// the grammar for --tokens steps choosing uniformly among the allowed tokens (seeded; a
// finished text starts again), timing each step's mask and its token's advance: the
// per-token cost a constrained request adds to a decode step (docs/PERFORMANCE.md
// compares it with `bench decode` of the same model).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/grammar_constraint.h"
#include "cli/tokenizer_path.h"
#include "text/grammar/gbnf.h"
#include "text/grammar/json_schema_gbnf.h"
#include "text/grammar/matcher.h"
#include "text/tokenizer.h"

namespace hyperion::cli {

const CommandSpec kBenchGrammarSpec = {
    "bench grammar",
    "",
    "time structured output: grammar compile, and the mask + advance of each token",
    {{"tokenizer", "PATH", "the vocabulary: a checkpoint directory, tokenizer.json or .model"},
     {"json-schema", "FILE", "the schema (default: a built-in object of 20 properties)"},
     {"grammar", "FILE", "a GBNF grammar instead of a schema"},
     {"compiles", "N", "compilations to time (default 5; the median is reported)"},
     {"tokens", "N", "tokens to walk (default 2000)"},
     {"seed", "S", "seed of the walk's choices (default 0)"},
     {"json", "", "print the figures as one JSON object"}},
    "The built-in schema has 20 properties: strings with and without bounds, integers and "
    "numbers with bounds, booleans, enums, a date, a uuid, arrays and a nested object.",
    "bench grammar --tokenizer /path/to/Llama-3.2-1B --json"};

namespace {

// 20 properties of the kinds API users send (the issue's compile-time target).
const char* kTwentyProperties = R"({
  "type": "object",
  "properties": {
    "id": {"type": "string", "format": "uuid"},
    "name": {"type": "string", "maxLength": 40},
    "email": {"type": "string", "format": "email"},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "height_m": {"type": "number", "minimum": 0.3, "maximum": 2.8},
    "active": {"type": "boolean"},
    "role": {"enum": ["admin", "editor", "viewer", "guest"]},
    "joined": {"type": "string", "format": "date"},
    "score": {"type": "number"},
    "rank": {"type": "integer", "exclusiveMinimum": 0},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 8},
    "bio": {"type": "string"},
    "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
    "phone": {"anyOf": [{"type": "string", "pattern": "^\\+[0-9]{7,15}$"}, {"type": "null"}]},
    "address": {"type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                               "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["street", "city", "zip"], "additionalProperties": false},
    "languages": {"type": "array", "items": {"enum": ["en", "fr", "de", "es", "zh"]}, "minItems": 1},
    "verified": {"type": "boolean"},
    "balance": {"type": "number", "minimum": -1000000, "maximum": 1000000},
    "notes": {"type": ["string", "null"], "maxLength": 200},
    "level": {"type": "integer", "minimum": 1, "maximum": 10}
  },
  "required": ["id", "name", "email", "age", "height_m", "active", "role", "joined", "score",
               "rank", "tags", "bio", "country", "phone", "address", "languages", "verified",
               "balance", "notes", "level"],
  "additionalProperties": false
})";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int cmd_bench_grammar(const Args& args) {
  const Flags f(kBenchGrammarSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "bench grammar: unexpected argument '{}'", f.positional()[0]);
  HYP_USAGE_CHECK(!(f.has("json-schema") && f.has("grammar")),
                  "bench grammar: give --json-schema or --grammar, not both");
  const int64_t compiles = f.integer("compiles", 5), steps = f.integer("tokens", 2000);
  HYP_USAGE_CHECK(compiles >= 1, "bench grammar: --compiles must be >= 1, got {}", compiles);
  HYP_USAGE_CHECK(steps >= 1, "bench grammar: --tokens must be >= 1, got {}", steps);
  const int64_t seed = f.integer("seed", 0);
  std::string source = "built-in 20-property schema", gbnf;
  if (f.has("grammar")) {
    source = f.get("grammar");
    gbnf = read_grammar_file("grammar", source);
  } else if (f.has("json-schema")) {
    source = f.get("json-schema");
    gbnf = read_grammar_file("json-schema", source);
  } else {
    gbnf = text::json_schema_to_gbnf(nlohmann::ordered_json::parse(kTwentyProperties));
  }
  const text::Tokenizer tok = text::Tokenizer::load(tokenizer_path(f.require("tokenizer"), "bench grammar"));
  auto t0 = std::chrono::steady_clock::now();
  const auto vocab = text::TokenVocabulary::from_tokenizer(tok, tok.vocab_size());
  const double vocab_s = seconds_since(t0);

  std::vector<double> compile_s;
  std::shared_ptr<const text::CompiledGrammar> compiled;
  for (int64_t i = 0; i < compiles; ++i) {
    t0 = std::chrono::steady_clock::now();
    compiled = text::CompiledGrammar::compile(text::parse_gbnf(gbnf), vocab);
    compile_s.push_back(seconds_since(t0));
  }

  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  auto matcher = std::make_unique<text::GrammarMatcher>(compiled);
  std::vector<uint64_t> mask(vocab->mask_words());
  std::vector<double> mask_s, accept_s;
  std::vector<int32_t> allowed;
  int64_t texts = 0, allowed_total = 0;
  for (int64_t i = 0; i < steps; ++i) {
    t0 = std::chrono::steady_clock::now();
    matcher->fill_mask(mask.data());
    mask_s.push_back(seconds_since(t0));
    const int64_t n = text::GrammarMatcher::count(mask.data(), mask.size());
    allowed_total += n;
    allowed.clear();
    for (size_t w = 0; w < mask.size(); ++w)
      for (uint64_t bits = mask[w]; bits != 0; bits &= bits - 1)
        allowed.push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits))));
    // Text tokens only, unless the grammar may end: an end token closes this text.
    const bool can_end = matcher->can_end();
    if (!can_end)
      allowed.erase(std::remove_if(allowed.begin(), allowed.end(), [&](int32_t t) { return tok.is_end(t); }),
                    allowed.end());
    HYP_CHECK(!allowed.empty(), "bench grammar: the grammar allows no token of this vocabulary at step {}", i);
    const int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    t0 = std::chrono::steady_clock::now();
    HYP_CHECK(matcher->accept(pick), "bench grammar: token {} was allowed but refused", pick);
    accept_s.push_back(seconds_since(t0));
    if (matcher->finished()) {
      ++texts;
      matcher = std::make_unique<text::GrammarMatcher>(compiled);
    }
  }
  double mask_sum = 0, accept_sum = 0;
  for (const double s : mask_s) mask_sum += s;
  for (const double s : accept_s) accept_sum += s;
  const double per_token_us = (mask_sum + accept_sum) / static_cast<double>(steps) * 1e6;
  nlohmann::ordered_json j;
  j["source"] = source;
  j["tokenizer"] = tok.origin();
  j["vocab_size"] = vocab->size();
  j["vocab_build_ms"] = vocab_s * 1e3;
  j["grammar_rules"] = compiled->grammar().rule_count();
  j["grammar_elements"] = compiled->grammar().elements.size();
  j["compile_ms_median"] = percentile(compile_s, 0.5) * 1e3;
  j["compile_ms_max"] = percentile(compile_s, 1.0) * 1e3;
  j["precomputed_mib"] = static_cast<double>(compiled->memory_bytes()) / (1 << 20);
  j["uncertain_tokens_total"] = compiled->uncertain_total();
  j["tokens"] = steps;
  j["texts_completed"] = texts;
  j["allowed_mean"] = static_cast<double>(allowed_total) / static_cast<double>(steps);
  j["mask_us_mean"] = mask_sum / static_cast<double>(steps) * 1e6;
  j["mask_us_p50"] = percentile(mask_s, 0.5) * 1e6;
  j["mask_us_p99"] = percentile(mask_s, 0.99) * 1e6;
  j["mask_us_max"] = percentile(mask_s, 1.0) * 1e6;
  j["accept_us_mean"] = accept_sum / static_cast<double>(steps) * 1e6;
  j["per_token_us_mean"] = per_token_us;
  if (f.has("json")) {
    print_json(j, 2);
    return 0;
  }
  std::printf("bench grammar: %s for %s (%d tokens, vocabulary built in %.1f ms)\n", source.c_str(),
              tok.origin().c_str(), vocab->size(), vocab_s * 1e3);
  std::printf("  compile      %.1f ms median of %lld (max %.1f ms), %d rules, %.2f MiB precomputed\n",
              j["compile_ms_median"].get<double>(), static_cast<long long>(compiles),
              j["compile_ms_max"].get<double>(), compiled->grammar().rule_count(),
              j["precomputed_mib"].get<double>());
  std::printf("  per token    mask %.1f us mean (p50 %.1f, p99 %.1f, max %.1f), advance %.1f us; %.0f tokens "
              "allowed on average; %lld texts completed in %lld tokens\n",
              j["mask_us_mean"].get<double>(), j["mask_us_p50"].get<double>(), j["mask_us_p99"].get<double>(),
              j["mask_us_max"].get<double>(), j["accept_us_mean"].get<double>(), j["allowed_mean"].get<double>(),
              static_cast<long long>(texts), static_cast<long long>(steps));
  return 0;
}

}  // namespace hyperion::cli
