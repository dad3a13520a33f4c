// Streaming detokenisation and stop strings, on a tokenizer trained on the bundled corpus.
#include <gtest/gtest.h>

#include <fstream>

#include "../test_files.h"
#include "serve/openai_api.h"
#include "serve/text_stream.h"

namespace hyperion::serve {
namespace {

using testing_util::TempDir;

const text::Tokenizer& tokenizer() {
  static TempDir dir;  // removed at exit; the tokenizer below is never destroyed
  static text::Tokenizer* tok = [] {
    std::ifstream in(std::string(HYPERION_SOURCE_DIR) + "/data/corpus/fortunes.txt");
    std::vector<std::string> lines;
    std::string line;
    while (lines.size() < 2000 && std::getline(in, line)) lines.push_back(line);
    text::TokenizerTrainOptions o;
    o.vocab_size = 400;
    return new text::Tokenizer(text::Tokenizer::train(lines, dir.file("t.model"), o));
  }();
  return *tok;
}

// Streams `text`'s tokens after a context token; returns the pieces released.
std::vector<std::string> stream(const std::string& text, std::vector<std::string> stop,
                                bool* stopped_at_end, std::string* all) {
  const text::Tokenizer& tok = tokenizer();
  const std::vector<int32_t> ids = tok.encode(text);
  TextStream ts(&tok, {tok.bos_id()}, std::move(stop));
  std::vector<std::string> pieces;
  *stopped_at_end = false;
  for (int32_t id : ids) {
    bool stopped = false;
    pieces.push_back(ts.push(id, &stopped));
    if (stopped) {
      *stopped_at_end = true;
      break;
    }
  }
  if (!*stopped_at_end) pieces.push_back(ts.flush());
  *all = ts.text();
  return pieces;
}

TEST(TextStream, ReassemblesTheDecodedText) {
  for (const std::string text : {"Hello there, friend.", "x", "caf\xC3\xA9 \xE2\x82\xAC 100",
                                 "emoji \xF0\x9F\x98\x80 end", "  two  spaces"}) {
    bool stopped = false;
    std::string all;
    const auto pieces = stream(text, {}, &stopped, &all);
    std::string joined;
    for (const auto& p : pieces) {
      joined += p;
      // Never a split character: no replacement char is ever released.
      EXPECT_EQ(p.find("\xEF\xBF\xBD"), std::string::npos) << text;
    }
    EXPECT_EQ(joined, all);
    EXPECT_EQ(all, tokenizer().decode(tokenizer().encode(text))) << text;
    EXPECT_FALSE(stopped);
  }
}

// Random token sequences, rich in byte-fallback tokens (split and invalid UTF-8): the
// streamed text, which decodes a short window per token, equals decoding all the
// generated tokens at once after the context token.
TEST(TextStream, WindowedDecodingEqualsDecodingEverything) {
  const text::Tokenizer& tok = tokenizer();
  std::vector<int32_t> byte_ids, other_ids;
  for (int32_t id = 3; id < tok.vocab_size(); ++id)
    (tok.id_to_piece(id).rfind("<0x", 0) == 0 ? byte_ids : other_ids).push_back(id);
  ASSERT_EQ(byte_ids.size(), 256u);
  const std::vector<int32_t> utf8 = tok.encode("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  uint64_t state = 12345;
  auto next = [&](uint64_t n) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state >> 33) % n;
  };
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 40; ++i) {
      const uint64_t kind = next(4);
      if (kind == 0)
        ids.push_back(byte_ids[next(byte_ids.size())]);
      else if (kind == 1)
        ids.push_back(utf8[next(utf8.size())]);
      else
        ids.push_back(other_ids[next(other_ids.size())]);
    }
    const int32_t context = trial % 2 == 0 ? tok.bos_id() : other_ids[next(other_ids.size())];
    TextStream ts(&tok, {context}, {});
    std::string joined;
    for (int32_t id : ids) {
      bool stopped = false;
      joined += ts.push(id, &stopped);
      ASSERT_FALSE(stopped);
    }
    joined += ts.flush();
    std::vector<int32_t> all{context};
    all.insert(all.end(), ids.begin(), ids.end());
    const std::string full = tok.decode(all);
    const std::string context_text = tok.decode({context});
    ASSERT_EQ(full.compare(0, context_text.size(), context_text), 0);
    EXPECT_EQ(joined, full.substr(context_text.size())) << "trial " << trial;
    EXPECT_EQ(ts.text(), joined);
  }
}

// Special tokens (which decode to nothing) at the end of the prompt or among the
// generated tokens are never the anchor: the streamed text still equals decoding the
// whole sequence, prompt included, after the prompt's text (a word after a special token
// keeps its leading space, as it has in the whole text).
TEST(TextStream, SpecialTokensNeverAnchorTheText) {
  const text::Tokenizer& tok = tokenizer();
  const std::vector<int32_t> words = tok.encode("Hello there, world of wonders");
  const int32_t bos = tok.bos_id(), eos = tok.eos_id();
  ASSERT_TRUE(tok.decode({bos}).empty());
  ASSERT_TRUE(tok.is_special(bos) && tok.is_special(eos) && !tok.is_special(words[0]));
  const std::vector<std::vector<int32_t>> contexts = {
      {bos}, {bos, words[0]}, {bos, words[0], bos}, {words[0], eos, bos}};
  const std::vector<std::vector<int32_t>> outputs = {
      words, {bos, words[1], words[2]}, {words[1], bos, eos, words[2], bos, words[3]}};
  for (const auto& context : contexts)
    for (const auto& out : outputs) {
      TextStream ts(&tok, context, {});
      std::string joined;
      for (int32_t id : out) {
        bool stopped = false;
        joined += ts.push(id, &stopped);
      }
      joined += ts.flush();
      std::vector<int32_t> all = context;
      all.insert(all.end(), out.begin(), out.end());
      const std::string full = tok.decode(all), head = tok.decode(context);
      ASSERT_EQ(full.compare(0, head.size(), head), 0) << full;
      EXPECT_EQ(joined, full.substr(head.size()))
          << "context " << ::testing::PrintToString(context) << " output "
          << ::testing::PrintToString(out);
    }
}

TEST(TextStream, StopsBeforeTheStopStringAndNeverSendsIt) {
  bool stopped = false;
  std::string all;
  stream("The cat sat on the mat. The end.", {"mat", "zebra"}, &stopped, &all);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(all, "The cat sat on the ");
  // A stop string split over many tokens, and one that never completes.
  stream("alpha beta gamma delta", {"a gam"}, &stopped, &all);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(all, "alpha bet");
  stream("alpha beta gamma", {"gamma ray"}, &stopped, &all);
  EXPECT_FALSE(stopped);
  EXPECT_EQ(all, "alpha beta gamma");  // held back as a possible prefix, flushed at the end
}

TEST(TextStream, WithoutTokenizerReleasesNothing) {
  TextStream ts(nullptr, {1}, {"x"});
  bool stopped = true;
  EXPECT_EQ(ts.push(5, &stopped), "");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(ts.flush(), "");
}

TEST(OpenAiApi, ChatTemplates) {
  ApiContext ctx;
  ctx.tokenizer = &tokenizer();
  ctx.model_name = "m";
  const nlohmann::json messages = {{{"role", "system"}, {"content", "Be kind."}},
                                   {{"role", "user"}, {"content", "Hi"}},
                                   {{"role", "assistant"}, {"content", "Hello"}},
                                   {{"role", "user"}, {"content", "Bye"}}};
  std::vector<int32_t> ids = apply_chat_template(messages, ctx);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(tokenizer().decode(ids),
            "System: Be kind.\nUser: Hi\nAssistant: Hello\nUser: Bye\nAssistant:");
  ctx.chat_template = "llama2";
  ids = apply_chat_template(messages, ctx);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);  // EOS after the assistant turn
  const std::string text = tokenizer().decode(ids);
  EXPECT_NE(text.find("[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi [/INST]"), std::string::npos)
      << text;
  EXPECT_NE(text.find("Bye [/INST]"), std::string::npos) << text;
}

TEST(OpenAiApi, ParsesEveryFieldAndNamesBadOnes) {
  ApiContext ctx;
  ctx.tokenizer = &tokenizer();
  ctx.model_name = "m";
  ApiRequest r = parse_completion_request(
      R"({"model": "m", "prompt": [1, 5, 6], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
          "top_k": 40, "seed": 3, "stop": ["a", "b"], "stream": true,
          "stream_options": {"include_usage": true}, "n": 1, "logprobs": 0, "echo": false,
          "ignore_eos": true, "user": "u", "presence_penalty": 0})",
      ctx);
  EXPECT_EQ(r.gen.prompt, (std::vector<int32_t>{1, 5, 6}));
  EXPECT_EQ(r.gen.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.gen.sampling.top_p, 0.9f);
  EXPECT_EQ(r.gen.sampling.top_k, 40);
  EXPECT_EQ(r.gen.sampling.seed, 3u);
  EXPECT_EQ(r.gen.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream && r.include_usage && r.gen.ignore_eos && r.gen.logprobs);
  auto param = [&](const std::string& body) {
    try {
      parse_completion_request(body, ctx);
    } catch (const ApiException& e) {
      return e.error.param;
    }
    return std::string("<accepted>");
  };
  EXPECT_EQ(param(R"({"prompt": "x", "n": 2})"), "n");
  EXPECT_EQ(param(R"({"prompt": "x", "stop": [1]})"), "stop");
  EXPECT_EQ(param(R"({"prompt": "x", "stop": ["a","b","c","d","e"]})"), "stop");
  EXPECT_EQ(param(R"({"prompt": "x", "top_p": 0})"), "top_p");
  EXPECT_EQ(param(R"({"prompt": "x", "seed": 1.5})"), "seed");
  EXPECT_EQ(param(R"({"prompt": "x", "logprobs": 9})"), "logprobs");
  EXPECT_EQ(param(R"({"prompt": "x", "echo": true})"), "echo");
  EXPECT_EQ(param(R"({"prompt": "x", "frequency_penalty": 1})"), "frequency_penalty");
  EXPECT_EQ(param(R"({"prompt": "x", "stream": true, "stream_options": {"x": 1}})"),
            "stream_options.x");
  EXPECT_EQ(param(R"({"prompt": [1, -4]})"), "prompt");
  EXPECT_EQ(param(R"({"prompt": "x", "max_tokens": 0})"), "max_tokens");
  EXPECT_EQ(param(R"({"prompt": "x", "max_tokens": 0, "max_completion_tokens": 5})"),
            "max_tokens");
  EXPECT_EQ(param(R"({"prompt": "x", "max_tokens": 5, "max_completion_tokens": 0})"),
            "max_completion_tokens");
}

// Given both, the newer max_completion_tokens wins, in either order (as vLLM and OpenAI).
TEST(OpenAiApi, MaxCompletionTokensWinsOverMaxTokens) {
  ApiContext ctx;
  ctx.tokenizer = &tokenizer();
  ctx.model_name = "m";
  for (const char* body :
       {R"({"prompt": "x", "max_tokens": 50, "max_completion_tokens": 3})",
        R"({"max_completion_tokens": 3, "prompt": "x", "max_tokens": 50})"})
    EXPECT_EQ(parse_completion_request(body, ctx).gen.max_tokens, 3) << body;
  EXPECT_EQ(parse_completion_request(R"({"prompt": "x", "max_tokens": 50,
                                         "max_completion_tokens": null})",
                                     ctx)
                .gen.max_tokens,
            50);
  EXPECT_EQ(parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 50, "max_completion_tokens": 4})",
                               ctx)
                .gen.max_tokens,
            4);
}

}  // namespace
}  // namespace hyperion::serve
