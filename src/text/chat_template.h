// A model's chat template: the Jinja `chat_template` of tokenizer_config.json (or
// chat_template.jinja), rendered as transformers' apply_chat_template renders it. The
// template sees `messages`, `tools` and `documents` (None when not given),
// `add_generation_prompt`, the special tokens (bos_token, eos_token, unk_token, pad_token),
// and any extra variables of the request (vLLM's chat_template_kwargs: enable_thinking,
// date_string...); raise_exception and strftime_now are its globals.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "text/jinja/jinja.h"
#include "text/tokenizer.h"

namespace hyperion::text {

class ChatTemplate {
 public:
  // Parses `source`; a syntax error throws hyperion::UsageError "ORIGIN:LINE:COL: ...".
  ChatTemplate(std::string_view source, std::string origin, const Tokenizer& tokenizer);
  // The tokenizer's own template; nullopt when it has none (a SentencePiece model).
  static std::optional<ChatTemplate> of(const Tokenizer& tokenizer);

  struct Input {
    const nlohmann::ordered_json* messages = nullptr;  // the conversation, as sent
    const nlohmann::ordered_json* tools = nullptr;     // null: no tools
    const nlohmann::ordered_json* kwargs = nullptr;    // extra template variables (an object)
    bool add_generation_prompt = true;
  };
  // The prompt text (to encode without adding special tokens: the template writes them).
  // Throws hyperion::UsageError naming the template and line:column when it raises or
  // fails (the server turns it into a 400).
  std::string render(const Input& input) const;

  const std::string& origin() const { return template_.origin(); }

 private:
  jinja::Template template_;
  nlohmann::ordered_json special_tokens_;
};

}  // namespace hyperion::text
