#include "serve/http_server.h"

#include <sys/resource.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <span>
#include <thread>

#include "base/log.h"
#include "serve/http_connection.h"
#include "serve/image_api.h"
#include "serve/metrics.h"

namespace hyperion::serve {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// Wait before accepting again after accept failed (out of file descriptors, say): the
// connection stays in the backlog, so an immediate retry fails at once, a busy loop.
constexpr std::chrono::milliseconds kAcceptRetry{100};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

ApiError make_error(int status, const std::string& message, const std::string& param = "",
                    const std::string& type = "") {
  ApiError e;
  e.status = status;
  e.message = message;
  e.param = param;
  if (!type.empty())
    e.type = type;
  else if (status == 429)
    e.type = "rate_limit_error";
  else if (status >= 500)
    e.type = "server_error";
  return e;
}

// Latency of one request, recorded on the engine thread (counted even when the client
// has gone).
struct Tracker {
  Clock::time_point arrival = Clock::now();
  Clock::time_point first{};
  int64_t tokens = 0;
};

// One generation request's state on its connection's strand.
struct Generation {
  ApiRequest api;
  Completion completion;
  bool first = true;
  std::atomic<int64_t> request_id{0};  // the engine's, once submit() returned it
  // A chat stream whose reply is parsed into tool calls (serve/tool_calls.h).
  std::unique_ptr<ToolCallStream> tools;
};

struct Route {
  const char* path;
  http::verb method;
};
constexpr Route kRoutes[] = {
    {"/v1/completions", http::verb::post}, {"/v1/chat/completions", http::verb::post},
    {"/v1/models", http::verb::get},       {"/tokenize", http::verb::post},
    {"/detokenize", http::verb::post},     {"/health", http::verb::get},
    {"/metrics", http::verb::get},         {"/v1/load_lora_adapter", http::verb::post},
    {"/v1/unload_lora_adapter", http::verb::post}};
constexpr Route kImageRoutes[] = {{"/v1/images/generations", http::verb::post},
                                  {"/v1/models", http::verb::get},
                                  {"/health", http::verb::get},
                                  {"/metrics", http::verb::get}};

}  // namespace

struct HttpServer::Impl : HttpApplication {
  Impl(AsyncEngine* e, ImageEngine* i, ApiContext c, HttpOptions o)
      : engine(e), images(i), ctx(std::move(c)), options(o), metrics_(registry) {
    limits.header_timeout_s = o.header_timeout_s;
    limits.request_timeout_s = o.request_timeout_s;
    limits.idle_timeout_s = o.idle_timeout_s;
    limits.write_timeout_s = o.write_timeout_s;
    if (engine) engine->set_round_listener([this] { deliver_round(); });
    if (images) image_metrics_.emplace(registry);
  }

  // Exactly one of the two: a text engine or an image engine.
  AsyncEngine* engine;
  ImageEngine* images;
  ApiContext ctx;
  HttpOptions options;
  HttpLimits limits;
  MetricsRegistry registry;
  ServerMetrics metrics_;
  std::optional<ImageMetrics> image_metrics_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> connections{0};
  std::mutex mu;  // guards: live, active, next_completion; metrics sync at scrape
  std::condition_variable idle_cv;
  std::vector<std::weak_ptr<HttpConnection>> live;
  int64_t active = 0;  // generation requests not yet answered
  int64_t next_completion = 1;
  int64_t accept_failures = 0;  // in a row (on accept_strand)
  // Last, so destroyed first: handlers still queued hold connections, whose destructors
  // use the members above. The hint is the number of threads that run it (1 would tell
  // Asio it is single-threaded).
  net::io_context ioc{std::max(1, options.io_threads)};
  // The acceptor, its retry timer and drain's close of it run on any I/O thread; neither
  // object may be used from two at once, so they share a strand.
  net::strand<net::io_context::executor_type> accept_strand{ioc.get_executor()};
  net::strand<net::io_context::executor_type> delivery_strand{ioc.get_executor()};
  tcp::acceptor acceptor{accept_strand};
  net::steady_timer accept_retry{accept_strand};
  // Token events queued by the engine's callbacks, handed on once per engine round
  // (deliver_round). After the io_context, so destroyed before it.
  struct Delivery {
    std::shared_ptr<HttpConnection> conn;
    std::shared_ptr<Generation> gen;
    TokenEvent ev;
  };
  std::mutex outbox_mu;  // guards: outbox, drain_posted
  std::vector<Delivery> outbox;
  bool drain_posted = false;  // a drain_outbox is queued on delivery_strand

  // HttpApplication.
  bool draining() const override { return draining_.load(); }
  ServerMetrics& metrics() override { return metrics_; }
  void connection_closed() override {
    const int64_t left = --connections;
    metrics_.http_connections.set(double(left));
    std::lock_guard<std::mutex> lock(mu);
    idle_cv.notify_all();
  }

  // (Handlers capture `this`, not a shared pointer: the io_context is a member, so a
  // handler still queued when the server goes is destroyed with it, never run, and a
  // shared pointer in it would keep the server alive forever.)
  void accept() {
    acceptor.async_accept(
        net::make_strand(ioc), [this](boost::system::error_code ec, tcp::socket s) {
          if (!ec) {
            if (accept_failures > 0)
              log_info("serve: accepting connections again (after {} failed attempts)",
                       accept_failures);
            accept_failures = 0;
            admit(std::move(s));
            return accept();
          }
          if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
          // E.g. out of file descriptors: back off instead of spinning, and warn once per
          // burst, not per attempt.
          if (accept_failures++ == 0)
            log_warn("serve: accept failed: {} (retrying every {} ms)", ec.message(),
                     kAcceptRetry.count());
          accept_retry.expires_after(kAcceptRetry);
          accept_retry.async_wait([this](boost::system::error_code e) {
            if (!e && acceptor.is_open()) accept();
          });
        });
  }

  void admit(tcp::socket socket) {
    if (connections.load() >= options.max_connections) {
      // Over the cap: say so and close, instead of letting the client wait in a backlog.
      metrics_.http_connections_rejected.inc();
      auto sock = std::make_shared<tcp::socket>(std::move(socket));
      auto msg = std::make_shared<std::string>(
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: "
          "close\r\nRetry-After: 1\r\n");
      const std::string body = error_body(make_error(
          503, fmt::format("too many connections (max_connections={})", options.max_connections)));
      *msg += fmt::format("Content-Length: {}\r\n\r\n{}", body.size(), body);
      net::async_write(*sock, net::buffer(*msg), [sock, msg](boost::system::error_code, size_t) {
        boost::system::error_code ignored;
        sock->shutdown(tcp::socket::shutdown_both, ignored);
      });
      return;
    }
    metrics_.http_connections.set(double(++connections));
    auto conn = std::make_shared<HttpConnection>(std::move(socket), *this, limits);
    {
      std::lock_guard<std::mutex> lock(mu);
      std::erase_if(live, [](const std::weak_ptr<HttpConnection>& w) { return w.expired(); });
      live.push_back(conn);
    }
    conn->start();
  }

  void handle(const std::shared_ptr<HttpConnection>& conn, HttpRequest req) override {
    std::string path(req.target());
    if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
    std::string allow;
    bool found = false;
    for (const Route& r : images ? std::span<const Route>(kImageRoutes) : std::span<const Route>(kRoutes)) {
      if (path != r.path) continue;
      found = true;
      if (r.method == req.method()) {
        allow.clear();
        break;
      }
      allow = std::string(http::to_string(r.method));
    }
    if (!found)
      return send_error(
          *conn,
          make_error(404,
                     fmt::format("no route {} {}{}", std::string(req.method_string()), path,
                                 images ? " (this server serves an image model: POST /v1/images/generations)"
                                        : ""),
                     "", "not_found_error"));
    if (!allow.empty())
      return send_error(*conn,
                        make_error(405,
                                   fmt::format("{} does not accept {} (allowed: {})", path,
                                               std::string(req.method_string()), allow),
                                   "", "invalid_request_error"),
                        {{"Allow", allow}});
    if (draining()) {
      metrics_.rejected_draining.inc();
      return send_error(*conn, make_error(503, "the server is shutting down"), {}, true);
    }
    if (path == "/health") return conn->respond(200, "application/json", "{\"status\":\"ok\"}");
    if (path == "/metrics")
      return conn->respond(200, "text/plain; version=0.0.4; charset=utf-8", render_metrics());
    if (path == "/v1/models") return conn->respond(200, "application/json", models_json());
    if (path == "/tokenize" || path == "/detokenize") {
      try {
        return conn->respond(200, "application/json",
                             path == "/tokenize" ? tokenize_response(req.body(), ctx)
                                                 : detokenize_response(req.body(), ctx));
      } catch (const ApiException& e) {
        return send_error(*conn, e.error);
      } catch (const std::exception& e) {
        return send_error(*conn, make_error(400, e.what()));
      }
    }
    if (path == "/v1/images/generations") return handle_images(conn, req.body());
    if (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter")
      return handle_lora(*conn, req.body(), path == "/v1/load_lora_adapter");
    handle_generate(conn, req.body(), path == "/v1/chat/completions");
  }

  void send_error(HttpConnection& conn, const ApiError& e, const HttpHeaders& extra = {},
                  bool close = false) {
    conn.respond(e.status, "application/json", error_body(e), extra, close);
  }

  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter (allow_runtime_lora=true). The
  // adapter is read here, on this I/O thread (the files, then the checks against the base),
  // and installed on the engine thread between two steps: running requests never wait for
  // the disk, and a failed load changes nothing.
  void handle_lora(HttpConnection& conn, const std::string& body, bool load) {
    const EngineConfig& c = engine->engine().config();
    if (!c.allow_runtime_lora || !ctx.read_adapter)
      return send_error(conn, make_error(403,
                                         fmt::format("{} LoRA adapters at run time is off; start the server with "
                                                     "allow_runtime_lora=true",
                                                     load ? "loading" : "unloading"),
                                         "", "permission_error"));
    try {
      const LoraAdapterRequest r = parse_lora_adapter_request(body, load);
      if (!load) {
        bool found = false;
        engine->call([&](Engine& e) { found = e.unload_adapter(r.name); });
        if (!found)
          return send_error(conn, make_error(404, fmt::format("the LoRA adapter '{}' is not loaded", r.name),
                                             "lora_name", "not_found_error"));
        log_info("serve: LoRA adapter '{}' unloaded", r.name);
        return conn.respond(200, "text/plain; charset=utf-8",
                            fmt::format("Success: LoRA adapter '{}' removed successfully.", r.name));
      }
      if (r.name == ctx.model_name)
        throw RequestError("lora_name", fmt::format("'{}' is the base model's name", r.name));
      if (ctx.adapters != nullptr && ctx.adapters->find(r.name))
        throw RequestError("lora_name", fmt::format("the LoRA adapter '{}' is already loaded", r.name));
      std::unique_ptr<LoraAdapter> adapter;
      try {
        adapter = ctx.read_adapter(r.path);
      } catch (const std::exception& e) {
        throw RequestError("lora_path", e.what());
      }
      engine->call([&](Engine& e) { e.load_adapter(r.name, r.path, *adapter); });
      log_info("serve: LoRA adapter '{}' loaded from {} (rank {})", r.name, r.path, adapter->rank());
      return conn.respond(200, "text/plain; charset=utf-8",
                          fmt::format("Success: LoRA adapter '{}' added successfully.", r.name));
    } catch (const ApiException& e) {
      return send_error(conn, e.error);
    } catch (const RequestError& e) {
      return send_error(conn, make_error(400, e.what(), e.param));
    } catch (const ShuttingDownError& e) {
      return send_error(conn, make_error(503, e.what()));
    } catch (const std::exception& e) {
      return send_error(conn, make_error(500, e.what()));
    }
  }

  std::string models_json() {
    nlohmann::json m = {{"id", ctx.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "hyperion"}};
    if (images) {
      const int64_t side = images->pipeline().default_size();
      m["default_size"] = fmt::format("{}x{}", side, side);
      m["max_image_side"] = diffusion::kMaxImageSide;
      m["max_batch_images"] = images->config().max_batch_images;
    } else {
      m["max_model_len"] = engine->engine().config().max_seq_len;
    }
    nlohmann::json data = nlohmann::json::array({m});
    if (ctx.adapters != nullptr)  // vLLM's shape: an adapter's root is its path, its parent the base
      for (const LoraRef& a : ctx.adapters->list())
        data.push_back({{"id", a->name},
                        {"object", "model"},
                        {"created", 0},
                        {"owned_by", "hyperion"},
                        {"root", a->path},
                        {"parent", ctx.model_name},
                        {"max_model_len", m["max_model_len"]}});
    return nlohmann::json({{"object", "list"}, {"data", data}})
        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

  std::string render_metrics() {
    std::lock_guard<std::mutex> lock(mu);
    if (images) return render_image_metrics();
    const EngineStats st = engine->stats();
    ServerMetrics& m = metrics_;
    m.requests_running.set(double(st.running));
    m.requests_waiting.set(double(st.waiting));
    m.slots_used.set(double(st.running));
    m.slots_total.set(double(st.slots_total));
    m.kv_pages_used.set(double(st.pages_used));
    m.kv_pages_free.set(double(st.pages_free));
    m.kv_pages_cached.set(double(st.pages_cached));
    m.kv_pages_total.set(double(st.pages_total));
    m.prefix_cache_hit_rate.set(
        st.prefix_queries > 0 ? double(st.prefix_hits) / double(st.prefix_queries) : 0.0);
    sync(m.prefix_cache_queries, st.prefix_queries);
    sync(m.prefix_cache_hits, st.prefix_hits);
    sync(m.prompt_tokens, st.prompt_tokens);
    sync(m.generation_tokens, st.generated_tokens);
    sync(m.decode_steps, st.decode_steps);
    sync(m.prefill_steps, st.prefill_steps);
    sync(m.decode_step_seconds, st.decode_step_seconds);
    sync(m.prefill_step_seconds, st.prefill_step_seconds);
    sync(m.forward_seconds, st.forward_seconds);
    sync(m.grammar_seconds, st.grammar_seconds);
    return registry.render();
  }

  static void sync(Counter& c, double total) {
    const double delta = total - c.value();
    if (delta > 0) c.inc(delta);
  }

  std::string render_image_metrics() {
    const ImageEngineStats st = images->stats();
    metrics_.requests_running.set(double(st.running));
    metrics_.requests_waiting.set(double(st.waiting));
    ImageMetrics& m = *image_metrics_;
    m.images_running.set(double(st.running_images));
    sync(m.images_generated, double(st.images_generated));
    sync(m.steps, double(st.unet_steps));
    sync(m.step_images, double(st.unet_step_images));
    sync(m.step_seconds, st.step_seconds);
    sync(m.encode_seconds, st.encode_seconds);
    sync(m.decode_seconds, st.decode_seconds);
    return registry.render();
  }

  // POST /v1/images/generations: checked here, run by the image engine, answered (PNG
  // and base64 encoding) on the connection's strand.
  void handle_images(const std::shared_ptr<HttpConnection>& conn, const std::string& body) {
    diffusion::ImageRequest request;
    try {
      request = parse_image_request(body, ctx);
    } catch (const ApiException& e) {
      metrics_.rejected_invalid.inc();
      return send_error(*conn, e.error);
    }
    const uint64_t seed = request.seed;
    const auto arrival = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mu);
      ++active;  // before submit: the result may arrive before submit returns
    }
    int64_t id = 0;
    try {
      id = images->submit(std::move(request), [this, conn, seed, arrival](ImageResult&& result) {
        // Engine thread: metrics, then the rest on the connection's strand.
        metrics_.e2e.observe(seconds_since(arrival));
        metrics_.finished(result.cancelled ? "abort" : !result.error.empty() ? "error" : "stop").inc();
        if (!result.cancelled && result.error.empty()) image_metrics_->queue.observe(result.queue_seconds);
        auto shared = std::make_shared<ImageResult>(std::move(result));
        try {
          conn->post([this, conn, shared, seed] { answer_images(*conn, *shared, seed); });
        } catch (...) {
          request_done();  // out of memory: the client gets nothing, drain must not wait
        }
      });
    } catch (const RequestError& e) {
      request_done();
      metrics_.rejected_invalid.inc();
      return send_error(*conn, make_error(400, e.what(), e.param));
    } catch (const QueueFullError& e) {
      request_done();
      metrics_.rejected_queue_full.inc();
      return send_error(*conn, make_error(429, e.what()), {{"Retry-After", "1"}});
    } catch (const std::exception& e) {
      request_done();
      return send_error(*conn, make_error(503, e.what()));
    }
    // A client that goes away stops its images at the engine's next step.
    conn->set_cancel_hook([this, id] { images->cancel(id); });
  }

  void answer_images(HttpConnection& conn, const ImageResult& result, uint64_t seed) {
    request_done();
    if (result.cancelled) return send_error(conn, make_error(503, "the request was cancelled"));
    if (!result.error.empty()) {
      const bool shutting = result.error.find("shutting down") != std::string::npos;
      return send_error(conn, make_error(shutting ? 503 : 500,
                                         shutting ? result.error : "image generation failed: " + result.error));
    }
    try {
      const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
      conn.respond(200, "application/json", image_response(result.images, seed, created));
    } catch (const std::exception& e) {
      send_error(conn, make_error(500, fmt::format("encoding the images failed: {}", e.what())));
    }
  }

  // Records latency metrics for one event (engine thread).
  void observe(Tracker& t, const TokenEvent& ev) {
    if (ev.token >= 0) {
      if (t.tokens == 0) {
        t.first = Clock::now();
        metrics_.ttft.observe(std::chrono::duration<double>(t.first - t.arrival).count());
      }
      ++t.tokens;
    }
    if (ev.finish == FinishReason::kNone) return;
    metrics_.e2e.observe(seconds_since(t.arrival));
    if (t.tokens >= 2)
      metrics_.tpot.observe(std::chrono::duration<double>(Clock::now() - t.first).count() /
                            double(t.tokens - 1));
    metrics_.finished(finish_reason_name(ev.finish)).inc();
  }

  void handle_generate(const std::shared_ptr<HttpConnection>& conn, const std::string& body,
                       bool chat) {
    auto gen = std::make_shared<Generation>();
    try {
      gen->api = chat ? parse_chat_request(body, ctx) : parse_completion_request(body, ctx);
      if (gen->api.stream && gen->api.tools.parse)
        gen->tools = std::make_unique<ToolCallStream>(gen->api.tools.syntax, gen->api.tools.names);
    } catch (const ApiException& e) {
      metrics_.rejected_invalid.inc();
      return send_error(*conn, e.error);
    } catch (const std::exception& e) {
      metrics_.rejected_invalid.inc();
      return send_error(*conn, make_error(400, e.what()));
    }
    auto tracker = std::make_shared<Tracker>();
    int64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      ++active;  // before submit: the final event may arrive before submit returns
    }
    try {
      // Engine thread: record metrics, then hand the event to the connection's strand.
      id = engine->submit(gen->api.gen, [this, conn, gen, tracker](const TokenEvent& ev) {
        try {
          observe(*tracker, ev);
          std::lock_guard<std::mutex> lock(outbox_mu);
          outbox.push_back(Delivery{conn, gen, ev});
        } catch (...) {
          // The event is not queued (out of memory): see lost(). The engine ends a request
          // whose callback throws.
          if (ev.finish != FinishReason::kNone) request_done();
          throw;
        }
      });
    } catch (const std::exception& e) {
      request_done();
      if (const auto* r = dynamic_cast<const RequestError*>(&e)) {
        metrics_.rejected_invalid.inc();
        return send_error(*conn, make_error(400, r->what(), r->param));
      }
      if (dynamic_cast<const QueueFullError*>(&e) != nullptr) {
        metrics_.rejected_queue_full.inc();
        return send_error(*conn, make_error(429, e.what()), {{"Retry-After", "1"}});
      }
      return send_error(*conn, make_error(503, e.what()));
    }
    gen->request_id.store(id);
    {
      std::lock_guard<std::mutex> lock(mu);
      gen->completion.id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_completion++);
    }
    gen->completion.created = std::chrono::duration_cast<std::chrono::seconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
    // A client that goes away frees its slot and pages at the engine's next step.
    conn->set_cancel_hook([this, id] { engine->cancel(id); });
    if (gen->api.stream) conn->begin_stream("text/event-stream");
  }

  // Engine thread, after each round: one post wakes an I/O thread for all the events
  // queued so far. Drains run one at a time on the delivery strand, each taking the
  // events queued before it, so every connection gets its events in order whichever
  // I/O thread runs them.
  void deliver_round() {
    {
      std::lock_guard<std::mutex> lock(outbox_mu);
      if (outbox.empty() || drain_posted) return;
      drain_posted = true;
    }
    try {
      net::post(delivery_strand, [this] { drain_outbox(); });
    } catch (...) {
      // Out of memory: the events stay queued for the next round's try.
      std::lock_guard<std::mutex> lock(outbox_mu);
      drain_posted = false;
    }
  }

  // Delivery strand: each queued event to its connection's strand.
  void drain_outbox() {
    std::vector<Delivery> batch;
    {
      std::lock_guard<std::mutex> lock(outbox_mu);
      batch.swap(outbox);
      drain_posted = false;
    }
    for (Delivery& d : batch) {
      try {
        d.conn->post([this, d] { on_event(*d.conn, *d.gen, d.ev); });
      } catch (...) {
        lost(d);
      }
    }
  }

  // An event that cannot reach its connection (out of memory). A last one must still
  // count its request as done, or drain would wait its whole grace period for it; an
  // earlier one ends the request, whose reply would otherwise miss text.
  void lost(const Delivery& d) noexcept {
    try {
      if (d.ev.finish != FinishReason::kNone) return request_done();
      if (const int64_t id = d.gen->request_id.load()) engine->cancel(id);
    } catch (...) {
      // Nothing more can be done without memory; the request ends at its own pace.
    }
  }

  void request_done() {
    std::lock_guard<std::mutex> lock(mu);
    --active;
    idle_cv.notify_all();
  }

  // One token event on the connection's strand.
  void on_event(HttpConnection& conn, Generation& g, const TokenEvent& ev) {
    Completion& c = g.completion;
    if (ev.token >= 0) {
      c.tokens.push_back(ev.token);
      c.logprobs.push_back(ev.logprob);
      c.token_texts.push_back(ev.text);
    } else if (!ev.text.empty() && !c.token_texts.empty()) {
      c.token_texts.back() += ev.text;  // held-back text released at the end
    }
    c.text += ev.text;
    const bool last = ev.finish != FinishReason::kNone;
    if (last) {
      c.finish = ev.finish;
      c.prompt_tokens = ev.prompt_tokens;
      c.completion_tokens = ev.completion_tokens;
      c.cached_tokens = ev.cached_tokens;
      request_done();
    }
    const bool failed = ev.finish == FinishReason::kError || ev.finish == FinishReason::kAbort;
    const ApiError failure =
        ev.finish == FinishReason::kError
            ? make_error(ev.error.find("shutting down") != std::string::npos ? 503 : 500,
                         ev.error.find("shutting down") != std::string::npos
                             ? ev.error
                             : "generation failed: " + ev.error)
            : make_error(503, "the request was cancelled");
    if (!g.api.stream) {
      if (!last) return;
      if (failed) return send_error(conn, failure);
      return conn.respond(200, "application/json", completion_response(g.api, c, ctx));
    }
    std::string out;
    if (failed) {
      out = stream_error_event(failure);
    } else {
      out = g.tools ? stream_tool_event(g.api, c, ev, g.first, *g.tools, ctx)
                    : stream_token_event(g.api, c, ev, g.first, ctx);
      g.first = false;
    }
    if (last) {
      if (g.api.include_usage && !failed) out += stream_usage_event(g.api, c, ctx);
      out += kStreamDone;
    }
    conn.stream_write(std::move(out));
    if (last) conn.stream_end();
  }

  void stop_engine() {
    if (engine) engine->stop("the server is shutting down");
    if (images) images->stop("the server is shutting down");
  }

  std::vector<std::shared_ptr<HttpConnection>> live_connections() {
    std::vector<std::shared_ptr<HttpConnection>> out;
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& w : live)
      if (auto c = w.lock()) out.push_back(std::move(c));
    return out;
  }
};

HttpServer::HttpServer(AsyncEngine& engine, ApiContext context, HttpOptions options)
    : impl_(std::make_shared<Impl>(&engine, nullptr, std::move(context), options)) {}

HttpServer::HttpServer(ImageEngine& images, ApiContext context, HttpOptions options)
    : impl_(std::make_shared<Impl>(nullptr, &images, std::move(context), options)) {}

HttpServer::~HttpServer() {
  stop();
  // No engine callback may outlive the server: they hold its connections and metrics.
  if (impl_) {
    impl_->stop_engine();
    if (impl_->engine) impl_->engine->set_round_listener(nullptr);
  }
}

namespace {

void listen_on(tcp::acceptor& acceptor, const std::string& host, int port) {
  boost::system::error_code ec;
  tcp::resolver resolver(acceptor.get_executor());
  const auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  HYP_CHECK(!ec && !endpoints.empty(), "serve: cannot resolve --host '{}': {}", host, ec.message());
  const tcp::endpoint ep = endpoints.begin()->endpoint();
  acceptor.open(ep.protocol(), ec);
  HYP_CHECK(!ec, "serve: cannot open a socket for {}:{}: {}", host, port, ec.message());
  // SO_REUSEADDR only (restart while old connections sit in TIME_WAIT); never
  // SO_REUSEPORT, with which a second server would share the port and split requests.
  acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  acceptor.bind(ep, ec);
  if (ec == net::error::address_in_use)
    fail(
        "serve: cannot listen on {}:{}: the port is in use (another server is listening "
        "there; stop it or choose another --port)",
        host, port);
  HYP_CHECK(!ec, "serve: cannot listen on {}:{}: {}", host, port, ec.message());
  acceptor.listen(1024, ec);  // a burst of clients must not overflow a small backlog
  HYP_CHECK(!ec, "serve: cannot listen on {}:{}: {}", host, port, ec.message());
}

}  // namespace

void check_port_available(const std::string& host, int port) {
  net::io_context ioc;
  tcp::acceptor probe(ioc);
  listen_on(probe, host, port);
}

void raise_open_file_limit(int64_t wanted) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  if (lim.rlim_cur != RLIM_INFINITY && static_cast<int64_t>(lim.rlim_cur) >= wanted) return;
  const rlim_t target = lim.rlim_max == RLIM_INFINITY
                            ? static_cast<rlim_t>(wanted)
                            : std::min<rlim_t>(lim.rlim_max, static_cast<rlim_t>(wanted));
  if (target > lim.rlim_cur) {
    lim.rlim_cur = target;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (static_cast<int64_t>(target) < wanted)
    log_warn("serve: the open-file limit is {} (hard); fewer than {} connections will fit",
             static_cast<int64_t>(target), wanted);
}

int HttpServer::bind(const std::string& host, int port) {
  Impl& s = *impl_;
  listen_on(s.acceptor, host, port);
  return s.acceptor.local_endpoint().port();
}

void HttpServer::run() {
  Impl& s = *impl_;
  HYP_CHECK(s.acceptor.is_open(), "HttpServer::run: call bind() first");
  auto guard = net::make_work_guard(s.ioc);
  net::post(s.accept_strand, [&s] { s.accept(); });
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, s.options.io_threads); ++i)
    threads.emplace_back([&s] { s.ioc.run(); });
  s.ioc.run();
  for (auto& t : threads) t.join();
}

void HttpServer::stop() {
  if (impl_) impl_->ioc.stop();
}

int64_t HttpServer::drain(double grace_s) {
  auto s = impl_;
  s->draining_ = true;
  // A raw pointer: a shared one in a handler that never runs (the server stopped first)
  // would be a cycle through the io_context, leaking the server. A handler that runs
  // finds the server alive, since the io_context is part of it.
  Impl* impl = s.get();
  net::post(impl->accept_strand, [impl] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
    impl->accept_retry.cancel();
  });
  for (auto& c : s->live_connections()) c->close_when_idle();
  int64_t cut = 0;
  {
    std::unique_lock<std::mutex> lock(s->mu);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(grace_s));
    s->idle_cv.wait_until(lock, deadline, [&] { return s->active == 0; });
    cut = s->active;
  }
  if (cut > 0)
    log_warn("serve: drain: {} requests still running after {} s; ending them", cut, grace_s);
  // Ends whatever is left with an error event (streams also get [DONE]).
  s->stop_engine();
  {
    // Let those last replies reach their clients (bounded).
    std::unique_lock<std::mutex> lock(s->mu);
    s->idle_cv.wait_for(lock, std::chrono::seconds(5),
                        [&] { return s->active == 0 && s->connections.load() == 0; });
  }
  s->ioc.stop();
  return cut;
}

std::string HttpServer::metrics_text() {
  return impl_->render_metrics();
}

}  // namespace hyperion::serve
