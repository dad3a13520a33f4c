// Structured output for `hyperion generate`: --json-schema FILE or --grammar FILE (GBNF)
// becomes a grammar (text/grammar/) that every sampled token must follow.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/generator.h"
#include "text/grammar/matcher.h"
#include "text/tokenizer.h"

namespace hyperion::cli {

// The GBNF of the file given as `flag` ("json-schema" or "grammar"): read, parsed and
// checked (a usage error, exit status 2, names the file and the place in it).
std::string read_grammar_file(const std::string& flag, const std::string& path);

// A TokenConstraint that follows a grammar matcher.
class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(const std::string& gbnf, const text::Tokenizer& tok, int64_t model_vocab);
  bool mask(float* logits, int64_t vocab) override;
  void accept(int32_t token) override;
  bool finished() const override { return matcher_->finished(); }

 private:
  std::unique_ptr<text::GrammarMatcher> matcher_;
  std::vector<uint64_t> mask_;
};

}  // namespace hyperion::cli
