// What other formats call each decoder family, as tables: Hugging Face's config.json
// (model_type, architectures[0], the config class's defaults) and llama.cpp's GGUF
// (general.architecture, its RoPE layout, the tensor names). The model itself
// (model/architecture.h) knows only its own names; everything that reads or writes another
// format's names (convert/hf_config.h, convert/gguf_convert.h) reads them here.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "model/architecture.h"
#include "model/decoder_config.h"
#include "model/param_store.h"

namespace hyperion::convert {

// The (model_type, architectures[0]) pairs a config.json may name, and the family each
// means: each family's own before other spellings of one (Mistral and Mixtral are
// Llama), with the transformers config class's defaults where they differ.
struct HfModelType {
  const char* model_type;
  const char* architecture;
  DecoderFamily family;
  double rope_theta;    // the config class's default
  double rms_norm_eps;  // idem
};
std::span<const HfModelType> hf_model_types();
// The family's own row: the model_type and class of a dense model of that family.
const HfModelType& hf_model_type(DecoderFamily family);

// llama.cpp: general.architecture, and whether its graph rotates adjacent pairs (its
// "llama" graph: q_proj/k_proj rows are permuted at export) rather than halves as
// Hugging Face does (gemma, qwen2, qwen3: NEOX-style RoPE, rows kept).
struct GgufArch {
  DecoderFamily family;
  const char* arch;
  bool permute_qk;
};
const GgufArch& gguf_arch(DecoderFamily family);

// llama.cpp's name for each tensor of `layout` (ParamStore::layout(config)), in order:
// "model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight". The experts of one
// MoE layer share their stacked tensor's name (blk.{i}.ffn_gate_exps.weight). Throws for
// a name the tables do not map.
std::vector<std::string> gguf_tensor_names(const DecoderConfig& config,
                                           const std::vector<ParamInfo>& layout);

}  // namespace hyperion::convert
