#include "cli/grammar_constraint.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "io/atomic_file.h"
#include "text/grammar/gbnf.h"
#include "text/grammar/json_schema_gbnf.h"

namespace hyperion::cli {

std::string read_grammar_file(const std::string& flag, const std::string& path) {
  std::string text;
  try {
    text = io::read_file(path, static_cast<int64_t>(text::GrammarLimits::kMaxSourceBytes));
  } catch (const Error& e) {
    usage_fail("generate: --{} {}: {}", flag, path, e.what());
  }
  try {
    std::string gbnf = text;
    if (flag == "json-schema") {
      nlohmann::ordered_json schema;
      try {
        schema = nlohmann::ordered_json::parse(text);
      } catch (const nlohmann::json::exception& e) {
        usage_fail("generate: --json-schema {}: not valid JSON: {}", path, e.what());
      }
      gbnf = text::json_schema_to_gbnf(schema);
    }
    text::parse_gbnf(gbnf);
    return gbnf;
  } catch (const text::GrammarError& e) {
    usage_fail("generate: --{} {}: {}", flag, path, e.what());
  }
}

GrammarConstraint::GrammarConstraint(const std::string& gbnf, const text::Tokenizer& tok,
                                     int64_t model_vocab) {
  auto compiled = text::CompiledGrammar::compile(text::parse_gbnf(gbnf),
                                                 text::TokenVocabulary::from_tokenizer(tok, model_vocab));
  matcher_ = std::make_unique<text::GrammarMatcher>(std::move(compiled));
  mask_.resize(matcher_->compiled().vocab().mask_words());
}

bool GrammarConstraint::mask(float* logits, int64_t vocab) {
  if (!matcher_->fill_mask(mask_.data())) return false;
  text::GrammarMatcher::apply_mask(mask_.data(), logits, vocab);
  return true;
}

void GrammarConstraint::accept(int32_t token) {
  HYP_CHECK(matcher_->accept(token), "generate: the grammar refused token {}, which its mask allowed", token);
}

}  // namespace hyperion::cli
