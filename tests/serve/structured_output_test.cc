// Structured output through `hyperion serve`'s HTTP API: a corpus of JSON schemas
// (tests/serve/data/structured_schemas.json) sampled at temperature 1 on a tiny model,
// every output validated by an independent JSON Schema validator (Debian's
// python3-jsonschema); guided_choice, guided_regex and GBNF grammars; bad schemas,
// grammars and regexes refused with 400 naming the field and the place, the server
// unharmed; and the engine ending a request whose grammar allows no token.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdio>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../test_files.h"
#include "http_test_util.h"
#include "serve/engine.h"
#include "serve_test_util.h"
#include "text/grammar/gbnf.h"
#include "text/grammar/matcher.h"

namespace hyperion::serve {
namespace {

using nlohmann::json;
using testing_util::corpus_lines;
using testing_util::sse_events;
using testing_util::TempDir;

class StructuredOutputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    text::TokenizerTrainOptions o;
    o.vocab_size = 400;
    tok_ = new text::Tokenizer(text::Tokenizer::train(corpus_lines(2000), dir_->file("t.model"), o));
    DecoderConfig c = testing_util::small_serving_config(400);
    c.max_seq_len = 768;  // room for JSON spelled in byte-fallback tokens
    params_ = testing_util::small_serving_params(c, false, 23).release();
    EngineConfig ec;
    ec.weights = WeightFormat::kF32;
    ec.kv_dtype = DType::kF32;
    ec.kv_page_tokens = 16;
    ec.prefill_chunk = 32;
    ec.max_concurrent_decodes = 4;
    stack_ = new testing_util::ServedStack(*tok_, *params_, ec);
  }
  static void TearDownTestSuite() {
    delete stack_;
    delete params_;
    delete tok_;
    delete dir_;
  }
  static httplib::Result post(const std::string& path, const json& body) {
    httplib::Client c("127.0.0.1", stack_->port);
    c.set_read_timeout(300, 0);
    return c.Post(path.c_str(), body.dump(), "application/json");
  }
  // The text and finish reason of a request, whole or streamed.
  static std::pair<std::string, std::string> run(const json& body) {
    const bool chat = body.contains("messages");
    auto r = post(chat ? "/v1/chat/completions" : "/v1/completions", body);
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    if (body.value("stream", false)) {
      bool done = false;
      std::string text, finish;
      for (const json& ev : sse_events(r->body, &done)) {
        if (!ev.contains("choices") || ev["choices"].empty()) continue;
        const json& ch = ev["choices"][0];
        if (chat && ch["delta"].contains("content") && ch["delta"]["content"].is_string())
          text += ch["delta"]["content"].get<std::string>();
        if (!chat) text += ch.value("text", "");
        if (ch.contains("finish_reason") && ch["finish_reason"].is_string()) finish = ch["finish_reason"];
      }
      EXPECT_TRUE(done);
      return {text, finish};
    }
    const json j = json::parse(r->body);
    const json& ch = j["choices"][0];
    return {chat ? ch["message"]["content"].get<std::string>() : ch["text"].get<std::string>(),
            ch["finish_reason"].get<std::string>()};
  }
  static std::string error_of(const std::string& path, const json& body, std::string* param = nullptr) {
    auto r = post(path, body);
    EXPECT_TRUE(r);
    if (!r) return "";
    EXPECT_EQ(r->status, 400) << body.dump().substr(0, 200) << " -> " << r->body.substr(0, 300);
    const json j = json::parse(r->body);
    if (param != nullptr) *param = j["error"]["param"].is_string() ? j["error"]["param"].get<std::string>() : "";
    return j["error"]["message"];
  }

  static TempDir* dir_;
  static text::Tokenizer* tok_;
  static ParamStore* params_;
  static testing_util::ServedStack* stack_;
};
TempDir* StructuredOutputTest::dir_ = nullptr;
text::Tokenizer* StructuredOutputTest::tok_ = nullptr;
ParamStore* StructuredOutputTest::params_ = nullptr;
testing_util::ServedStack* StructuredOutputTest::stack_ = nullptr;

TEST_F(StructuredOutputTest, EverySampledOutputValidatesAgainstItsSchema) {
  std::ifstream in(std::string(HYPERION_SOURCE_DIR) + "/tests/serve/data/structured_schemas.json");
  const json corpus = json::parse(in);
  ASSERT_GE(corpus.size(), 5U);
  // Four requests a schema, in flight together (each row its own matcher in the batch):
  // completions and chat, whole and streamed, at temperature 1.
  json results = json::array();
  int stopped = 0, total = 0;
  for (const json& c : corpus) {
    std::vector<std::future<std::pair<std::string, std::string>>> runs;
    for (int k = 0; k < 4; ++k) {
      json body = {{"max_tokens", 600}, {"temperature", 1.0}, {"seed", 100 + k}, {"stream", k % 2 == 1}};
      const json format = {{"type", "json_schema"},
                           {"json_schema", {{"name", c["name"]}, {"schema", c["schema"]}, {"strict", true}}}};
      body["response_format"] = format;
      if (k < 2)
        body["prompt"] = "Record:";
      else
        body["messages"] = json::array({{{"role", "user"}, {"content", "Give me a record."}}});
      runs.push_back(std::async(std::launch::async, [body] { return run(body); }));
    }
    json outputs = json::array();
    for (auto& f : runs) {
      const auto [text, finish] = f.get();
      ++total;
      EXPECT_EQ(finish, "stop") << c["name"] << ": " << text;
      if (finish == "stop") {
        ++stopped;
        outputs.push_back(text);
      }
    }
    results.push_back({{"name", c["name"]}, {"schema", c["schema"]}, {"outputs", outputs}});
  }
  EXPECT_EQ(stopped, total);
  const std::string file = dir_->file("outputs.json");
  std::ofstream(file) << results.dump();
  const std::string cmd = "/usr/bin/python3 " + std::string(HYPERION_SOURCE_DIR) +
                          "/tests/serve/validate_json_outputs.py " + file + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string report;
  char buf[512];
  while (fgets(buf, sizeof buf, p) != nullptr) report += buf;
  const int status = pclose(p);
  EXPECT_EQ(status, 0) << report;
  std::printf("%s", report.c_str());
  for (const json& r : results)
    if (!r["outputs"].empty()) std::printf("  %s: %s\n", r["name"].get<std::string>().c_str(), r["outputs"][0].get<std::string>().c_str());
  EXPECT_NE(report.find("0 failed"), std::string::npos) << report;
}

TEST_F(StructuredOutputTest, JsonObjectChoiceRegexAndGrammar) {
  int objects = 0;  // (a sample may run to max_tokens inside an unbounded value)
  for (int seed = 0; seed < 3; ++seed) {
    const auto [text, finish] = run({{"prompt", "Any:"}, {"max_tokens", 600}, {"temperature", 1.0}, {"seed", seed},
                                     {"response_format", {{"type", "json_object"}}}});
    if (finish != "stop") continue;
    ++objects;
    EXPECT_TRUE(json::parse(text).is_object()) << text;
  }
  EXPECT_GT(objects, 0);
  for (int seed = 0; seed < 4; ++seed) {
    const auto [text, finish] = run({{"prompt", "Pick:"}, {"max_tokens", 20}, {"temperature", 1.0}, {"seed", seed},
                                     {"guided_choice", {"red", "green", "blue wave"}}});
    EXPECT_TRUE(text == "red" || text == "green" || text == "blue wave") << text;
    EXPECT_EQ(finish, "stop");  // the grammar ended: no end token needed
  }
  // [a-c]{2,4}-[0-9]{3}(x|yz)?, checked by hand.
  auto matches = [](const std::string& t) {
    const size_t dash = t.find('-');
    if (dash < 2 || dash > 4 || dash == std::string::npos) return false;
    for (size_t i = 0; i < dash; ++i)
      if (t[i] < 'a' || t[i] > 'c') return false;
    if (t.size() < dash + 4) return false;
    for (size_t i = dash + 1; i < dash + 4; ++i)
      if (t[i] < '0' || t[i] > '9') return false;
    const std::string rest = t.substr(dash + 4);
    return rest.empty() || rest == "x" || rest == "yz";
  };
  for (int seed = 0; seed < 4; ++seed) {
    const auto [text, finish] = run({{"prompt", "Code:"}, {"max_tokens", 30}, {"temperature", 1.0}, {"seed", seed},
                                     {"guided_regex", "[a-c]{2,4}-[0-9]{3}(x|yz)?"}});
    EXPECT_TRUE(matches(text)) << text;
  }
  const std::string gbnf = "root ::= \"(\" item (\", \" item){0,2} \")\"\nitem ::= [0-9]+ | \"nil\"";
  const text::Grammar g = text::parse_gbnf(gbnf);
  int sentences = 0;
  for (int seed = 0; seed < 4; ++seed) {
    const auto [text, finish] =
        run({{"messages", json::array({{{"role", "user"}, {"content", "List"}}})}, {"max_tokens", 80},
             {"temperature", 1.0}, {"seed", seed}, {"grammar", gbnf}});
    if (finish != "stop") continue;  // ([0-9]+ may outrun max_tokens)
    ++sentences;
    EXPECT_TRUE(text::grammar_accepts(g, text)) << text;
  }
  EXPECT_GT(sentences, 0);
}

TEST_F(StructuredOutputTest, BadSchemasGrammarsAndRegexesAre400NamingWhere) {
  std::string param;
  auto schema_error = [&](const json& schema) {
    return error_of("/v1/completions",
                    {{"prompt", "x"},
                     {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}}}}}},
                    &param);
  };
  std::string m = schema_error({{"type", "object"}, {"properties", {{"a", {{"not", {{"type", "string"}}}}}}}});
  EXPECT_EQ(param, "response_format.json_schema.schema");
  EXPECT_NE(m.find("properties.a"), std::string::npos) << m;
  EXPECT_NE(m.find("not"), std::string::npos) << m;
  // Recursive without a way out.
  m = schema_error({{"$defs", {{"n", {{"type", "object"}, {"properties", {{"k", {{"$ref", "#/$defs/n"}}}}}, {"required", {"k"}}}}}},
                    {"$ref", "#/$defs/n"}});
  EXPECT_FALSE(m.empty());
  // 10^5 properties: refused, and quickly (bounded work; no timing asserted).
  json big = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 100000; ++i) big["properties"][fmt::format("p{}", i)] = {{"type", "integer"}};
  m = schema_error(big);
  EXPECT_EQ(param, "response_format");
  EXPECT_NE(m.find("over the limit"), std::string::npos) << m;
  // Not JSON, wrong types, unknown response_format types, two constraints at once.
  m = error_of("/v1/completions", {{"prompt", "x"}, {"guided_json", "{\"type\": "}}, &param);
  EXPECT_EQ(param, "guided_json");
  m = error_of("/v1/completions", {{"prompt", "x"}, {"response_format", {{"type", "xml"}}}}, &param);
  EXPECT_EQ(param, "response_format.type");
  m = error_of("/v1/completions", {{"prompt", "x"}, {"guided_regex", "a"}, {"guided_choice", {"b"}}}, &param);
  EXPECT_NE(m.find("send one"), std::string::npos) << m;
  // A grammar with a syntax error or left recursion, a regex that does not compile.
  m = error_of("/v1/chat/completions",
               {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}, {"grammar", "root ::= \"a\" (\"b\""}},
               &param);
  EXPECT_EQ(param, "grammar");
  EXPECT_NE(m.find("line 1, column"), std::string::npos) << m;
  m = error_of("/v1/completions", {{"prompt", "x"}, {"grammar", "root ::= root \"a\" | \"b\""}}, &param);
  EXPECT_NE(m.find("left recursion"), std::string::npos) << m;
  m = error_of("/v1/completions", {{"prompt", "x"}, {"guided_regex", "a(b"}}, &param);
  EXPECT_EQ(param, "guided_regex");
  EXPECT_NE(m.find("offset"), std::string::npos) << m;
  m = error_of("/v1/completions", {{"prompt", "x"}, {"guided_regex", "(a)\\1"}}, &param);
  EXPECT_EQ(param, "guided_regex");
  // The server is unharmed.
  const auto [text, finish] = run({{"prompt", "Pick:"}, {"max_tokens", 5}, {"guided_choice", {"ok"}}});
  EXPECT_EQ(text, "ok");
}

// A grammar no token of the vocabulary can follow ends the request ("stop") at once,
// rather than sampling from an all -inf row or hanging.
TEST(StructuredOutputEngine, AGrammarThatAllowsNoTokenEndsTheRequest) {
  const DecoderConfig c = testing_util::small_serving_config(97);
  auto params = testing_util::small_serving_params(c, false, 5);
  Engine engine(*params, nullptr, testing_util::f32_engine_config());
  // A vocabulary of the model's 97 ids that spell only "a" and "b".
  std::vector<std::string> bytes(97);
  bytes[10] = "a";
  bytes[11] = "b";
  auto vocab = std::make_shared<text::TokenVocabulary>(bytes, 97, std::vector<int32_t>{2});
  GenerationRequest r = testing_util::greedy_request(testing_util::random_prompt(5, 1), 8);
  r.grammar = text::CompiledGrammar::compile(text::parse_gbnf("root ::= \"a\" \"z\""), vocab);
  std::vector<TokenEvent> events;
  engine.add(r, [&](const TokenEvent& e) { events.push_back(e); });
  engine.run_until_idle();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().finish, FinishReason::kStop);
  EXPECT_EQ(events.back().completion_tokens, 1);  // "a", then nothing can follow
  EXPECT_EQ(events.front().token, 10);
}

}  // namespace
}  // namespace hyperion::serve
