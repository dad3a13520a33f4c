// `hyperion serve`'s HTTP/1.1 front end: the OpenAI-compatible routes on top of an
// AsyncEngine, on Boost.Beast and Asio (event-driven: a connection costs a socket and
// a buffer, not a thread).
//
//   POST /v1/completions, POST /v1/chat/completions   (stream: true -> server-sent events)
//   GET  /v1/models (with max_model_len; then each LoRA adapter, parent = the base),
//   GET /health, GET /metrics (Prometheus 0.0.4)
//   POST /v1/load_lora_adapter, /v1/unload_lora_adapter (vLLM's; allow_runtime_lora=true,
//   else 403): a request's `model` then picks a loaded adapter by name
//
// On an ImageEngine (a diffusion checkpoint) instead: POST /v1/images/generations
// (serve/image_api.h), GET /v1/models, /health, /metrics; the PNGs are encoded on the I/O
// threads, never the engine's.
//
// Status codes: 400 for a bad request (the JSON body names the field) or malformed HTTP
// (conflicting or negative Content-Length, bad chunking), 404 for an unknown route or
// model, 405 with `Allow` for a wrong method on a real route, 413 for a body over 8 MiB,
// 431 for headers over 16 KiB, 429 when the queue
// is full (always before any byte of a response), 503 while draining or when
// max_connections are open, 500 when the engine fails. Pipelined requests on one
// connection are answered in order.
//
// Slow or idle clients cannot starve others: every connection has a deadline to send a
// whole request head (header_timeout_s, from the accept for its first request), its body
// (request_timeout_s) and to take each write (write_timeout_s), past which it is closed;
// idle keep-alive connections are closed after idle_timeout_s,
// and at most max_connections are open at once. A fixed number of I/O threads serves
// every connection; the engine thread does the compute.
//
// A client that disconnects has its request cancelled at once (the engine frees its
// slot and pages on its next step). drain() is the graceful shutdown: stop accepting,
// answer 503 to new requests, let running ones finish within a grace period, then end
// the rest with an error event and [DONE].
#pragma once

#include <memory>
#include <string>

#include "serve/async_engine.h"
#include "serve/image_engine.h"
#include "serve/openai_api.h"

namespace hyperion::serve {

struct HttpOptions {
  int io_threads = 2;
  int64_t max_connections = 1024;
  double header_timeout_s = 10;   // accept, or a later request's first byte -> end of head
  double request_timeout_s = 60;  // end of the head -> end of the body
  double idle_timeout_s = 60;     // kept-alive connection between requests
  double write_timeout_s = 60;    // each write to a client that stopped reading
};

// Throws naming host:port when nothing can listen there now (a port in use is said to
// be), so `hyperion serve` fails before loading a model it could not serve.
void check_port_available(const std::string& host, int port);
// Raises this process's open-file limit (soft, up to the hard limit) to `wanted`, so
// max_connections sockets fit; logs when the hard limit is lower.
void raise_open_file_limit(int64_t wanted);

class HttpServer {
 public:
  HttpServer(AsyncEngine& engine, ApiContext context, HttpOptions options = {});
  // The image routes on a diffusion pipeline (context: model_name only).
  HttpServer(ImageEngine& images, ApiContext context, HttpOptions options = {});
  ~HttpServer();

  // Binds host:port (port 0 picks a free one) and starts listening; returns the port.
  // Throws naming the address when it cannot (a port in use is said to be in use).
  int bind(const std::string& host, int port);
  // Serves until stop() or the end of drain() (call bind first).
  void run();
  // Closes every connection at once and makes run() return.
  void stop();
  // Graceful shutdown (blocks up to `grace_s` + a few seconds): stops accepting, answers
  // 503 to new requests on open connections, waits up to `grace_s` for the running
  // requests, ends the rest with an error (a stream gets an error event and [DONE]),
  // stops the engine, then makes run() return. Returns the requests that were cut.
  int64_t drain(double grace_s);
  // The /metrics text as it would be served now.
  std::string metrics_text();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace hyperion::serve
