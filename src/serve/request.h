// What a client asks the serving engine for, and what it gets back token by token.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/sampler.h"
#include "serve/lora_registry.h"
#include "text/grammar/matcher.h"

namespace hyperion::serve {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, BOS included when wanted
  SamplingParams sampling;      // temperature 0 = greedy
  int64_t max_tokens = 16;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool ignore_eos = false;        // keep going past EOS up to max_tokens
  bool logprobs = false;          // report log p(chosen token)
  LoraRef adapter;                // the LoRA adapter it runs with (null: the base model)
  // Structured output: every token is drawn from those the grammar allows next, and the
  // request ends (finish "stop") when the grammar has ended or allows no token. Compiled
  // for this model's vocabulary (text/grammar/matcher.h); null: unconstrained.
  std::shared_ptr<const text::CompiledGrammar> grammar;
  // Keep special tokens' text in the output (tool-call markers such as <|python_tag|> or
  // [TOOL_CALLS], which the tool-call parser reads); end tokens are never text.
  bool keep_special_text = false;
};

enum class FinishReason : uint8_t { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

// One event per generated token (token >= 0), the last one with finish != kNone. An
// abort or error ends the stream with token = -1.
struct TokenEvent {
  int32_t token = -1;
  float logprob = 0.0f;
  std::string text;  // new text this token makes printable (may be empty)
  FinishReason finish = FinishReason::kNone;
  int64_t prompt_tokens = 0;      // set on the final event
  int64_t completion_tokens = 0;  // set on the final event
  int64_t cached_tokens = 0;      // prompt tokens served from the prefix cache (final event)
  std::string error;              // kError only
};

// Called on the engine thread; must not block for long (queue the event for the HTTP
// threads: serve/async_engine.h).
using TokenCallback = std::function<void(const TokenEvent&)>;

}  // namespace hyperion::serve
