// A checkpoint directory loaded for inference (eval, generate, serve): its config,
// weights (with a bf16 copy when asked) and tokenizer.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/decoder_config.h"
#include "model/param_store.h"
#include "text/tokenizer.h"

namespace hyperion::cli {

struct LoadedCheckpoint {
  std::string dir;      // the model's weights (a LoRA adapter's base)
  std::string adapter;  // the LoRA adapter merged into them ("" if none)
  DecoderConfig config;
  std::unique_ptr<ParamStore> params;
  text::Tokenizer tokenizer;
};

// `path` is a checkpoint directory or a run directory (its latest checkpoint).
// `before_load` runs once config.json is checked against the weight files and the
// weights against the machine's memory, before they are allocated (serve checks its KV
// cache beside them there, in the memory of `device`). The weights are placed on `device`
// (read through a host copy).
// `adapter`: a PEFT LoRA adapter directory merged into the weights (W + s B A, as PEFT's
// merge_and_unload). A `path` that is itself an adapter directory (a LoRA run's
// checkpoint) loads its base from adapter_config.json's base_model_name_or_path with the
// adapter merged; its tokenizer is the adapter directory's when it has one.
LoadedCheckpoint load_checkpoint(
    const std::string& path, bool bf16,
    const std::function<void(const DecoderConfig&)>& before_load = nullptr,
    Device device = Device::kHost, std::string adapter = "");

}  // namespace hyperion::cli
