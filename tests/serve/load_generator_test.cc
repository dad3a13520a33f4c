#include "serve/load_generator.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

// Debian builds cpp-httplib as a library with OpenSSL/zlib/brotli: its CPPHTTPLIB_*
// defines (they change class layouts) come from pkg-config through CMake.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "../test_files.h"
#include "base/error.h"
#include "text/tokenizer.h"

namespace hyperion::serve {
namespace {

using namespace hyperion::testing_util;
using json = nlohmann::json;

// ---------------------------------------------------------------------------------------
// A fake OpenAI completion server: /v1/models, and a streaming /v1/completions that sends
// max_tokens token events (1 ms apart), a usage chunk and [DONE]. Text prompts select
// failure modes: "reject" -> 429, "bad" -> 400, "midstream" -> an error event after two
// tokens, "nousage" -> no usage chunk. It counts requests in flight and keeps the maximum.
class FakeServer {
 public:
  FakeServer() {
    svr_.new_task_queue = [] { return new httplib::ThreadPool(24); };
    svr_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model",)"
                      R"("max_model_len":300},{"id":"other","object":"model"}]})",
                      "application/json");
    });
    svr_.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { complete(req, res); });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    while (!svr_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeServer() {
    svr_.stop();
    thread_.join();
  }
  ServerAddress address() const { return {"127.0.0.1", port_}; }
  int max_in_flight() const { return max_in_flight_.load(); }
  std::vector<json> bodies() {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }

 private:
  struct Stream {
    int64_t n = 0, i = 0, prompt_tokens = 0;
    bool usage = true, midstream_error = false, released = false;
  };

  void release(Stream& s) {
    if (!s.released) --in_flight_;
    s.released = true;
  }

  void complete(const httplib::Request& req, httplib::Response& res) {
    const json body = json::parse(req.body);
    {
      std::lock_guard<std::mutex> lock(mu_);
      bodies_.push_back(body);
    }
    const json& prompt = body.at("prompt");
    const std::string text = prompt.is_string() ? prompt.get<std::string>() : std::string();
    if (text == "reject") {
      res.status = 429;
      res.set_content(R"({"error":{"message":"queue full","type":"overloaded","param":null,)"
                      R"("code":429}})",
                      "application/json");
      return;
    }
    if (text == "bad") {
      res.status = 400;
      res.set_content(R"({"error":{"message":"max_tokens must be >= 1","type":)"
                      R"("invalid_request_error","param":"max_tokens","code":null}})",
                      "application/json");
      return;
    }
    auto s = std::make_shared<Stream>();
    s->n = body.at("max_tokens").get<int64_t>();
    s->prompt_tokens = prompt.is_array() ? int64_t(prompt.size()) : int64_t(text.size());
    s->usage = text != "nousage";
    s->midstream_error = text == "midstream";
    const int now = ++in_flight_;
    int seen = max_in_flight_.load();
    while (now > seen && !max_in_flight_.compare_exchange_weak(seen, now)) {
    }
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, s](size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& data) {
            const std::string ev = "data: " + data + "\n\n";
            return sink.write(ev.data(), ev.size());
          };
          if (s->midstream_error && s->i == 2) {
            release(*s);
            send(R"({"error":{"message":"engine crashed","type":"internal_error"}})");
            sink.done();
            return true;
          }
          if (s->i < s->n) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            ++s->i;
            json chunk = {{"id", "cmpl-1"},
                          {"object", "text_completion"},
                          {"created", 0},
                          {"model", "fake-model"},
                          {"choices",
                           {{{"index", 0},
                             {"text", s->i % 3 == 0 ? "" : " tok"},
                             {"logprobs", nullptr},
                             {"finish_reason", s->i == s->n ? json("length") : json()}}}}};
            return send(chunk.dump());
          }
          if (s->usage)
            send(json{{"id", "cmpl-1"},
                      {"choices", json::array()},
                      {"usage",
                       {{"prompt_tokens", s->prompt_tokens},
                        {"completion_tokens", s->n},
                        {"total_tokens", s->prompt_tokens + s->n}}}}
                     .dump());
          // Leaves the in-flight count before the client can see the end of the stream.
          release(*s);
          send("[DONE]");
          sink.done();
          return true;
        },
        [this, s](bool) { release(*s); });
  }

  httplib::Server svr_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> in_flight_{0}, max_in_flight_{0};
  std::mutex mu_;
  std::vector<json> bodies_;
};

// A port nobody listens on: bound (never listened on) to learn a free number, then closed.
// (httplib::Server::bind_to_any_port would also listen, and its destructor keeps the socket
// open, so connections would be accepted by the kernel and never answered.)
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

PromptShape small_shape(int64_t n, uint64_t seed = 0) {
  PromptShape s;
  s.num_prompts = n;
  s.min_input_len = 4;
  s.max_input_len = 12;
  s.min_output_len = 2;
  s.max_output_len = 6;
  s.seed = seed;
  return s;
}

// ---------------------------------------------------------------------------------------
// Statistics on hand-made values.

TEST(LoadGeneratorStats, PercentilesMatchNumpyLinear) {
  // numpy.percentile([1, 2, 3, 4], [50, 90, 99]) = [2.5, 3.7, 3.97]
  const std::vector<double> a = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(percentile_sorted(a, 50), 2.5);
  EXPECT_NEAR(percentile_sorted(a, 90), 3.7, 1e-12);
  EXPECT_NEAR(percentile_sorted(a, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(percentile_sorted(a, 0), 1);
  EXPECT_DOUBLE_EQ(percentile_sorted(a, 100), 4);
  EXPECT_DOUBLE_EQ(percentile_sorted({}, 50), 0);
  EXPECT_DOUBLE_EQ(percentile_sorted({7}, 99), 7);

  // Unsorted input; sorted = [1, 1, 2, 3, 4, 5, 6, 9].
  const Distribution d = summarize({3, 1, 4, 1, 5, 9, 2, 6});
  EXPECT_EQ(d.count, 8);
  EXPECT_DOUBLE_EQ(d.mean, 3.875);
  EXPECT_DOUBLE_EQ(d.p50, 3.5);                      // pos 3.5
  EXPECT_NEAR(d.p90, 6.9, 1e-12);                    // pos 6.3: 6 + 0.3 * 3
  EXPECT_NEAR(d.p99, 8.79, 1e-12);                   // pos 6.93: 6 + 0.93 * 3
  EXPECT_NEAR(d.std, std::sqrt(52.875 / 8), 1e-12);  // population std (numpy default)
  EXPECT_EQ(d.min, 1);
  EXPECT_EQ(d.max, 9);

  const Distribution empty = summarize({});
  EXPECT_EQ(empty.count, 0);
  EXPECT_EQ(empty.mean, 0);
  EXPECT_EQ(empty.p99, 0);
}

TEST(LoadGeneratorStats, RequestTimingFromEventTimes) {
  const std::vector<double> t = {0.1, 0.15, 0.25, 0.3};
  RequestTiming r = request_timing(t, 0.35, 4);
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.1);
  EXPECT_DOUBLE_EQ(r.latency_s, 0.35);
  EXPECT_EQ(r.output_tokens, 4);
  ASSERT_EQ(r.itl_s.size(), 3u);
  EXPECT_NEAR(r.itl_s[0], 0.05, 1e-15);
  EXPECT_NEAR(r.itl_s[1], 0.10, 1e-15);
  EXPECT_NEAR(r.itl_s[2], 0.05, 1e-15);
  EXPECT_NEAR(r.tpot_s, (0.35 - 0.1) / 3, 1e-15);

  // No usage: the events are counted.
  r = request_timing(t, 0.35, -1);
  EXPECT_EQ(r.output_tokens, 4);
  EXPECT_NEAR(r.tpot_s, (0.35 - 0.1) / 3, 1e-15);
  // Usage above the event count (events merged by the server): usage wins.
  r = request_timing(t, 0.35, 6);
  EXPECT_EQ(r.output_tokens, 6);
  EXPECT_NEAR(r.tpot_s, 0.25 / 5, 1e-15);
  // One token: TPOT undefined.
  r = request_timing({0.2}, 0.21, 1);
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.2);
  EXPECT_TRUE(r.itl_s.empty());
  EXPECT_LT(r.tpot_s, 0);
}

TEST(LoadGeneratorStats, AggregateHandMadeOutcomes) {
  std::vector<RequestOutcome> o(3);
  o[0].success = true;
  o[0].token_times_s = {0.1, 0.2, 0.4};
  o[0].done_s = 0.5;
  o[0].usage_prompt_tokens = 10;
  o[0].usage_completion_tokens = 3;
  o[0].input_len = 99;  // usage wins
  o[1].success = false;
  o[1].http_status = 429;
  o[1].error = "HTTP 429: overloaded: queue full";
  o[2].success = true;
  o[2].token_times_s = {0.3, 0.35};
  o[2].done_s = 0.5;
  o[2].input_len = 7;  // no usage: the known length and the event count
  const BenchResult r = aggregate(o, 2.0);
  EXPECT_EQ(r.num_prompts, 3);
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.total_input_tokens, 17);
  EXPECT_EQ(r.total_output_tokens, 5);
  EXPECT_DOUBLE_EQ(r.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(r.output_tokens_per_s, 2.5);
  EXPECT_DOUBLE_EQ(r.input_tokens_per_s, 8.5);
  EXPECT_DOUBLE_EQ(r.concurrency, 0.5);  // (0.5 + 0.5) / 2
  EXPECT_EQ(r.ttft_ms.count, 2);
  EXPECT_NEAR(r.ttft_ms.mean, 200, 1e-9);
  EXPECT_NEAR(r.ttft_ms.p90, 100 + 0.9 * 200, 1e-9);
  // TPOT: (500 - 100) / 2 = 200 and (500 - 300) / 1 = 200.
  EXPECT_EQ(r.tpot_ms.count, 2);
  EXPECT_NEAR(r.tpot_ms.mean, 200, 1e-9);
  // ITL pooled: 100, 200, 50.
  EXPECT_EQ(r.itl_ms.count, 3);
  EXPECT_NEAR(r.itl_ms.mean, 350.0 / 3, 1e-9);
  EXPECT_NEAR(r.itl_ms.p50, 100, 1e-9);
  EXPECT_NEAR(r.e2e_latency_ms.mean, 500, 1e-9);
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0], "request 1: HTTP 429: overloaded: queue full");
  ASSERT_EQ(r.requests.size(), 3u);
  EXPECT_EQ(r.requests[2].timing.output_tokens, 2);

  // Only the first kMaxErrors errors are kept; zero duration gives zero rates.
  std::vector<RequestOutcome> fails(8);
  for (size_t i = 0; i < fails.size(); ++i) fails[i].error = fmt::format("e{}", i);
  const BenchResult f = aggregate(fails, 0.0);
  EXPECT_EQ(f.failed, 8);
  ASSERT_EQ(f.errors.size(), kMaxErrors);
  EXPECT_EQ(f.errors[4], "request 4: e4");
  EXPECT_EQ(f.request_throughput, 0);
}

// ---------------------------------------------------------------------------------------
// The event-stream parser.

std::string sample_stream(const std::string& eol) {
  std::string s;
  for (int i = 0; i < 3; ++i)
    s += "data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"finish_reason\":" +
         std::string(i == 2 ? "\"length\"" : "null") + "}]}" + eol + eol;
  s += ": a comment" + eol + eol;
  s += "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3," +
       std::string("\"total_tokens\":8}}") + eol + eol;
  s += "data: [DONE]" + eol + eol;
  return s;
}

TEST(LoadGeneratorStream, ParsesWholeAndBytewise) {
  for (const std::string eol : {"\n", "\r\n"}) {
    const std::string s = sample_stream(eol);
    CompletionStream whole;
    EXPECT_FALSE(whole.feed(s.data(), s.size(), 1.0));
    EXPECT_TRUE(whole.done());
    EXPECT_FALSE(whole.failed());
    EXPECT_EQ(whole.token_times().size(), 3u);
    EXPECT_EQ(whole.usage_prompt_tokens(), 5);
    EXPECT_EQ(whole.usage_completion_tokens(), 3);
    EXPECT_EQ(whole.finish_reason(), "length");
    EXPECT_EQ(whole.done_time(), 1.0);

    // One byte at a time, byte i at time i: each token is stamped with the byte that ends
    // its event (the last byte of the blank line).
    std::vector<double> expect;
    for (size_t at = s.find("data: {\"choices\":[{"); at != std::string::npos;
         at = s.find("data: {\"choices\":[{", at + 1))
      expect.push_back(double(s.find(eol + eol, at) + 2 * eol.size() - 1));
    CompletionStream bytes;
    for (size_t i = 0; i < s.size(); ++i) bytes.feed(&s[i], 1, double(i));
    EXPECT_TRUE(bytes.done());
    EXPECT_EQ(bytes.token_times(), expect);
    EXPECT_EQ(bytes.token_times().size(), 3u);
    EXPECT_EQ(bytes.usage_completion_tokens(), 3);
    EXPECT_EQ(bytes.done_time(), double(s.size() - 1));
  }
}

TEST(LoadGeneratorStream, ErrorsAndOddEvents) {
  {
    const std::string s =
        "data: {\"choices\":[{\"text\":\"x\"}]}\n\n"
        "data: {\"error\": {\"message\": \"engine crashed\", \"type\": \"internal_error\"}}\n\n"
        "data: {\"choices\":[{\"text\":\"y\"}]}\n\n";
    CompletionStream c;
    EXPECT_FALSE(c.feed(s.data(), s.size(), 0.5));
    EXPECT_TRUE(c.failed());
    EXPECT_FALSE(c.done());
    EXPECT_NE(c.error().find("engine crashed"), std::string::npos) << c.error();
    EXPECT_NE(c.error().find("internal_error"), std::string::npos) << c.error();
    EXPECT_EQ(c.token_times().size(), 1u);  // nothing after the error
  }
  {
    const std::string s = "data: {not json\n\n";
    CompletionStream c;
    c.feed(s.data(), s.size(), 0);
    EXPECT_TRUE(c.failed());
    EXPECT_NE(c.error().find("invalid JSON"), std::string::npos);
  }
  {
    // Multi-line data fields join with '\n' (valid JSON whitespace); "event:" is ignored;
    // an unfinished event waits for its blank line.
    const std::string s =
        "event: completion\ndata: {\"choices\":\ndata: [{\"text\":\"z\"}]}\n\ndata: [DO";
    CompletionStream c;
    EXPECT_TRUE(c.feed(s.data(), s.size(), 0));
    EXPECT_EQ(c.token_times().size(), 1u);
    EXPECT_FALSE(c.done());
    const std::string rest = "NE]\n\n";
    EXPECT_FALSE(c.feed(rest.data(), rest.size(), 1));
    EXPECT_TRUE(c.done());
  }
}

// ---------------------------------------------------------------------------------------
// Arrivals and prompt sources.

TEST(LoadGeneratorArrivals, PoissonDeterministicWithRightMean) {
  const std::vector<double> a = arrival_offsets(20000, 50.0, 7);
  EXPECT_EQ(a, arrival_offsets(20000, 50.0, 7));
  EXPECT_NE(a, arrival_offsets(20000, 50.0, 8));
  EXPECT_EQ(a[0], 0.0);
  for (size_t i = 1; i < a.size(); ++i) ASSERT_GE(a[i], a[i - 1]);
  // Mean gap 1/50 s (the sample mean of 19999 exponentials is within ~2% at 3 sigma);
  // variance of an exponential = mean^2.
  const double mean = a.back() / double(a.size() - 1);
  EXPECT_NEAR(mean, 0.02, 0.02 * 0.03);
  double var = 0;
  for (size_t i = 1; i < a.size(); ++i) var += std::pow(a[i] - a[i - 1] - mean, 2);
  var /= double(a.size() - 2);
  EXPECT_NEAR(std::sqrt(var), 0.02, 0.02 * 0.06);

  for (double t : arrival_offsets(5, INFINITY, 1)) EXPECT_EQ(t, 0.0);
  EXPECT_TRUE(arrival_offsets(0, 1.0, 1).empty());
  expect_error([] { arrival_offsets(3, 0.0, 1); }, {"arrival_offsets", "rate"});
  expect_error([] { arrival_offsets(3, -2.0, 1); }, {"arrival_offsets", "rate"});
}

TEST(LoadGeneratorPrompts, RandomPromptsLengthsAndRange) {
  PromptShape s = small_shape(50, 3);
  const auto p = random_prompts(100, s);
  ASSERT_EQ(p.size(), 50u);
  std::set<int64_t> in_lens;
  for (const auto& r : p) {
    EXPECT_FALSE(r.is_text);
    ASSERT_GE(r.ids.size(), 4u);
    ASSERT_LE(r.ids.size(), 12u);
    EXPECT_EQ(r.input_len, int64_t(r.ids.size()));
    EXPECT_EQ(r.ids[0], 1);
    for (size_t k = 1; k < r.ids.size(); ++k) {
      EXPECT_GE(r.ids[k], 3);
      EXPECT_LT(r.ids[k], 100);
    }
    EXPECT_GE(r.max_tokens, 2);
    EXPECT_LE(r.max_tokens, 6);
    in_lens.insert(r.input_len);
  }
  EXPECT_GT(in_lens.size(), 4u);  // lengths actually vary
  const auto again = random_prompts(100, s);
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(p[i].ids, again[i].ids);
  s.seed = 4;
  EXPECT_NE(random_prompts(100, s)[0].ids, p[0].ids);

  expect_error([&] { random_prompts(3, small_shape(2)); }, {"random_prompts", "vocab_size"});
  PromptShape bad = small_shape(2);
  bad.min_input_len = 20;
  expect_error([&] { random_prompts(100, bad); }, {"random_prompts", "min_input_len"});
  bad = small_shape(2);
  bad.min_output_len = 0;
  expect_error([&] { random_prompts(100, bad); }, {"random_prompts", "min_output_len"});
  bad = small_shape(0);
  expect_error([&] { random_prompts(100, bad); }, {"random_prompts", "num_prompts"});
}

std::vector<std::string> tiny_docs() {
  static const char* kWords[] = {"the", "quick", "brown",  "fox",    "jumps", "over", "lazy",
                                 "dog", "a",     "model",  "learns", "from",  "data", "tokens",
                                 "are", "small", "pieces", "of",     "text",  "and",  "every"};
  std::mt19937 rng(5);
  std::vector<std::string> docs;
  for (int d = 0; d < 150; ++d) {
    std::string s;
    for (int i = 0; i < 20; ++i) s += std::string(kWords[rng() % std::size(kWords)]) + " ";
    docs.push_back(s + "End.");
  }
  return docs;
}

TEST(LoadGeneratorPrompts, CorpusPromptsFromBundledAndTinyCorpus) {
  TempDir dir;
  text::TokenizerTrainOptions o;
  o.vocab_size = 300;
  const text::Tokenizer tok = text::Tokenizer::train(tiny_docs(), dir.file("t.model"), o);

  const std::string bundled = bundled_corpus_path();
  EXPECT_NE(bundled.find("data/corpus/"), std::string::npos) << bundled;
  PromptShape s = small_shape(30, 11);
  s.max_input_len = 40;
  const auto p = corpus_prompts(tok, bundled, s);
  ASSERT_EQ(p.size(), 30u);
  for (const auto& r : p) {
    ASSERT_GE(r.ids.size(), 4u);
    ASSERT_LE(r.ids.size(), 40u);
    EXPECT_EQ(r.input_len, int64_t(r.ids.size()));
    EXPECT_EQ(r.ids[0], tok.bos_id());
    for (int32_t id : r.ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tok.vocab_size());
    }
    EXPECT_GE(r.max_tokens, 2);
    EXPECT_LE(r.max_tokens, 6);
  }
  // Consecutive windows of real text: the decoded prompt is non-trivial text.
  EXPECT_FALSE(tok.decode(std::vector<int32_t>(p[0].ids.begin() + 1, p[0].ids.end())).empty());
  const auto again = corpus_prompts(tok, bundled, s);
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(p[i].ids, again[i].ids);
  s.seed = 12;
  EXPECT_NE(corpus_prompts(tok, bundled, s)[0].ids, p[0].ids);

  // A corpus far shorter than the prompts need wraps around.
  const std::string small = dir.write("small.txt", "the quick fox\n\nover the dog\n");
  PromptShape big = small_shape(20, 1);
  big.min_input_len = 50;
  big.max_input_len = 60;
  for (const auto& r : corpus_prompts(tok, small, big)) {
    EXPECT_GE(r.ids.size(), 50u);
    EXPECT_LE(r.ids.size(), 60u);
  }
  const std::string empty = dir.write("empty.txt", "\n\n");
  expect_error([&] { corpus_prompts(tok, empty, big); }, {"corpus_prompts", empty});
  expect_error([&] { corpus_prompts(tok, dir.file("missing.txt"), big); }, {"missing.txt"});
}

TEST(LoadGeneratorPrompts, JsonlDataset) {
  TempDir dir;
  const std::string path = dir.write("d.jsonl",
                                     "{\"prompt\": \"Hello there\", \"max_tokens\": 5}\n"
                                     "\n"
                                     "{\"prompt\": [1, 20, 30], \"output_len\": 3}\r\n"
                                     "{\"prompt\": \"no length\"}\n"
                                     "   \n"
                                     "{\"prompt\": [1, 2]}\n");
  PromptShape s = small_shape(10);
  const auto p = load_jsonl_prompts(path, s);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_TRUE(p[0].is_text);
  EXPECT_EQ(p[0].text, "Hello there");
  EXPECT_EQ(p[0].max_tokens, 5);
  EXPECT_EQ(p[0].input_len, -1);
  EXPECT_FALSE(p[1].is_text);
  EXPECT_EQ(p[1].ids, (std::vector<int32_t>{1, 20, 30}));
  EXPECT_EQ(p[1].input_len, 3);
  EXPECT_EQ(p[1].max_tokens, 3);
  EXPECT_GE(p[2].max_tokens, 2);  // drawn from [min_output_len, max_output_len]
  EXPECT_LE(p[2].max_tokens, 6);
  EXPECT_EQ(p[3].ids.size(), 2u);
  s.num_prompts = 2;
  EXPECT_EQ(load_jsonl_prompts(path, s).size(), 2u);

  struct Bad {
    const char* content;
    std::vector<std::string> needles;
  };
  const std::vector<Bad> bad = {
      {"{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\"\n", {":3:", "invalid JSON"}},
      {"[1, 2]\n", {":1:", "JSON object"}},
      {"{\"max_tokens\": 4}\n", {":1:", "'prompt'"}},
      {"{\"prompt\": 5}\n", {":1:", "'prompt'", "string or an array"}},
      {"{\"prompt\": []}\n", {":1:", "'prompt'", "empty"}},
      {"{\"prompt\": \"\"}\n", {":1:", "'prompt'", "empty"}},
      {"{\"prompt\": [1, -4]}\n", {":1:", "'prompt'[1]"}},
      {"{\"prompt\": [1, \"x\"]}\n", {":1:", "'prompt'[1]"}},
      {"{\"prompt\": \"a\", \"max_tokens\": 0}\n", {":1:", "'max_tokens'", "positive"}},
      {"{\"prompt\": \"a\", \"output_len\": 2.5}\n", {":1:", "'output_len'"}},
      {"{\"prompt\": \"a\", \"max_tokens\": 2, \"output_len\": 2}\n", {":1:", "not both"}},
      {"{\"prompt\": \"a\", \"temperature\": 1}\n", {":1:", "unknown field 'temperature'"}},
      {"\n  \n", {"no prompts"}},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::string f = dir.write(fmt::format("bad{}.jsonl", i), bad[i].content);
    std::vector<std::string> needles = bad[i].needles;
    needles.push_back(f);
    expect_error([&] { load_jsonl_prompts(f, small_shape(10)); }, needles);
  }
  expect_error([&] { load_jsonl_prompts(dir.file("nope.jsonl"), small_shape(10)); },
               {"nope.jsonl"});
}

TEST(LoadGeneratorPrompts, SizedToTheServersContext) {
  PromptShape asked;  // the defaults: inputs 32..512, outputs 16..256
  // The tiny model's context: both maxima shrink in proportion (2:1), minima stay.
  PromptShape fit = fit_shape(asked, 256);
  EXPECT_EQ(fit.max_input_len, 170);
  EXPECT_EQ(fit.max_output_len, 86);
  EXPECT_EQ(fit.min_input_len, 32);
  EXPECT_EQ(fit.min_output_len, 16);
  EXPECT_LE(fit.max_input_len + fit.max_output_len, 256);
  // A context smaller than the minima: the minima follow the maxima down.
  fit = fit_shape(asked, 24);
  EXPECT_EQ(fit.max_input_len + fit.max_output_len, 24);
  EXPECT_LE(fit.min_input_len, fit.max_input_len);
  EXPECT_LE(fit.min_output_len, fit.max_output_len);
  EXPECT_GE(fit.max_output_len, 1);
  // Room enough, or unknown (0): unchanged.
  EXPECT_EQ(fit_shape(asked, 4096).max_input_len, 512);
  EXPECT_EQ(fit_shape(asked, 0).max_output_len, 256);
  // Every generated request then fits.
  for (const BenchRequest& r : random_prompts(300, fit_shape(asked, 100)))
    EXPECT_LE(r.input_len + r.max_tokens, 100);

  std::vector<BenchRequest> reqs(4);
  reqs[0].input_len = 50, reqs[0].max_tokens = 80;   // capped to 50
  reqs[1].input_len = 100, reqs[1].max_tokens = 5;   // fills the context: dropped
  reqs[2].is_text = true, reqs[2].max_tokens = 500;  // unknown length: left to the server
  reqs[3].input_len = 10, reqs[3].max_tokens = 20;   // fits
  EXPECT_EQ(fit_requests(reqs, 100), 1);
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].max_tokens, 50);
  EXPECT_EQ(reqs[1].max_tokens, 500);
  EXPECT_EQ(reqs[2].max_tokens, 20);
}

TEST(LoadGeneratorClient, ParseUrlAndRequestBody) {
  ServerAddress a = parse_url("http://127.0.0.1:8000");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 8000);
  a = parse_url("http://localhost:9/");
  EXPECT_EQ(a.host, "localhost");
  EXPECT_EQ(a.port, 9);
  EXPECT_EQ(parse_url("http://example").port, 80);
  expect_error([] { parse_url("https://h:1"); }, {"https://h:1", "https is not supported"});
  expect_error([] { parse_url("h:1"); }, {"'h:1'", "http://host:port"});
  expect_error([] { parse_url("http://h:1/v1"); }, {"path"});
  expect_error([] { parse_url("http://h:x"); }, {"bad port"});
  expect_error([] { parse_url("http://h:70000"); }, {"out of range"});
  expect_error([] { parse_url("http://:80"); }, {"missing host"});

  LoadOptions opts;
  opts.model = "m";
  BenchRequest r;
  r.ids = {1, 5, 9};
  r.max_tokens = 7;
  json j = json::parse(request_body(r, opts));
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["prompt"], json({1, 5, 9}));
  EXPECT_EQ(j["max_tokens"], 7);
  EXPECT_EQ(j["temperature"], 0.0);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_EQ(j["ignore_eos"], true);
  opts.ignore_eos = false;
  r.is_text = true;
  r.text = "hi";
  j = json::parse(request_body(r, opts));
  EXPECT_EQ(j["prompt"], "hi");
  EXPECT_FALSE(j.contains("ignore_eos"));
  // A chat endpoint gets the text as one user message (it has no `prompt` field), and
  // refuses token ids.
  opts.endpoint = "/v1/chat/completions";
  j = json::parse(request_body(r, opts));
  EXPECT_FALSE(j.contains("prompt"));
  EXPECT_EQ(j["messages"], json::parse(R"([{"role": "user", "content": "hi"}])"));
  r.is_text = false;
  EXPECT_THROW(request_body(r, opts), Error);
}

// ---------------------------------------------------------------------------------------
// Against the fake server.

TEST(LoadGeneratorServer, AllAtOnceCountsTokensAndTimings) {
  FakeServer server;
  LoadOptions opts;
  opts.server = server.address();
  opts.timeout_s = 20;  // a broken build fails instead of hanging
  EXPECT_EQ(fetch_model_name(opts.server), "fake-model");
  EXPECT_EQ(fetch_model(opts.server, "").max_model_len, 300);
  EXPECT_EQ(fetch_model(opts.server, "other").max_model_len, 0);  // not reported
  EXPECT_EQ(fetch_model(opts.server, "absent").id, "absent");
  EXPECT_EQ(fetch_model(opts.server, "absent").max_model_len, 0);
  const auto prompts = random_prompts(500, small_shape(12, 2));
  int64_t want_out = 0, want_in = 0;
  for (const auto& p : prompts) want_out += p.max_tokens, want_in += p.input_len;

  const BenchResult r = run_benchmark(prompts, opts);  // model from /v1/models
  EXPECT_EQ(r.model, "fake-model");
  EXPECT_EQ(r.completed, 12);
  EXPECT_EQ(r.failed, 0);
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(r.total_output_tokens, want_out);
  EXPECT_EQ(r.total_input_tokens, want_in);
  EXPECT_GT(r.duration_s, 0);
  EXPECT_NEAR(r.request_throughput, 12 / r.duration_s, 1e-9);
  EXPECT_NEAR(r.output_tokens_per_s, double(want_out) / r.duration_s, 1e-6);
  EXPECT_GT(r.ttft_ms.mean, 0);
  EXPECT_GT(r.itl_ms.mean, 0);
  EXPECT_GT(r.tpot_ms.mean, 0);
  EXPECT_EQ(r.ttft_ms.count, 12);
  EXPECT_EQ(r.tpot_ms.count, 12);  // every max_tokens >= 2
  EXPECT_EQ(r.itl_ms.count, want_out - 12);
  EXPECT_LE(r.ttft_ms.max, r.e2e_latency_ms.max);
  std::vector<double> tpot;
  for (size_t i = 0; i < r.requests.size(); ++i) {
    const RequestOutcome& o = r.requests[i];
    ASSERT_TRUE(o.success) << o.error;
    EXPECT_EQ(o.http_status, 200);
    EXPECT_EQ(int64_t(o.token_times_s.size()), prompts[i].max_tokens);
    EXPECT_EQ(o.usage_completion_tokens, prompts[i].max_tokens);
    EXPECT_EQ(o.usage_prompt_tokens, prompts[i].input_len);
    EXPECT_GT(o.token_times_s.front(), 0);
    EXPECT_LE(o.token_times_s.back(), o.done_s);
    EXPECT_DOUBLE_EQ(o.timing.ttft_s, o.token_times_s.front());
    const double want_tpot =
        (o.done_s - o.token_times_s.front()) / double(o.token_times_s.size() - 1);
    EXPECT_DOUBLE_EQ(o.timing.tpot_s, want_tpot);
    tpot.push_back(want_tpot * 1e3);
  }
  const Distribution d = summarize(tpot);
  EXPECT_DOUBLE_EQ(r.tpot_ms.mean, d.mean);
  EXPECT_DOUBLE_EQ(r.tpot_ms.p99, d.p99);

  // What the server received.
  const auto bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 12u);
  for (const json& b : bodies) {
    EXPECT_EQ(b["model"], "fake-model");
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["ignore_eos"], true);
    EXPECT_TRUE(b["prompt"].is_array());
  }

  // The JSON report: the stable keys.
  const json j = json::parse(result_json(r, opts));
  for (const char* k :
       {"request_throughput", "output_tokens_per_s", "input_tokens_per_s", "completed", "failed",
        "duration_s", "total_input_tokens", "total_output_tokens", "num_prompts", "request_rate",
        "max_concurrency", "ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms", "errors"})
    EXPECT_TRUE(j.contains(k)) << k;
  for (const char* k : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"})
    for (const char* s : {"mean", "p50", "p90", "p99"}) EXPECT_TRUE(j[k][s].is_number()) << k << s;
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["max_concurrency"].is_null());
  EXPECT_EQ(j["completed"], 12);
  EXPECT_EQ(j["num_prompts"], 12);
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_TRUE(j["errors"].is_array());
  const std::string table = result_table(r, opts);
  for (const char* k : {"Successful requests:", "Benchmark duration (s):",
                        "Request throughput (req/s):", "Output token throughput (tok/s):",
                        "Mean TTFT (ms):", "P99 TPOT (ms):", "Median ITL (ms):"})
    EXPECT_NE(table.find(k), std::string::npos) << k;
}

TEST(LoadGeneratorServer, MaxConcurrencyAndPoissonArrivals) {
  FakeServer server;
  LoadOptions opts;
  opts.server = server.address();
  opts.timeout_s = 20;  // a broken build fails instead of hanging
  opts.model = "fake-model";
  opts.max_concurrency = 3;
  opts.request_rate = 400;
  opts.seed = 9;
  opts.ignore_eos = false;
  const auto prompts = random_prompts(500, small_shape(14, 4));
  const BenchResult r = run_benchmark(prompts, opts);
  EXPECT_EQ(r.completed, 14);
  EXPECT_LE(server.max_in_flight(), 3);
  EXPECT_GE(server.max_in_flight(), 1);
  // No request leaves before its Poisson arrival time.
  const std::vector<double> at = arrival_offsets(14, 400, 9);
  for (size_t i = 0; i < at.size(); ++i) EXPECT_GE(r.requests[i].start_s, at[i]);
  for (const json& b : server.bodies()) EXPECT_FALSE(b.contains("ignore_eos"));
  const json j = json::parse(result_json(r, opts));
  EXPECT_EQ(j["request_rate"], 400.0);
  EXPECT_EQ(j["max_concurrency"], 3);
}

TEST(LoadGeneratorServer, FailedRequestsAreCountedWithMessages) {
  FakeServer server;
  LoadOptions opts;
  opts.server = server.address();
  opts.timeout_s = 20;  // a broken build fails instead of hanging
  opts.model = "fake-model";
  std::vector<BenchRequest> reqs;
  for (const char* t : {"ok one", "reject", "bad", "midstream", "nousage", "reject"}) {
    BenchRequest r;
    r.is_text = true;
    r.text = t;
    r.max_tokens = 4;
    reqs.push_back(r);
  }
  const BenchResult r = run_benchmark(reqs, opts);
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.failed, 4);
  EXPECT_EQ(r.total_output_tokens, 8);  // "nousage": the 4 events counted
  EXPECT_EQ(r.total_input_tokens, 6);   // usage of "ok one"; "nousage" has no known length
  EXPECT_EQ(r.requests[1].http_status, 429);
  EXPECT_EQ(r.requests[2].http_status, 400);
  EXPECT_EQ(r.requests[4].usage_completion_tokens, -1);
  ASSERT_EQ(r.errors.size(), 4u);
  EXPECT_NE(r.errors[0].find("request 1: HTTP 429"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[0].find("queue full"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[1].find("HTTP 400"), std::string::npos) << r.errors[1];
  EXPECT_NE(r.errors[1].find("max_tokens must be >= 1"), std::string::npos) << r.errors[1];
  EXPECT_NE(r.errors[2].find("engine crashed"), std::string::npos) << r.errors[2];
  EXPECT_EQ(r.requests[3].token_times_s.size(), 2u);

  // Nobody listening: every request fails with the client's error; no model lookup works.
  LoadOptions closed = opts;
  closed.server = {"127.0.0.1", closed_port()};
  const BenchResult c = run_benchmark(random_prompts(50, small_shape(3)), closed);
  EXPECT_EQ(c.completed, 0);
  EXPECT_EQ(c.failed, 3);
  EXPECT_NE(c.errors[0].find("request failed"), std::string::npos) << c.errors[0];
  EXPECT_EQ(c.requests[0].http_status, 0);
  closed.model.clear();
  expect_error([&] { run_benchmark(random_prompts(50, small_shape(1)), closed); },
               {"/v1/models", std::to_string(closed.server.port)});

  LoadOptions bad = opts;
  bad.endpoint = "v1/completions";
  expect_error([&] { run_benchmark(reqs, bad); }, {"run_benchmark", "endpoint"});
  bad = opts;
  bad.max_concurrency = -1;
  expect_error([&] { run_benchmark(reqs, bad); }, {"run_benchmark", "max_concurrency"});
  bad = opts;
  bad.request_rate = 0;
  expect_error([&] { run_benchmark(reqs, bad); }, {"rate"});
}

}  // namespace
}  // namespace hyperion::serve
