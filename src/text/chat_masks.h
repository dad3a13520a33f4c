// A conversation as supervised fine-tuning trains on it: the model's own chat template
// renders it, and the loss covers the assistant's tokens only (TRL's assistant_only_loss,
// MaxText's sft_train_on_completion_only): each assistant turn's content, tool calls and
// end-of-turn marker, not the system prompt, the user's or tools' turns, nor the header
// the template writes before each assistant turn (what add_generation_prompt adds).
//
// How the spans are found, for any template: the whole conversation is rendered once;
// assistant turn i starts where the render of the turns before it with the generation
// prompt ends (that render must be a prefix of the whole one: a template that renders
// earlier turns differently once more follow is refused), and ends after the template's
// end-of-turn text (what it writes after an assistant's content, found once by rendering
// a probe conversation). Qwen3's template, which writes an empty <think></think> block
// into the last assistant turn only, passes: the last turn's block is trained, as it is
// what the model generates there.
//
// Tokens: each span (trained or not) is encoded on its own, special-token strings parsed,
// nothing added (the template writes BOS where the model has one); the spans meet at turn
// boundaries, where the templates put special tokens or newlines.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace hyperion::text {

struct ChatTokens {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;  // 1: the loss covers this token (as a prediction target)
  int64_t trained_count() const;
};

class ChatMasker {
 public:
  // Probes the template's end-of-turn text; throws hyperion::UsageError naming the
  // template when it cannot render a user / assistant exchange.
  ChatMasker(const ChatTemplate& chat_template, const Tokenizer& tokenizer);

  // messages: a list of {role, content[, tool_calls, ...]} (OpenAI / Hugging Face chat
  // format) with at least one assistant turn; tools: null or the tools list the template
  // reads. Throws hyperion::UsageError saying what is wrong (no assistant turn, a role or
  // order the template refuses, a template whose renders are not prefixes); the caller
  // names the line. assistant_only = false trains on every token. from_message > 0 trains
  // the assistant turns from that message on only (a preference pair's completion after
  // a prompt that may hold earlier assistant turns); there must be one.
  ChatTokens tokenize(const nlohmann::ordered_json& messages, const nlohmann::ordered_json* tools,
                      bool assistant_only = true, size_t from_message = 0) const;

  // The text the template writes after an assistant's content ("<|eot_id|>",
  // "<|im_end|>\n", "<end_of_turn>\n").
  const std::string& end_of_turn() const { return end_of_turn_; }

 private:
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json* tools,
                     bool generation_prompt) const;
  const ChatTemplate& template_;
  const Tokenizer& tokenizer_;
  std::string end_of_turn_;
};

}  // namespace hyperion::text
