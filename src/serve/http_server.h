// `hyperion serve`'s HTTP front end (cpp-httplib): the OpenAI-compatible routes on top
// of an AsyncEngine.
//
//   POST /v1/completions, POST /v1/chat/completions   (stream: true -> server-sent events)
//   GET  /v1/models, GET /health, GET /metrics (Prometheus text format 0.0.4)
//
// Errors are OpenAI-style JSON bodies: 400 for a bad request (naming the field), 404 for
// an unknown model or route, 413 for a body over 8 MiB, 429 when the queue is full, 500
// when the engine fails. A streaming client that disconnects has its request cancelled:
// the engine frees its slot and pages on its next step. Each HTTP connection is served
// by one of httplib's I/O threads (sized for every slot and queue entry to stream at
// once); they only wait on sockets and queues, the engine thread does the compute.
#pragma once

#include <memory>
#include <string>

#include "serve/async_engine.h"
#include "serve/openai_api.h"

namespace hyperion::serve {

class HttpServer {
 public:
  HttpServer(AsyncEngine& engine, ApiContext context);
  ~HttpServer();

  // Binds host:port (port 0 picks a free one); returns the port. Throws naming the
  // address when it cannot bind.
  int bind(const std::string& host, int port);
  // Serves until stop() (call bind first).
  void run();
  void stop();
  // The /metrics text as it would be served now.
  std::string metrics_text();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyperion::serve
