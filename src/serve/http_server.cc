#include "serve/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "base/log.h"
#include "serve/metrics.h"

namespace hyperion::serve {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxBody = 8u << 20;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Token events of one request, handed from the engine thread to the HTTP thread. The
// engine-side callback also records the request's latency metrics, so they are counted
// even when the client has gone.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<TokenEvent> events;

  void push(const TokenEvent& e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
    }
    cv.notify_all();
  }
  // Waits up to `timeout` for an event.
  bool pop(TokenEvent& e, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, timeout, [&] { return !events.empty(); })) return false;
    e = std::move(events.front());
    events.pop_front();
    return true;
  }
};

struct Tracker {
  Clock::time_point arrival = Clock::now();
  Clock::time_point first{};
  int64_t tokens = 0;
};

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e), "application/json");
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

}  // namespace

struct HttpServer::Impl {
  Impl(AsyncEngine& e, ApiContext c) : engine(e), ctx(std::move(c)), metrics(registry) {}

  AsyncEngine& engine;
  ApiContext ctx;
  MetricsRegistry registry;
  ServerMetrics metrics;
  httplib::Server server;
  std::mutex metrics_mu;  // counters synced from engine totals at scrape time
  int64_t next_completion = 1;
  std::mutex id_mu;

  std::string completion_id(bool chat) {
    std::lock_guard<std::mutex> lock(id_mu);
    return fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_completion++);
  }

  std::string render_metrics() {
    std::lock_guard<std::mutex> lock(metrics_mu);
    const EngineStats st = engine.stats();
    ServerMetrics& m = metrics;
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
    auto sync = [](Counter& c, int64_t total) {
      const double delta = double(total) - c.value();
      if (delta > 0) c.inc(delta);
    };
    sync(m.prefix_cache_queries, st.prefix_queries);
    sync(m.prefix_cache_hits, st.prefix_hits);
    sync(m.prompt_tokens, st.prompt_tokens);
    sync(m.generation_tokens, st.generated_tokens);
    return registry.render();
  }

  // Records latency metrics for one event (engine thread).
  void observe(Tracker& t, const TokenEvent& ev) {
    if (ev.token >= 0) {
      if (t.tokens == 0) {
        t.first = Clock::now();
        metrics.ttft.observe(std::chrono::duration<double>(t.first - t.arrival).count());
      }
      ++t.tokens;
    }
    if (ev.finish == FinishReason::kNone) return;
    const double e2e = seconds_since(t.arrival);
    metrics.e2e.observe(e2e);
    if (t.tokens >= 2)
      metrics.tpot.observe(std::chrono::duration<double>(Clock::now() - t.first).count() /
                           double(t.tokens - 1));
    metrics.finished(finish_reason_name(ev.finish)).inc();
  }

  void handle_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    ApiRequest api;
    try {
      api = chat ? parse_chat_request(req.body, ctx) : parse_completion_request(req.body, ctx);
    } catch (const ApiException& e) {
      metrics.rejected_invalid.inc();
      return send_error(res, e.error);
    } catch (const std::exception& e) {
      metrics.rejected_invalid.inc();
      return send_error(res, make_error(400, e.what()));
    }
    auto channel = std::make_shared<Channel>();
    auto tracker = std::make_shared<Tracker>();
    int64_t id = 0;
    try {
      id = engine.submit(api.gen, [this, channel, tracker](const TokenEvent& ev) {
        observe(*tracker, ev);
        channel->push(ev);
      });
    } catch (const RequestError& e) {
      metrics.rejected_invalid.inc();
      return send_error(res, make_error(400, e.what(), e.param));
    } catch (const QueueFullError& e) {
      metrics.rejected_queue_full.inc();
      return send_error(res, make_error(429, e.what()));
    } catch (const Error& e) {
      return send_error(res, make_error(503, e.what()));
    }
    auto completion = std::make_shared<Completion>();
    completion->id = completion_id(chat);
    completion->created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
    auto absorb = [completion](const TokenEvent& ev) {
      if (ev.token >= 0) {
        completion->tokens.push_back(ev.token);
        completion->logprobs.push_back(ev.logprob);
      }
      completion->text += ev.text;
      if (ev.finish != FinishReason::kNone) {
        completion->finish = ev.finish;
        completion->prompt_tokens = ev.prompt_tokens;
        completion->completion_tokens = ev.completion_tokens;
        completion->cached_tokens = ev.cached_tokens;
      }
    };

    if (!api.stream) {
      TokenEvent ev;
      for (;;) {
        if (!channel->pop(ev, std::chrono::milliseconds(200))) continue;
        absorb(ev);
        if (ev.finish != FinishReason::kNone) break;
      }
      if (ev.finish == FinishReason::kError)
        return send_error(res, make_error(500, "generation failed: " + ev.error));
      if (ev.finish == FinishReason::kAbort)
        return send_error(res, make_error(503, "the request was cancelled"));
      res.set_content(completion_response(api, *completion, ctx), "application/json");
      return;
    }

    res.set_header("Cache-Control", "no-cache");
    auto first = std::make_shared<bool>(true);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, api, channel, completion, absorb, first](size_t, httplib::DataSink& sink) {
          TokenEvent ev;
          if (!channel->pop(ev, std::chrono::milliseconds(50))) {
            // Nothing yet (queued or a long prefill): make sure the client is still there.
            return sink.is_writable();
          }
          absorb(ev);
          std::string out;
          if (ev.finish == FinishReason::kError || ev.finish == FinishReason::kAbort) {
            out = stream_error_event(make_error(ev.finish == FinishReason::kError ? 500 : 503,
                                                ev.finish == FinishReason::kError
                                                    ? "generation failed: " + ev.error
                                                    : "the request was cancelled"));
          } else {
            out = stream_token_event(api, *completion, ev, *first, ctx);
            *first = false;
          }
          if (ev.finish != FinishReason::kNone) {
            if (api.include_usage && ev.finish != FinishReason::kError &&
                ev.finish != FinishReason::kAbort)
              out += stream_usage_event(api, *completion, ctx);
            out += kStreamDone;
          }
          if (!sink.write(out.data(), out.size())) return false;
          if (ev.finish != FinishReason::kNone) sink.done();
          return true;
        },
        [this, id, completion](bool success) {
          // The stream ended early (client gone): free the slot and pages now.
          if (!success || completion->finish == FinishReason::kNone) engine.cancel(id);
        });
  }

  void routes() {
    server.set_payload_max_length(kMaxBody);
    server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      handle_generate(req, res, false);
    });
    server.Post("/v1/chat/completions",
                [this](const httplib::Request& req, httplib::Response& res) {
                  handle_generate(req, res, true);
                });
    server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const EngineConfig& c = engine.engine().config();
      nlohmann::json m = {{"id", ctx.model_name},
                          {"object", "model"},
                          {"created", 0},
                          {"owned_by", "hyperion"},
                          {"max_model_len", c.max_seq_len}};
      nlohmann::json j = {{"object", "list"}, {"data", nlohmann::json::array({m})}};
      res.set_content(j.dump(), "application/json");
    });
    server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(render_metrics(), "text/plain; version=0.0.4; charset=utf-8");
    });
    server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler already wrote an error body
      if (res.status == 404)
        send_error(res, make_error(404, fmt::format("no route {} {}", req.method, req.path), "",
                                   "not_found_error"));
      else if (res.status == 413)
        send_error(res,
                   make_error(413, fmt::format("the request body exceeds {} bytes", kMaxBody)));
      else
        send_error(res, make_error(res.status, fmt::format("HTTP {}", res.status)));
    });
    server.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "internal error";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          send_error(res, make_error(500, what));
        });
    // Every slot and queue entry may hold a streaming connection at once.
    const EngineConfig& c = engine.engine().config();
    const size_t threads = static_cast<size_t>(
        std::clamp<int64_t>(c.max_concurrent_decodes + c.max_queue + 8, 16, 1024));
    server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  }
};

HttpServer::HttpServer(AsyncEngine& engine, ApiContext context)
    : impl_(std::make_unique<Impl>(engine, std::move(context))) {
  impl_->routes();
}

HttpServer::~HttpServer() {
  stop();
}

int HttpServer::bind(const std::string& host, int port) {
  // httplib listens with a backlog of 5; a burst of clients (a benchmark opening 64
  // streams at once) overflows that and connections stall or fail. Keep the listening
  // socket and raise its backlog once bound (listen() again only updates it).
  int listen_fd = -1;
  impl_->server.set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = sock;
  });
  auto raise_backlog = [&listen_fd] {
    if (listen_fd >= 0) ::listen(listen_fd, 1024);
  };
  if (port == 0) {
    const int p = impl_->server.bind_to_any_port(host);
    HYP_CHECK(p > 0, "serve: cannot bind {} (any port)", host);
    raise_backlog();
    return p;
  }
  HYP_CHECK(impl_->server.bind_to_port(host, port), "serve: cannot bind {}:{} (in use?)", host,
            port);
  raise_backlog();
  return port;
}

void HttpServer::run() {
  impl_->server.listen_after_bind();
}

void HttpServer::stop() {
  if (impl_) impl_->server.stop();
}

std::string HttpServer::metrics_text() {
  return impl_->render_metrics();
}

}  // namespace hyperion::serve
