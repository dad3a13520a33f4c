#include "model/decoder_config.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "base/system_memory.h"
#include "kernels/attention.h"
#include "model/moe_block.h"

namespace hyperion {

void DecoderConfig::validate(const std::string& origin, ConfigKeyNames names) const {
  // Errors name the key as the user wrote it: a config.json's Hugging Face key or a
  // training YAML's (MaxText) key, never this struct's field.
  const bool hf = names == ConfigKeyNames::kHuggingFace;
  auto key = [hf](const char* hf_key, const char* train_key) { return hf ? hf_key : train_key; };
  const char* k_vocab = "vocab_size";
  const char* k_dim = key("hidden_size", "base_emb_dim");
  const char* k_layers = key("num_hidden_layers", "base_num_decoder_layers");
  const char* k_heads = key("num_attention_heads", "base_num_query_heads");
  const char* k_kv_heads = key("num_key_value_heads", "base_num_kv_heads");
  const char* k_head_dim = "head_dim";
  // A Mixtral config.json's intermediate_size is the expert's; a dense layer's differs
  // only when hyperion_dense_intermediate_size is set.
  const char* k_ffn = key(is_moe() && moe_ffn_dim != 0 && moe_ffn_dim != ffn_dim
                              ? "hyperion_dense_intermediate_size"
                              : "intermediate_size",
                          "base_mlp_dim");
  const char* k_moe_ffn = key("intermediate_size", "base_moe_mlp_dim");
  const char* k_positions = "max_position_embeddings";
  const char* k_experts = key("num_local_experts", "num_experts");
  auto positive = [&](int64_t v, const char* name) {
    HYP_CHECK(v > 0, "{}: {} must be > 0, got {}", origin, name, v);
  };
  positive(vocab_size, k_vocab);
  positive(dim, k_dim);
  positive(n_layers, k_layers);
  positive(n_heads, k_heads);
  positive(n_kv_heads, k_kv_heads);
  positive(head_dim, k_head_dim);
  positive(ffn_dim, k_ffn);
  positive(max_seq_len, k_positions);
  // Upper bounds far past any real model: beyond them the sizes overflow or cannot be
  // allocated, and a typo (1e12) must be named here rather than fail inside malloc.
  // Within them every parameter count fits int64 (the largest, 4096 layers of 4096
  // experts of 2^17 x 2^20, is 3 x 2^61); byte counts can still overflow and saturate
  // (base/system_memory.h).
  auto at_most = [&](int64_t v, int64_t hi, const char* name) {
    HYP_CHECK(v <= hi, "{}: {} = {} is out of range (at most {})", origin, name, v, hi);
  };
  at_most(vocab_size, int64_t{1} << 24, k_vocab);  // token ids are int32; 16.7M
  at_most(dim, int64_t{1} << 17, k_dim);
  at_most(n_layers, 4096, k_layers);
  at_most(n_heads, 4096, k_heads);
  at_most(head_dim, 4096, k_head_dim);
  at_most(ffn_dim, int64_t{1} << 20, k_ffn);
  at_most(moe_ffn_dim, int64_t{1} << 20, k_moe_ffn);
  at_most(max_seq_len, int64_t{1} << 24, k_positions);
  at_most(n_experts, 4096, k_experts);
  HYP_CHECK(n_heads % n_kv_heads == 0, "{}: {} ({}) must divide {} ({})", origin, k_kv_heads,
            n_kv_heads, k_heads, n_heads);
  HYP_CHECK(head_dim % 2 == 0, "{}: {} must be even for RoPE, got {}", origin, k_head_dim,
            head_dim);
  HYP_CHECK(norm_eps > 0, "{}: {} must be > 0, got {}", origin,
            key("rms_norm_eps", "normalization_layer_epsilon"), norm_eps);
  HYP_CHECK(rope_theta > 0, "{}: {} must be > 0, got {}", origin,
            key("rope_theta", "rope_max_timescale"), rope_theta);
  if (n_experts != 0) {
    HYP_CHECK(n_experts > 0, "{}: {} must be >= 0, got {}", origin, k_experts, n_experts);
    HYP_CHECK(n_experts_per_tok >= 1 && n_experts_per_tok <= n_experts,
              "{}: key 'num_experts_per_tok' = {} must be >= 1 and at most {} = {}", origin,
              n_experts_per_tok, k_experts, n_experts);
    HYP_CHECK(moe_ffn_dim >= 0, "{}: {} must be >= 0, got {}", origin, k_moe_ffn, moe_ffn_dim);
    HYP_CHECK(first_dense_layers >= 0 && first_dense_layers <= n_layers,
              "{}: {} must lie in [0, {}={}], got {}", origin,
              key("hyperion_first_dense_layers", "first_num_dense_layers"), k_layers, n_layers,
              first_dense_layers);
    HYP_CHECK(moe_layer_step >= 1, "{}: key '{}' = {} must be >= 1", origin,
              key("hyperion_moe_layer_step", "interleave_moe_layer_step"), moe_layer_step);
  }
  // The family's fields the decoder does not implement yet (architecture.h).
  if (rope_scaling.type != RopeScaling::Type::kNone) {
    try {
      (void)rope_inv_freq(head_dim, rope_theta, rope_scaling);
    } catch (const Error& e) {
      fail("{}: {}", origin, e.what());
    }
  }
  auto non_negative = [&](double v, const char* name) {
    HYP_CHECK(std::isfinite(v) && v >= 0.0, "{}: {} = {} must be finite and >= 0 (0: off)", origin,
              name, v);
  };
  non_negative(arch.final_logit_softcap, key("final_logit_softcapping", "final_logits_soft_cap"));
  non_negative(arch.attn_logit_softcap, key("attn_logit_softcapping", "attn_logits_soft_cap"));
  non_negative(arch.query_pre_attn_scalar, "query_pre_attn_scalar");
  non_negative(arch.local_rope_theta, key("rope_local_base_freq", "local_rope_max_timescale"));
  // What only Gemma 2/3's config.json can say (and Gemma 3's alone, the local RoPE): on
  // another family it would be lost when the checkpoint is saved.
  const bool gemma_n = family_info(arch.family).gemma2_features;
  auto family_only = [&](bool ok, double v, const char* name, const char* families) {
    HYP_CHECK(ok || v == 0.0, "{}: {} = {} is read and written for {} only (decoder_block {})",
              origin, name, v, families, family_info(arch.family).decoder_block);
  };
  family_only(gemma_n, arch.attn_logit_softcap,
              key("attn_logit_softcapping", "attn_logits_soft_cap"), "gemma2 and gemma3");
  family_only(gemma_n, arch.final_logit_softcap,
              key("final_logit_softcapping", "final_logits_soft_cap"), "gemma2 and gemma3");
  family_only(gemma_n, arch.query_pre_attn_scalar, "query_pre_attn_scalar", "gemma2 and gemma3");
  family_only(arch.family == DecoderFamily::kGemma3, arch.local_rope_theta,
              key("rope_local_base_freq", "local_rope_max_timescale"), "gemma3");
  HYP_CHECK(arch.post_norms == family_info(arch.family).defaults.post_norms,
            "{}: post-norms are part of the {} family's definition", origin,
            family_info(arch.family).decoder_block);
  HYP_CHECK(!arch.post_norms || n_experts == 0,
            "{}: the {} family's post-norms have no mixture-of-experts form here", origin,
            family_info(arch.family).decoder_block);
  HYP_CHECK(arch.sliding_window >= 0 && arch.sliding_window <= (int64_t{1} << 24),
            "{}: {} = {} must be in [0, 16777216] (0: global attention)", origin,
            key("sliding_window", "sliding_window_size"), arch.sliding_window);
  HYP_CHECK(arch.sliding_window_pattern == 0 ||
                (arch.sliding_window_pattern >= 2 && arch.sliding_window > 0),
            "{}: {} = {} must be 0 (every layer local) or >= 2 (every N-th layer global) with a "
            "sliding window",
            origin, key("sliding_window_pattern", "sliding_window_pattern"),
            arch.sliding_window_pattern);
  // What a config.json can say about biases and qk-norm, per family (convert/hf_config.h).
  const DecoderArch& fam = family_info(arch.family).defaults;
  if (arch.family == DecoderFamily::kQwen2)
    HYP_CHECK(arch.qkv_bias && !arch.o_bias,
              "{}: qwen2 has q/k/v biases and no o_proj bias (attention_bias does not apply)",
              origin);
  else
    HYP_CHECK(arch.qkv_bias == arch.o_bias,
              "{}: attention_bias puts a bias on q, k, v and o alike (got q/k/v {}, o {})", origin,
              arch.qkv_bias, arch.o_bias);
  HYP_CHECK(arch.qk_norm == fam.qk_norm, "{}: qk-norm is part of the {} family's definition",
            origin, family_info(arch.family).decoder_block);
  HYP_CHECK(n_experts == 0 || arch.activation == GatedActivation::kSilu,
            "{}: {} experts use SwiGLU; the {} family's activation {} has no MoE form", origin,
            k_experts, family_info(arch.family).decoder_block,
            gated_activation_name(arch.activation));
  // (A training config has no token-id keys: its ids are the tokenizer's.)
  HYP_CHECK(pad_id >= -1 && pad_id < vocab_size, "{}: pad_token_id {} must lie in [0, {})", origin,
            pad_id, vocab_size);
  HYP_CHECK(bos_id >= 0 && bos_id < vocab_size && eos_id >= 0 && eos_id < vocab_size,
            "{}: {} {} / {} {} must lie in [0, vocab_size={})", origin,
            key("bos_token_id", "bos_id"), bos_id, key("eos_token_id", "eos_id"), eos_id,
            vocab_size);
}

bool DecoderConfig::is_moe_layer(int64_t l) const {
  return n_experts > 0 && l >= first_dense_layers &&
         (l - first_dense_layers + 1) % moe_layer_step == 0;
}

int64_t DecoderConfig::n_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < n_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

namespace {
int64_t attention_params(const DecoderConfig& c) {
  int64_t p = c.dim * c.q_dim() + 2 * c.dim * c.kv_dim() + c.q_dim() * c.dim;
  if (c.arch.qkv_bias) p += c.q_dim() + 2 * c.kv_dim();
  if (c.arch.o_bias) p += c.dim;
  if (c.arch.qk_norm) p += 2 * c.head_dim;
  return p;
}
}  // namespace

int64_t DecoderConfig::layer_params(int64_t l) const {
  const int64_t mlp =
      is_moe_layer(l) ? n_experts * (dim + 3 * dim * expert_ffn_dim()) : 3 * dim * ffn_dim;
  return attention_params(*this) + mlp + (arch.post_norms ? 4 : 2) * dim;
}

int64_t DecoderConfig::active_layer_params(int64_t l) const {
  const int64_t mlp = is_moe_layer(l)
                          ? n_experts * dim + n_experts_per_tok * 3 * dim * expert_ffn_dim()
                          : 3 * dim * ffn_dim;
  return attention_params(*this) + mlp + (arch.post_norms ? 4 : 2) * dim;
}

int64_t DecoderConfig::total_params() const {
  int64_t layers = 0;
  for (int64_t l = 0; l < n_layers; ++l) layers += layer_params(l);
  return embedding_params() + layers + dim + lm_head_params();
}

int64_t DecoderConfig::non_embedding_params() const {
  int64_t layers = 0;
  for (int64_t l = 0; l < n_layers; ++l) layers += layer_params(l);
  return layers + dim + vocab_size * dim;
}

int64_t DecoderConfig::active_non_embedding_params() const {
  int64_t layers = 0;
  for (int64_t l = 0; l < n_layers; ++l) layers += active_layer_params(l);
  return layers + dim + vocab_size * dim;
}

double DecoderConfig::train_flops_per_token(int64_t seq_len) const {
  // A sliding-window layer does the causal figure times the share of the causal pairs
  // its window keeps (attention_visible_pairs).
  double layers = 0;
  const double causal = double(attention_visible_pairs(seq_len, seq_len, true));
  for (int64_t l = 0; l < n_layers; ++l) {
    const int64_t w = arch.layer_window(l);
    layers += w > 0 && w < seq_len && causal > 0
                  ? double(attention_visible_pairs(seq_len, seq_len, true, w)) / causal
                  : 1.0;
  }
  return 6.0 * double(active_non_embedding_params()) +
         6.0 * layers * double(seq_len) * double(q_dim());
}

double DecoderConfig::forward_flops_per_token(int64_t seq_len) const {
  return train_flops_per_token(seq_len) / 3.0;
}

RematPolicy parse_remat_policy(const std::string& name, const std::string& origin) {
  if (name == "none") return RematPolicy::kNone;
  if (name == "minimal") return RematPolicy::kMinimal;
  if (name == "full") return RematPolicy::kFull;
  fail("{}: remat_policy must be one of none, minimal, full; got '{}'", origin, name);
}

const char* remat_policy_name(RematPolicy p) {
  switch (p) {
    case RematPolicy::kNone:
      return "none";
    case RematPolicy::kMinimal:
      return "minimal";
    case RematPolicy::kFull:
      return "full";
  }
  return "?";
}

MemoryPlan memory_plan(const DecoderConfig& c, int64_t batch, int64_t seq_len, bool bf16_compute,
                       RematPolicy remat, double capacity_factor) {
  // The byte counts saturate (sat_mul, sat_add) rather than wrap: batch and seq_len come
  // from the user, and a wrapped plan would pass the memory check it exists for. The
  // per-token and per-row figures need no care: validate()'s caps keep them below 2^42.
  MemoryPlan p;
  p.params = c.total_params();
  p.weight_bytes = sat_mul(4, p.params);
  p.compute_weight_bytes = bf16_compute ? sat_mul(2, p.params) : 0;
  p.grad_bytes = sat_mul(4, p.params);
  p.optimizer_bytes = sat_mul(8, p.params);
  const int64_t a = bf16_compute ? 2 : 4;
  const int64_t n = sat_mul(batch, seq_len);
  const int64_t d = c.dim, q = c.q_dim(), kv = c.kv_dim(), f = c.ffn_dim;
  // Per token and layer, as CausalLM allocates them (see causal_lm.h).
  // Layer input (f32) + two rstd; with post-norms the blocks' outputs (f32) and their rstd.
  const int64_t always = 4 * d + 8 + (c.arch.post_norms ? 8 * d + 8 : 0);
  const int64_t norms = a * d * 2;  // h, h2
  // q k v, attention out; with qk-norm also the projections before it and their rstd.
  const int64_t attn = a * (q + 2 * kv + q) + (c.arch.qk_norm ? a * (q + kv) : 0);
  const int64_t attn_other =
      4 * d + 4 * c.n_heads + (c.arch.qk_norm ? 4 * (c.n_heads + c.n_kv_heads) : 0);  // x2, lse
  // Dense MLP: gate and up (matmul outputs), swiglu out.
  const int64_t mlp_mm = a * 2 * f, mlp_other = a * f;
  // MoE MLP: its expert buffers have `rows` rows (moe_shape: n*k plus the dropless
  // alignment padding, or E x batch x capacity when capped); the routing state (logits,
  // probs, choices, weights) is per token and always kept.
  const int64_t e = c.n_experts, k = c.n_experts_per_tok, fe = c.expert_ffn_dim();
  int64_t rows = 0;
  if (c.is_moe()) {
    MoeOptions o;
    o.capacity_factor = capacity_factor;
    rows = moe_shape(c, o, batch, seq_len).rows;
  }
  const int64_t routing = 8 * e + 8 * k;
  const int64_t moe_mm = sat_mul(rows, a * (2 * fe + d));  // g, u, y
  const int64_t moe_other = sat_mul(rows, a * (d + fe));   // gathered x, swiglu out
  const int64_t n_moe = c.n_moe_layers(), n_dense = c.n_layers - n_moe;
  // Per-token bytes of a layer (dense MLP) or of an MoE layer's per-token part.
  auto saved = [&](int64_t mm, int64_t other, int64_t keep) {
    int64_t s = always + keep;
    if (remat == RematPolicy::kNone) s += norms + attn + attn_other + mm + other;
    if (remat == RematPolicy::kMinimal) s += attn + attn_other + mm;
    return s;
  };
  const int64_t moe_rows_saved = remat == RematPolicy::kNone
                                     ? sat_add(moe_mm, moe_other)
                                     : (remat == RematPolicy::kMinimal ? moe_mm : 0);
  const int64_t per_token =
      n_dense * saved(mlp_mm, mlp_other, 0) + n_moe * saved(0, 0, routing) + 4 * d;
  p.activation_bytes = sat_add(sat_mul(n, per_token), sat_mul(n_moe, moe_rows_saved));
  // One layer's worth of recomputation buffers, gradient buffers, and the logits.
  int64_t recompute = 0, recompute_rows = 0;
  if (remat == RematPolicy::kMinimal) {
    recompute = norms + (n_dense > 0 ? mlp_other : 0);
    recompute_rows = n_moe > 0 ? moe_other : 0;
  }
  if (remat == RematPolicy::kFull) {
    recompute = norms + attn + attn_other + (n_dense > 0 ? mlp_mm + mlp_other : 0);
    recompute_rows = n_moe > 0 ? sat_add(moe_mm, moe_other) : 0;
  }
  int64_t grads = 4 * d * 2 + a * d + a * (q + 2 * kv) + a * q + (n_dense > 0 ? a * f : 0);
  int64_t grads_rows = 0;
  if (n_moe > 0) {
    grads += 8 * e + a * e + 4 * k;
    grads_rows = sat_mul(rows, a * d + a * fe + 4 * d);
  }
  // With post-norms, one f32 [n, D] buffer for a norm's output before its add.
  const int64_t post = c.arch.post_norms ? 4 * d : 0;
  p.scratch_bytes = sat_add(
      sat_add(sat_mul(n, recompute + grads + a * c.vocab_size + a * d + 4 + post), recompute_rows),
      grads_rows);
  return p;
}

}  // namespace hyperion
