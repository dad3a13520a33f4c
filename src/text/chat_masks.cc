#include "text/chat_masks.h"

#include <algorithm>
#include <utility>

#include "base/error.h"

namespace hyperion::text {

namespace {

using json = nlohmann::ordered_json;

// The first `n` messages of a conversation.
json first(const json& messages, size_t n) {
  json out = json::array();
  for (size_t i = 0; i < n; ++i) out.push_back(messages[i]);
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

int64_t ChatTokens::trained_count() const {
  return std::count(trained.begin(), trained.end(), uint8_t{1});
}

ChatMasker::ChatMasker(const ChatTemplate& chat_template, const Tokenizer& tokenizer)
    : template_(chat_template), tokenizer_(tokenizer) {
  // A probe exchange: what follows the assistant's content in its render is the
  // template's end-of-turn text.
  const std::string answer = "Probe answer 9Z";
  const json probe = json::array({json{{"role", "user"}, {"content", "Probe question 7Q"}},
                                  json{{"role", "assistant"}, {"content", answer}}});
  const std::string r = render(probe, nullptr, false);
  const size_t at = r.rfind(answer);
  if (at == std::string::npos)
    throw_usage_error(fmt::format(
        "chat template {}: an assistant's content does not appear in its render, so its tokens "
        "cannot be found for training",
        template_.origin()));
  end_of_turn_ = r.substr(at + answer.size());
}

std::string ChatMasker::render(const json& messages, const json* tools, bool generation_prompt) const {
  ChatTemplate::Input in;
  in.messages = &messages;
  in.tools = tools;
  in.add_generation_prompt = generation_prompt;
  return template_.render(in);
}

ChatTokens ChatMasker::tokenize(const json& messages, const json* tools, bool assistant_only,
                                size_t from_message) const {
  if (!messages.is_array() || messages.empty()) throw_usage_error("messages must be a non-empty list");
  size_t assistants = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw_usage_error(fmt::format("message {} has no \"role\" string", i));
    if (m["role"] == "assistant" && i >= from_message) ++assistants;
  }
  if (assistants == 0) throw_usage_error("the conversation has no assistant turn to train on");
  const std::string whole = render(messages, tools, false);
  ChatTokens out;
  auto append = [&](size_t begin, size_t end, bool trained) {
    if (end <= begin) return;
    const std::vector<int32_t> ids = tokenizer_.encode(std::string_view(whole).substr(begin, end - begin));
    out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
    out.trained.insert(out.trained.end(), ids.size(), trained ? 1 : 0);
  };
  if (!assistant_only) {
    append(0, whole.size(), true);
    return out;
  }
  // [start, end) of each assistant turn in the whole render.
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant" || i < from_message) continue;
    if (i == 0) throw_usage_error("the conversation starts with an assistant turn (message 0): there is no prompt");
    const std::string before = render(first(messages, i), tools, true);
    if (!starts_with(whole, before))
      throw_usage_error(fmt::format(
          "chat template {} renders the turns before message {} (an assistant turn) differently "
          "once later turns follow, so that turn's tokens cannot be located",
          template_.origin(), i));
    const size_t start = before.size();
    if (!spans.empty() && start < spans.back().second)
      throw_usage_error(fmt::format("chat template {}: assistant message {} overlaps the turn before it",
                                    template_.origin(), i));
    size_t end;
    if (!end_of_turn_.empty()) {
      const size_t at = whole.find(end_of_turn_, start);
      if (at == std::string::npos)
        throw_usage_error(fmt::format("chat template {}: no end-of-turn text after assistant message {}",
                                      template_.origin(), i));
      end = at + end_of_turn_.size();
    } else {
      const std::string through = render(first(messages, i + 1), tools, false);
      if (!starts_with(whole, through))
        throw_usage_error(fmt::format(
            "chat template {} renders message {} (an assistant turn) differently once later turns "
            "follow, so its tokens cannot be located",
            template_.origin(), i));
      end = through.size();
    }
    spans.emplace_back(start, end);
  }
  size_t at = 0;
  for (const auto& [start, end] : spans) {
    append(at, start, false);
    append(start, end, true);
    at = end;
  }
  append(at, whole.size(), false);
  return out;
}

}  // namespace hyperion::text
