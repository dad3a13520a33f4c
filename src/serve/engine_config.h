// Serving engine settings (`hyperion serve CHECKPOINT key=value ...`), checked against a
// schema so a misspelt key or a wrong value is an error naming it.
//
//   max_concurrent_decodes  decode slots (requests generating at once);        0
//                           0 = what memory allows (resolve_engine_config)
//   kv_memory_fraction      share of the memory beside the weights that        0
//                           automatic slots fill; 0 = 0.5 cpu, 0.9 gpu
//   max_queue               requests waiting for a slot before 429            256
//   max_seq_len             context (prompt + output); 0 = the model's          0
//   prefill_chunk           prompt tokens prefilled per engine step           256
//   kv_page_tokens          positions per KV page                              16
//   kv_pages                pages in the pool; 0 = every slot's full context    0
//   kv_dtype                bfloat16 | int8 | fp8_e4m3 | float32         bfloat16
//   weights                 bfloat16 | float32                           bfloat16
//   quantize_weights        none | int8 (per output channel)                 none
//   attention               ragged | padded                                ragged
//   prefix_caching          reuse full KV pages of shared prompt prefixes    true
//   cuda_graphs             on a GPU, replay each decode batch size's        true
//                           recorded step (docs/GPU.md)
//   chat_template           auto | plain | llama2 | FILE.jinja               auto
//                           (auto: the tokenizer's Jinja chat template, else plain)
//   model_name              id reported by /v1/models; "" = checkpoint name    ""
//   hardware                cpu | gpu (docs/GPU.md)                           cpu
//   max_loras               LoRA adapters loaded at once                        4
//   max_lora_rank           largest adapter rank; 0 = the --lora ones' (>= 16)  0
//   allow_runtime_lora      POST /v1/load_lora_adapter, /v1/unload_lora_... false
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/allocator.h"
#include "base/config.h"
#include "model/decoder_config.h"
#include "serve/model_runner.h"
#include "tensor/dtype.h"

namespace hyperion::serve {

// The most slots max_concurrent_decodes=0 chooses.
inline constexpr int64_t kAutoMaxSlots = 256;

struct EngineConfig {
  int64_t max_concurrent_decodes = 0;  // 0 until resolved: what memory allows
  int64_t max_queue = 256;
  int64_t max_seq_len = 0;
  int64_t prefill_chunk = 256;
  int64_t kv_page_tokens = 16;
  int64_t kv_pages = 0;
  double kv_memory_fraction = 0;  // 0: automatic (0.5 cpu, 0.9 gpu)
  DType kv_dtype = DType::kBF16;
  Device hardware = Device::kHost;  // hardware: cpu | gpu
  WeightFormat weights = WeightFormat::kBF16;
  bool padded_attention = false;
  bool prefix_caching = true;
  bool cuda_graphs = true;
  bool allow_long_context = false;  // max_seq_len may exceed max_position_embeddings
  std::string chat_template = "auto";
  std::string model_name;
  bool automatic_slots = false;  // max_concurrent_decodes was chosen from memory
  int64_t max_loras = 4;
  int64_t max_lora_rank = 0;  // 0 until the first adapter: the largest --lora rank, >= 16
  bool allow_runtime_lora = false;
};

// The keys above, with types, defaults and help (`hyperion serve --help` lists them).
std::vector<ConfigKey> engine_config_schema();

// Parses `key=value` overrides (errors name the key and the accepted values).
EngineConfig parse_engine_config(const std::vector<std::string>& overrides);

// Fills the automatic values for this model: max_seq_len (the model's),
// max_concurrent_decodes (as many whole contexts, or windows with a sliding window on every
// layer, as kv_memory_fraction of the memory beside `weight_bytes` holds, 1..kAutoMaxSlots),
// kv_pages (every slot's max_pages_per_sequence); padded attention
// always gets one static region per slot. Then checks the KV cache fits the device's memory
// beside `weight_bytes` of weights; the engine checks the cache alone (0) as a backstop. Errors
// name the keys that size the cache.
void resolve_engine_config(EngineConfig& c, const DecoderConfig& model, int64_t weight_bytes = 0);

// The most KV pages one sequence holds at once: its whole context (max_seq_len), or, with a
// sliding window on every layer and ragged attention (Mistral v0.1), the pages a step can
// read, from the window behind its first query to its last: (W + chunk - 2) / P + 2, when
// that is fewer (the engine releases the older ones as the sequence runs, and
// resolve_engine_config turns the prefix cache off: a released page another request shares
// would free nothing).
int64_t max_pages_per_sequence(const EngineConfig& c, const DecoderConfig& model);

// Before the weights are loaded: resolves a copy of `c` beside the weights the engine's
// format keeps (ParamStore::bytes), so a model and KV cache that do not fit the device are
// refused first, and keeps the slot count chosen there (the engine's own resolve, with the
// cache alone, would leave room for more).
// `weight_bytes` >= 0 gives the weights' size instead (a GGUF model, whose matrices stay in
// their blocks).
void plan_engine_memory(EngineConfig& c, const DecoderConfig& model, int64_t weight_bytes = -1);

const char* weight_format_name(WeightFormat w);

}  // namespace hyperion::serve
