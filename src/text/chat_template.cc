#include "text/chat_template.h"

#include <filesystem>

#include "base/error.h"

namespace hyperion::text {

namespace {

std::string token_text(const Tokenizer& tok, int32_t id) {
  return id >= 0 ? tok.id_to_piece(id) : std::string();
}

}  // namespace

namespace {

// A template that does not parse, or refuses a conversation, is bad input (exit status 2
// on the command line; the server answers 400).
jinja::Template parse_template(std::string_view source, std::string origin) {
  try {
    return jinja::Template::parse(source, std::move(origin));
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw_usage_error(e.what());
  }
}

}  // namespace

ChatTemplate::ChatTemplate(std::string_view source, std::string origin, const Tokenizer& tokenizer)
    : template_(parse_template(source, std::move(origin))) {
  // As transformers' special_tokens_map: a token the tokenizer lacks is None.
  auto add = [&](const char* name, const std::string& text) {
    special_tokens_[name] = text.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(text);
  };
  add("bos_token", tokenizer.bos_token());
  add("eos_token", tokenizer.eos_token());
  add("unk_token", token_text(tokenizer, tokenizer.unk_id()));
  add("pad_token", token_text(tokenizer, tokenizer.pad_id()));
}

std::optional<ChatTemplate> ChatTemplate::of(const Tokenizer& tokenizer) {
  if (tokenizer.chat_template().empty()) return std::nullopt;
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(tokenizer.origin()).parent_path();
  bool separate = false;
  for (const auto& f : tokenizer.files()) separate |= f.first == "chat_template.jinja";
  const std::string origin = separate ? (dir / "chat_template.jinja").string()
                                      : (dir / "tokenizer_config.json").string() + ":chat_template";
  return ChatTemplate(tokenizer.chat_template(), origin, tokenizer);
}

std::string ChatTemplate::render(const Input& input) const {
  HYP_CHECK(input.messages != nullptr && input.messages->is_array(),
            "chat template {}: messages must be a list", origin());
  nlohmann::ordered_json ctx = special_tokens_;
  ctx["messages"] = *input.messages;
  ctx["tools"] = input.tools != nullptr ? *input.tools : nlohmann::ordered_json();
  ctx["documents"] = nlohmann::ordered_json();
  ctx["add_generation_prompt"] = input.add_generation_prompt;
  if (input.kwargs != nullptr) {
    for (const auto& [k, v] : input.kwargs->items()) {
      // As Python's keyword arguments: a variable the render sets itself cannot be given.
      if (ctx.contains(k))
        throw_usage_error(fmt::format(
            "chat template {}: the template variable '{}' is set by the request itself, not by "
            "extra variables",
            origin(), k));
      ctx[k] = v;
    }
  }
  try {
    return template_.render(jinja::from_json(ctx));
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw_usage_error(e.what());
  }
}

}  // namespace hyperion::text
