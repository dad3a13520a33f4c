// A decoder family described as data. Llama, Mixtral and Gemma are one decoder
// (model/decoder.h) that differs only in the fields below; the parameter layout and
// initialisation (param_store) and the forward and backward (decoder) read them from here.
// What other formats call each family (Hugging Face's config.json, llama.cpp's GGUF) is
// convert/'s (convert/family_formats.h), above the model.
//
//                       Llama / Mixtral        Gemma (GemmaForCausalLM)
//   RMSNorm scale       w                      1 + w      (norm_weight_offset 0 / 1)
//   gated activation    SiLU (SwiGLU)          GELU-tanh (GeGLU)
//   embedding scale     1                      sqrt(hidden_size)
//   LM head             own or tied            tied to the embedding
//   head_dim            hidden / heads         its own (hidden / heads need not match)
//
//                       Qwen2 (Qwen2ForCausalLM)  Qwen3 (Qwen3ForCausalLM)
//   q/k/v biases        yes                       no
//   q/k RMSNorm per head no                        yes, before RoPE
//   otherwise           Llama                     Llama
//
//                       Gemma 2 (Gemma2ForCausalLM)  Gemma 3 (Gemma3ForCausalLM, text)
//   norms               four: pre and post around      Gemma 2's, plus q/k RMSNorm
//                       attention and around the MLP   per head (1 + w)
//   attention scale     query_pre_attn_scalar^-0.5     idem
//   soft caps           scores 50, final logits 30     none
//   local layers        every other (window 4096)      5 of every 6 (window 512), their
//                                                      own RoPE base (10000, unscaled)
//
// Sliding-window attention, on every layer (Mistral v0.1) or on all but every N-th
// (Gemma 2: N = 2, Gemma 3: N = 6), is data too.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/gated_activation.h"

namespace hyperion {

enum class DecoderFamily : uint8_t { kLlama, kGemma, kQwen2, kQwen3, kGemma2, kGemma3 };

// The per-model fields (a DecoderConfig holds one): a family's defaults, as every family
// fixes them today, but kept as data so the decoder never asks which family it runs.
struct DecoderArch {
  DecoderFamily family = DecoderFamily::kLlama;
  float norm_weight_offset = 0.0f;  // RMSNorm multiplies by (w + offset)
  GatedActivation activation = GatedActivation::kSilu;
  bool scale_embeddings = false;       // x = embed(tokens) * sqrt(hidden_size)
  bool qkv_bias = false;               // q_proj, k_proj, v_proj have biases (Qwen2)
  bool o_bias = false;                 // o_proj has a bias (Llama's attention_bias: all four)
  bool qk_norm = false;                // RMSNorm on q and k per head before RoPE (Qwen3)
  int64_t sliding_window = 0;          // local attention window in tokens; 0: global
  int64_t sliding_window_pattern = 0;  // >= 2: every N-th layer global, the rest local;
                                       // 0: every layer local (when sliding_window > 0)
  // RMSNorm on the attention's and the MLP's outputs before each residual add (Gemma 2/3:
  // post_attention_layernorm, post_feedforward_layernorm; the MLP's input norm is then
  // pre_feedforward_layernorm).
  bool post_norms = false;
  double query_pre_attn_scalar = 0.0;  // > 0: attention scale 1/sqrt(this); 0: 1/sqrt(head_dim)
  double attn_logit_softcap = 0.0;     // scores = cap * tanh(scores / cap); 0: off
  double final_logit_softcap = 0.0;    // logits = cap * tanh(logits / cap); 0: off
  double local_rope_theta = 0.0;       // > 0: local layers' RoPE base, unscaled (Gemma 3); 0: the
                                       // global RoPE everywhere

  // The factor embedding_forward applies (1 unless scale_embeddings).
  float embedding_scale(int64_t hidden_size) const;
  // Layer l's attention window: sliding_window on a local layer, 0 (global) otherwise.
  int64_t layer_window(int64_t l) const {
    if (sliding_window <= 0) return 0;
    return sliding_window_pattern >= 2 && (l + 1) % sliding_window_pattern == 0 ? 0
                                                                                : sliding_window;
  }
  // Local layers that use their own RoPE table.
  bool local_rope(int64_t l) const { return local_rope_theta > 0 && layer_window(l) > 0; }
  bool operator==(const DecoderArch&) const = default;
};

// A family's name and defaults.
struct FamilyInfo {
  DecoderFamily family;
  const char* decoder_block;  // the training YAML's decoder_block (MaxText's names)
  bool tied_head;             // the LM head is always the embedding (Gemma)
  // Gemma 2's extras (Gemma 2 and 3): soft caps, query_pre_attn_scalar, and a window
  // pattern of local and global layers.
  bool gemma2_features;
  DecoderArch defaults;
};

const FamilyInfo& family_info(DecoderFamily family);
// By the YAML's decoder_block ("llama2", "gemma", ...) or another spelling of one
// ("llama", "llama3", "mistral", "mixtral", "gemma3_text"); null when unknown.
const FamilyInfo* find_family(const std::string& name);
// The decoder_block names accepted, for error messages ("llama2, mistral, ...").
std::string family_names();

}  // namespace hyperion
