// A checkpoint directory loaded for inference (eval, generate, serve): its config,
// weights (with a bf16 copy when asked) and tokenizer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "model/llama_config.h"
#include "model/param_store.h"

namespace hyperion::cli {

struct LoadedCheckpoint {
  std::string dir;
  LlamaConfig config;
  std::unique_ptr<ParamStore> params;
  io::Tokenizer tokenizer;
};

// `path` is a checkpoint directory or a run directory (its latest checkpoint).
LoadedCheckpoint load_checkpoint(const std::string& path, bool bf16);

}  // namespace hyperion::cli
