// libFuzzer: the configuration parsers. The first byte picks one: a training config in
// YAML (schema, types, duplicate keys, nesting) followed by parse_train_config's checks,
// or a Hugging Face config.json (convert::decoder_config_from_hf_json, with its range checks).
#include <cstdint>
#include <string>

#include "base/config.h"
#include "base/error.h"
#include "convert/hf_config.h"
#include "model/decoder_config.h"
#include "train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hyperion;
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      Config c(train_config_schema());
      c.load_yaml_string(text, "fuzz.yml");
      const TrainConfig t = parse_train_config(c, "fuzz");
      // Accepted sizes are bounded, so the memory arithmetic cannot overflow.
      (void)memory_plan(t.model, t.per_device_batch_size, t.max_target_length, t.bf16, t.remat);
    } else {
      const DecoderConfig c = convert::decoder_config_from_hf_json(text, "config.json");
      (void)c.total_params();
      // What we write must read back as the same model.
      try {
        const DecoderConfig back =
            convert::decoder_config_from_hf_json(convert::to_hf_config_json(c), "round trip");
        if (back.dim != c.dim || back.n_layers != c.n_layers || back.vocab_size != c.vocab_size ||
            back.n_kv_heads != c.n_kv_heads || back.n_experts != c.n_experts)
          __builtin_trap();
      } catch (const Error&) {
        __builtin_trap();
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
