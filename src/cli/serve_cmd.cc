// `hyperion serve CHECKPOINT [--host H] [--port P] [key=value ...]`: the OpenAI-compatible
// server (serve/http_server.h) on a checkpoint, until SIGINT or SIGTERM.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/loaded_checkpoint.h"
#include "serve/async_engine.h"
#include "serve/engine.h"
#include "serve/http_server.h"

namespace hyperion::cli {

const CommandSpec kServeSpec = {
    "serve",
    "CHECKPOINT [key=value ...]",
    "OpenAI-compatible HTTP server for a checkpoint (continuous batching, paged KV cache)",
    {{"host", "H", "address to listen on (default 127.0.0.1)"},
     {"port", "P", "port to listen on (default 8000; 0 picks a free one)"}},
    "Routes: POST /v1/completions, /v1/chat/completions; GET /v1/models, /health, /metrics.\n"
    "SIGTERM or SIGINT drains: no new requests, running ones finish within drain_timeout_s.\n"
    "Guide: docs/SERVING.md.",
    "serve runs/tiny --port 8000 kv_dtype=int8 max_concurrent_decodes=32",
    serve::engine_config_schema};

int cmd_serve(const Args& args) {
  const Flags f(kServeSpec, args);
  const auto [checkpoint, overrides] = split_positional(f, "CHECKPOINT");
  HYP_USAGE_CHECK(!checkpoint.empty(),
                  "serve: expected a CHECKPOINT directory (or a training run directory)");
  serve::EngineConfig ec = serve::parse_engine_config(overrides);
  const std::string host = f.get("host", "127.0.0.1");
  const int64_t port = f.integer("port", 8000);
  HYP_USAGE_CHECK(port >= 0 && port <= 65535, "serve: --port must be in [0, 65535], got {}",
                  port);

  // SIGINT/SIGTERM are handled by one thread (sigwait), so no handler runs inside the
  // engine or the HTTP threads; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  LoadedCheckpoint c = load_checkpoint(checkpoint, ec.weights != serve::WeightFormat::kF32);
  if (ec.model_name.empty()) {
    std::filesystem::path p(checkpoint);
    if (!p.has_filename()) p = p.parent_path();
    ec.model_name = p.filename().string();
  }
  serve::Engine engine(*c.params, &c.tokenizer, ec);
  const double warm = engine.warmup();
  log_info("serve: kernels compiled for every batch size in {:.2f} s", warm);
  const serve::EngineConfig& rc = engine.config();
  serve::ApiContext ctx;
  ctx.tokenizer = &c.tokenizer;
  ctx.model_name = rc.model_name;
  ctx.chat_template = rc.chat_template;
  serve::AsyncEngine async(engine);
  serve::HttpServer server(async, ctx);
  const int bound = server.bind(host, static_cast<int>(port));
  const serve::ModelRunner& runner = engine.runner();
  log_info(
      "serve: {} ({}) on http://{}:{}  slots {}  context {}  KV {} pages x {} tokens ({}, {:.1f} "
      "MiB, {} B/token)  weights {}  attention {}  prefix caching {}",
      rc.model_name, c.dir, host, bound, rc.max_concurrent_decodes, rc.max_seq_len, rc.kv_pages,
      rc.kv_page_tokens, dtype_name(rc.kv_dtype), double(runner.kv_cache_bytes()) / (1 << 20),
      runner.kv_bytes_per_token(), serve::weight_format_name(rc.weights),
      rc.padded_attention ? "padded" : "ragged", rc.prefix_caching ? "on" : "off");
  log_info("serve: weights read per token {:.1f} MiB ({} B)",
           double(runner.weight_bytes()) / (1 << 20), runner.weight_bytes());
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    log_info("serve: signal {}: shutting down", sig);
    server.stop();
  });
  server.run();
  // run() also returns if the listener fails; wake the signal thread in that case.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  async.stop();
  return 0;
}

}  // namespace hyperion::cli
