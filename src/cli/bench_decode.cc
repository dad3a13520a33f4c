// `hyperion bench decode CHECKPOINT [--batch B] [--context-min N] [--context-max N]
// [--steps S] [key=value ...] [--json]`: the serving engine's decode step alone (what
// llama-bench calls tg), with no HTTP and no prefill in the timed part. B requests with
// prompt lengths uniform in [context-min, context-max] are prefilled, then S decode
// steps (each one token for every request) are timed. Reports tokens/s, the step time
// (mean, median and slowest), the bytes a step must read (weights once + every request's
// KV), and the rate those bytes allow at the machine's measured read bandwidth
// (`--bandwidth-gbps`, else the memory figure of `hyperion bench peak` is measured; with
// hardware=gpu, a 1 GiB device-to-device copy in the same process).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/loaded_checkpoint.h"
#include "convert/gguf_model.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/hardware.h"
#include "kernels/fill.h"
#include "kernels/peak.h"
#include "model/lora.h"
#include "serve/engine.h"
#include "train/train_config.h"

namespace hyperion::cli {

const CommandSpec kBenchDecodeSpec = {
    "bench decode",
    "CHECKPOINT [key=value ...]",
    "time the serving engine's decode step against the memory-bandwidth bound",
    {{"batch", "B", "requests decoding at once (default 1)"},
     {"context-min", "N", "shortest prompt, tokens (default 16)"},
     {"context-max", "N", "longest prompt, tokens (default: --context-min)"},
     {"steps", "S", "timed decode steps (default 20)"},
     {"warmup", "S", "untimed decode steps first (default 3)"},
     {"seed", "S", "seed of the prompt lengths and ids (default 0)"},
     {"bandwidth-gbps", "G",
      "read bandwidth for the bound (default: measured now; on a GPU a device copy)"},
     {"random-weights", "",
      "CHECKPOINT is a training config (preset name or YAML): its model with random weights "
      "(speed only; no checkpoint needed)"},
     {"loras", "N",
      "serve N random LoRA adapters (all-linear), request b using adapter b % N, so every step "
      "applies N different adapters (default 0: the base alone)"},
     {"lora-rank", "R", "rank of those adapters (default 16)"},
     {"prefill", "N",
      "also time the prefill of one N-token prompt before the decode steps (llama-bench's ppN; "
      "default 0: none)"},
     {"json", "", "print the result as one JSON object"}},
    "key=value: the serving engine's keys (see hyperion serve --help).",
    "bench decode runs/tiny --batch 8 --context-min 64 --context-max 256 kv_dtype=int8"};

int cmd_bench_decode(const Args& args) {
  const Flags f(kBenchDecodeSpec, args);
  const auto [checkpoint, overrides] = split_positional(f, "CHECKPOINT");
  HYP_USAGE_CHECK(!checkpoint.empty(), "bench decode: expected a CHECKPOINT directory");
  const int64_t batch = f.integer("batch", 1), cmin = f.integer("context-min", 16);
  const int64_t cmax = f.integer("context-max", cmin), steps = f.integer("steps", 20);
  const int64_t warm = f.integer("warmup", 3);
  HYP_USAGE_CHECK(batch >= 1, "bench decode: --batch must be >= 1");
  HYP_USAGE_CHECK(cmin >= 1 && cmax >= cmin,
                  "bench decode: need 1 <= --context-min <= --context-max");
  HYP_USAGE_CHECK(steps >= 1 && warm >= 0, "bench decode: --steps >= 1 and --warmup >= 0");
  const int64_t loras = f.integer("loras", 0), lora_rank = f.integer("lora-rank", 16);
  HYP_USAGE_CHECK(loras >= 0 && loras <= 256, "bench decode: --loras must be in [0, 256], got {}", loras);
  HYP_USAGE_CHECK(lora_rank >= 1 && lora_rank <= 1024, "bench decode: --lora-rank must be in [1, 1024], got {}",
                  lora_rank);
  serve::EngineConfig ec = serve::parse_engine_config(overrides);
  if (loras > 0) {
    ec.max_loras = std::max(ec.max_loras, loras);
    ec.max_lora_rank = std::max(ec.max_lora_rank, lora_rank);
  }
  bool has_slots = false;
  for (const std::string& o : overrides) has_slots |= o.rfind("max_concurrent_decodes=", 0) == 0;
  if (!has_slots) ec.max_concurrent_decodes = batch;
  HYP_USAGE_CHECK(ec.max_concurrent_decodes >= batch,
                  "bench decode: --batch {} exceeds max_concurrent_decodes={}", batch,
                  ec.max_concurrent_decodes);
  const bool bf16 = ec.weights != serve::WeightFormat::kF32;
  std::optional<LoadedCheckpoint> loaded;
  std::unique_ptr<ParamStore> random;
  if (f.has("random-weights")) {
    // A model's shape is all a decode step's speed depends on: random weights spare
    // writing and reading a checkpoint of billions of parameters.
    const DecoderConfig model =
        parse_train_config(load_train_config(checkpoint, {}), checkpoint).model;
    serve::plan_engine_memory(ec, model);
    random = std::make_unique<ParamStore>(model, bf16, /*gradients=*/false,
                                          backend_for(ec.hardware).allocator());
    random->init(static_cast<uint64_t>(f.integer("seed", 0)));
    if (bf16) random->sync_bf16();
  } else {
    const int64_t gguf_bytes = convert::gguf_weight_bytes(checkpoint);  // -1: not a GGUF
    loaded.emplace(load_checkpoint(
        checkpoint, bf16,
        [&](const DecoderConfig& model) { serve::plan_engine_memory(ec, model, gguf_bytes); },
        ec.hardware));
  }
  const ParamStore& params = random ? *random : *loaded->params;
  const DecoderConfig& model = params.config();
  serve::Engine engine(params, loaded ? &loaded->tokenizer : nullptr, ec);
  const serve::EngineConfig& rc = engine.config();
  HYP_CHECK(cmax + warm + steps + 1 <= rc.max_seq_len,
            "bench decode: context {} + {} steps exceeds max_seq_len={} (set max_seq_len=)", cmax,
            warm + steps, rc.max_seq_len);
  engine.warmup();
  std::vector<serve::LoraRef> adapters;
  for (int64_t i = 0; i < loras; ++i) {
    // Random adapters: the step's cost depends on their shapes alone.
    LoraConfig lc;
    lc.rank = lora_rank;
    lc.alpha = 2.0 * static_cast<double>(lora_rank);
    lc.targets = parse_lora_targets("all-linear", "bench decode");
    LoraAdapter a(params, lc, /*gradients=*/false, /*bf16_copy=*/false);
    a.init(static_cast<uint64_t>(100 + i));
    ParamStore& s = a.store();
    for (size_t t = 1; t < s.infos().size(); t += 2)
      fill_normal(s.param(static_cast<int>(t)), static_cast<uint64_t>(1000 + 7 * i) + t, 0.0f, 0.01f);
    adapters.push_back(engine.load_adapter(fmt::format("lora{}", i), "random", a));
  }
  std::mt19937 rng(static_cast<uint32_t>(f.integer("seed", 0)));
  std::vector<int64_t> produced(static_cast<size_t>(batch), 0), lengths;
  const int64_t vocab = model.vocab_size;
  // Prefill: one prompt to its first token, after an untimed short one (first-use costs).
  const int64_t prefill = f.integer("prefill", 0);
  HYP_USAGE_CHECK(prefill >= 0 && prefill + 2 <= rc.max_seq_len,
                  "bench decode: --prefill {} must be in [0, max_seq_len - 2 = {}]", prefill,
                  rc.max_seq_len - 2);
  double prefill_secs = 0;
  for (const int64_t len : {std::min<int64_t>(prefill, 16), prefill}) {
    if (prefill == 0) break;
    serve::GenerationRequest r;
    r.prompt.push_back(1);
    for (int64_t i = 1; i < len; ++i) r.prompt.push_back(3 + static_cast<int32_t>(rng() % (vocab - 3)));
    r.max_tokens = 1;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    bool first = false;
    engine.add(r, [&first](const serve::TokenEvent& ev) {
      if (ev.token >= 0) first = true;
    });
    const auto p0 = std::chrono::steady_clock::now();
    while (!first) engine.step();
    prefill_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
    while (engine.stats().running > 0) engine.step();
  }
  for (int64_t b = 0; b < batch; ++b) {
    serve::GenerationRequest r;
    const int64_t len = cmin + static_cast<int64_t>(rng() % static_cast<uint32_t>(cmax - cmin + 1));
    r.prompt.push_back(1);
    for (int64_t i = 1; i < len; ++i)
      r.prompt.push_back(3 + static_cast<int32_t>(rng() % (vocab - 3)));
    r.max_tokens = rc.max_seq_len - len;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    if (loras > 0) r.adapter = adapters[static_cast<size_t>(b % loras)];
    lengths.push_back(len);
    engine.add(r, [&produced, b](const serve::TokenEvent& ev) {
      if (ev.token >= 0) ++produced[static_cast<size_t>(b)];
    });
  }
  // Until every prompt is prefilled (early ones decode meanwhile: not timed).
  auto all_started = [&] {
    for (int64_t p : produced)
      if (p == 0) return false;
    return true;
  };
  while (!all_started()) engine.step();
  for (int64_t s = 0; s < warm; ++s) engine.step();
  HYP_CHECK(engine.stats().running == batch,
            "bench decode: requests reached max_seq_len={} while others prefilled; raise "
            "max_seq_len= or prefill_chunk=",
            rc.max_seq_len);
  int64_t context_now = 0;
  for (int64_t b = 0; b < batch; ++b)
    context_now += lengths[static_cast<size_t>(b)] + produced[static_cast<size_t>(b)];
  const int64_t before = engine.stats().generated_tokens;
  cuda_op_profile_restart();  // HYPERION_CUDA_OP_TIMES: the timed steps only
  const double queue_before = engine.runner().queue_seconds();
  const int64_t replayed_before = engine.runner().replayed_steps();
  // Each step is timed too: the median and the slowest show steps that stall (a page
  // fault of fresh KV memory, a stray thread) apart from the steady state the mean mixes
  // them into.
  std::vector<double> step_times(static_cast<size_t>(steps));
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  for (int64_t s = 0; s < steps; ++s) {
    engine.step();
    const auto now = std::chrono::steady_clock::now();
    step_times[static_cast<size_t>(s)] = std::chrono::duration<double>(now - last).count() * 1e3;
    last = now;
  }
  const double secs = std::chrono::duration<double>(last - t0).count();
  const double queue_ms = (engine.runner().queue_seconds() - queue_before) * 1e3 / double(steps);
  const int64_t replayed = engine.runner().replayed_steps() - replayed_before;
  std::sort(step_times.begin(), step_times.end());
  const double p50_ms = step_times[step_times.size() / 2], max_ms = step_times.back();
  const int64_t tokens = engine.stats().generated_tokens - before;
  HYP_CHECK(tokens == batch * steps, "bench decode: {} tokens in {} steps of {} requests", tokens,
            steps, batch);

  double bw = f.number("bandwidth-gbps", 0.0);
  const bool on_device = rc.hardware != Device::kHost;
  if (bw <= 0)  // the best STREAM figure on the host, as every ratio uses; a device copy on a GPU
    bw = on_device ? measure_backend_copy_gbps(backend_for(rc.hardware), size_t{1} << 30)
                   : measure_peak().mem_gbps;
  const double mean_context = double(context_now) / double(batch) + double(steps) / 2;
  // Each request's KV read at its mean context over the timed steps (produced counts
  // them already; a sliding-window layer reads only its window).
  double kv_bytes = 0;
  for (int64_t b = 0; b < batch; ++b)
    kv_bytes += double(engine.runner().kv_bytes_read(
        lengths[static_cast<size_t>(b)] + produced[static_cast<size_t>(b)] - (steps + 1) / 2));
  const double step_bytes = double(engine.runner().weight_bytes()) + kv_bytes;
  const double step_ms = secs * 1000.0 / double(steps);
  const double tps = double(tokens) / secs;
  const double bound_tps = double(batch) / (step_bytes / (bw * 1e9));
  if (f.has("json")) {
    nlohmann::ordered_json j;
    j["checkpoint"] = loaded ? loaded->dir : checkpoint;
    j["batch"] = batch;
    j["mean_context"] = mean_context;
    j["kv_dtype"] = dtype_name(rc.kv_dtype);
    j["weights"] = params.has_block_weights() ? params.block_weights_summary()
                                              : std::string(serve::weight_format_name(rc.weights));
    j["hardware"] = hardware_name(rc.hardware);
    j["attention"] = rc.padded_attention ? "padded" : "ragged";
    j["loras"] = loras;
    j["lora_rank"] = loras > 0 ? lora_rank : 0;
    j["step_ms"] = step_ms;
    j["step_ms_p50"] = p50_ms;
    j["step_ms_max"] = max_ms;
    j["queue_ms"] = queue_ms;
    j["cuda_graphs"] = rc.cuda_graphs && on_device;
    j["replayed_steps"] = replayed;
    j["tokens_per_s"] = tps;
    j["weight_bytes"] = engine.runner().weight_bytes();
    j["kv_bytes_per_token"] = engine.runner().kv_bytes_per_token();
    j["step_bytes"] = step_bytes;
    j["read_gbps"] = bw;
    j["bandwidth_bound_tokens_per_s"] = bound_tps;
    j["fraction_of_bound"] = tps / bound_tps;
    if (prefill > 0) {
      j["prefill_tokens"] = prefill;
      j["prefill_ms"] = prefill_secs * 1e3;
      j["prefill_tokens_per_s"] = double(prefill) / prefill_secs;
    }
    print_json(j, -1);
  } else {
    std::printf(
        "decode on %s: batch %lld, mean context %.0f, KV %s, weights %s, %s attention%s\n"
        "  %.2f ms/step (median %.2f, slowest %.2f; %.2f ms to queue it), %.1f tokens/s; a step "
        "reads %.1f MiB (weights %.1f + KV %.1f)\n"
        "  at %.1f GB/s that allows %.1f tokens/s: %.0f%% of the bound\n"
        "  %lld of %lld timed steps replayed from a recording (cuda_graphs=%s)\n",
        hardware_name(rc.hardware), static_cast<long long>(batch), mean_context,
        std::string(dtype_name(rc.kv_dtype)).c_str(),
        params.has_block_weights() ? params.block_weights_summary().c_str() : serve::weight_format_name(rc.weights),
        rc.padded_attention ? "padded" : "ragged",
        loras > 0 ? fmt::format(", {} LoRA adapters of rank {}", loras, lora_rank).c_str() : "", step_ms,
        p50_ms, max_ms, queue_ms, tps, step_bytes / (1 << 20),
        double(engine.runner().weight_bytes()) / (1 << 20), kv_bytes / (1 << 20), bw, bound_tps,
        100.0 * tps / bound_tps, static_cast<long long>(replayed), static_cast<long long>(steps),
        rc.cuda_graphs && on_device ? "true" : "false");
    if (prefill > 0)
      std::printf("  prefill of %lld tokens: %.1f ms, %.1f tokens/s\n", static_cast<long long>(prefill),
                  prefill_secs * 1e3, double(prefill) / prefill_secs);
  }
  return 0;
}

}  // namespace hyperion::cli
