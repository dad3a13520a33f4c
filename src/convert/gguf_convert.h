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
#include <string>

namespace hyperion::convert {

// out_type: "f32" | "f16" | "bf16" | "q8_0". Norms and other 1-D tensors stay f32; with
// q8_0, 2-D tensors whose row length is not a multiple of 32 fall back to f16 (as
// llama.cpp does). The output is written atomically. Errors name the checkpoint
// directory, the file and the key or tensor at fault.
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
