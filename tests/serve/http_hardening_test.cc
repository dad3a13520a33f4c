// `hyperion serve` under hostile or careless clients: queue overflow, invalid UTF-8,
// huge prompts, slow clients, too many connections, a taken port, a graceful drain,
// and the HTTP/1.1 edges (pipelining, conflicting or negative Content-Length, wrong
// methods). Every case gets a clean status code, never a crash, a hang or a 500.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <thread>

#include "../test_files.h"
#include "base/log.h"
#include "http_test_util.h"
#include "serve_test_util.h"

namespace hyperion::serve {
namespace {

using nlohmann::json;
using testing_util::greedy_body;
using testing_util::RawClient;
using testing_util::ServedStack;
using testing_util::sse_events;

class HttpHardening : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing_util::TempDir();
    text::TokenizerTrainOptions o;
    o.vocab_size = 400;
    tok_ = new text::Tokenizer(
        text::Tokenizer::train(testing_util::corpus_lines(2000), dir_->file("t.model"), o));
    params_ = testing_util::small_serving_params(testing_util::small_serving_config(400), false, 5)
                  .release();
  }
  static void TearDownTestSuite() {
    delete params_;
    delete tok_;
    delete dir_;
  }
  static EngineConfig config(int64_t slots = 4, int64_t queue = 8) {
    EngineConfig ec;
    ec.weights = WeightFormat::kF32;
    ec.kv_dtype = DType::kF32;
    ec.kv_page_tokens = 8;
    ec.prefill_chunk = 32;
    ec.max_concurrent_decodes = slots;
    ec.max_queue = queue;
    return ec;
  }
  std::unique_ptr<ServedStack> stack(EngineConfig ec = config(), HttpOptions http = {}) {
    return std::make_unique<ServedStack>(*tok_, *params_, ec, http);
  }
  static httplib::Client client(int port) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    c.set_connection_timeout(10, 0);
    return c;
  }

  static testing_util::TempDir* dir_;
  static text::Tokenizer* tok_;
  static ParamStore* params_;
};
testing_util::TempDir* HttpHardening::dir_ = nullptr;
text::Tokenizer* HttpHardening::tok_ = nullptr;
ParamStore* HttpHardening::params_ = nullptr;

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0) return -1;
  return std::atoi(response.c_str() + 9);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every rejection is a 429 before any byte of a response: no 500, no 200 that turns
// into an error event, and never more requests accepted than slots + max_queue.
// /health on new connections until one is answered 200 (at most 4 s): a closed
// connection's place frees asynchronously. The last status seen.
int health_once_a_place_frees(int port) {
  int status = -1;
  for (int i = 0; i < 200 && status != 200; ++i) {
    RawClient again(port);
    again.send("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    status = status_of(again.read());
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

TEST_F(HttpHardening, QueueOverflowIsAlwaysA429AndTheBoundHolds) {
  auto s = stack(config(4, 8));
  s->async.set_step_delay(std::chrono::milliseconds(5));
  std::atomic<bool> done{false};
  std::atomic<int64_t> max_outstanding{0};
  std::thread sampler([&] {
    while (!done) {
      const int64_t o = s->async.outstanding();
      int64_t m = max_outstanding.load();
      while (o > m && !max_outstanding.compare_exchange_weak(m, o)) {
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::mutex mu;
  std::map<int, int> statuses;
  std::vector<std::string> problems;
  std::vector<std::thread> threads;
  for (int t = 0; t < 32; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < 3; ++k) {
        json b = greedy_body("The queue test " + std::to_string(t), 6);
        b["stream"] = (t + k) % 2 == 0;
        auto r = client(s->port).Post("/v1/completions", b.dump(), "application/json");
        std::lock_guard<std::mutex> lock(mu);
        if (!r) {
          problems.push_back("transport error " + httplib::to_string(r.error()));
          continue;
        }
        ++statuses[r->status];
        if (r->status == 429) {
          if (json::parse(r->body)["error"]["type"] != "rate_limit_error")
            problems.push_back("429 body: " + r->body);
        } else if (r->status == 200 && b["stream"].get<bool>()) {
          bool finished = false;
          for (const json& e : sse_events(r->body, &finished))
            if (e.contains("error")) problems.push_back("error event after 200: " + e.dump());
          if (!finished) problems.push_back("stream without [DONE]");
        } else if (r->status != 200) {
          problems.push_back(std::to_string(r->status) + ": " + r->body);
        }
      }
    });
  for (auto& t : threads) t.join();
  done = true;
  sampler.join();
  EXPECT_TRUE(problems.empty()) << problems.size() << " problems, first: " << problems[0];
  EXPECT_GT(statuses[200], 0);
  EXPECT_GT(statuses[429], 0);
  EXPECT_EQ(statuses[200] + statuses[429], 96);
  EXPECT_LE(max_outstanding.load(), 12);  // 4 slots + max_queue 8, exactly
}

TEST_F(HttpHardening, AcceptedRequestsAreNeverRejectedLater) {
  // A paused engine takes requests but runs none: exactly slots + max_queue are taken.
  auto s = stack(config(2, 3));
  s->async.set_paused(true);
  std::atomic<int> errors{0}, finished{0};
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r;
    r.prompt = {1, 5, 6};
    r.max_tokens = 2;
    s->async.submit(r, [&](const TokenEvent& ev) {
      if (ev.finish == FinishReason::kError) ++errors;
      if (ev.finish != FinishReason::kNone) ++finished;
    });
  }
  GenerationRequest extra;
  extra.prompt = {1, 5};
  extra.max_tokens = 2;
  EXPECT_THROW(s->async.submit(extra, nullptr), QueueFullError);
  EXPECT_EQ(s->async.outstanding(), 5);
  s->async.set_paused(false);
  for (int i = 0; i < 2000 && finished < 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(finished.load(), 5);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(s->async.outstanding(), 0);
}

TEST_F(HttpHardening, InvalidUtf8IsA400NamingTheField) {
  auto s = stack();
  const std::string bad = "ab\xff\xfe";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/v1/completions", "{\"prompt\": \"" + bad + "\", \"max_tokens\": 2}"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"stop\": [\"ok\", \"" + bad + "\"]}"},
      {"/v1/completions", "{\"model\": \"" + bad + "\", \"prompt\": \"hi\"}"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"stop\": \"\\ud800\"}"},  // lone surrogate
      {"/v1/chat/completions",
       "{\"messages\": [{\"role\": \"user\", \"content\": \"" + bad + "\"}]}"}};
  const std::vector<std::string> fields = {"prompt", "stop[1]", "model", "stop",
                                           "messages[0].content"};
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = client(s->port).Post(cases[i].first, cases[i].second, "application/json");
    ASSERT_TRUE(r) << i;
    EXPECT_EQ(r->status, 400) << i << ": " << r->body;
    const json j = json::parse(r->body);  // the error itself is valid UTF-8 JSON
    EXPECT_EQ(j["error"]["param"], fields[i]) << r->body;
    EXPECT_TRUE(contains(j["error"]["message"].get<std::string>(), "UTF-8")) << r->body;
  }
  // Still serving.
  auto ok =
      client(s->port).Post("/v1/completions", greedy_body("fine", 2).dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST_F(HttpHardening, HugePromptsAreRejectedByTheirSizeBeforeTokenizing) {
  auto s = stack();
  const size_t bound = prompt_byte_bound(*tok_, 128);
  const std::string huge(std::max<size_t>(bound + 1, 1 << 20), 'a');
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    const json body = std::string(path) == "/v1/completions"
                          ? json{{"prompt", huge}}
                          : json{{"messages", {{{"role", "user"}, {"content", huge}}}}};
    auto r = client(s->port).Post(path, body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["error"]["param"], std::string(path) == "/v1/completions" ? "prompt" : "messages");
    EXPECT_TRUE(contains(j["error"]["message"].get<std::string>(),
                         "over " + std::to_string(bound) + " bytes"))
        << r->body;
  }
  // A token-id prompt longer than the context is refused while parsing, too.
  json ids = json::array();
  for (int i = 0; i < 200; ++i) ids.push_back(5);
  auto r =
      client(s->port).Post("/v1/completions", json{{"prompt", ids}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
}

TEST_F(HttpHardening, SlowClientsAreCutAndDoNotStarveOthers) {
  HttpOptions http;
  http.header_timeout_s = 1.5;
  auto s = stack(config(), http);
  // 64 clients that send one header line at a time, slowly (a slowloris).
  std::vector<std::unique_ptr<RawClient>> slow;
  for (int i = 0; i < 64; ++i) {
    slow.push_back(std::make_unique<RawClient>(s->port));
    ASSERT_TRUE(slow.back()->connected());
    slow.back()->send("GET /health HTTP/1.1\r\n");
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (int round = 0; round < 20 && !stop; ++round) {
      for (auto& c : slow) c->send("X-Slow: " + std::to_string(round) + "\r\n");
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  });
  // Meanwhile everyone else is served.
  for (int i = 0; i < 10; ++i) {
    auto h = client(s->port).Get("/health");
    ASSERT_TRUE(h) << httplib::to_string(h.error());
    EXPECT_EQ(h->status, 200);
  }
  // Each slow client is cut (closed) once its header deadline passes, while it is still
  // sending.
  const std::string answer = slow[0]->read();
  stop = true;
  trickle.join();
  EXPECT_EQ(answer, "");
  EXPECT_TRUE(slow[0]->saw_eof());
  auto m = client(s->port).Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_TRUE(contains(m->body, "hyperion_http_timeouts_total")) << m->body;
}

TEST_F(HttpHardening, ConnectionsOverTheCapGet503) {
  HttpOptions http;
  http.max_connections = 3;
  auto s = stack(config(), http);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<RawClient>(s->port));
    held.back()->send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(status_of(held.back()->read("\r\n\r\n")), 200);  // keep-alive: stays open
  }
  RawClient over(s->port);
  const std::string refused = over.read();
  EXPECT_EQ(status_of(refused), 503) << refused;
  EXPECT_TRUE(contains(refused, "max_connections=3")) << refused;
  held.clear();  // closing frees the places (polled: the server notices asynchronously)
  EXPECT_EQ(health_once_a_place_frees(s->port), 200);
}

TEST_F(HttpHardening, APortInUseIsRefusedByName) {
  auto s = stack();
  try {
    check_port_available("127.0.0.1", s->port);
    ADD_FAILURE() << "a port in use was reported free";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "in use")) << e.what();
    EXPECT_TRUE(contains(e.what(), std::to_string(s->port))) << e.what();
  }
  EngineConfig ec = config();
  Engine engine(*params_, tok_, ec);
  AsyncEngine async(engine);
  HttpServer second(async, ApiContext{});
  EXPECT_THROW(second.bind("127.0.0.1", s->port), Error);
}

TEST_F(HttpHardening, PipelinedRequestsAreAnsweredInOrder) {
  auto s = stack();
  RawClient c(s->port);
  const std::string completion = greedy_body("Pipelines", 3).dump();
  c.send(
      "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(completion.size()) + "\r\n\r\n" + completion +
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string all = c.read();
  EXPECT_EQ(RawClient::occurrences(all, "HTTP/1.1 200 OK"), 3) << all;
  const size_t health = all.find("\"status\":\"ok\"");
  const size_t text = all.find("text_completion");
  const size_t models = all.find("max_model_len");
  ASSERT_NE(health, std::string::npos);
  ASSERT_NE(text, std::string::npos);
  ASSERT_NE(models, std::string::npos);
  EXPECT_LT(health, text);
  EXPECT_LT(text, models);
  EXPECT_TRUE(c.saw_eof());
}

TEST_F(HttpHardening, MalformedHttpGetsTheRightStatus) {
  auto s = stack();
  auto raw = [&](const std::string& request) {
    RawClient c(s->port);
    c.send(request);
    return c.read();
  };
  // Conflicting Content-Length headers: 400 (request smuggling otherwise).
  std::string r =
      raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
          "Content-Length: 14\r\n\r\n{}");
  EXPECT_EQ(status_of(r), 400) << r;
  // A negative or non-numeric length: 400, not 413.
  r = raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n");
  EXPECT_EQ(status_of(r), 400) << r;
  r = raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n");
  EXPECT_EQ(status_of(r), 400) << r;
  // A body over 8 MiB announced by its length: 413.
  r = raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n");
  EXPECT_EQ(status_of(r), 413) << r;
  // Headers over 16 KiB: 431.
  r = raw("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'b') + "\r\n\r\n");
  EXPECT_EQ(status_of(r), 431) << r;
  // Not HTTP at all.
  r = raw("HELLO THERE\r\n\r\n");
  EXPECT_EQ(status_of(r), 400) << r;
  // A wrong method on a real route: 405 with Allow; an unknown route: 404.
  r = raw("DELETE /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(status_of(r), 405) << r;
  EXPECT_TRUE(contains(r, "Allow: POST\r\n")) << r;
  r = raw("POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(status_of(r), 405) << r;
  EXPECT_TRUE(contains(r, "Allow: GET\r\n")) << r;
  r = raw("GET /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(status_of(r), 404) << r;
  // A chunked request body is read like any other.
  const std::string body = greedy_body("Chunks", 2).dump();
  r =
      raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: "
          "chunked\r\n\r\n" +
          fmt::format("{:x}\r\n{}\r\n0\r\n\r\n", body.size(), body));
  EXPECT_EQ(status_of(r), 200) << r;
  auto m = client(s->port).Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_TRUE(contains(m->body, "hyperion_http_bad_requests_total")) << m->body;
}

TEST_F(HttpHardening, DrainFinishesRunningRequestsWithinTheGracePeriod) {
  auto s = stack();
  s->async.set_step_delay(std::chrono::milliseconds(20));
  json b = greedy_body("Drain me gently", 4);
  b["stream"] = true;
  std::string body;
  std::thread request([&] {
    auto r = client(s->port).Post("/v1/completions", b.dump(), "application/json");
    if (r) body = r->body;
  });
  // Wait until it runs, then drain with a generous grace period.
  for (int i = 0; i < 2000 && s->async.outstanding() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(s->server->drain(60), 0);  // returns as soon as the request is done
  request.join();
  bool done = false;
  const auto events = sse_events(body, &done);
  EXPECT_TRUE(done);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
  // No new connections once drained.
  RawClient late(s->port);
  EXPECT_FALSE(late.connected() && status_of(late.read()) == 200);
}

TEST_F(HttpHardening, DrainEndsStreamsPastTheGracePeriodWithAnErrorAndDone) {
  auto s = stack();
  s->async.set_step_delay(std::chrono::milliseconds(200));
  json b = greedy_body("This one will not finish", 100);
  b["stream"] = true;
  std::string body;
  int status = 0;
  std::thread request([&] {
    auto r = client(s->port).Post("/v1/completions", b.dump(), "application/json");
    if (r) {
      body = r->body;
      status = r->status;
    }
  });
  for (int i = 0; i < 2000 && s->async.outstanding() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Meanwhile an idle keep-alive connection is closed, not left hanging.
  RawClient idle(s->port);
  idle.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(status_of(idle.read("\r\n\r\n")), 200);
  EXPECT_EQ(s->server->drain(0.3), 1);
  request.join();
  EXPECT_EQ(status, 200);
  bool done = false;
  const auto events = sse_events(body, &done);
  EXPECT_TRUE(done) << body;
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.back().contains("error")) << body;
  EXPECT_TRUE(contains(events.back()["error"]["message"].get<std::string>(), "shutting down"));
  idle.read();
  EXPECT_TRUE(idle.saw_eof());
}

// A connection that never sends a byte is cut at the head deadline, counted from the
// accept, not kept for the idle keep-alive timeout (1024 of them would hold every
// connection place, /health answering 503, for that long). Between requests on a
// kept-alive connection the idle timeout still applies.
TEST_F(HttpHardening, SilentConnectionsAreCutAtTheHeadDeadline) {
  HttpOptions http;
  http.header_timeout_s = 1;
  http.idle_timeout_s = 600;
  http.max_connections = 2;
  auto s = stack(config(), http);
  RawClient kept(s->port);
  kept.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(status_of(kept.read("\r\n\r\n")), 200);
  // With `kept`, this one takes the last place.
  RawClient silent(s->port, /*timeout_s=*/10);  // a liveness bound: 10x the deadline
  ASSERT_TRUE(silent.connected());
  EXPECT_EQ(silent.read(), "");
  EXPECT_TRUE(silent.saw_eof());
  // Its place is free again (polled: the server notices asynchronously).
  EXPECT_EQ(health_once_a_place_frees(s->port), 200);
  // `kept`, idle for longer than the head deadline by now, still serves.
  kept.send("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(status_of(kept.read()), 200);
}

// Sends `request` on a fresh connection, shuts the sending side (shutdown(SHUT_WR), as
// `nc -N` does after its input), and reads until the server closes or 20 s pass (a
// liveness bound, not a timing assertion). *eof: whether the server closed.
std::string send_and_half_close(int port, const std::string& request, bool* eof) {
  *eof = false;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{};
  tv.tv_sec = 20;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    size_t done = 0;
    while (done < request.size()) {
      const ssize_t n = ::send(fd, request.data() + done, request.size() - done, MSG_NOSIGNAL);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    if (done == request.size() && ::shutdown(fd, SHUT_WR) == 0) {
      char buf[4096];
      for (;;) {
        const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) {
          *eof = n == 0;
          break;
        }
        out.append(buf, static_cast<size_t>(n));
      }
    }
  }
  ::close(fd);
  return out;
}

// A client that sends a whole request and then half-closes (EOF on the server's read
// side) is still reading: it gets its answer, then the server closes. Before, the EOF
// was taken for a client gone and the request was cancelled with no reply.
TEST_F(HttpHardening, HalfClosedClientStillGetsItsAnswer) {
  auto s = stack();
  const std::string completion = greedy_body("Half closed", 4).dump();
  bool eof = false;
  const std::string reply = send_and_half_close(
      s->port,
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
          std::to_string(completion.size()) + "\r\n\r\n" + completion,
      &eof);
  EXPECT_EQ(status_of(reply), 200) << reply;
  EXPECT_TRUE(eof) << "the connection stays open after the reply to a half-closed client";
  const size_t head_end = reply.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << reply;
  const json body = json::parse(reply.substr(head_end + 4), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(body.is_object()) << reply;
  ASSERT_TRUE(body.contains("choices")) << reply;
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length") << reply;
  EXPECT_EQ(body["usage"]["completion_tokens"], 4) << reply;

  // The same for a request answered at once.
  const std::string health =
      send_and_half_close(s->port, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", &eof);
  EXPECT_EQ(status_of(health), 200) << health;
  EXPECT_TRUE(contains(health, "\"status\":\"ok\"")) << health;
  EXPECT_TRUE(eof);

  // A streamed reply, too: every token and [DONE].
  json streamed = greedy_body("Half closed stream", 4);
  streamed["stream"] = true;
  const std::string sb = streamed.dump();
  const std::string stream = send_and_half_close(
      s->port,
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
          std::to_string(sb.size()) + "\r\n\r\n" + sb,
      &eof);
  EXPECT_EQ(status_of(stream), 200) << stream;
  EXPECT_TRUE(contains(stream, "data: [DONE]")) << stream;
  EXPECT_TRUE(eof);
}

// Out of file descriptors (EMFILE), accept fails until some are freed: the server
// retries after a pause and warns once, instead of spinning on accept and flooding the
// log, and takes the waiting connection once it can.
TEST_F(HttpHardening, AcceptFailuresBackOffAndWarnOnce) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizer runtimes open files of their own (/proc/self/maps) from any thread; out
  // of descriptors they die with exit status 1, reporting into the redirected stderr.
  // The release suite runs this test.
  GTEST_SKIP() << "needs a process with no sanitizer runtime";
#endif
  auto s = stack();
  // The client's socket exists before the limit drops; connect() needs no descriptor.
  RawClient c(s->port, 20, /*connect_now=*/false);
  testing_util::TempDir dir;
  const int log_fd = ::open(dir.file("stderr").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(log_fd, 0);
  rlimit saved_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved_limit), 0);
  const int saved_stderr = ::dup(STDERR_FILENO);
  ASSERT_GE(saved_stderr, 0);
  const LogLevel saved_level = log_level();
  auto logged = [&] {
    std::string text(1 << 20, '\0');
    const ssize_t n = ::pread(log_fd, text.data(), text.size(), 0);
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return text;
  };
  {
    // Undone on every way out, a failed assertion included.
    struct Restore {
      rlimit limit;
      int stderr_copy;
      LogLevel level;
      ~Restore() {
        ::setrlimit(RLIMIT_NOFILE, &limit);
        ::dup2(stderr_copy, STDERR_FILENO);
        ::close(stderr_copy);
        set_log_level(level);
      }
    } restore{saved_limit, saved_stderr, saved_level};
    ::dup2(log_fd, STDERR_FILENO);  // the server's log, read back below
    if (saved_level > LogLevel::kWarn) set_log_level(LogLevel::kWarn);
    // The lowest free descriptor number becomes the limit: no new one can be opened.
    const int lowest_free = ::fcntl(log_fd, F_DUPFD, 0);
    ASSERT_GE(lowest_free, 0);
    ::close(lowest_free);
    rlimit low = saved_limit;
    low.rlim_cur = static_cast<rlim_t>(lowest_free);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    ASSERT_TRUE(c.connect());  // completed by the kernel; the server cannot accept it
    for (int i = 0; i < 1000 && !contains(logged(), "accept failed"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    // A server that spins on accept logs thousands of failures meanwhile.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const std::string text = logged();
  ::close(log_fd);
  EXPECT_EQ(RawClient::occurrences(text, "accept failed"), 1) << text.substr(0, 2000);
  EXPECT_TRUE(contains(text, "Too many open files")) << text.substr(0, 2000);
  // Descriptors are back: the waiting connection is accepted and served.
  c.send("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(status_of(c.read()), 200);
}

// A token callback that throws (the HTTP layer out of memory, say) ends only its own
// request, which gets exactly one last event and gives its admission back; the
// engine's other requests finish normally.
TEST_F(HttpHardening, AThrowingTokenCallbackEndsOnlyItsRequest) {
  auto s = stack(config(4, 4));
  s->async.set_paused(true);  // all three start in the same step
  auto request = [](int64_t max_tokens) {
    GenerationRequest r;
    r.prompt = {1, 5, 6, 7};
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  };
  struct Seen {
    std::atomic<int> finals{0};
    std::atomic<FinishReason> last{FinishReason::kNone};
    void take(const TokenEvent& ev) {
      if (ev.finish == FinishReason::kNone) return;
      last = ev.finish;
      ++finals;
    }
  };
  Seen a, b, d;
  // `a` throws on its first token, `b` when its answer is complete.
  std::atomic<bool> a_threw{false};
  s->async.submit(request(6), [&](const TokenEvent& ev) {
    a.take(ev);
    if (ev.finish == FinishReason::kNone && !a_threw.exchange(true)) throw std::bad_alloc();
  });
  s->async.submit(request(2), [&](const TokenEvent& ev) {
    b.take(ev);
    if (ev.finish == FinishReason::kLength) throw std::bad_alloc();
  });
  s->async.submit(request(8), [&](const TokenEvent& ev) { d.take(ev); });
  s->async.set_paused(false);
  for (int i = 0; i < 2000 && (a.finals == 0 || b.finals == 0 || d.finals == 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(d.last.load(), FinishReason::kLength);  // not failed with the others
  EXPECT_EQ(a.last.load(), FinishReason::kAbort);   // ended at once
  EXPECT_EQ(b.last.load(), FinishReason::kLength);
  for (int i = 0; i < 2000 && s->async.outstanding() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(s->async.outstanding(), 0);
  EXPECT_EQ(a.finals.load(), 1);
  EXPECT_EQ(b.finals.load(), 1);
  EXPECT_EQ(d.finals.load(), 1);
  // Still serving.
  auto ok =
      client(s->port).Post("/v1/completions", greedy_body("after", 2).dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// drain() has the I/O threads close the acceptor; a server whose I/O never ran that
// (drained before run(), or stopped first) is still destroyed when it goes, its
// listening socket with it.
TEST_F(HttpHardening, ADrainedServerIsFreedEvenIfItsIoNeverRan) {
  Engine engine(*params_, tok_, config());
  AsyncEngine async(engine);
  int port = 0;
  {
    HttpServer server(async, ApiContext{});
    port = server.bind("127.0.0.1", 0);
    EXPECT_EQ(server.drain(0), 0);
  }
  EXPECT_NO_THROW(check_port_available("127.0.0.1", port));
}

}  // namespace
}  // namespace hyperion::serve
