// `hyperion serve CHECKPOINT [--host H] [--port P] [key=value ...]`: the OpenAI-compatible
// server (serve/http_server.h) on a checkpoint, until SIGINT or SIGTERM.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "base/signals.h"
#include "base/threads.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/loaded_checkpoint.h"
#include "convert/gguf_model.h"
#include "convert/peft_adapter.h"
#include "diffusion/pipeline.h"
#include "diffusion/single_file.h"
#include "io/atomic_file.h"
#include "kernels/hardware.h"
#include "model/param_store.h"
#include "serve/async_engine.h"
#include "serve/engine.h"
#include "serve/http_server.h"
#include "serve/image_engine.h"
#include "text/chat_template.h"

namespace hyperion::cli {

const CommandSpec kServeSpec = {
    "serve",
    "CHECKPOINT [key=value ...]",
    "OpenAI-compatible HTTP server for a checkpoint (continuous batching, paged KV cache)",
    {{"host", "H", "address to listen on (default 127.0.0.1)"},
     {"port", "P", "port to listen on (default 8000; 0 picks a free one)"},
     {"drain-timeout", "S",
      "on SIGTERM/SIGINT, seconds running requests may take to finish "
      "(default 30)"},
     {"max-connections", "N", "open connections at most; more get 503 (default 1024)"},
     {"header-timeout", "S", "seconds a client has to send a request head (default 10)"},
     {"request-timeout", "S", "seconds a client has to send a request body (default 60)"},
     {"idle-timeout", "S", "seconds an idle keep-alive connection stays open (default 60)"},
     {"io-threads", "N", "threads serving the HTTP connections (default 2)"},
     {"lora", "NAME=DIR",
      "serve the PEFT LoRA adapter in DIR as model NAME (a request's \"model\": NAME uses it); "
      "repeatable, up to max_loras",
      true},
     {"config", "DIR",
      "with a single-file Stable Diffusion checkpoint: the diffusers directory whose configs and "
      "tokenizer it uses"}},
    "Routes: POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize; GET /v1/models,\n"
    "/health, /metrics; with allow_runtime_lora=true, POST /v1/load_lora_adapter\n"
    "{lora_name, lora_path} and /v1/unload_lora_adapter {lora_name}. Requests for different\n"
    "LoRA adapters and for the base share every decode step (docs/POST_TRAINING.md).\n"
    "On a diffusion checkpoint (a directory with model_index.json, or a single file with --config):\n"
    "POST /v1/images/generations (OpenAI's; also seed, steps, guidance_scale, negative_prompt,\n"
    "scheduler), GET /v1/models, /health, /metrics; concurrent requests are denoised together,\n"
    "a request joining at the next step. Its keys: max_batch_images (8), max_queue (64),\n"
    "model_name. Guide: docs/DIFFUSION.md.\n"
    "SIGTERM or SIGINT drains: no new connections or requests (503), running requests finish\n"
    "within --drain-timeout, the rest end with an error event and [DONE]; exit status 0.\n"
    "Guide: docs/SERVING.md.",
    "serve runs/tiny --port 8000 kv_dtype=int8 max_concurrent_decodes=32",
    serve::engine_config_schema};

namespace {

// Serves until run() returns: the first SIGINT/SIGTERM drains (on a thread of its own),
// a second one stops at once.
void run_until_signalled(serve::HttpServer& server, sigset_t& signals, double drain_s) {
  std::atomic<bool> serving{true};
  std::thread drainer;
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (!serving) return;  // woken by run() returning on its own
    log_info("serve: signal {}: draining (up to {} s for running requests; a second signal "
             "stops at once)",
             sig, drain_s);
    drainer = std::thread([&] {
      const int64_t cut = server.drain(drain_s);
      log_info("serve: drained; {} requests were cut short", cut);
    });
    sigwait(&signals, &sig);
    if (!serving) return;
    log_warn("serve: second signal {}: stopping now, without waiting for running requests", sig);
    die_by_signal(sig);
  });
  server.run();
  serving = false;
  pthread_kill(waiter.native_handle(), SIGTERM);  // wake the signal thread if still waiting
  waiter.join();
  if (drainer.joinable()) drainer.join();
}

// `serve` on a diffusion checkpoint: the image routes on an ImageEngine.
int serve_images(const Flags& f, const std::string& checkpoint, const std::vector<std::string>& overrides,
                 const std::string& host, int port, const serve::HttpOptions& http, double drain_s,
                 sigset_t& signals) {
  serve::ImageEngineConfig ic = serve::parse_image_engine_config(overrides);
  HYP_USAGE_CHECK(!diffusion::DiffusionPipeline::is_pipeline_dir(checkpoint) || !f.has("config"),
                  "serve: --config applies to single-file checkpoints; {} is a diffusers directory", checkpoint);
  const auto pipe = diffusion::DiffusionPipeline::is_pipeline_dir(checkpoint)
                        ? diffusion::DiffusionPipeline::load(checkpoint)
                        : diffusion::load_single_file(checkpoint, f.require("config"));
  pipe->to_device(ic.hardware);
  pipe->set_compute_dtype(ic.compute_dtype);
  if (ic.model_name.empty()) {
    std::filesystem::path p(checkpoint);
    if (!p.has_filename()) p = p.parent_path();
    // A single file is named without its extension (v1-5-pruned.safetensors: v1-5-pruned).
    ic.model_name = std::filesystem::is_regular_file(p) ? p.stem().string() : p.filename().string();
  }
  serve::ApiContext ctx;
  ctx.model_name = ic.model_name;
  release_thread_pool();  // the engine thread runs every parallel region from here on
  serve::ImageEngine engine(*pipe, ic);
  serve::HttpServer server(engine, ctx, http);
  const int bound = server.bind(host, port);
  log_info("serve: {} ({}) on http://{}:{}  images {}x{} by default, {} denoised together, {} may wait, {}, on the {}",
           ic.model_name, checkpoint, host, bound, pipe->default_size(), pipe->default_size(), ic.max_batch_images,
           ic.max_queue, ic.compute_dtype == DType::kBF16 ? "bf16 mixed precision" : "float32",
           hardware_name(ic.hardware));
  run_until_signalled(server, signals, drain_s);
  engine.stop();
  return 0;
}

}  // namespace

int cmd_serve(const Args& args) {
  // SIGINT/SIGTERM are handled by one thread (sigwait), so no handler runs inside the
  // engine or the HTTP threads; block them before any thread starts: the CUDA driver's
  // own threads start with the device (hardware=gpu is checked while the keys are
  // parsed), and one of them left unblocked would take SIGTERM's default action.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  const Flags f(kServeSpec, args);
  const auto [checkpoint, overrides] = split_positional(f, "CHECKPOINT");
  HYP_USAGE_CHECK(!checkpoint.empty(),
                  "serve: expected a CHECKPOINT directory (or a training run directory)");
  const bool images = diffusion::DiffusionPipeline::is_pipeline_dir(checkpoint) || f.has("config");
  serve::EngineConfig ec = images ? serve::EngineConfig{} : serve::parse_engine_config(overrides);
  const std::string host = f.get("host", "127.0.0.1");
  const int64_t port = f.integer("port", 8000);
  HYP_USAGE_CHECK(port >= 0 && port <= 65535, "serve: --port must be in [0, 65535], got {}", port);
  auto positive = [&f](const char* name, double fallback) {
    const double v = f.number(name, fallback);
    HYP_USAGE_CHECK(v > 0 && v < 1e7, "serve: --{} must be > 0, got '{}'", name, f.get(name));
    return v;
  };
  serve::HttpOptions http;
  http.max_connections = static_cast<int64_t>(positive("max-connections", 1024));
  http.header_timeout_s = positive("header-timeout", http.header_timeout_s);
  http.request_timeout_s = positive("request-timeout", http.request_timeout_s);
  http.idle_timeout_s = positive("idle-timeout", http.idle_timeout_s);
  http.io_threads = static_cast<int>(positive("io-threads", http.io_threads));
  const double drain_s = f.number("drain-timeout", 30);
  HYP_USAGE_CHECK(drain_s >= 0, "serve: --drain-timeout must be >= 0, got '{}'",
                  f.get("drain-timeout"));
  // Fail before the (slow) load when the port is taken.
  serve::check_port_available(host, static_cast<int>(port));
  serve::raise_open_file_limit(http.max_connections + 64);
  if (images) return serve_images(f, checkpoint, overrides, host, static_cast<int>(port), http, drain_s, signals);

  // The weights and the KV cache together, before the (slow) load of the weights: both
  // are sized by config.json, checked against the weight files by then. (The engine
  // checks its KV cache again once the weights are in.)
  const int64_t gguf_bytes = convert::gguf_weight_bytes(checkpoint);  // -1: not a GGUF
  LoadedCheckpoint c = load_checkpoint(
      checkpoint, ec.weights != serve::WeightFormat::kF32,
      [&](const DecoderConfig& model) { serve::plan_engine_memory(ec, model, gguf_bytes); },
      ec.hardware);
  if (ec.model_name.empty()) {
    std::filesystem::path p(checkpoint);
    if (!p.has_filename()) p = p.parent_path();
    ec.model_name = p.filename().string();
  }
  // --lora NAME=DIR: checked (names, directories, ranks) before the engine is built, so the
  // bank is sized for the largest of them.
  std::vector<std::pair<std::string, std::string>> loras;
  const bool rank_given = std::any_of(overrides.begin(), overrides.end(),
                                      [](const std::string& o) { return o.starts_with("max_lora_rank="); });
  for (const std::string& spec : f.all("lora")) {
    const size_t eq = spec.find('=');
    HYP_USAGE_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < spec.size(),
                    "serve: --lora takes NAME=DIR (an adapter directory), got '{}'", spec);
    const std::string name = spec.substr(0, eq), dir = spec.substr(eq + 1);
    for (const auto& [other, d] : loras)
      HYP_USAGE_CHECK(other != name, "serve: --lora {} is given twice", name);
    HYP_USAGE_CHECK(name != ec.model_name, "serve: --lora {}: that is the base model's name", name);
    HYP_USAGE_CHECK(convert::is_peft_adapter_dir(dir), "serve: --lora {}: {} holds no adapter_config.json", name,
                    dir);
    const LoraConfig lc = convert::read_peft_config(dir);
    if (ec.max_lora_rank == 0) ec.max_lora_rank = 16;
    if (lc.rank > ec.max_lora_rank) {
      HYP_USAGE_CHECK(!rank_given, "serve: --lora {} has rank {}, over max_lora_rank={}", name, lc.rank,
                      ec.max_lora_rank);
      ec.max_lora_rank = lc.rank;
    }
    loras.emplace_back(name, dir);
  }
  HYP_USAGE_CHECK(static_cast<int64_t>(loras.size()) <= ec.max_loras,
                  "serve: {} --lora adapters, over max_loras={}", loras.size(), ec.max_loras);
  serve::Engine engine(*c.params, &c.tokenizer, ec);
  const auto read_adapter = [&c](const std::string& dir) { return convert::load_peft_adapter(dir, *c.params); };
  for (const auto& [name, dir] : loras) {
    try {
      const std::unique_ptr<LoraAdapter> a = read_adapter(dir);
      engine.load_adapter(name, dir, *a);
      log_info("serve: LoRA adapter '{}' from {} (rank {}, {})", name, dir, a->rank(),
               lora_target_list(a->config()));
    } catch (const std::exception& e) {
      usage_fail("serve: --lora {}={}: {}", name, dir, e.what());
    }
  }
  const double warm = engine.warmup();
  log_info("serve: kernels compiled for every batch size in {:.2f} s", warm);
  const serve::EngineConfig& rc = engine.config();
  serve::ApiContext ctx;
  ctx.tokenizer = &c.tokenizer;
  ctx.model_name = rc.model_name;
  // The chat format: the tokenizer's Jinja template (auto), a .jinja file, or a built-in.
  // A template that does not parse stops the server here, naming its line and column.
  std::optional<text::ChatTemplate> jinja;
  std::string template_source;  // the Jinja text, which says how the model writes tool calls
  if (rc.chat_template == "auto") {
    jinja = text::ChatTemplate::of(c.tokenizer);
    template_source = c.tokenizer.chat_template();
  } else if (rc.chat_template.ends_with(".jinja")) {
    // A Jinja template writes its special tokens as text ("<s>"), which only a
    // tokenizer.json turns back into those tokens (SentencePiece encodes them as letters).
    HYP_USAGE_CHECK(std::string(c.tokenizer.format()) == "tokenizer.json",
                    "serve: chat_template={} needs a checkpoint with a tokenizer.json; {} is a "
                    "SentencePiece model (use chat_template=plain or llama2)",
                    rc.chat_template, c.tokenizer.origin());
    template_source = io::read_file(rc.chat_template);
    jinja.emplace(template_source, rc.chat_template, c.tokenizer);
  }
  ctx.chat_template = jinja ? "jinja" : rc.chat_template == "auto" ? "plain" : rc.chat_template;
  ctx.jinja = jinja ? &*jinja : nullptr;
  log_info("serve: chat format {}", jinja ? jinja->origin() : ctx.chat_template);
  if (jinja) {
    ctx.tools = serve::detect_tool_syntax(template_source, c.tokenizer);
    log_info("serve: tool calls {}", ctx.tools.format == serve::ToolFormat::kNone
                                         ? std::string("not parsed (the chat template teaches no tool-call format)")
                                         : fmt::format("in the {} format", serve::tool_format_name(ctx.tools.format)));
  }
  ctx.context_tokens = rc.max_seq_len;
  ctx.max_prompt_bytes = serve::prompt_byte_bound(c.tokenizer, rc.max_seq_len);
  ctx.adapters = &engine.adapters();
  ctx.grammars = std::make_shared<text::GrammarCache>(
      text::TokenVocabulary::from_tokenizer(c.tokenizer, engine.runner().config().vocab_size));
  if (rc.allow_runtime_lora) ctx.read_adapter = read_adapter;
  release_thread_pool();  // the engine thread runs every parallel region from here on
  serve::AsyncEngine async(engine);
  serve::HttpServer server(async, ctx, http);
  const int bound = server.bind(host, static_cast<int>(port));
  const serve::ModelRunner& runner = engine.runner();
  log_info(
      "serve: {} ({}) on http://{}:{}  slots {}{}  context {}  KV {} pages x {} tokens ({}, {:.1f} "
      "MiB, {} B/token)  weights {}  attention {}  prefix caching {}",
      rc.model_name, c.dir, host, bound, rc.max_concurrent_decodes,
      rc.automatic_slots ? " (from memory)" : "", rc.max_seq_len, rc.kv_pages, rc.kv_page_tokens,
      dtype_name(rc.kv_dtype), double(runner.kv_cache_bytes()) / (1 << 20),
      runner.kv_bytes_per_token(),
      c.params->has_block_weights() ? c.params->block_weights_summary()
                                    : std::string(serve::weight_format_name(rc.weights)),
      rc.padded_attention ? "padded" : "ragged", rc.prefix_caching ? "on" : "off");
  log_info("serve: weights read per token {:.1f} MiB ({} B); KV cache backed by memory in {:.2f} s",
           double(runner.weight_bytes()) / (1 << 20), runner.weight_bytes(),
           runner.kv_commit_seconds());
  run_until_signalled(server, signals, drain_s);
  async.stop();
  return 0;
}

}  // namespace hyperion::cli
