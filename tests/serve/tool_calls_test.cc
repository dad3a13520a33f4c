// Tool calls (serve/tool_calls.h): each family's format detected and parsed (single,
// several, with content around, malformed -> content), streamed deltas equal to the whole
// parse for every split of the text, the forcing grammar accepting each family's canonical
// call and refusing wrong names and arguments, and the 400s for bad tools / tool_choice;
// then the chat API's side: parse_chat_request, the whole response and the stream chunks.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../text/bpe_tokenizer_fixture.h"
#include "serve/api_fields.h"
#include "serve/openai_api.h"
#include "serve/tool_calls.h"
#include "text/chat_template.h"
#include "text/grammar/gbnf.h"
#include "text/grammar/grammar_cache.h"
#include "text/grammar/matcher.h"
#include "text/grammar/token_vocabulary.h"
#include "text/tokenizer.h"

namespace hyperion::serve {
namespace {

using ojson = nlohmann::ordered_json;
using nlohmann::json;

const char* const kTools = R"J([
  {"type": "function", "function": {"name": "get_weather", "description": "The weather",
   "parameters": {"type": "object", "properties": {
       "city": {"type": "string", "enum": ["Paris", "Oslo"]},
       "days": {"type": "integer", "minimum": 1, "maximum": 7}},
     "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time",
   "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}},
                  "required": ["zone"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "ping"}}
])J";

const std::vector<std::string> kNames = {"get_weather", "get_time", "ping"};

ToolSyntax syntax_of(ToolFormat f, bool mistral_args = false) {
  ToolSyntax s;
  s.format = f;
  s.mistral_args = mistral_args;
  return s;
}

// A reply as a stream would give it: the deltas joined into content and calls.
ParsedReply from_deltas(const std::vector<ToolDelta>& deltas) {
  ParsedReply r;
  int next = 0;
  for (const ToolDelta& d : deltas) {
    if (d.kind == ToolDelta::kContent) {
      r.content += d.text;
    } else if (d.kind == ToolDelta::kCallStart) {
      EXPECT_EQ(d.index, next) << "calls are numbered in order";
      ++next;
      r.calls.push_back({d.id, d.name, ""});
    } else {
      EXPECT_LT(d.index, next) << "arguments before their call's header";
      if (d.index < next) r.calls[static_cast<size_t>(d.index)].arguments += d.text;
    }
  }
  return r;
}

ParsedReply stream_chunks(const ToolSyntax& s, const std::vector<std::string_view>& chunks,
                          const std::vector<std::string>& names = kNames) {
  ToolCallStream p(s, names);
  std::vector<ToolDelta> out;
  for (std::string_view c : chunks) p.feed(c, out);
  p.finish(out);
  return from_deltas(out);
}

void expect_same(const ParsedReply& got, const ParsedReply& want, const std::string& what) {
  EXPECT_EQ(got.content, want.content) << what;
  ASSERT_EQ(got.calls.size(), want.calls.size()) << what;
  for (size_t i = 0; i < got.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].name, want.calls[i].name) << what;
    EXPECT_EQ(got.calls[i].arguments, want.calls[i].arguments) << what;
  }
}

struct Case {
  ToolSyntax syntax;
  std::string text;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

std::vector<Case> cases() {
  const ToolSyntax llama = syntax_of(ToolFormat::kLlama3Json), hermes = syntax_of(ToolFormat::kHermes),
                   mistral = syntax_of(ToolFormat::kMistral), gemma = syntax_of(ToolFormat::kGemma);
  const std::string weather = R"({"city": "Paris", "days": 3})", weather_c = R"({"city":"Paris","days":3})";
  return {
      // Llama 3.x JSON.
      {llama, R"({"name": "get_weather", "parameters": {"city": "Paris", "days": 3}})", "", {{"get_weather", weather_c}}},
      {llama, "<|python_tag|>{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}", "",
       {{"get_time", R"({"zone":"UTC"})"}}},
      {llama, "  {\"name\": \"get_weather\", \"parameters\": " + weather + "}; {\"name\": \"ping\", \"parameters\": {}}",
       "", {{"get_weather", weather_c}, {"ping", "{}"}}},
      {llama, "Let me look. <|python_tag|>{\"name\": \"ping\", \"parameters\": {}}", "Let me look. ", {{"ping", "{}"}}},
      {llama, "The answer is {\"name\": \"ping\"}.", "The answer is {\"name\": \"ping\"}.", {}},
      {llama, R"({"name": "Bob", "age": 3})", R"({"name": "Bob", "age": 3})", {}},
      {llama, R"({"name": "get_weather", "parameters": {"city": }})", R"({"name": "get_weather", "parameters": {"city": }})", {}},
      {llama, R"({"name": "ping"})", "", {{"ping", "{}"}}},
      {llama, R"({"parameters": {"zone": "a b\"c"}, "name": "get_time"})", "", {{"get_time", R"({"zone":"a b\"c"})"}}},
      {llama, "<|python_tag|>brave_search.call(query=\"x\")", "<|python_tag|>brave_search.call(query=\"x\")", {}},
      {llama, "  plain text  ", "  plain text  ", {}},
      // Qwen / Hermes.
      {hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + weather + "}\n</tool_call>", "",
       {{"get_weather", weather_c}}},
      {hermes,
       "<think>\nok\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + weather +
           "}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>",
       "<think>\nok\n</think>\n\nLet me check.\n", {{"get_weather", weather_c}, {"get_time", R"({"zone":"CET"})"}}},
      {hermes, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\nDone.", "Done.", {{"ping", "{}"}}},
      {hermes, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}", "", {{"ping", "{}"}}},
      {hermes, "<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", {}},
      {hermes, "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>", {}},
      {hermes, "<tool_call>\n{\"name\": \"ping\", \"arguments\": \"{}\"}\n</tool_call>",
       "<tool_call>\n{\"name\": \"ping\", \"arguments\": \"{}\"}\n</tool_call>", {}},
      {hermes, "a <tool_ b <tool_call", "a <tool_ b <tool_call", {}},
      {hermes, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UT",
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UT", {}},
      // Mistral, both forms.
      {mistral,
       "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": " + weather +
           ", \"id\": \"abc123XYZ\"}, {\"name\": \"ping\", \"arguments\": {}}]",
       "", {{"get_weather", weather_c}, {"ping", "{}"}}},
      {mistral, "Sure. [TOOL_CALLS][{\"name\": \"ping\", \"arguments\": {}}]", "Sure. ", {{"ping", "{}"}}},
      {mistral, "[TOOL_CALLS]get_weather[ARGS]" + weather + "[TOOL_CALLS]ping[ARGS]{}", "",
       {{"get_weather", weather_c}, {"ping", "{}"}}},
      {mistral, "[TOOL_CALLS]get_time{\"zone\": \"UTC\"}", "", {{"get_time", R"({"zone":"UTC"})"}}},
      {mistral, "[TOOL_CALLS] nonsense here", "[TOOL_CALLS] nonsense here", {}},
      {mistral, "[TOOL_CALLS]unknown[ARGS]{}", "[TOOL_CALLS]unknown[ARGS]{}", {}},
      {mistral, "[TOOL_CALLS] []", "[TOOL_CALLS] []", {}},
      // Gemma.
      {gemma, "{\"name\": \"get_weather\", \"parameters\": " + weather + "}", "", {{"get_weather", weather_c}}},
      {gemma, "{\"name\": \"ping\", \"parameters\": {}}\n{\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}",
       "", {{"ping", "{}"}, {"get_time", R"({"zone":"UTC"})"}}},
      {gemma, "I will call it.\n```tool_code\n{\"name\": \"ping\", \"parameters\": {}}\n```\n", "I will call it.\n",
       {{"ping", "{}"}}},
      {gemma, "[{\"name\": \"ping\", \"parameters\": {}}, {\"name\": \"ping\", \"parameters\": {}}]", "",
       {{"ping", "{}"}, {"ping", "{}"}}},
      {gemma, "```json\n{\"a\": 1}\n```", "```json\n{\"a\": 1}\n```", {}},
  };
}

TEST(ToolCallParse, EveryFamilysFormatWholeReply) {
  for (const Case& c : cases()) {
    const ParsedReply r = parse_tool_calls(c.syntax, kNames, c.text);
    const std::string what = std::string(tool_format_name(c.syntax.format)) + ": " + c.text;
    EXPECT_EQ(r.content, c.content) << what;
    ASSERT_EQ(r.calls.size(), c.calls.size()) << what;
    for (size_t i = 0; i < r.calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].name, c.calls[i].first) << what;
      EXPECT_EQ(r.calls[i].arguments, c.calls[i].second) << what;
      EXPECT_TRUE(json::accept(r.calls[i].arguments)) << what;
      if (c.syntax.format == ToolFormat::kMistral) {
        EXPECT_EQ(r.calls[i].id.size(), 9u) << what;
      } else {
        EXPECT_EQ(r.calls[i].id.rfind("call_", 0), 0u) << what;
        EXPECT_EQ(r.calls[i].id.size(), 29u) << what;
      }
    }
    // No call: the content is the text, byte for byte.
    if (c.calls.empty()) {
      EXPECT_EQ(r.content, c.text) << what;
    }
  }
}

TEST(ToolCallParse, IdsAreUnique) {
  const ParsedReply r = parse_tool_calls(syntax_of(ToolFormat::kLlama3Json), kNames,
                                         R"({"name": "ping", "parameters": {}}; {"name": "ping", "parameters": {}})");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
}

TEST(ToolCallParse, NoToolListAcceptsAnyNameAndNoFormatIsText) {
  EXPECT_EQ(parse_tool_calls(syntax_of(ToolFormat::kHermes), {}, "<tool_call>{\"name\": \"x\", \"arguments\": {}}")
                .calls.size(),
            1u);
  const ParsedReply r = parse_tool_calls(ToolSyntax{}, kNames, "<tool_call>{\"name\": \"ping\", \"arguments\": {}}");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "<tool_call>{\"name\": \"ping\", \"arguments\": {}}");
}

TEST(ToolCallParse, GarbageNeverThrows) {
  // Random bytes built from the formats' own pieces: whatever comes, content or calls.
  const std::vector<std::string> pieces = {"<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>",
                                           "{", "}", "[", "]", "\"", "\\", "name", ":", ",", ";", " ", "\n",
                                           "\"name\": \"ping\"", "\"arguments\": ", "\"parameters\": ", "1e", "-",
                                           "```json", "```", "true", "nul", "\xc3\xa9"};
  uint32_t seed = 1;
  for (int n = 0; n < 400; ++n) {
    std::string text;
    for (int k = 0; k < 12; ++k) {
      seed = seed * 1103515245u + 12345u;
      text += pieces[(seed >> 8) % pieces.size()];
    }
    for (ToolFormat f : {ToolFormat::kLlama3Json, ToolFormat::kHermes, ToolFormat::kMistral, ToolFormat::kGemma}) {
      ParsedReply r;
      ASSERT_NO_THROW(r = parse_tool_calls(syntax_of(f), kNames, text)) << text;
      for (const ToolCall& c : r.calls) EXPECT_TRUE(json::accept(c.arguments)) << text;
      if (r.calls.empty()) {
        EXPECT_EQ(r.content, text);
      }
      // A stream of the same bytes one at a time agrees.
      std::vector<std::string_view> bytes;
      for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
      ASSERT_NO_THROW((void)stream_chunks(syntax_of(f), bytes)) << text;
    }
  }
}

// Streamed in two pieces at every split point (and three at every pair for the short ones),
// and a byte at a time: the deltas join to the same reply, which is the whole parse unless
// a call was cut off.
TEST(ToolCallStreaming, EverySplitGivesTheWholeParse) {
  for (const Case& c : cases()) {
    const std::string_view t = c.text;
    const ParsedReply want = stream_chunks(c.syntax, {t});
    const bool complete = std::all_of(want.calls.begin(), want.calls.end(), [](const ToolCall& call) {
      return json::accept(call.arguments);
    });
    if (complete) {
      expect_same(want, parse_tool_calls(c.syntax, kNames, c.text), c.text + " whole");
    } else {
      // A call cut off: the stream has sent it; a whole reply gives it back as text.
      EXPECT_EQ(parse_tool_calls(c.syntax, kNames, c.text).content, c.text);
    }
    for (size_t i = 0; i <= t.size(); ++i)
      expect_same(stream_chunks(c.syntax, {t.substr(0, i), t.substr(i)}), want, c.text + " split at " + std::to_string(i));
    if (t.size() <= 90)
      for (size_t i = 0; i <= t.size(); ++i)
        for (size_t j = i; j <= t.size(); ++j)
          expect_same(stream_chunks(c.syntax, {t.substr(0, i), t.substr(i, j - i), t.substr(j)}), want,
                      c.text + " split at " + std::to_string(i) + ", " + std::to_string(j));
    std::vector<std::string_view> bytes;
    for (size_t i = 0; i < t.size(); ++i) bytes.push_back(t.substr(i, 1));
    expect_same(stream_chunks(c.syntax, bytes), want, c.text + " byte by byte");
  }
}

TEST(ToolCallStreaming, ContentGoesOutAtOnceAndMarkerPrefixesWait) {
  ToolCallStream p(syntax_of(ToolFormat::kHermes), kNames);
  std::vector<ToolDelta> out;
  p.feed("Hello <tool", out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].text, "Hello ");
  out.clear();
  p.feed("box> and <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\"", out);
  // "<toolbox> and " is text; the call is committed once its arguments began.
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].kind, ToolDelta::kContent);
  EXPECT_EQ(out[0].text, "<toolbox> and ");
  EXPECT_EQ(out[1].kind, ToolDelta::kCallStart);
  EXPECT_EQ(out[1].name, "get_weather");
  EXPECT_EQ(out[2].kind, ToolDelta::kArguments);
  EXPECT_EQ(out[2].text, "{\"city\"");
  out.clear();
  p.feed(": \"Oslo\"}}\n</tool_call>", out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].text, ":\"Oslo\"}");
  EXPECT_EQ(p.calls(), 1);
  const json header = tool_delta_json([] {
    ToolDelta d;
    d.kind = ToolDelta::kCallStart;
    d.index = 0;
    d.id = "call_x";
    d.name = "f";
    return d;
  }());
  EXPECT_EQ(header.dump(), R"({"function":{"arguments":"","name":"f"},"id":"call_x","index":0,"type":"function"})");
}

TEST(ToolCallDetect, FromTheTemplateAndTheVocabulary) {
  const auto ids = [](std::string_view t) -> int32_t {
    if (t == "<|python_tag|>") return 10;
    if (t == "[TOOL_CALLS]") return 11;
    if (t == "[ARGS]") return 12;
    if (t == "<tool_call>") return 13;
    return -1;
  };
  const auto special = [](int32_t id) { return id != 13; };
  const ToolSyntax llama = detect_tool_syntax(
      "<|start_header_id|>system<|end_header_id|>{{ 'Respond in the format {\"name\": function name, "
      "\"parameters\": dictionary}' }}",
      ids, special);
  EXPECT_EQ(llama.format, ToolFormat::kLlama3Json);
  EXPECT_EQ(llama.python_tag.token, 10);
  EXPECT_TRUE(llama.needs_special_text());
  EXPECT_EQ(detect_tool_syntax("{{ '<|python_tag|>' + call }}", ids, special).format, ToolFormat::kLlama3Json);
  // Llama 3's first template teaches no tools.
  EXPECT_EQ(detect_tool_syntax("{{ '<|start_header_id|>' + message['role'] }}", ids, special).format, ToolFormat::kNone);
  const ToolSyntax qwen = detect_tool_syntax("{{- '<tool_call>\\n{\"name\": \"' }}", ids, special);
  EXPECT_EQ(qwen.format, ToolFormat::kHermes);
  EXPECT_EQ(qwen.open.token, 13);
  EXPECT_FALSE(qwen.needs_special_text());  // Qwen's <tool_call> is not a special token
  const ToolSyntax mistral = detect_tool_syntax("{{ '[TOOL_CALLS] [' }}", ids, special);
  EXPECT_EQ(mistral.format, ToolFormat::kMistral);
  EXPECT_TRUE(mistral.mistral_args);  // the vocabulary has [ARGS]
  EXPECT_FALSE(detect_tool_syntax("{{ '[TOOL_CALLS] [' }}", [](std::string_view) { return -1; }).mistral_args);
  EXPECT_EQ(detect_tool_syntax("{% if tools %}{{ '<start_of_turn>user' }}{% endif %}", ids, special).format,
            ToolFormat::kGemma);
  EXPECT_EQ(detect_tool_syntax("{{ '<start_of_turn>' + role }}", ids, special).format, ToolFormat::kNone);
  EXPECT_EQ(detect_tool_syntax("{{ messages }}", ids, special).format, ToolFormat::kNone);
}

// ---- The forcing grammar ----

std::string gbnf_for(const ToolSyntax& s, ToolChoice::Mode mode, const std::string& name, bool parallel) {
  ToolChoice c;
  c.mode = mode;
  c.name = name;
  return tool_call_gbnf(s, ojson::parse(kTools), c, parallel);
}

TEST(ToolCallGrammar, TextMarkersAcceptTheCanonicalCallsAndNothingElse) {
  struct G {
    ToolSyntax syntax;
    std::string one, two;  // a call; two calls
    std::vector<std::string> wrong;
  };
  const std::vector<G> grammars = {
      {syntax_of(ToolFormat::kLlama3Json), R"({"name": "get_weather", "parameters": {"city": "Paris", "days": 3}})",
       R"({"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "ping", "parameters": {}})",
       {R"({"name": "get_wether", "parameters": {"city": "Paris"}})",
        R"({"name": "get_weather", "parameters": {"city": "Rome"}})",
        R"({"name": "get_weather", "parameters": {"city": "Paris", "days": 9}})",
        R"({"name": "get_weather", "parameters": {"days": 3}})",
        R"({"name": "get_weather", "arguments": {"city": "Paris"}})",
        R"({"name": "ping", "parameters": {"x": 1}})", "Sure"}},
      {syntax_of(ToolFormat::kHermes),
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
       "\"ping\", \"arguments\": {}}\n</tool_call>",
       {"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"much too long\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        "{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}"}},
      {syntax_of(ToolFormat::kMistral), "[TOOL_CALLS] [{\"name\": \"ping\", \"arguments\": {}}]",
       "[TOOL_CALLS][{\"name\": \"ping\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\"}}]",
       {"[TOOL_CALLS] [{\"name\": \"pong\", \"arguments\": {}}]", "[{\"name\": \"ping\", \"arguments\": {}}]"}},
      {syntax_of(ToolFormat::kMistral, true), "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}",
       "[TOOL_CALLS]ping[ARGS]{}[TOOL_CALLS]get_time[ARGS]{\"zone\": \"CET\"}",
       {"[TOOL_CALLS]get_weather[ARGS]{}", "[TOOL_CALLS]get_weather{\"city\": \"Oslo\"}"}},
      {syntax_of(ToolFormat::kGemma), R"({"name": "ping", "parameters": {}})",
       "{\"name\": \"ping\", \"parameters\": {}}\n{\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}",
       {R"({"name": "ping", "arguments": {}})", "```tool_code\n{\"name\": \"ping\", \"parameters\": {}}\n```"}},
  };
  for (const G& g : grammars) {
    const std::string what = tool_format_name(g.syntax.format);
    const text::Grammar many = text::parse_gbnf(gbnf_for(g.syntax, ToolChoice::kRequired, "", true));
    const text::Grammar one = text::parse_gbnf(gbnf_for(g.syntax, ToolChoice::kRequired, "", false));
    EXPECT_TRUE(text::grammar_accepts(many, g.one)) << what << ": " << g.one;
    EXPECT_TRUE(text::grammar_accepts(many, g.two)) << what << ": " << g.two;
    EXPECT_TRUE(text::grammar_accepts(one, g.one)) << what;
    EXPECT_FALSE(text::grammar_accepts(one, g.two)) << what << ": parallel_tool_calls false allows one call";
    for (const std::string& w : g.wrong) EXPECT_FALSE(text::grammar_accepts(many, w)) << what << ": " << w;
    // What the grammar forces, the parser reads as calls.
    for (const std::string& t : {g.one, g.two}) {
      const ParsedReply r = parse_tool_calls(g.syntax, kNames, t);
      EXPECT_EQ(r.calls.size(), t == g.one ? 1u : 2u) << what << ": " << t;
      EXPECT_EQ(r.content, "") << what << ": " << t;
    }
  }
  // A named function: that one only.
  const text::Grammar named =
      text::parse_gbnf(gbnf_for(syntax_of(ToolFormat::kLlama3Json), ToolChoice::kNamed, "ping", true));
  EXPECT_TRUE(text::grammar_accepts(named, R"({"name": "ping", "parameters": {}})"));
  EXPECT_FALSE(text::grammar_accepts(named, R"({"name": "get_time", "parameters": {"zone": "UTC"}})"));
  EXPECT_FALSE(text::grammar_accepts(named, R"({"name": "ping", "parameters": {}}; {"name": "ping", "parameters": {}})"));
}

// Special-token markers are token elements: a matcher over a small vocabulary (every byte,
// the marker tokens, an end token) takes the marker only as its token.
TEST(ToolCallGrammar, SpecialTokenMarkersAreTokens) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  bytes.push_back("");  // 256: [TOOL_CALLS]
  bytes.push_back("");  // 257: [ARGS]
  bytes.push_back("");  // 258: end
  bytes.push_back("<tool_call>");  // 259: Qwen's, a text token
  bytes.push_back("</tool_call>");  // 260
  auto vocab = std::make_shared<text::TokenVocabulary>(bytes, 261, std::vector<int32_t>{258});
  ToolSyntax mistral = syntax_of(ToolFormat::kMistral, true);
  mistral.tool_calls.token = 256;
  mistral.tool_calls.special = true;
  mistral.args.token = 257;
  mistral.args.special = true;
  const auto g = text::CompiledGrammar::compile(
      text::parse_gbnf(gbnf_for(mistral, ToolChoice::kNamed, "get_time", false)), vocab);
  const auto run = [&](const std::vector<int32_t>& prefix, const std::string& text) {
    text::GrammarMatcher m(g);
    for (int32_t t : prefix)
      if (!m.accept(t)) return false;
    for (unsigned char ch : text)
      if (!m.accept(ch)) return false;
    return m.can_end() && m.accept(258);
  };
  EXPECT_TRUE(run({256}, "get_time") == false);  // [ARGS] must follow the name
  {
    text::GrammarMatcher m(g);
    EXPECT_FALSE(m.accept('['));  // "[TOOL_CALLS]" spelled in text is not the token
    EXPECT_TRUE(m.accept(256));
    for (unsigned char ch : std::string("get_time")) ASSERT_TRUE(m.accept(ch));
    EXPECT_FALSE(m.accept('['));
    EXPECT_TRUE(m.accept(257));
    for (unsigned char ch : std::string("{\"zone\": \"UTC\"}")) ASSERT_TRUE(m.accept(ch));
    EXPECT_TRUE(m.can_end());
  }
  EXPECT_FALSE(run({256}, "get_weather"));
  // Qwen's <tool_call>, a text token of its vocabulary: a literal, which that token matches.
  ToolSyntax hermes = syntax_of(ToolFormat::kHermes);
  hermes.open.token = 259;
  hermes.close.token = 260;
  const std::string src = gbnf_for(hermes, ToolChoice::kRequired, "", true);
  EXPECT_EQ(src.find("<[259]>"), std::string::npos) << src;
  const auto hg = text::CompiledGrammar::compile(text::parse_gbnf(src), vocab);
  text::GrammarMatcher m(hg);
  EXPECT_TRUE(m.accept(259));
  for (unsigned char ch : std::string("\n{\"name\": \"ping\", \"arguments\": {}}\n")) ASSERT_TRUE(m.accept(ch));
  EXPECT_TRUE(m.accept(260));
  EXPECT_TRUE(m.can_end());
}

// ---- 400s ----

template <class F>
std::pair<std::string, std::string> refusal(F&& f) {
  try {
    f();
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error.status, 400);
    return {e.error.param, e.error.message};
  }
  return {"<accepted>", ""};
}

TEST(ToolCallRequest, BadToolsAndToolChoiceNameTheField) {
  const auto tools = [](const char* j) { return refusal([&] { read_tools(ojson::parse(j)); }).first; };
  EXPECT_EQ(tools(R"({"type": "function"})"), "tools");
  EXPECT_EQ(tools(R"([3])"), "tools[0]");
  EXPECT_EQ(tools(R"([{"function": {"name": "f"}}])"), "tools[0].type");
  EXPECT_EQ(tools(R"([{"type": "retrieval", "function": {"name": "f"}}])"), "tools[0].type");
  EXPECT_EQ(tools(R"([{"type": "function"}])"), "tools[0].function");
  EXPECT_EQ(tools(R"([{"type": "function", "function": {"name": "get weather"}}])"), "tools[0].function.name");
  EXPECT_EQ(tools(R"([{"type": "function", "function": {"description": "x"}}])"), "tools[0].function.name");
  EXPECT_EQ(tools(R"([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g", "parameters": []}}])"),
            "tools[1].function.parameters");
  EXPECT_EQ(tools(R"([{"type": "function", "function": {"name": "f", "color": 1}}])"), "tools[0].function.color");
  EXPECT_EQ(tools(R"([{"type": "function", "function": {"name": "f"}, "extra": 1}])"), "tools[0].extra");
  EXPECT_EQ(tools(R"([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}])"),
            "tools[1].function.name");
  EXPECT_EQ(tools(kTools), "<accepted>");

  const auto choice = [](const char* j) {
    return refusal([&] { read_tool_choice(ojson::parse(j), kNames); }).first;
  };
  EXPECT_EQ(choice(R"("sometimes")"), "tool_choice");
  EXPECT_EQ(choice(R"(3)"), "tool_choice");
  EXPECT_EQ(choice(R"({"type": "function", "function": {"name": "nope"}})"), "tool_choice.function.name");
  EXPECT_EQ(choice(R"({"type": "tool", "function": {"name": "ping"}})"), "tool_choice.type");
  EXPECT_EQ(choice(R"({"type": "function"})"), "tool_choice.function");
  EXPECT_EQ(choice(R"({"type": "function", "function": {"name": "ping"}})"), "<accepted>");
  EXPECT_EQ(refusal([] { read_tool_choice(ojson("required"), {}); }).first, "tool_choice");

  // Parameters the grammar cannot force: named down to the keyword.
  const auto grammar = [](const char* params) {
    const ojson t = ojson::array({{{"type", "function"},
                                   {"function", {{"name", "f"}, {"parameters", ojson::parse(params)}}}}});
    ToolChoice c;
    c.mode = ToolChoice::kRequired;
    return refusal([&] { tool_call_gbnf(syntax_of(ToolFormat::kHermes), t, c, true); });
  };
  const auto [param, message] = grammar(R"({"type": "object", "properties": {"a": {"not": {"type": "string"}}}})");
  EXPECT_EQ(param, "tools[0].function.parameters");
  EXPECT_NE(message.find("properties.a.not"), std::string::npos) << message;
  EXPECT_EQ(grammar(R"({"type": "string"})").first, "tools[0].function.parameters.type");
  EXPECT_EQ(grammar(R"({"properties": {"a": {"type": "integer"}}})").first, "<accepted>");
}

// ---- The chat API ----

// A byte-level BPE tokenizer with Mistral's markers as special tokens, and a template of each
// family.
struct ChatFixture {
  explicit ChatFixture(const std::string& tpl, bool mistral_tokens = false) {
    nlohmann::json tj = testing_util::bpe_tokenizer(testing_util::kQwen2Split, false, false);
    if (mistral_tokens) {
      tj["added_tokens"].push_back({{"id", 303}, {"content", "[TOOL_CALLS]"}, {"special", true}});
      tj["model"]["vocab"]["[TOOL_CALLS]"] = 303;
    }
    nlohmann::json cfg = {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}, {"chat_template", tpl}};
    tok = std::make_unique<text::Tokenizer>(text::Tokenizer::from_hf_json(tj.dump(), cfg.dump(), "", "test"));
    jinja = std::make_unique<text::ChatTemplate>(tpl, "test.jinja", *tok);
    ctx.tokenizer = tok.get();
    ctx.model_name = "m";
    ctx.chat_template = "jinja";
    ctx.jinja = jinja.get();
    ctx.tools = detect_tool_syntax(tpl, *tok);
    ctx.grammars = std::make_shared<text::GrammarCache>(text::TokenVocabulary::from_tokenizer(*tok, 320));
  }
  std::string body(const std::string& extra) const {
    return R"({"messages": [{"role": "user", "content": "Weather?"}], "tools": )" + std::string(kTools) + extra + "}";
  }
  std::unique_ptr<text::Tokenizer> tok;
  std::unique_ptr<text::ChatTemplate> jinja;
  ApiContext ctx;
};

const char* const kHermesTemplate =
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if tools %}Call with "
    "<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>{% for t in tools %} {{ t.function.name }}{% endfor "
    "%}{% endif %}";
const char* const kMistralTemplate =
    "{% for m in messages %}{{ m.role }}: {{ m.content }}{% if m.tool_calls %}[TOOL_CALLS] {{ m.tool_calls | tojson "
    "}}{% endif %}\n{% endfor %}";

TEST(ToolCallRequest, ChatRequestsForceParseAndRefuse) {
  ChatFixture hermes(kHermesTemplate);
  EXPECT_EQ(hermes.ctx.tools.format, ToolFormat::kHermes);
  ApiRequest r = parse_chat_request(hermes.body(R"(, "tool_choice": "required")"), hermes.ctx);
  EXPECT_TRUE(r.tools.parse);
  EXPECT_NE(r.gen.grammar, nullptr);
  EXPECT_FALSE(r.gen.keep_special_text);  // <tool_call> is text in this vocabulary
  EXPECT_EQ(r.tools.names, kNames);
  r = parse_chat_request(hermes.body(""), hermes.ctx);  // auto: parsed, not forced
  EXPECT_TRUE(r.tools.parse);
  EXPECT_EQ(r.gen.grammar, nullptr);
  r = parse_chat_request(hermes.body(R"(, "tool_choice": "none")"), hermes.ctx);
  EXPECT_FALSE(r.tools.parse);
  r = parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "tools": [], "tool_choice": "auto"})",
                         hermes.ctx);
  EXPECT_FALSE(r.tools.parse);  // no functions: nothing to call
  r = parse_chat_request(hermes.body(R"(, "tool_choice": {"type": "function", "function": {"name": "ping"}}, "parallel_tool_calls": false)"),
                         hermes.ctx);
  EXPECT_NE(r.gen.grammar, nullptr);
  EXPECT_FALSE(r.tools.parallel);

  const auto param = [&](const ChatFixture& f, const std::string& extra) {
    return refusal([&] { parse_chat_request(f.body(extra), f.ctx); }).first;
  };
  EXPECT_EQ(param(hermes, R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})"),
            "tool_choice.function.name");
  EXPECT_EQ(param(hermes, R"(, "tool_choice": "required", "response_format": {"type": "json_object"})"), "tool_choice");
  EXPECT_EQ(param(hermes, R"(, "tool_choice": "required", "guided_regex": "a+")"), "tool_choice");
  EXPECT_EQ(param(hermes, R"(, "parallel_tool_calls": "yes")"), "parallel_tool_calls");
  EXPECT_EQ(refusal([&] {
              parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})",
                                 hermes.ctx);
            }).first,
            "tool_choice");
  // A template that teaches no format: auto is text, forcing is refused by name.
  ChatFixture plain("{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_EQ(plain.ctx.tools.format, ToolFormat::kNone);
  EXPECT_FALSE(parse_chat_request(plain.body(""), plain.ctx).tools.parse);
  const auto [p, message] = refusal([&] { parse_chat_request(plain.body(R"(, "tool_choice": "required")"), plain.ctx); });
  EXPECT_EQ(p, "tool_choice");
  EXPECT_NE(message.find("teaches no tool-call format"), std::string::npos) << message;

  // Mistral's [TOOL_CALLS] is a special token: its text is kept for the parser, and the
  // grammar asks for the token.
  ChatFixture mistral(kMistralTemplate, true);
  EXPECT_EQ(mistral.ctx.tools.format, ToolFormat::kMistral);
  EXPECT_EQ(mistral.ctx.tools.tool_calls.token, 303);
  r = parse_chat_request(mistral.body(R"(, "tool_choice": "required")"), mistral.ctx);
  EXPECT_TRUE(r.gen.keep_special_text);
  ASSERT_NE(r.gen.grammar, nullptr);
  text::GrammarMatcher m(r.gen.grammar);
  EXPECT_FALSE(m.accept('['));
  EXPECT_TRUE(m.accept(303));
}

TEST(ToolCallRequest, ResponsesCarryToolCalls) {
  ChatFixture hermes(kHermesTemplate);
  const ApiRequest r = parse_chat_request(hermes.body(""), hermes.ctx);
  Completion c;
  c.id = "chatcmpl-1";
  c.text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  c.finish = FinishReason::kStop;
  json j = json::parse(completion_response(r, c, hermes.ctx));
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Oslo"})");
  // Plain text stays as it was.
  c.text = "It is sunny.";
  j = json::parse(completion_response(r, c, hermes.ctx));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "It is sunny.");
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));

  // Streamed token by token: content, then a header and argument pieces, then a chunk with
  // finish_reason "tool_calls".
  const std::vector<std::string> tokens = {"Sure", ".\n<tool", "_call>\n{\"name\": \"get_weather\"",
                                           ", \"arguments\": {\"ci", "ty\": \"Oslo\"}}\n</tool_call>", ""};
  ToolCallStream parser(r.tools.syntax, r.tools.names);
  Completion sc;
  std::vector<json> chunks;
  for (size_t i = 0; i < tokens.size(); ++i) {
    TokenEvent ev;
    ev.token = static_cast<int32_t>(i);
    ev.text = tokens[i];
    if (i + 1 == tokens.size()) ev.finish = FinishReason::kStop;
    sc.text += ev.text;
    const std::string sse = stream_tool_event(r, sc, ev, i == 0, parser, hermes.ctx);
    for (size_t at = sse.find("data: "); at != std::string::npos; at = sse.find("data: ", at + 1))
      chunks.push_back(json::parse(sse.substr(at + 6, sse.find("\n\n", at) - at - 6)));
  }
  std::string content, args, name;
  std::vector<std::string> finishes;
  for (const json& ch : chunks) {
    const json& d = ch["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      const json& tc = d["tool_calls"][0];
      EXPECT_EQ(tc["index"], 0);
      if (tc.contains("id")) {
        EXPECT_TRUE(name.empty());
        name = tc["function"]["name"];
        EXPECT_EQ(tc["function"]["arguments"], "");
      }
      args += tc["function"]["arguments"].get<std::string>();
    }
    if (!ch["choices"][0]["finish_reason"].is_null()) finishes.push_back(ch["choices"][0]["finish_reason"]);
  }
  EXPECT_EQ(chunks.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(content, "Sure.\n");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(args, R"({"city":"Oslo"})");
  EXPECT_EQ(finishes, std::vector<std::string>{"tool_calls"});
  EXPECT_TRUE(chunks.back()["choices"][0]["delta"].empty());
}

}  // namespace
}  // namespace hyperion::serve
