#include "serve/engine_config.h"

#include <algorithm>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/system_memory.h"
#include "kernels/hardware.h"
#include "kernels/paged_attention.h"
#include "model/param_store.h"

namespace hyperion::serve {

std::vector<ConfigKey> engine_config_schema() {
  return {
      {"max_concurrent_decodes", ConfigType::kInt, "0",
       "decode slots; 0 = as many as kv_memory_fraction of the memory beside the weights holds "
       "(at most 256)"},
      {"kv_memory_fraction", ConfigType::kFloat, "0",
       "share of the device memory beside the weights the automatic slots' KV cache fills; 0 "
       "= 0.5 on cpu, 0.9 on gpu"},
      {"max_queue", ConfigType::kInt, "256", "waiting requests before 429"},
      {"max_seq_len", ConfigType::kInt, "0",
       "context length; 0 = the model's (max_position_embeddings, the most it allows)"},
      {"allow_long_context", ConfigType::kBool, "false",
       "allow max_seq_len past the model's positions (its output there is unreliable; for "
       "load tests)"},
      {"prefill_chunk", ConfigType::kInt, "256", "prompt tokens prefilled per step"},
      {"kv_page_tokens", ConfigType::kInt, "16", "positions per KV page"},
      {"kv_pages", ConfigType::kInt, "0", "KV pages; 0 = every slot's whole context"},
      {"kv_dtype", ConfigType::kString, "bfloat16", "bfloat16 | int8 | fp8_e4m3 | float32"},
      {"weights", ConfigType::kString, "bfloat16", "bfloat16 | float32"},
      {"quantize_weights", ConfigType::kString, "none", "none | int8"},
      {"hardware", ConfigType::kString, "cpu", "cpu | gpu (docs/GPU.md)"},
      {"attention", ConfigType::kString, "ragged", "ragged | padded"},
      {"prefix_caching", ConfigType::kBool, "true", "reuse KV pages of shared prefixes"},
      {"cuda_graphs", ConfigType::kBool, "true",
       "on a GPU, record each decode batch size's step once and replay it (false: queue every "
       "op of every step)"},
      {"chat_template", ConfigType::kString, "auto",
       "auto (the tokenizer's Jinja template, else plain) | plain | llama2 | a .jinja file"},
      {"model_name", ConfigType::kString, "", "model id for /v1/models"},
      {"max_loras", ConfigType::kInt, "4",
       "LoRA adapters loaded at once (--lora, POST /v1/load_lora_adapter); requests for any of "
       "them share each decode step"},
      {"max_lora_rank", ConfigType::kInt, "0",
       "largest LoRA rank served; 0 = the largest --lora adapter's, at least 16"},
      {"allow_runtime_lora", ConfigType::kBool, "false",
       "accept POST /v1/load_lora_adapter and /v1/unload_lora_adapter (they read directories "
       "on this machine)"},
  };
}

const char* weight_format_name(WeightFormat w) {
  switch (w) {
    case WeightFormat::kF32:
      return "float32";
    case WeightFormat::kBF16:
      return "bfloat16";
    case WeightFormat::kInt8:
      return "int8";
  }
  return "?";
}

EngineConfig parse_engine_config(const std::vector<std::string>& overrides) {
  Config cfg(engine_config_schema());
  for (const std::string& o : overrides) cfg.apply_override(o);
  EngineConfig c;
  // The device first: a server that cannot have it fails before loading anything.
  c.hardware = parse_hardware(cfg.get_string("hardware"), "serve: hardware");
  require_hardware(c.hardware, "hardware");
  c.max_concurrent_decodes = cfg.get_int("max_concurrent_decodes");
  c.max_queue = cfg.get_int("max_queue");
  c.max_seq_len = cfg.get_int("max_seq_len");
  c.allow_long_context = cfg.get_bool("allow_long_context");
  c.prefill_chunk = cfg.get_int("prefill_chunk");
  c.kv_page_tokens = cfg.get_int("kv_page_tokens");
  c.kv_pages = cfg.get_int("kv_pages");
  c.kv_memory_fraction = cfg.get_float("kv_memory_fraction");
  HYP_CHECK(c.kv_memory_fraction >= 0 && c.kv_memory_fraction <= 1,
            "serve: kv_memory_fraction must be in [0, 1] (0 = automatic), got {}",
            c.kv_memory_fraction);
  HYP_CHECK(c.max_concurrent_decodes >= 0 && c.max_concurrent_decodes <= 4096,
            "serve: max_concurrent_decodes must be in [0, 4096] (0 = what memory allows), got {}",
            c.max_concurrent_decodes);
  HYP_CHECK(c.max_queue >= 0 && c.max_queue <= 1000000,
            "serve: max_queue must be in [0, 1000000], got {}", c.max_queue);
  HYP_CHECK(c.max_seq_len >= 0 && c.max_seq_len <= (int64_t{1} << 24),
            "serve: max_seq_len must be in [0, 16777216], got {}", c.max_seq_len);
  HYP_CHECK(c.prefill_chunk >= 1 && c.prefill_chunk <= (int64_t{1} << 20),
            "serve: prefill_chunk must be in [1, 1048576], got {}", c.prefill_chunk);
  HYP_CHECK(c.kv_page_tokens >= 1 && c.kv_page_tokens <= 4096,
            "serve: kv_page_tokens must be in [1, 4096], got {}", c.kv_page_tokens);
  HYP_CHECK(c.kv_pages >= 0 && c.kv_pages <= (int64_t{1} << 31),
            "serve: kv_pages must be in [0, 2147483648], got {}", c.kv_pages);
  const std::string kv = cfg.get_string("kv_dtype");
  if (kv == "bfloat16" || kv == "bf16")
    c.kv_dtype = DType::kBF16;
  else if (kv == "int8")
    c.kv_dtype = DType::kI8;
  else if (kv == "fp8_e4m3" || kv == "fp8" || kv == "e4m3")
    c.kv_dtype = DType::kE4M3;
  else if (kv == "float32" || kv == "f32")
    c.kv_dtype = DType::kF32;
  else
    fail("serve: kv_dtype must be bfloat16, int8, fp8_e4m3 or float32, got '{}'", kv);
  const std::string w = cfg.get_string("weights");
  if (w == "bfloat16" || w == "bf16")
    c.weights = WeightFormat::kBF16;
  else if (w == "float32" || w == "f32")
    c.weights = WeightFormat::kF32;
  else
    fail("serve: weights must be bfloat16 or float32, got '{}'", w);
  const std::string q = cfg.get_string("quantize_weights");
  HYP_CHECK(q == "none" || q == "int8", "serve: quantize_weights must be none or int8, got '{}'",
            q);
  if (q == "int8") c.weights = WeightFormat::kInt8;
  const std::string a = cfg.get_string("attention");
  HYP_CHECK(a == "ragged" || a == "padded", "serve: attention must be ragged or padded, got '{}'",
            a);
  c.padded_attention = a == "padded";
  c.prefix_caching = cfg.get_bool("prefix_caching");
  c.cuda_graphs = cfg.get_bool("cuda_graphs");
  c.chat_template = cfg.get_string("chat_template");
  HYP_CHECK(c.chat_template == "auto" || c.chat_template == "plain" ||
                c.chat_template == "llama2" || c.chat_template.ends_with(".jinja"),
            "serve: chat_template must be auto, plain, llama2 or a .jinja file, got '{}'",
            c.chat_template);
  c.model_name = cfg.get_string("model_name");
  c.max_loras = cfg.get_int("max_loras");
  c.max_lora_rank = cfg.get_int("max_lora_rank");
  c.allow_runtime_lora = cfg.get_bool("allow_runtime_lora");
  HYP_CHECK(c.max_loras >= 0 && c.max_loras <= 256, "serve: max_loras must be in [0, 256], got {}", c.max_loras);
  HYP_CHECK(c.max_lora_rank >= 0 && c.max_lora_rank <= 1024, "serve: max_lora_rank must be in [0, 1024], got {}",
            c.max_lora_rank);
  // What the GPU path does not have yet is refused by name, never run on the CPU.
  if (c.hardware != Device::kHost) {
    HYP_CHECK(c.kv_dtype != DType::kE4M3,
              "serve: kv_dtype=fp8_e4m3 is not on the GPU yet (hardware=gpu takes bfloat16, "
              "int8 or float32)");
  }
  return c;
}

int64_t max_pages_per_sequence(const EngineConfig& c, const DecoderConfig& model) {
  const int64_t full = (c.max_seq_len + c.kv_page_tokens - 1) / c.kv_page_tokens;
  const DecoderArch& a = model.arch;
  if (c.padded_attention || a.sliding_window <= 0 || a.sliding_window_pattern != 0) return full;
  const int64_t n = std::max<int64_t>(c.prefill_chunk, 1);
  return std::min(full, (a.sliding_window + n - 2) / c.kv_page_tokens + 2);
}

void resolve_engine_config(EngineConfig& c, const DecoderConfig& model, int64_t weight_bytes) {
  if (c.max_seq_len == 0) c.max_seq_len = model.max_seq_len;
  // Positions past those the model was trained for (max_position_embeddings) give RoPE
  // angles it never saw: its output there is unreliable, so they are not offered, unless
  // asked for by name (as vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN), with a warning.
  HYP_USAGE_CHECK(c.max_seq_len <= model.max_seq_len || c.allow_long_context,
                  "serve: max_seq_len={} is beyond the model's context (max_position_embeddings "
                  "{} in its config.json); give at most {} (or allow_long_context=true for a "
                  "load test, knowing its output past {} is unreliable)",
                  c.max_seq_len, model.max_seq_len, model.max_seq_len, model.max_seq_len);
  if (c.max_seq_len > model.max_seq_len)
    log_warn("serve: max_seq_len={} is past the model's {} positions (allow_long_context): "
             "output beyond them is unreliable",
             c.max_seq_len, model.max_seq_len);
  const bool automatic_pages = c.kv_pages == 0 || c.padded_attention;
  // What one slot can hold at once: its whole context, or a window's worth.
  const int64_t per_slot = max_pages_per_sequence(c, model);
  const int64_t page_bytes = sat_mul(
      c.kv_page_tokens, sat_mul(model.n_layers, paged_kv_bytes_per_token(
                                                    c.kv_dtype, model.n_kv_heads, model.head_dim)));
  const int64_t memory = device_memory_bytes(c.hardware);
  if (c.max_concurrent_decodes == 0) {
    // As vLLM sizes its KV cache from the memory left beside the weights: a share of what
    // this machine (or its cgroup), or the GPU, has beyond the weights (kv_memory_fraction:
    // half on the host, where the OS and the page cache live too; 0.9 of a GPU, the rest
    // for activations and the GEMM workspace), in whole contexts, so every slot can hold a
    // full max_seq_len (or, with a window on every layer, a window); at least 1 (the memory check below names the keys when even that
    // does not fit) and at most kAutoMaxSlots, past which a step only grows its latency.
    const double fraction = c.kv_memory_fraction > 0 ? c.kv_memory_fraction
                            : c.hardware == Device::kHost ? 0.5
                                                          : 0.9;
    const int64_t left = static_cast<int64_t>(
        static_cast<double>(std::max<int64_t>(0, memory - weight_bytes)) * fraction);
    const int64_t slot_bytes = std::max<int64_t>(1, sat_mul(per_slot, page_bytes));
    c.max_concurrent_decodes = std::clamp<int64_t>(left / slot_bytes, 1, kAutoMaxSlots);
    c.automatic_slots = true;
  }
  if (c.padded_attention) {
    // The padded baseline gives every slot a static region of its whole context.
    HYP_CHECK(c.kv_pages == 0 || c.kv_pages == per_slot * c.max_concurrent_decodes,
              "serve: attention=padded reserves max_seq_len per slot ({} pages); kv_pages={} "
              "must be 0 or that",
              per_slot * c.max_concurrent_decodes, c.kv_pages);
    c.kv_pages = per_slot * c.max_concurrent_decodes;
    c.prefix_caching = false;
  } else if (c.kv_pages == 0) {
    c.kv_pages = per_slot * c.max_concurrent_decodes;
  }
  // Pages released behind a window (a window on every layer) may be shared with another
  // request through the prefix cache, and then free nothing: the reservations that the
  // release makes room for would not be backed. Such a model serves without the cache.
  if (per_slot * c.kv_page_tokens < c.max_seq_len) c.prefix_caching = false;
  HYP_CHECK(c.kv_pages >= per_slot,
            "serve: kv_pages={} cannot hold one sequence of max_seq_len={} ({} pages of {}{})",
            c.kv_pages, c.max_seq_len, per_slot, c.kv_page_tokens,
            per_slot * c.kv_page_tokens < c.max_seq_len ? ", a sliding window's worth" : "");
  // The pool is allocated whole at start-up: check it fits (beside the weights, when
  // given) before trying. Saturating: kv_pages x layers x bytes can pass 2^63.
  const int64_t kv_bytes = sat_mul(c.kv_pages, page_bytes);
  const std::string kv = fmt::format("the KV cache ({} pages x {} tokens, {}", c.kv_pages,
                                     c.kv_page_tokens, dtype_name(c.kv_dtype));
  std::string hint =
      automatic_pages
          ? fmt::format(
                "it holds max_seq_len={}{} for each of max_concurrent_decodes={}{}; set "
                "max_seq_len=, max_concurrent_decodes=, kv_pages= or kv_dtype=int8",
                c.max_seq_len, c.max_seq_len == model.max_seq_len ? " (the model's)" : "",
                c.max_concurrent_decodes, c.automatic_slots ? " (automatic)" : "")
          : std::string("set a smaller kv_pages= or kv_dtype=int8");
  if (weight_bytes > kv_bytes && c.weights != WeightFormat::kF32)
    hint +=
        "; the weights are most of it: weights=float32 keeps no bf16 copy (4 bytes per "
        "parameter instead of 6)";
  check_fits_in_memory(sat_add(kv_bytes, weight_bytes), memory, device_memory_name(c.hardware),
                       weight_bytes > 0
                           ? fmt::format("serve: the weights ({}) plus {}: {})",
                                         format_bytes(weight_bytes), kv, format_bytes(kv_bytes))
                           : "serve: " + kv + ")",
                       hint);
}

void plan_engine_memory(EngineConfig& c, const DecoderConfig& model, int64_t weight_bytes) {
  EngineConfig planned = c;
  resolve_engine_config(planned, model,
                        weight_bytes >= 0 ? weight_bytes
                                          : ParamStore::bytes(model, {c.weights != WeightFormat::kF32,
                                                                      /*gradients=*/false}));
  c.max_concurrent_decodes = planned.max_concurrent_decodes;
  c.automatic_slots = planned.automatic_slots;
}

}  // namespace hyperion::serve
