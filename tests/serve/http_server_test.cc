// `hyperion serve`'s HTTP API over a real loopback socket: the OpenAI routes, streaming,
// every error status, queue-full, client disconnects, and the page accounting seen
// through /metrics after a saturating load.
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "../test_files.h"
#include "http_test_util.h"
#include "serve/http_server.h"
#include "serve/metrics.h"
#include "serve_test_util.h"

namespace hyperion::serve {
namespace {

using nlohmann::json;
using testing_util::small_serving_config;
using testing_util::small_serving_params;
using testing_util::TempDir;

using Stack = testing_util::ServedStack;
using testing_util::corpus_lines;
using testing_util::greedy_body;
using testing_util::sse_events;

class HttpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    text::TokenizerTrainOptions o;
    o.vocab_size = 400;
    tok_ =
        new text::Tokenizer(text::Tokenizer::train(corpus_lines(2000), dir_->file("t.model"), o));
    params_ = small_serving_params(small_serving_config(400), false, 11).release();
    stack_ = new Stack(*tok_, *params_, config());
  }
  static void TearDownTestSuite() {
    delete stack_;
    delete params_;
    delete tok_;
    delete dir_;
  }
  static EngineConfig config() {
    EngineConfig ec;
    ec.weights = WeightFormat::kF32;
    ec.kv_dtype = DType::kF32;
    ec.kv_page_tokens = 8;
    ec.prefill_chunk = 32;
    ec.max_concurrent_decodes = 4;
    return ec;
  }
  void TearDown() override {
    stack_->async.set_paused(false);
    stack_->async.set_step_delay(std::chrono::milliseconds(0));
  }

  static httplib::Client client(int port = 0) {
    httplib::Client c("127.0.0.1", port ? port : stack_->port);
    c.set_read_timeout(60, 0);
    return c;
  }
  static httplib::Result post(const std::string& path, const json& body, int port = 0) {
    return client(port).Post(path.c_str(), body.dump(), "application/json");
  }
  static double metric(const std::string& name, const Labels& labels = {}) {
    auto r = client().Get("/metrics");
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    const auto v = monitor::parse_prometheus_value(r->body, name, labels);
    EXPECT_TRUE(v.has_value()) << name;
    return v.value_or(-1);
  }
  // Polls /metrics (bounded: no timing assertion) until no request is running.
  static void wait_idle() {
    for (int i = 0; i < 400; ++i) {
      if (metric("hyperion_requests_running") == 0 && metric("hyperion_requests_waiting") == 0)
        return;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }

  static TempDir* dir_;
  static text::Tokenizer* tok_;
  static ParamStore* params_;
  static Stack* stack_;
};
TempDir* HttpServerTest::dir_ = nullptr;
text::Tokenizer* HttpServerTest::tok_ = nullptr;
ParamStore* HttpServerTest::params_ = nullptr;
Stack* HttpServerTest::stack_ = nullptr;

TEST_F(HttpServerTest, HealthModelsAndUnknownRoutes) {
  auto h = client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = client().Get("/v1/models");
  ASSERT_TRUE(m);
  const json j = json::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "test-model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 128);
  auto nf = client().Get("/v1/nothing");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_TRUE(json::parse(nf->body).contains("error"));
}

TEST_F(HttpServerTest, CompletionStreamsTheSameTextAsWhole) {
  json body = greedy_body("The quick brown fox", 12);
  body["logprobs"] = 1;
  auto whole = post("/v1/completions", body);
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json w = json::parse(whole->body);
  EXPECT_EQ(w["object"], "text_completion");
  EXPECT_EQ(w["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(w["usage"]["completion_tokens"], 12);
  EXPECT_EQ(w["choices"][0]["logprobs"]["token_logprobs"].size(), 12u);
  for (const json& lp : w["choices"][0]["logprobs"]["token_logprobs"])
    EXPECT_LE(lp.get<double>(), 0.0);
  const int prompt_tokens = w["usage"]["prompt_tokens"];
  EXPECT_EQ(prompt_tokens, static_cast<int>(tok_->encode("The quick brown fox").size()) + 1);

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto streamed = post("/v1/completions", body);
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200);
  EXPECT_NE(streamed->get_header_value("Content-Type").find("text/event-stream"),
            std::string::npos);
  bool done = false;
  const auto events = sse_events(streamed->body, &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(events.size(), 13u);  // one per token, then usage
  std::string text;
  for (size_t i = 0; i < 12; ++i) {
    text += events[i]["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(events[i]["choices"][0]["finish_reason"].is_null(), i < 11);
  }
  EXPECT_EQ(events[11]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events[12]["usage"]["completion_tokens"], 12);
  EXPECT_EQ(text, w["choices"][0]["text"].get<std::string>());
}

TEST_F(HttpServerTest, ConcurrentGreedyRequestsMatchASingleOne) {
  const json body = greedy_body("A penny saved", 16);
  auto single = post("/v1/completions", body);
  ASSERT_TRUE(single);
  const std::string want = json::parse(single->body)["choices"][0]["text"];
  std::vector<std::string> got(7);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] {
      // Different neighbours in every batch: other prompts run alongside.
      json b = i % 2 ? greedy_body("Something else entirely " + std::to_string(i), 10) : body;
      auto r = post("/v1/completions", b);
      if (r && r->status == 200) got[i] = json::parse(r->body)["choices"][0]["text"];
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < got.size(); i += 2) EXPECT_EQ(got[i], want) << i;
}

TEST_F(HttpServerTest, ChatCompletionWholeAndStreamed) {
  json body = {{"messages",
                {{{"role", "system"}, {"content", "Be brief."}},
                 {{"role", "user"}, {"content", "Say something."}}}},
               {"max_tokens", 6},
               {"temperature", 0},
               {"ignore_eos", true}};
  auto whole = post("/v1/chat/completions", body);
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json w = json::parse(whole->body);
  EXPECT_EQ(w["object"], "chat.completion");
  EXPECT_EQ(w["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(w["choices"][0]["message"]["content"].is_string());
  body["stream"] = true;
  auto streamed = post("/v1/chat/completions", body);
  ASSERT_TRUE(streamed);
  bool done = false;
  const auto events = sse_events(streamed->body, &done);
  EXPECT_TRUE(done);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (const json& e : events) text += e["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(text, w["choices"][0]["message"]["content"].get<std::string>());
}

// logprobs tokens are the text each token added (as OpenAI's are), not the tokenizer's
// pieces ("\u2581word", "<0xE2>"): joined they give the returned text, text_offset
// indexes it, and chat's bytes are each token's UTF-8.
TEST_F(HttpServerTest, LogprobsTokensConcatenateToTheText) {
  const std::string piece_mark = "\xE2\x96\x81";  // SentencePiece's word mark, U+2581
  json body = greedy_body("The quick brown fox", 16);
  body["logprobs"] = 0;
  auto r = post("/v1/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json choice = json::parse(r->body)["choices"][0];
  const json& lp = choice["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r->body;
  ASSERT_TRUE(lp.contains("tokens") && lp.contains("text_offset")) << r->body;
  const std::string text = choice["text"];
  ASSERT_EQ(lp["tokens"].size(), 16u) << r->body;
  ASSERT_EQ(lp["token_logprobs"].size(), lp["tokens"].size());
  ASSERT_EQ(lp["text_offset"].size(), lp["tokens"].size());
  std::string joined;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    const std::string token = lp["tokens"][i];
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), joined.size()) << i << ": " << r->body;
    EXPECT_EQ(token.find(piece_mark), std::string::npos) << i << ": " << token;
    joined += token;
  }
  EXPECT_EQ(joined, text) << r->body;

  // Streamed: each chunk's token is its text, at its offset in the whole.
  body["stream"] = true;
  auto streamed = post("/v1/completions", body);
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  bool done = false;
  std::string so_far, stream_tokens;
  for (const json& e : sse_events(streamed->body, &done)) {
    const json& c = e["choices"][0];
    const std::string piece = c["text"];
    if (!c["logprobs"].is_null()) {
      ASSERT_TRUE(c["logprobs"].contains("text_offset")) << e.dump();
      ASSERT_EQ(c["logprobs"]["tokens"].size(), 1u) << e.dump();
      EXPECT_EQ(c["logprobs"]["tokens"][0].get<std::string>(), piece) << e.dump();
      ASSERT_EQ(c["logprobs"]["text_offset"].size(), 1u) << e.dump();
      EXPECT_EQ(c["logprobs"]["text_offset"][0].get<size_t>(), so_far.size()) << e.dump();
      stream_tokens += c["logprobs"]["tokens"][0].get<std::string>();
    }
    so_far += piece;
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(so_far, text);
  EXPECT_EQ(stream_tokens.find(piece_mark), std::string::npos) << stream_tokens;

  // Chat: content[i].token joins to the message, bytes are its UTF-8.
  const json chat = {{"messages", json::array({{{"role", "user"}, {"content", "Say something."}}})},
                     {"max_tokens", 16},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"logprobs", true}};
  auto cr = post("/v1/chat/completions", chat);
  ASSERT_TRUE(cr);
  ASSERT_EQ(cr->status, 200) << cr->body;
  const json cc = json::parse(cr->body)["choices"][0];
  ASSERT_TRUE(cc["logprobs"].is_object() && cc["logprobs"].contains("content")) << cr->body;
  const json& content = cc["logprobs"]["content"];
  ASSERT_FALSE(content.empty()) << cr->body;  // 16 unless the template's stop ends it
  std::string chat_joined;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string token = content[i]["token"];
    EXPECT_EQ(token.find(piece_mark), std::string::npos) << i << ": " << token;
    ASSERT_TRUE(content[i].contains("bytes") && content[i]["bytes"].is_array())
        << content[i].dump();
    std::vector<int> want;
    for (const unsigned char b : token) want.push_back(static_cast<int>(b));
    EXPECT_EQ(content[i]["bytes"].get<std::vector<int>>(), want) << i << ": " << content[i].dump();
    EXPECT_LE(content[i]["logprob"].get<double>(), 0.0);
    chat_joined += token;
  }
  EXPECT_EQ(chat_joined, cc["message"]["content"].get<std::string>()) << cr->body;
}

TEST_F(HttpServerTest, BadRequestsGet400NamingTheField) {
  auto expect_error = [](const std::string& path, const std::string& body, int status,
                         const std::string& param) {
    auto r = client().Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << body << " -> " << r->body;
    const json j = json::parse(r->body);
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    if (param.empty())
      EXPECT_TRUE(j["error"]["param"].is_null()) << r->body;
    else
      EXPECT_EQ(j["error"]["param"], param) << r->body;
  };
  expect_error("/v1/completions", "{\"prompt\": \"hi\",", 400, "");
  expect_error("/v1/completions", "[1, 2]", 400, "");
  expect_error("/v1/completions", R"({"prompt": "hi", "foo": 1})", 400, "foo");
  expect_error("/v1/completions", R"({"prompt": "hi", "max_tokens": "ten"})", 400, "max_tokens");
  expect_error("/v1/completions", R"({"prompt": 5})", 400, "prompt");
  expect_error("/v1/completions", R"({"max_tokens": 5})", 400, "prompt");
  expect_error("/v1/completions", R"({"prompt": "hi", "temperature": -1})", 400, "temperature");
  expect_error("/v1/completions", R"({"prompt": "hi", "stream": "yes"})", 400, "stream");
  expect_error("/v1/completions", R"({"prompt": "hi", "stream_options": {"include_usage": true}})",
               400, "stream_options");
  expect_error("/v1/completions", R"({"prompt": "hi", "model": "other"})", 404, "model");
  std::string long_prompt = "[1";
  for (int i = 0; i < 130; ++i) long_prompt += ",5";
  expect_error("/v1/completions", "{\"prompt\": " + long_prompt + "]}", 400, "prompt");
  expect_error("/v1/completions", R"({"prompt": "hi", "max_tokens": 500})", 400, "max_tokens");
  expect_error("/v1/completions", R"({"prompt": [1, 9999]})", 400, "prompt");
  expect_error("/v1/chat/completions", R"({"messages": []})", 400, "messages");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "robot", "content": "x"}]})", 400,
               "messages[0].role");
  EXPECT_GE(metric("hyperion_requests_rejected_total", {{"reason", "invalid"}}), 13);
}

TEST_F(HttpServerTest, FullQueueGets429) {
  EngineConfig ec = config();
  ec.max_concurrent_decodes = 1;
  ec.max_queue = 0;  // room for exactly one request (the free slot)
  Stack small(*tok_, *params_, ec);
  small.async.set_paused(true);
  std::vector<int> status(2, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      auto r = post("/v1/completions", greedy_body("hello", 4), small.port);
      status[static_cast<size_t>(i)] = r ? r->status : -1;
      if (r && r->status == 429) {
        EXPECT_EQ(json::parse(r->body)["error"]["type"], "rate_limit_error");
        small.async.set_paused(false);  // let the accepted one finish
      }
    });
  for (auto& t : threads) t.join();
  std::sort(status.begin(), status.end());
  EXPECT_EQ(status, (std::vector<int>{200, 429}));
}

TEST_F(HttpServerTest, DisconnectMidStreamFreesSlotAndPages) {
  const double aborted = metric("hyperion_requests_total", {{"finish_reason", "abort"}});
  stack_->async.set_step_delay(std::chrono::milliseconds(20));
  json body = greedy_body("Once upon a time", 100);
  body["stream"] = true;
  httplib::Client c = client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (std::string(data, len).find("data: ") != std::string::npos) ++chunks;
    return chunks < 2;  // hang up after the second token
  };
  httplib::Response res;
  httplib::Error err;
  c.send(req, res, err);
  EXPECT_GE(chunks, 1);
  wait_idle();
  EXPECT_EQ(metric("hyperion_requests_running"), 0);
  EXPECT_EQ(metric("hyperion_kv_pages_used"), 0);
  EXPECT_EQ(metric("hyperion_requests_total", {{"finish_reason", "abort"}}), aborted + 1);
  // Far fewer than 100 tokens were generated for it.
  EXPECT_EQ(metric("hyperion_slots_used"), 0);
}

// A client that closes its connection while a whole (not streamed) reply is being made
// is told from one that only half-closed it: the closed one's request is cancelled (its
// slot and pages freed long before max_tokens), the half-closed one still gets its
// complete answer.
TEST_F(HttpServerTest, AClosedClientCancelsAWholeRequestAHalfClosedOneIsAnswered) {
  stack_->async.set_step_delay(std::chrono::milliseconds(20));
  const std::string body = greedy_body("Once upon a time", 100).dump();
  const std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  auto running_soon = [] {
    for (int i = 0; i < 400 && metric("hyperion_requests_running") == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  const double aborted = metric("hyperion_requests_total", {{"finish_reason", "abort"}});
  const double tokens = metric("hyperion_generation_tokens_total");
  {
    testing_util::RawClient c(stack_->port);
    ASSERT_TRUE(c.send(request));
    running_soon();
  }  // closed: the client is gone
  wait_idle();
  EXPECT_EQ(metric("hyperion_requests_total", {{"finish_reason", "abort"}}), aborted + 1);
  EXPECT_LT(metric("hyperion_generation_tokens_total") - tokens, 100);
  EXPECT_EQ(metric("hyperion_slots_used"), 0);
  EXPECT_EQ(metric("hyperion_kv_pages_used"), 0);

  // Half-closed while it runs: the whole answer, every token, then the server closes.
  const std::string short_body = greedy_body("Once upon a time", 12).dump();
  testing_util::RawClient h(stack_->port);
  ASSERT_TRUE(h.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     "application/json\r\nContent-Length: " +
                     std::to_string(short_body.size()) + "\r\n\r\n" + short_body));
  running_soon();
  ASSERT_EQ(::shutdown(h.fd(), SHUT_WR), 0);
  const std::string reply = h.read();
  stack_->async.set_step_delay(std::chrono::milliseconds(0));
  ASSERT_EQ(reply.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << reply;
  const size_t head_end = reply.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << reply;
  const json answer = json::parse(reply.substr(head_end + 4), nullptr, false);
  ASSERT_TRUE(answer.is_object()) << reply;
  EXPECT_EQ(answer["usage"]["completion_tokens"], 12) << reply;
}

TEST_F(HttpServerTest, SaturatingLoadReturnsEveryPage) {
  const double before = metric("hyperion_generation_tokens_total");
  std::map<std::string, double> steps_before, seconds_before;
  for (const char* kind : {"decode", "prefill"}) {
    steps_before[kind] = metric("hyperion_engine_steps_total", {{"kind", kind}});
    seconds_before[kind] = metric("hyperion_engine_step_seconds_total", {{"kind", kind}});
  }
  const double forward_before = metric("hyperion_engine_forward_seconds_total");
  const auto prompts = corpus_lines(24);
  std::vector<int> completion(prompts.size(), -1);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      json b = greedy_body(prompts[i], 5 + static_cast<int>(i % 7) * 4);
      b["stream"] = i % 2 == 0;
      b["stream_options"] = b["stream"].get<bool>() ? json{{"include_usage", true}} : json(nullptr);
      b["temperature"] = 0.8;
      b["seed"] = i;
      auto r = post("/v1/completions", b);
      ASSERT_TRUE(r) << "request " << i << ": " << httplib::to_string(r.error());
      ASSERT_EQ(r->status, 200) << "request " << i << ": " << r->body;
      if (b["stream"].get<bool>()) {
        bool done = false;
        const auto ev = sse_events(r->body, &done);
        if (done && !ev.empty()) completion[i] = ev.back()["usage"]["completion_tokens"];
      } else {
        completion[i] = json::parse(r->body)["usage"]["completion_tokens"];
      }
    });
  for (auto& t : threads) t.join();
  int64_t total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(completion[i], 5 + static_cast<int>(i % 7) * 4) << i;
    total += completion[i];
  }
  wait_idle();
  EXPECT_EQ(metric("hyperion_kv_pages_used"), 0);
  EXPECT_EQ(metric("hyperion_kv_pages_free") + metric("hyperion_kv_pages_cached"),
            metric("hyperion_kv_pages_total"));
  EXPECT_EQ(metric("hyperion_generation_tokens_total") - before, double(total));
  EXPECT_GT(metric("hyperion_time_to_first_token_seconds_count"), 0);
  // This load's prompts took prefill steps and its longer outputs decode-only steps; the
  // model's time is part of the steps'.
  double step_seconds = 0;
  for (const char* kind : {"decode", "prefill"}) {
    EXPECT_GT(metric("hyperion_engine_steps_total", {{"kind", kind}}), steps_before[kind]) << kind;
    const double s = metric("hyperion_engine_step_seconds_total", {{"kind", kind}});
    EXPECT_GT(s, seconds_before[kind]) << kind;
    step_seconds += s - seconds_before[kind];
  }
  const double forward = metric("hyperion_engine_forward_seconds_total") - forward_before;
  EXPECT_GT(forward, 0);
  EXPECT_LE(forward, step_seconds);
}

}  // namespace
}  // namespace hyperion::serve
