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
// need (and its names in convert/family_formats.cc); Mixtral is the llama row with
// experts (the config's MoE keys).
const FamilyInfo kFamilies[] = {
    {DecoderFamily::kLlama, "llama2", false, false, DecoderArch{}},
    {DecoderFamily::kGemma, "gemma", true, false, gemma_defaults()},
    {DecoderFamily::kQwen2, "qwen2", false, false, qwen2_defaults()},
    {DecoderFamily::kQwen3, "qwen3", false, false, qwen3_defaults()},
    {DecoderFamily::kGemma2, "gemma2", true, true, gemma2_defaults()},
    {DecoderFamily::kGemma3, "gemma3", true, true, gemma3_defaults()},
};

// Other spellings of a row: MaxText's decoder_block names for Llama-shaped models and
// the Hugging Face model_types that differ from the row's name (accepted, not listed in
// help and errors).
struct FamilyAlias {
  const char* name;
  DecoderFamily family;
  bool listed;
};
const FamilyAlias kAliases[] = {{"llama", DecoderFamily::kLlama, true},
                                {"llama3", DecoderFamily::kLlama, true},
                                {"mistral", DecoderFamily::kLlama, true},
                                {"mixtral", DecoderFamily::kLlama, true},
                                {"gemma3_text", DecoderFamily::kGemma3, false}};

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
    if (name == f.decoder_block) return &f;
  for (const FamilyAlias& alias : kAliases)
    if (name == alias.name) return &family_info(alias.family);
  return nullptr;
}

std::string family_names() {
  std::string out;
  for (const FamilyInfo& f : kFamilies)
    out += std::string(out.empty() ? "" : ", ") + f.decoder_block;
  for (const FamilyAlias& alias : kAliases)
    if (alias.listed) out += std::string(", ") + alias.name;
  return out;
}

}  // namespace hyperion
