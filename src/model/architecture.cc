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
    {DecoderFamily::kLlama, "llama2", "llama", "LlamaForCausalLM", false, DecoderArch{}, "llama",
     true},
    {DecoderFamily::kGemma, "gemma", "gemma", "GemmaForCausalLM", true, gemma_defaults(), "gemma",
     false},
    {DecoderFamily::kQwen2, "qwen2", "qwen2", "Qwen2ForCausalLM", false, qwen2_defaults(), "qwen2",
     false},
    {DecoderFamily::kQwen3, "qwen3", "qwen3", "Qwen3ForCausalLM", false, qwen3_defaults(), "qwen3",
     false},
};

// Other spellings of the llama row: MaxText's decoder_block names for Llama-shaped
// models and the Hugging Face model_types that map onto it.
const char* const kLlamaAliases[] = {"llama", "llama3", "mistral", "mixtral"};

}  // namespace

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
