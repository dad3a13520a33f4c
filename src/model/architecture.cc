#include "model/architecture.h"

#include <cmath>

namespace hyperion {

namespace {

DecoderArch gemma_defaults() {
  DecoderArch a;
  a.family = DecoderFamily::kGemma;
  a.norm_weight_offset = 1.0f;
  a.activation = GatedActivation::kGeluTanh;
  a.scale_embeddings = true;
  return a;
}

// Gemma 2 2B/9B's values (Gemma2Config's defaults).
DecoderArch gemma2_defaults() {
  DecoderArch a = gemma_defaults();
  a.family = DecoderFamily::kGemma2;
  a.post_norms = true;
  a.query_pre_attn_scalar = 256;
  a.attn_logit_softcap = 50.0;
  a.final_logit_softcap = 30.0;
  a.sliding_window = 4096;
  a.sliding_window_pattern = 2;
  return a;
}

// Gemma3TextConfig's defaults (the released 1B narrows the window to 512).
DecoderArch gemma3_defaults() {
  DecoderArch a = gemma_defaults();
  a.family = DecoderFamily::kGemma3;
  a.post_norms = true;
  a.qk_norm = true;
  a.query_pre_attn_scalar = 256;
  a.sliding_window = 4096;
  a.sliding_window_pattern = 6;
  a.local_rope_theta = 10000.0;
  return a;
}

DecoderArch qwen2_defaults() {
  DecoderArch a;
  a.family = DecoderFamily::kQwen2;
  a.qkv_bias = true;
  return a;
}

DecoderArch qwen3_defaults() {
  DecoderArch a;
  a.family = DecoderFamily::kQwen3;
  a.qk_norm = true;
  return a;
}

// One row per family. Adding a family is a row here plus whatever kernels its fields
// need; Mixtral is the llama row with experts (the config's MoE keys).
const FamilyInfo kFamilies[] = {
    {DecoderFamily::kLlama, "llama2", "llama", "LlamaForCausalLM", false, false, DecoderArch{},
     "llama", true},
    {DecoderFamily::kGemma, "gemma", "gemma", "GemmaForCausalLM", true, false, gemma_defaults(),
     "gemma", false},
    {DecoderFamily::kQwen2, "qwen2", "qwen2", "Qwen2ForCausalLM", false, false, qwen2_defaults(),
     "qwen2", false},
    {DecoderFamily::kQwen3, "qwen3", "qwen3", "Qwen3ForCausalLM", false, false, qwen3_defaults(),
     "qwen3", false},
    {DecoderFamily::kGemma2, "gemma2", "gemma2", "Gemma2ForCausalLM", true, true, gemma2_defaults(),
     "gemma2", false},
    {DecoderFamily::kGemma3, "gemma3", "gemma3_text", "Gemma3ForCausalLM", true, true,
     gemma3_defaults(), "gemma3", false},
};

const HfModelType kHfModelTypes[] = {
    {"llama", "LlamaForCausalLM", DecoderFamily::kLlama, 10000.0, 1e-6},
    {"mistral", "MistralForCausalLM", DecoderFamily::kLlama, 10000.0, 1e-6},
    {"mixtral", "MixtralForCausalLM", DecoderFamily::kLlama, 1e6, 1e-5},
    {"gemma", "GemmaForCausalLM", DecoderFamily::kGemma, 10000.0, 1e-6},
    {"gemma2", "Gemma2ForCausalLM", DecoderFamily::kGemma2, 10000.0, 1e-6},
    {"gemma3_text", "Gemma3ForCausalLM", DecoderFamily::kGemma3, 1e6, 1e-6},
    {"qwen2", "Qwen2ForCausalLM", DecoderFamily::kQwen2, 10000.0, 1e-6},
    {"qwen3", "Qwen3ForCausalLM", DecoderFamily::kQwen3, 10000.0, 1e-6},
};

// Other spellings of the llama row: MaxText's decoder_block names for Llama-shaped
// models and the Hugging Face model_types that map onto it.
const char* const kLlamaAliases[] = {"llama", "llama3", "mistral", "mixtral"};

}  // namespace

std::span<const HfModelType> hf_model_types() {
  return kHfModelTypes;
}

float DecoderArch::embedding_scale(int64_t hidden_size) const {
  return scale_embeddings ? std::sqrt(static_cast<float>(hidden_size)) : 1.0f;
}

const FamilyInfo& family_info(DecoderFamily family) {
  for (const FamilyInfo& f : kFamilies)
    if (f.family == family) return f;
  return kFamilies[0];
}

const FamilyInfo* find_family(const std::string& name) {
  for (const FamilyInfo& f : kFamilies)
    if (name == f.decoder_block || name == f.hf_model_type) return &f;
  for (const char* alias : kLlamaAliases)
    if (name == alias) return &kFamilies[0];
  return nullptr;
}

std::string family_names() {
  std::string out;
  for (const FamilyInfo& f : kFamilies)
    out += std::string(out.empty() ? "" : ", ") + f.decoder_block;
  for (const char* alias : kLlamaAliases) out += std::string(", ") + alias;
  return out;
}

}  // namespace hyperion
