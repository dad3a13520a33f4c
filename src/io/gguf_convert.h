// Converts a hyperion checkpoint directory to a llama.cpp GGUF file, writing what
// llama.cpp's convert_hf_to_gguf.py writes for a LlamaForCausalLM or MixtralForCausalLM
// model (both as GGUF architecture "llama").
//
// The checkpoint directory holds
//   model.safetensors  Hugging Face Llama tensor names (model.embed_tokens.weight,
//                      model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
//                      model.layers.{i}.mlp.{gate,up,down}_proj.weight,
//                      model.layers.{i}.{input,post_attention}_layernorm.weight,
//                      model.norm.weight, lm_head.weight unless tie_word_embeddings);
//                      Linear weights are [out, in]; f32, bf16 or f16.
//                      Mixtral instead of mlp.*: model.layers.{i}.block_sparse_moe.gate.weight
//                      [E, D] (router) and ...block_sparse_moe.experts.{e}.{w1,w3}.weight
//                      [F, D] (gate, up), .w2.weight [D, F] (down), e < E
//   config.json        Hugging Face LlamaConfig keys (model_type "llama"), or MixtralConfig
//                      keys (model_type "mixtral": intermediate_size = F, num_local_experts
//                      = E, num_experts_per_tok = k, norm_topk_prob)
//   tokenizer.model    SentencePiece model
// q_proj/k_proj rows are permuted from Hugging Face's rotate-half RoPE layout to the
// interleaved (adjacent pairs) layout that llama.cpp's llama graph expects.
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

namespace hyperion::io {

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

}  // namespace hyperion::io
