#include "model/llama_config.h"

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace hyperion {

void LlamaConfig::validate(const std::string& origin) const {
  auto positive = [&](int64_t v, const char* name) {
    HYP_CHECK(v > 0, "{}: {} must be > 0, got {}", origin, name, v);
  };
  positive(vocab_size, "vocab_size");
  positive(dim, "dim");
  positive(n_layers, "n_layers");
  positive(n_heads, "n_heads");
  positive(n_kv_heads, "n_kv_heads");
  positive(head_dim, "head_dim");
  positive(ffn_dim, "ffn_dim");
  positive(max_seq_len, "max_seq_len");
  HYP_CHECK(n_heads % n_kv_heads == 0, "{}: n_kv_heads ({}) must divide n_heads ({})", origin,
            n_kv_heads, n_heads);
  HYP_CHECK(head_dim % 2 == 0, "{}: head_dim must be even for RoPE, got {}", origin, head_dim);
  HYP_CHECK(norm_eps > 0, "{}: norm_eps must be > 0, got {}", origin, norm_eps);
  HYP_CHECK(rope_theta > 0, "{}: rope_theta must be > 0, got {}", origin, rope_theta);
  HYP_CHECK(bos_id >= 0 && bos_id < vocab_size && eos_id >= 0 && eos_id < vocab_size,
            "{}: bos_id {} / eos_id {} must lie in [0, vocab_size={})", origin, bos_id, eos_id,
            vocab_size);
}

int64_t LlamaConfig::layer_params() const {
  const int64_t attn = dim * q_dim() + 2 * dim * kv_dim() + q_dim() * dim;
  const int64_t mlp = 3 * dim * ffn_dim;
  return attn + mlp + 2 * dim;
}

int64_t LlamaConfig::total_params() const {
  return embedding_params() + n_layers * layer_params() + dim + lm_head_params();
}

int64_t LlamaConfig::non_embedding_params() const {
  return n_layers * layer_params() + dim + vocab_size * dim;
}

double LlamaConfig::train_flops_per_token(int64_t seq_len) const {
  return 6.0 * double(non_embedding_params()) +
         6.0 * double(n_layers) * double(seq_len) * double(q_dim());
}

double LlamaConfig::forward_flops_per_token(int64_t seq_len) const {
  return train_flops_per_token(seq_len) / 3.0;
}

std::string LlamaConfig::to_hf_json() const {
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = dim;
  j["intermediate_size"] = ffn_dim;
  j["num_hidden_layers"] = n_layers;
  j["num_attention_heads"] = n_heads;
  j["num_key_value_heads"] = n_kv_heads;
  j["head_dim"] = head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = max_seq_len;
  j["rms_norm_eps"] = norm_eps;
  j["rope_theta"] = rope_theta;
  j["tie_word_embeddings"] = tie_embeddings;
  j["bos_token_id"] = bos_id;
  j["eos_token_id"] = eos_id;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["initializer_range"] = 0.02;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

LlamaConfig LlamaConfig::from_hf_json(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail("{}: invalid JSON: {}", origin, e.what());
  }
  HYP_CHECK(j.is_object(), "{}: expected a JSON object", origin);
  auto get_int = [&](const char* key, bool required, int64_t fallback) -> int64_t {
    if (!j.contains(key) || j[key].is_null()) {
      HYP_CHECK(!required, "{}: missing key '{}'", origin, key);
      return fallback;
    }
    HYP_CHECK(j[key].is_number_integer(), "{}: key '{}' must be an integer, got {}", origin, key,
              j[key].dump());
    return j[key].get<int64_t>();
  };
  auto get_num = [&](const char* key, double fallback) -> double {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    HYP_CHECK(j[key].is_number(), "{}: key '{}' must be a number, got {}", origin, key,
              j[key].dump());
    return j[key].get<double>();
  };
  LlamaConfig c;
  c.vocab_size = get_int("vocab_size", true, 0);
  c.dim = get_int("hidden_size", true, 0);
  c.ffn_dim = get_int("intermediate_size", true, 0);
  c.n_layers = get_int("num_hidden_layers", true, 0);
  c.n_heads = get_int("num_attention_heads", true, 0);
  c.n_kv_heads = get_int("num_key_value_heads", false, c.n_heads);
  HYP_CHECK(c.n_heads > 0, "{}: num_attention_heads must be > 0", origin);
  c.head_dim = get_int("head_dim", false, c.dim / c.n_heads);
  c.max_seq_len = get_int("max_position_embeddings", false, 2048);
  c.norm_eps = get_num("rms_norm_eps", 1e-6);
  c.rope_theta = get_num("rope_theta", 10000.0);
  if (j.contains("tie_word_embeddings")) {
    HYP_CHECK(j["tie_word_embeddings"].is_boolean(), "{}: key 'tie_word_embeddings' must be a bool",
              origin);
    c.tie_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  c.bos_id = static_cast<int32_t>(get_int("bos_token_id", false, 1));
  // eos_token_id may be a list in newer configs; take the first.
  if (j.contains("eos_token_id") && j["eos_token_id"].is_array() && !j["eos_token_id"].empty())
    c.eos_id = j["eos_token_id"][0].get<int32_t>();
  else
    c.eos_id = static_cast<int32_t>(get_int("eos_token_id", false, 2));
  c.validate(origin);
  return c;
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

MemoryPlan memory_plan(const LlamaConfig& c, int64_t batch, int64_t seq_len, bool bf16_compute,
                       RematPolicy remat) {
  MemoryPlan p;
  p.params = c.total_params();
  p.weight_bytes = 4 * p.params;
  p.compute_weight_bytes = bf16_compute ? 2 * p.params : 0;
  p.grad_bytes = 4 * p.params;
  p.optimizer_bytes = 8 * p.params;
  const int64_t a = bf16_compute ? 2 : 4;
  const int64_t n = batch * seq_len;
  const int64_t d = c.dim, q = c.q_dim(), kv = c.kv_dim(), f = c.ffn_dim;
  // Per token and layer, as LlamaModel allocates them (see llama_model.h).
  const int64_t always = 4 * d + 8;                      // layer input (f32) + two rstd
  const int64_t norms = a * d * 2;                       // h, h2
  const int64_t matmuls = a * (q + 2 * kv + q + 2 * f);  // q k v, attention out, gate, up
  const int64_t others = 4 * d + 4 * c.n_heads + a * f;  // x2 (f32), lse, swiglu out
  int64_t saved = always;
  if (remat == RematPolicy::kNone) saved += norms + matmuls + others;
  if (remat == RematPolicy::kMinimal) saved += matmuls + 4 * d + 4 * c.n_heads;
  p.activation_bytes = n * (c.n_layers * saved + 4 * d);  // + final layer output
  // One layer's worth of recomputation buffers, gradient buffers, and the logits.
  const int64_t recompute = remat == RematPolicy::kNone ? 0 : (norms + matmuls + others);
  const int64_t grads = 4 * d * 2 + a * d + a * (q + 2 * kv) + a * q + a * f;
  p.scratch_bytes = n * (recompute + grads + a * c.vocab_size + a * d + 4);
  return p;
}

}  // namespace hyperion
