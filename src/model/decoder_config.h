// Shape of a decoder (every family's: Llama, Mistral, Mixtral, Gemma, Qwen; Hugging Face's
// config.json semantics, read and written by convert/hf_config.h) and the arithmetic that
// follows from it: parameter counts, training FLOPs per token, and the
// memory a training process needs for a batch and a rematerialisation policy.
#pragma once

#include <cstdint>
#include <string>

#include "base/system_memory.h"
#include "kernels/rope.h"
#include "model/architecture.h"

namespace hyperion {

// Where a config's keys came from, so errors name the key as the user wrote it.
enum class ConfigKeyNames {
  kHuggingFace,  // config.json: hidden_size, num_hidden_layers, intermediate_size, ...
  kTraining,     // a training YAML: base_emb_dim, base_num_decoder_layers, base_mlp_dim, ...
};

// The decoder's shape and family (arch says how a family differs, model/architecture.h).
struct DecoderConfig {
  DecoderArch arch;
  int64_t vocab_size = 32000;
  int64_t dim = 4096;           // hidden_size
  int64_t n_layers = 32;        // num_hidden_layers
  int64_t n_heads = 32;         // num_attention_heads
  int64_t n_kv_heads = 32;      // num_key_value_heads (grouped-query attention when fewer)
  int64_t head_dim = 128;       // hidden_size / num_attention_heads unless set
  int64_t ffn_dim = 11008;      // intermediate_size
  double norm_eps = 1e-5;       // rms_norm_eps
  double rope_theta = 10000;    // rope_theta
  RopeScaling rope_scaling;     // rope_scaling (or transformers 5's rope_parameters)
  int64_t max_seq_len = 2048;   // max_position_embeddings
  bool tie_embeddings = false;  // tie_word_embeddings
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  int32_t pad_id = -1;  // pad_token_id; -1: none

  // Mixture of experts (Hugging Face MixtralConfig semantics when every layer is MoE).
  int64_t n_experts = 0;          // num_local_experts; 0 = a dense model
  int64_t n_experts_per_tok = 2;  // num_experts_per_tok (top-k)
  int64_t moe_ffn_dim = 0;        // intermediate size of one expert; 0 = ffn_dim
  int64_t first_dense_layers =
      0;  // the first layers keep a dense MLP (MaxText first_num_dense_layers)
  int64_t moe_layer_step =
      1;  // after those, every step-th layer is MoE (interleave_moe_layer_step)
  bool norm_topk_prob = true;         // renormalise the chosen k router probabilities (Mixtral)
  double router_aux_loss_coef = 0.0;  // load-balance loss weight, recorded for Hugging Face

  int64_t q_dim() const { return n_heads * head_dim; }
  bool is_moe() const { return n_experts > 0; }
  // Layer l's MLP is a mixture of experts: l >= first_dense_layers and
  // (l - first_dense_layers + 1) is a multiple of moe_layer_step (step 2: layers 1, 3, ...).
  bool is_moe_layer(int64_t l) const;
  int64_t n_moe_layers() const;
  int64_t expert_ffn_dim() const { return moe_ffn_dim > 0 ? moe_ffn_dim : ffn_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  // Errors name `origin` (file or preset) and the key as `names` spells it (e.g.
  // "num_hidden_layers = 1000000 is out of range" for a config.json).
  void validate(const std::string& origin,
                ConfigKeyNames names = ConfigKeyNames::kHuggingFace) const;

  // Parameters of decoder layer l (attention + MLP or router and experts + two norms),
  // and the ones a token actually uses there (only its k experts).
  int64_t layer_params(int64_t l = 0) const;
  int64_t active_layer_params(int64_t l = 0) const;
  int64_t embedding_params() const { return vocab_size * dim; }
  // lm_head [vocab, dim]; 0 extra parameters when tied to the embedding.
  int64_t lm_head_params() const { return tie_embeddings ? 0 : vocab_size * dim; }
  int64_t total_params() const;
  // Every parameter that takes part in a matmul or norm: layers, final norm and the LM
  // head (counted even when tied, since its matmul runs either way).
  int64_t non_embedding_params() const;
  // non_embedding_params() counting only the k experts a token is routed to (equal to it
  // for a dense model): the parameters behind one token's FLOPs.
  int64_t active_non_embedding_params() const;

  // Training FLOPs per token for sequences of `seq_len`: 6 x active_non_embedding_params()
  // (forward 2, backward 4 per weight per token) plus causal attention: per layer the
  // forward does q k^T and P v, 2 x 2 x seq_len x q_dim per token without masking, halved
  // for causality, times 3 for forward + backward: 6 x n_layers x seq_len x q_dim. A
  // sliding-window layer counts only the pairs its window keeps.
  double train_flops_per_token(int64_t seq_len) const;
  // Forward-only FLOPs per token (evaluation, prefill): a third of the training figure.
  double forward_flops_per_token(int64_t seq_len) const;
};

enum class RematPolicy { kNone, kMinimal, kFull };
RematPolicy parse_remat_policy(const std::string& name, const std::string& origin);
const char* remat_policy_name(RematPolicy p);

// Bytes a training process holds, by category (see DecoderConfig::memory_plan).
struct MemoryPlan {
  int64_t params = 0;                // number of parameters
  int64_t weight_bytes = 0;          // f32 master weights
  int64_t compute_weight_bytes = 0;  // bf16 copy used by the matmuls (0 in f32)
  int64_t grad_bytes = 0;            // f32 gradients
  int64_t optimizer_bytes = 0;       // AdamW m and v, f32
  int64_t activation_bytes = 0;      // saved for backward, all layers, per the remat policy
  int64_t scratch_bytes = 0;         // recomputation and temporary buffers, logits
  // Saturates at INT64_MAX (an absurd batch must fail the memory check, not wrap past it).
  int64_t total() const {
    int64_t t = 0;
    for (int64_t b : {weight_bytes, compute_weight_bytes, grad_bytes, optimizer_bytes,
                      activation_bytes, scratch_bytes})
      t = sat_add(t, b);
    return t;
  }
};

// Training memory of one process for a micro-batch of batch x seq_len tokens
// (capacity_factor > 0: capped MoE layers, whose buffers hold E x capacity rows).
MemoryPlan memory_plan(const DecoderConfig& c, int64_t batch, int64_t seq_len, bool bf16_compute,
                       RematPolicy remat, double capacity_factor = -1.0);

}  // namespace hyperion
