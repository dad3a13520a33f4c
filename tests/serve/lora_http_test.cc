// LoRA adapters through the HTTP API (vLLM's routes and conventions): a request's `model`
// picks an adapter and gets its generator's tokens, the response names it; /v1/models
// lists adapters with their parent; POST /v1/load_lora_adapter and /v1/unload_lora_adapter
// load a PEFT directory and forget it, and refuse bad bodies, unknown names and paths with
// a 4xx naming the field, leaving the server serving; without allow_runtime_lora they are
// refused with 403.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "../test_files.h"
#include "convert/peft_adapter.h"
#include "kernels/fill.h"
#include "model/generator.h"
#include "model/lora.h"
#include "http_test_util.h"
#include "serve_test_util.h"

namespace hyperion::serve {
namespace {

using nlohmann::json;
using testing_util::corpus_lines;
using testing_util::small_serving_config;
using testing_util::small_serving_params;
using testing_util::TempDir;
using Stack = testing_util::ServedStack;

std::unique_ptr<LoraAdapter> make_adapter(const ParamStore& base, int64_t rank, uint64_t seed) {
  return testing_util::random_adapter(base, rank, "all-linear", seed);
}

class LoraHttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    text::TokenizerTrainOptions o;
    o.vocab_size = 400;
    tok_ = new text::Tokenizer(text::Tokenizer::train(corpus_lines(2000), dir_->file("t.model"), o));
    params_ = small_serving_params(small_serving_config(400), false, 11).release();
    for (int i = 0; i < 2; ++i) {
      adapters_[i] = make_adapter(*params_, 4 + 4 * i, 20 + i).release();
      convert::save_peft_adapter(dir_->file("adapter" + std::to_string(i)), *adapters_[i], "base");
    }
    EngineConfig ec;
    ec.weights = WeightFormat::kF32;
    ec.kv_dtype = DType::kF32;
    ec.kv_page_tokens = 8;
    ec.max_concurrent_decodes = 4;
    ec.max_loras = 2;
    ec.allow_runtime_lora = true;
    stack_ = new Stack(*tok_, *params_, ec, {}, "test-model", [](ApiContext& ctx, Engine& engine) {
      ctx.adapters = &engine.adapters();
      ctx.read_adapter = [](const std::string& dir) { return convert::load_peft_adapter(dir, *params_); };
    });
  }
  static void TearDownTestSuite() {
    delete stack_;
    for (auto*& a : adapters_) delete a;
    delete params_;
    delete tok_;
    delete dir_;
  }
  static httplib::Result post(const std::string& path, const json& body, int port = 0) {
    httplib::Client c("127.0.0.1", port ? port : stack_->port);
    c.set_read_timeout(60, 0);
    return c.Post(path.c_str(), body.dump(), "application/json");
  }
  static void expect_error(const httplib::Result& r, int status, const std::string& param, const std::string& says) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    const json e = json::parse(r->body)["error"];
    if (!param.empty()) {
      EXPECT_EQ(e["param"], param) << r->body;
    }
    EXPECT_NE(e["message"].get<std::string>().find(says), std::string::npos) << r->body;
  }
  // The text the generator gives for `prompt` (token ids) with adapter i (-1: none).
  static std::string reference(const std::vector<int32_t>& prompt, int adapter, int64_t n) {
    Generator gen(*params_, params_->config().max_seq_len);
    gen.set_lora(adapter < 0 ? nullptr : adapters_[adapter]);
    GenerateOptions o;
    o.sampling.temperature = 0.0f;
    o.max_tokens = n;
    o.stop_at_eos = false;
    // The continuation's text as the server streams it: the whole decoded less the prompt.
    std::vector<int32_t> all = prompt;
    const std::vector<int32_t> out = generate_tokens(gen, prompt, o);
    all.insert(all.end(), out.begin(), out.end());
    return tok_->decode(all).substr(tok_->decode(prompt).size());
  }
  static json completion(const std::string& model, const std::vector<int32_t>& prompt, int64_t n) {
    auto r = post("/v1/completions",
                  {{"model", model}, {"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}});
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body);
  }

  static TempDir* dir_;
  static text::Tokenizer* tok_;
  static ParamStore* params_;
  static LoraAdapter* adapters_[2];
  static Stack* stack_;
};
TempDir* LoraHttpTest::dir_ = nullptr;
text::Tokenizer* LoraHttpTest::tok_ = nullptr;
ParamStore* LoraHttpTest::params_ = nullptr;
LoraAdapter* LoraHttpTest::adapters_[2] = {nullptr, nullptr};
Stack* LoraHttpTest::stack_ = nullptr;

TEST_F(LoraHttpTest, LoadServeListAndUnload) {
  auto ok = post("/v1/load_lora_adapter", {{"lora_name", "sql"}, {"lora_path", dir_->file("adapter0")}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  ASSERT_EQ(post("/v1/load_lora_adapter", {{"lora_name", "chat"}, {"lora_path", dir_->file("adapter1")}})->status,
            200);

  httplib::Client c("127.0.0.1", stack_->port);
  const json models = json::parse(c.Get("/v1/models")->body);
  ASSERT_EQ(models["data"].size(), 3u);
  EXPECT_EQ(models["data"][0]["id"], "test-model");
  EXPECT_EQ(models["data"][1]["id"], "chat");
  EXPECT_EQ(models["data"][1]["parent"], "test-model");
  EXPECT_EQ(models["data"][2]["root"], dir_->file("adapter0"));

  const std::vector<int32_t> prompt = tok_->encode_with_special_tokens("The quick brown fox");
  const json base = completion("test-model", prompt, 10), sql = completion("sql", prompt, 10),
             chat = completion("chat", prompt, 10);
  EXPECT_EQ(sql["model"], "sql");
  EXPECT_EQ(base["choices"][0]["text"], reference(prompt, -1, 10));
  EXPECT_EQ(sql["choices"][0]["text"], reference(prompt, 0, 10));
  EXPECT_EQ(chat["choices"][0]["text"], reference(prompt, 1, 10));
  EXPECT_NE(sql["choices"][0]["text"], base["choices"][0]["text"]);

  // Streamed chat chunks name the adapter too.
  auto s = post("/v1/chat/completions", {{"model", "chat"},
                                         {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                         {"max_tokens", 3},
                                         {"stream", true}});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, 200);
  bool done = false;
  const auto events = testing_util::sse_events(s->body, &done);
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(done);
  EXPECT_EQ(events[0]["model"], "chat");

  // A third does not fit max_loras=2.
  expect_error(post("/v1/load_lora_adapter", {{"lora_name", "third"}, {"lora_path", dir_->file("adapter0")}}), 400,
               "lora_name", "max_loras=2");
  auto un = post("/v1/unload_lora_adapter", {{"lora_name", "sql"}});
  ASSERT_TRUE(un);
  EXPECT_EQ(un->status, 200) << un->body;
  expect_error(post("/v1/unload_lora_adapter", {{"lora_name", "sql"}}), 404, "lora_name", "not loaded");
  auto gone = post("/v1/completions", {{"model", "sql"}, {"prompt", "hi"}});
  expect_error(gone, 404, "model", "'chat'");  // the message lists what is served
  EXPECT_EQ(json::parse(c.Get("/v1/models")->body)["data"].size(), 2u);
  ASSERT_EQ(post("/v1/unload_lora_adapter", {{"lora_name", "chat"}})->status, 200);
}

TEST_F(LoraHttpTest, BadLoadsGet4xxNamingTheField) {
  expect_error(post("/v1/load_lora_adapter", {{"lora_name", "x"}}), 400, "lora_path", "required");
  expect_error(post("/v1/load_lora_adapter", {{"lora_path", dir_->file("adapter0")}}), 400, "lora_name", "required");
  expect_error(post("/v1/load_lora_adapter", {{"lora_name", 3}, {"lora_path", "p"}}), 400, "lora_name", "string");
  expect_error(post("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", "p"}, {"rank", 3}}), 400, "rank",
               "unknown field");
  expect_error(post("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", dir_->file("nothing")}}), 400,
               "lora_path", "nothing");
  // An adapter for another base (other shapes) names the tensor.
  DecoderConfig other_cfg = small_serving_config(400);
  other_cfg.ffn_dim = 48;
  ParamStore other(other_cfg, false, false);
  convert::save_peft_adapter(dir_->file("foreign"), *make_adapter(other, 2, 3), "other");
  expect_error(post("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", dir_->file("foreign")}}), 400,
               "lora_path", "gate_proj");
  expect_error(post("/v1/load_lora_adapter", {{"lora_name", "test-model"}, {"lora_path", dir_->file("adapter0")}}),
               400, "lora_name", "base model");
  expect_error(post("/v1/unload_lora_adapter", {{"lora_name", "never"}}), 404, "lora_name", "not loaded");
  expect_error(post("/v1/completions", {{"model", "never"}, {"prompt", "hi"}}), 404, "model", "does not exist");
  // Still serving.
  EXPECT_EQ(completion("test-model", tok_->encode_with_special_tokens("a"), 2)["choices"][0]["text"],
            reference(tok_->encode_with_special_tokens("a"), -1, 2));
}

TEST_F(LoraHttpTest, RuntimeUpdatesAreOffByDefault) {
  EngineConfig ec;
  ec.weights = WeightFormat::kF32;
  ec.max_concurrent_decodes = 1;
  Stack plain(*tok_, *params_, ec);
  expect_error(post("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", dir_->file("adapter0")}}, plain.port),
               403, "", "allow_runtime_lora=true");
  expect_error(post("/v1/unload_lora_adapter", {{"lora_name", "x"}}, plain.port), 403, "", "allow_runtime_lora");
}

}  // namespace
}  // namespace hyperion::serve
