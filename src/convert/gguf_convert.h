// Converts a hyperion checkpoint or Hugging Face model directory to a llama.cpp GGUF
// file, writing what llama.cpp's convert_hf_to_gguf.py writes for the family's
// architecture: "llama" for Llama 2/3, Mistral and Mixtral, "gemma", "qwen2", "qwen3".
//
// The directory holds
//   model.safetensors  the tensors, with their Hugging Face names (or a sharded layout with
//                      model.safetensors.index.json); f32, bf16 or f16. Which tensors, and
//                      each one's llama.cpp name, come from the model's parameter layout
//                      (model/param_store.cc), the same one every other command reads.
//   config.json        read by decoder_config_from_hf_json (convert/hf_config.h), as
//                      everywhere: what it refuses, this refuses.
//   tokenizer.model    a SentencePiece model (a tokenizer.json is refused: the GGUF
//                      vocabulary written here is SentencePiece's)
// For the "llama" architecture q_proj/k_proj rows (and their biases) are permuted from
// Hugging Face's rotate-half RoPE layout to the interleaved (adjacent pairs) layout that
// llama.cpp's llama graph expects; the other architectures rotate halves and keep them.
// Norms whose scale is (1 + w) (Gemma) are stored as that scale.
//
// RoPE scaling: linear and YaRN as <arch>.rope.scaling.{type,factor,original_context_length};
// Llama 3.1's as the rope_freqs.weight tensor (per frequency, plain over scaled), as
// convert_hf_to_gguf.py writes it.
//
// Mixtral: llama.expert_count = E, llama.expert_used_count = k, llama.feed_forward_length
// = F, and per layer blk.{i}.ffn_gate_inp.weight (the router, always f32) and the experts
// stacked as blk.{i}.ffn_{gate,up}_exps.weight [E, F, D] and ffn_down_exps.weight
// [E, D, F] (row-major; GGUF ne = [D, F, E] and [F, D, E]). llama.cpp routes by softmax ->
// top-k -> renormalise and makes every layer MoE, so config.json's norm_topk_prob = false
// and hyperion's dense/MoE interleaving (hyperion_first_dense_layers > 0,
// hyperion_moe_layer_step > 1) are refused.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/gguf.h"
#include "tensor/tensor.h"

namespace hyperion::convert {

// What a GGUF holds: one tensor type for every matrix (f32, f16, bf16, q8_0), or one of
// llama.cpp's quantisation mixtures, each tensor's type chosen as llama-quantize chooses it
// (gguf_tensor_types below): q4_0 (LLAMA_FTYPE_MOSTLY_Q4_0), q4_k_m, q5_k_m, q6_k. q8_0
// is both (llama-quantize's Q8_0 makes every matrix q8_0).
enum class GgufOutType { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_K_M, kQ5_K_M, kQ6_K };
// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k" (lower case, as the CLI
// takes them); nullopt for anything else.
std::optional<GgufOutType> parse_gguf_out_type(std::string_view name);
// general.file_type (llama.cpp's llama_ftype): 0, 1, 32, 7, 2, 15, 17, 18.
uint32_t gguf_file_type(GgufOutType type);

// The model facts llama.cpp's type choice looks at.
struct GgufQuantModel {
  std::string arch;  // llama.cpp's architecture: "llama", "qwen2", "gemma2", ...
  int64_t n_layers = 0, n_heads = 0, n_kv_heads = 0;
  int64_t n_experts = 0;  // 0 for a dense model
};

// The type of each tensor of a GGUF (names and row-major shapes in file order), as
// llama.cpp's llama-quantize (src/llama-quant.cpp, llama_tensor_get_type and
// tensor_type_fallback, without an importance matrix or overrides) chooses it for a
// mixture, or the one type for a plain output type:
//   - Tensors of rank < 2, names not ending in "weight", norms ("_norm.weight") and MoE
//     routers ("ffn_gate_inp.weight") are not quantised: f32 (as convert_hf_to_gguf.py
//     writes them, and the mixtures keep them).
//   - output.weight, or token_embd.weight when there is no output.weight (tied
//     embeddings): q6_K for every mixture but q8_0 (which keeps q8_0); q8_0 when its row
//     length is not a multiple of the mixture's block size.
//   - token_embd.weight otherwise: the mixture's base type.
//   - attn_v.weight: q6_K in q4_k_m and q5_k_m on the layers use_more_bits picks (the
//     first and last eighth and every third between, counted over the attn_v tensors in
//     file order); on a 70B model (llama: 80 layers with grouped-query attention; qwen2:
//     80 layers) a q4_K there becomes q5_K; with 8 experts q8_0 (every mixture).
//   - attn_k.weight: q8_0 with 8 experts.
//   - ffn_down (and ffn_down_exps): q6_K in q4_k_m and q5_k_m on the use_more_bits layers
//     (the layer from the name for MoE models, else the count in file order).
//   - attn_output.weight: q5_K in q4_k_m with 8 experts.
//   - everything else: the base type (q4_0, q8_0, q4_K, q5_K, q6_K).
//   (llama.cpp's n_gqa() >= 4 and expert-count >= 4 rules on attn_v apply to the Q2_K, Q3
//   and IQ mixtures only, none of which is written here.)
// Then the fallback for row lengths the chosen type's blocks do not divide: llama.cpp
// turns q4_K into q5_0, q5_K into q5_1 and q6_K into q8_0. q5_0 and q5_1 are not written
// here, so all three become q8_0, the nearest supported type that is at least as accurate
// (q4_0 would be smaller but less accurate than llama.cpp's q5_0); and a row length that
// is not a multiple of 32 either gives f16, as in llama.cpp.
std::vector<io::GgmlType> gguf_tensor_types(
    GgufOutType type, const GgufQuantModel& model,
    const std::vector<std::pair<std::string, Shape>>& tensors);

// out_type: any name parse_gguf_out_type takes. The output is written atomically. Errors
// name the checkpoint directory, the file and the key or tensor at fault.
void convert_checkpoint_to_gguf(const std::string& checkpoint_dir, const std::string& out_path,
                                const std::string& out_type);

// The row permutation applied to q_proj (n_head = num_attention_heads) and k_proj
// (n_head = num_key_value_heads), equal to numpy's
//   w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
// i.e. out[h*hd + 2*j + t] = in[h*hd + t*hd/2 + j] for head h, pair j, t in {0, 1}.
// `rows` must be a multiple of 2 * n_head. `in` and `out` must not overlap.
void permute_rope_rows_for_gguf(const float* in, float* out, int64_t rows, int64_t cols,
                                int64_t n_head);

}  // namespace hyperion::convert
