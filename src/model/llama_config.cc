#include "model/llama_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/system_memory.h"
#include "model/moe_block.h"

namespace hyperion {

void LlamaConfig::validate(const std::string& origin, ConfigKeyNames names) const {
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
  HYP_CHECK(arch.final_logit_softcap == 0.0, "{}: {} = {} is not supported yet (0: off)", origin,
            key("final_logit_softcapping", "final_logits_soft_cap"), arch.final_logit_softcap);
  HYP_CHECK(arch.sliding_window >= 0 && arch.sliding_window <= (int64_t{1} << 24),
            "{}: {} = {} must be in [0, 16777216] (0: global attention)", origin,
            key("sliding_window", "sliding_window_size"), arch.sliding_window);
  HYP_CHECK(arch.sliding_window_pattern == 0 ||
                (arch.sliding_window_pattern >= 2 && arch.sliding_window > 0),
            "{}: {} = {} must be 0 (every layer local) or >= 2 (every N-th layer global) with a "
            "sliding window",
            origin, key("sliding_window_pattern", "sliding_window_pattern"),
            arch.sliding_window_pattern);
  // What a config.json can say about biases and qk-norm, per family (to_hf_json).
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
  HYP_CHECK(pad_id >= -1 && pad_id < vocab_size, "{}: pad_token_id {} must lie in [0, {})",
            origin, pad_id, vocab_size);
  HYP_CHECK(bos_id >= 0 && bos_id < vocab_size && eos_id >= 0 && eos_id < vocab_size,
            "{}: {} {} / {} {} must lie in [0, vocab_size={})", origin,
            key("bos_token_id", "bos_id"), bos_id, key("eos_token_id", "eos_id"), eos_id,
            vocab_size);
}

bool LlamaConfig::is_moe_layer(int64_t l) const {
  return n_experts > 0 && l >= first_dense_layers &&
         (l - first_dense_layers + 1) % moe_layer_step == 0;
}

int64_t LlamaConfig::n_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < n_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

namespace {
int64_t attention_params(const LlamaConfig& c) {
  int64_t p = c.dim * c.q_dim() + 2 * c.dim * c.kv_dim() + c.q_dim() * c.dim;
  if (c.arch.qkv_bias) p += c.q_dim() + 2 * c.kv_dim();
  if (c.arch.o_bias) p += c.dim;
  if (c.arch.qk_norm) p += 2 * c.head_dim;
  return p;
}
}  // namespace

int64_t LlamaConfig::layer_params(int64_t l) const {
  const int64_t mlp =
      is_moe_layer(l) ? n_experts * (dim + 3 * dim * expert_ffn_dim()) : 3 * dim * ffn_dim;
  return attention_params(*this) + mlp + 2 * dim;
}

int64_t LlamaConfig::active_layer_params(int64_t l) const {
  const int64_t mlp = is_moe_layer(l)
                          ? n_experts * dim + n_experts_per_tok * 3 * dim * expert_ffn_dim()
                          : 3 * dim * ffn_dim;
  return attention_params(*this) + mlp + 2 * dim;
}

int64_t LlamaConfig::total_params() const {
  int64_t layers = 0;
  for (int64_t l = 0; l < n_layers; ++l) layers += layer_params(l);
  return embedding_params() + layers + dim + lm_head_params();
}

int64_t LlamaConfig::non_embedding_params() const {
  int64_t layers = 0;
  for (int64_t l = 0; l < n_layers; ++l) layers += layer_params(l);
  return layers + dim + vocab_size * dim;
}

int64_t LlamaConfig::active_non_embedding_params() const {
  int64_t layers = 0;
  for (int64_t l = 0; l < n_layers; ++l) layers += active_layer_params(l);
  return layers + dim + vocab_size * dim;
}

double LlamaConfig::train_flops_per_token(int64_t seq_len) const {
  return 6.0 * double(active_non_embedding_params()) +
         6.0 * double(n_layers) * double(seq_len) * double(q_dim());
}

double LlamaConfig::forward_flops_per_token(int64_t seq_len) const {
  return train_flops_per_token(seq_len) / 3.0;
}

namespace {

// rope_scaling as checkpoints on the Hub spell it (transformers 5 reads it too).
nlohmann::ordered_json rope_scaling_json(const RopeScaling& s) {
  using T = RopeScaling::Type;
  nlohmann::ordered_json j;
  j["rope_type"] = rope_type_name(s.type);
  j["factor"] = s.factor;
  if (s.type == T::kLlama3) {
    j["low_freq_factor"] = s.low_freq_factor;
    j["high_freq_factor"] = s.high_freq_factor;
  }
  if (s.type == T::kLlama3 || s.type == T::kYarn)
    j["original_max_position_embeddings"] = s.original_max_positions;
  if (s.type == T::kYarn) {
    j["beta_fast"] = s.beta_fast;
    j["beta_slow"] = s.beta_slow;
    if (s.attention_factor > 0) j["attention_factor"] = s.attention_factor;
    if (s.mscale > 0) j["mscale"] = s.mscale;
    if (s.mscale_all_dim > 0) j["mscale_all_dim"] = s.mscale_all_dim;
    if (!s.truncate) j["truncate"] = false;
  }
  return j;
}

}  // namespace

std::string LlamaConfig::to_hf_json() const {
  nlohmann::ordered_json j;
  const FamilyInfo& fam = family_info(arch.family);
  // A Llama with a window on every layer is transformers' Mistral (LlamaConfig has none).
  HYP_CHECK(arch.sliding_window == 0 ||
                (arch.family == DecoderFamily::kLlama && arch.sliding_window_pattern == 0),
            "config.json: a {} model with sliding_window {} and pattern {} has no Hugging Face "
            "class that reads it",
            fam.decoder_block, arch.sliding_window, arch.sliding_window_pattern);
  const bool mistral = arch.sliding_window > 0 && !is_moe();
  j["architectures"] = {is_moe() ? "MixtralForCausalLM" : mistral ? "MistralForCausalLM" : fam.hf_class};
  j["model_type"] = is_moe() ? "mixtral" : mistral ? "mistral" : fam.hf_model_type;
  if (mistral) j["sliding_window"] = arch.sliding_window;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = dim;
  // Mixtral's intermediate_size is the expert's; a dense layer's is kept beside it.
  j["intermediate_size"] = is_moe() ? expert_ffn_dim() : ffn_dim;
  if (is_moe()) {
    j["num_local_experts"] = n_experts;
    j["num_experts_per_tok"] = n_experts_per_tok;
    j["router_aux_loss_coef"] = router_aux_loss_coef;
    j["output_router_logits"] = false;
    j["sliding_window"] = arch.sliding_window > 0 ? nlohmann::json(arch.sliding_window) : nullptr;
    j["norm_topk_prob"] = norm_topk_prob;
    if (first_dense_layers > 0 || moe_layer_step > 1) {
      j["hyperion_dense_intermediate_size"] = ffn_dim;
      j["hyperion_first_dense_layers"] = first_dense_layers;
      j["hyperion_moe_layer_step"] = moe_layer_step;
    }
  }
  j["num_hidden_layers"] = n_layers;
  j["num_attention_heads"] = n_heads;
  j["num_key_value_heads"] = n_kv_heads;
  j["head_dim"] = head_dim;
  j["hidden_act"] = gated_activation_name(arch.activation);
  // GemmaConfig reads hidden_activation (hidden_act is its legacy key).
  if (arch.family == DecoderFamily::kGemma)
    j["hidden_activation"] = gated_activation_name(arch.activation);
  j["max_position_embeddings"] = max_seq_len;
  j["rms_norm_eps"] = norm_eps;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = nullptr;
  if (rope_scaling.type != RopeScaling::Type::kNone) j["rope_scaling"] = rope_scaling_json(rope_scaling);
  j["tie_word_embeddings"] = tie_embeddings;
  j["bos_token_id"] = bos_id;
  j["eos_token_id"] = eos_id;
  if (pad_id >= 0) j["pad_token_id"] = pad_id;
  // Qwen2 always has q/k/v biases (no key); elsewhere attention_bias puts one on all four.
  if (arch.family != DecoderFamily::kQwen2) j["attention_bias"] = arch.o_bias;
  if (arch.family == DecoderFamily::kQwen2 || arch.family == DecoderFamily::kQwen3) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  if (arch.family == DecoderFamily::kLlama && !mistral) j["mlp_bias"] = false;
  j["initializer_range"] = 0.02;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

namespace {

// The model_types and architectures a config.json may name, and the family each means.
struct HfModelType {
  const char* model_type;
  const char* architecture;
  DecoderFamily family;
  double rope_theta;    // the transformers config class's default
  double rms_norm_eps;  // idem
};
const HfModelType kHfModelTypes[] = {
    {"llama", "LlamaForCausalLM", DecoderFamily::kLlama, 10000.0, 1e-6},
    {"mistral", "MistralForCausalLM", DecoderFamily::kLlama, 10000.0, 1e-6},
    {"mixtral", "MixtralForCausalLM", DecoderFamily::kLlama, 1e6, 1e-5},
    {"gemma", "GemmaForCausalLM", DecoderFamily::kGemma, 10000.0, 1e-6},
    {"qwen2", "Qwen2ForCausalLM", DecoderFamily::kQwen2, 10000.0, 1e-6},
    {"qwen3", "Qwen3ForCausalLM", DecoderFamily::kQwen3, 10000.0, 1e-6},
};

std::string hf_names(bool architectures) {
  std::string out;
  for (const HfModelType& m : kHfModelTypes)
    out += std::string(out.empty() ? "" : ", ") + (architectures ? m.architecture : m.model_type);
  return out;
}

// Reads one rope_scaling / rope_parameters object into `s` (and rope_theta when the
// object carries it, as transformers 5 writes it). `where` names the key for errors.
void read_rope_object(const nlohmann::json& r, const std::string& where, int64_t max_positions,
                      RopeScaling* s, double* theta) {
  using T = RopeScaling::Type;
  HYP_CHECK(r.is_object(), "{} must be an object, got {}", where, r.dump());
  auto num = [&](const char* key, double fallback) -> double {
    if (!r.contains(key) || r[key].is_null()) return fallback;
    HYP_CHECK(r[key].is_number(), "{}.{} must be a number, got {}", where, key, r[key].dump());
    return r[key].get<double>();
  };
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})  // "type" is the older spelling
    if (r.contains(key) && !r[key].is_null()) {
      HYP_CHECK(r[key].is_string(), "{}.{} must be a string, got {}", where, key, r[key].dump());
      type = r[key].get<std::string>();
      break;
    }
  HYP_CHECK(parse_rope_type(type, &s->type),
            "{}.rope_type '{}' is not supported (supported: default, linear, llama3, yarn)", where,
            type);
  static const char* const kKnown[] = {"rope_type", "type", "rope_theta", "factor",
                                       "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings", "beta_fast",
                                       "beta_slow", "attention_factor", "mscale",
                                       "mscale_all_dim", "truncate", "partial_rotary_factor"};
  for (const auto& [key, value] : r.items()) {
    bool known = false;
    for (const char* k : kKnown) known = known || key == k;
    HYP_CHECK(known, "{}.{} is not a key this RoPE reads (a setting it would ignore)", where, key);
  }
  HYP_CHECK(num("partial_rotary_factor", 1.0) == 1.0,
            "{}.partial_rotary_factor = {} is not supported (RoPE over the whole head only)", where,
            num("partial_rotary_factor", 1.0));
  if (r.contains("rope_theta") && !r["rope_theta"].is_null()) *theta = num("rope_theta", *theta);
  if (s->type == T::kNone) return;
  const double original = num("original_max_position_embeddings", 0.0);
  HYP_CHECK(original >= 0 && original <= double(int64_t{1} << 24) && original == std::floor(original),
            "{}.original_max_position_embeddings = {} must be a whole number in [1, 2^24]", where,
            original);
  s->original_max_positions = static_cast<int64_t>(original);
  if (s->type == T::kYarn && s->original_max_positions == 0)
    s->original_max_positions = max_positions;
  const bool has_factor = r.contains("factor") && !r["factor"].is_null();
  if (s->type == T::kYarn && !has_factor && s->original_max_positions > 0) {
    s->factor = double(max_positions) / double(s->original_max_positions);
  } else {
    HYP_CHECK(has_factor, "{}: rope_type {} needs 'factor'", where, type);
    s->factor = num("factor", 1.0);
  }
  if (s->type == T::kLlama3) {
    for (const char* key : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      HYP_CHECK(r.contains(key) && !r[key].is_null(), "{}: rope_type llama3 needs '{}'", where, key);
    s->low_freq_factor = num("low_freq_factor", 1.0);
    s->high_freq_factor = num("high_freq_factor", 4.0);
  }
  if (s->type == T::kYarn) {
    // `x or default` in the reference: 0 and null both mean the default.
    s->beta_fast = num("beta_fast", 0.0) > 0 ? num("beta_fast", 0.0) : 32.0;
    s->beta_slow = num("beta_slow", 0.0) > 0 ? num("beta_slow", 0.0) : 1.0;
    s->attention_factor = num("attention_factor", 0.0);
    s->mscale = num("mscale", 0.0);
    s->mscale_all_dim = num("mscale_all_dim", 0.0);
    if (r.contains("truncate") && !r["truncate"].is_null()) {
      HYP_CHECK(r["truncate"].is_boolean(), "{}.truncate must be a bool", where);
      s->truncate = r["truncate"].get<bool>();
    }
  }
}

}  // namespace

LlamaConfig LlamaConfig::from_hf_json(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail("{}: invalid JSON: {}", origin, e.what());
  }
  HYP_CHECK(j.is_object(), "{}: expected a JSON object", origin);
  auto has = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  // Keys that change the computation in ways this decoder does not implement: refused by
  // name, never silently ignored (the outputs would be wrong without any error).
  auto require_one_of = [&](const char* key, std::initializer_list<const char*> accepted) {
    if (!has(key)) return;
    const std::string v = j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
    for (const char* a : accepted)
      if (v == a) return;
    fail("{}: {} '{}' is not supported (supported: {})", origin, key, v, fmt::join(accepted, ", "));
  };
  // The family: model_type, else the architectures (as transformers' AutoConfig users).
  const HfModelType* mt = nullptr;
  if (has("model_type")) {
    const std::string v = j["model_type"].is_string() ? j["model_type"].get<std::string>()
                                                      : j["model_type"].dump();
    for (const HfModelType& m : kHfModelTypes)
      if (v == m.model_type) mt = &m;
    HYP_CHECK(mt != nullptr, "{}: key 'model_type' = '{}' is not supported (supported: {})", origin,
              v, hf_names(false));
  }
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"]) {
      const std::string name = a.is_string() ? a.get<std::string>() : a.dump();
      const HfModelType* by_class = nullptr;
      for (const HfModelType& m : kHfModelTypes)
        if (name == m.architecture) by_class = &m;
      HYP_CHECK(by_class != nullptr, "{}: architectures '{}' is not supported ({})", origin, name,
                hf_names(true));
      HYP_CHECK(mt == nullptr || by_class->family == mt->family,
                "{}: architectures '{}' does not match model_type '{}'", origin, name,
                mt->model_type);
      if (mt == nullptr) mt = by_class;
    }
  if (mt == nullptr) mt = &kHfModelTypes[0];
  const DecoderFamily family = mt->family;
  const bool gemma = family == DecoderFamily::kGemma;
  LlamaConfig c;
  c.arch = family_info(family).defaults;
  if (gemma) {
    // GemmaConfig: hidden_activation wins; without it Hugging Face runs the tanh form even
    // when the legacy hidden_act says "gelu".
    const char* act_key = has("hidden_activation") ? "hidden_activation" : "hidden_act";
    if (has(act_key)) {
      const std::string v =
          j[act_key].is_string() ? j[act_key].get<std::string>() : j[act_key].dump();
      const bool legacy_gelu = v == "gelu" && std::string(act_key) == "hidden_act";
      HYP_CHECK(legacy_gelu || (parse_gated_activation(v, &c.arch.activation) &&
                                c.arch.activation == GatedActivation::kGeluTanh),
                "{}: {} '{}' is not supported for Gemma (supported: gelu_pytorch_tanh)", origin,
                act_key, v);
    }
  } else {
    require_one_of("hidden_act", {"silu"});
  }
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"})
    HYP_CHECK(!has(key), "{}: {} = {} is not supported yet", origin, key,
              j.contains(key) ? j[key].dump() : "");
  HYP_CHECK(!has("mlp_bias") || j["mlp_bias"] == false,
            "{}: mlp_bias = {} is not supported (the MLP has no biases)", origin,
            j.contains("mlp_bias") ? j["mlp_bias"].dump() : "");
  // Qwen2's q/k/v biases are fixed (its config has no key); elsewhere attention_bias puts
  // a bias on q, k, v and o alike (LlamaAttention, Qwen3Attention).
  if (has("attention_bias")) {
    HYP_CHECK(j["attention_bias"].is_boolean(), "{}: key 'attention_bias' = {} is not a boolean",
              origin, j["attention_bias"].dump());
    if (family != DecoderFamily::kQwen2)
      c.arch.qkv_bias = c.arch.o_bias = j["attention_bias"].get<bool>();
  }
  auto get_int = [&](const char* key, bool required, int64_t fallback) -> int64_t {
    if (!has(key)) {
      HYP_CHECK(!required, "{}: missing key '{}'", origin, key);
      return fallback;
    }
    HYP_CHECK(j[key].is_number_integer(), "{}: key '{}' = {} is not an integer", origin, key,
              j[key].dump());
    return j[key].get<int64_t>();
  };
  auto get_num = [&](const char* key, double fallback) -> double {
    if (!has(key)) return fallback;
    HYP_CHECK(j[key].is_number(), "{}: key '{}' = {} is not a number", origin, key,
              j[key].dump());
    return j[key].get<double>();
  };
  c.vocab_size = get_int("vocab_size", true, 0);
  c.dim = get_int("hidden_size", true, 0);
  c.ffn_dim = get_int("intermediate_size", true, 0);
  c.n_layers = get_int("num_hidden_layers", true, 0);
  c.n_heads = get_int("num_attention_heads", true, 0);
  c.n_kv_heads = get_int("num_key_value_heads", false, c.n_heads);
  HYP_CHECK(c.n_heads > 0, "{}: num_attention_heads must be > 0", origin);
  c.head_dim = get_int("head_dim", false, c.dim / c.n_heads);
  c.max_seq_len = get_int("max_position_embeddings", false, 2048);
  c.norm_eps = get_num("rms_norm_eps", mt->rms_norm_eps);
  c.rope_theta = get_num("rope_theta", mt->rope_theta);
  // Sliding-window attention: Qwen's configs carry a window that use_sliding_window
  // (false in every released one) switches off; a window at least the context is global.
  if (has("sliding_window")) {
    const bool used = !has("use_sliding_window") || j["use_sliding_window"] == true;
    const int64_t window = get_int("sliding_window", false, 0);
    // Qwen's max_window_layers (local only past a layer) has no pattern here.
    HYP_CHECK(!used || window >= c.max_seq_len || c.arch.family == DecoderFamily::kLlama,
              "{}: key 'sliding_window' = {} with use_sliding_window on a {} model (local "
              "attention from max_window_layers on) is not supported yet",
              origin, window, mt->model_type);
    // Every layer local, as Mistral v0.1 (a window covering the context is none).
    if (used && window < c.max_seq_len) c.arch.sliding_window = window;
  }
  // transformers 5 lists each layer's attention; every layer local, or all global.
  if (has("layer_types")) {
    HYP_CHECK(j["layer_types"].is_array() &&
                  static_cast<int64_t>(j["layer_types"].size()) == c.n_layers,
              "{}: key 'layer_types' must list num_hidden_layers ({}) entries", origin,
              c.n_layers);
    for (const auto& t : j["layer_types"]) {
      const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
      HYP_CHECK(type == (c.arch.sliding_window > 0 ? "sliding_attention" : "full_attention"),
                "{}: key 'layer_types' has '{}' where the config's sliding_window says {}: "
                "mixed local and global layers are read for Gemma only",
                origin, type,
                c.arch.sliding_window > 0 ? "sliding_attention" : "full_attention");
    }
  }
  // RoPE: rope_scaling (+ rope_theta) as on the Hub, or transformers 5's rope_parameters.
  if (has("rope_parameters")) {
    HYP_CHECK(!has("rope_scaling"), "{}: both rope_scaling and rope_parameters are set; give one",
              origin);
    const nlohmann::json& rp = j["rope_parameters"];
    HYP_CHECK(rp.is_object(), "{}: rope_parameters must be an object, got {}", origin, rp.dump());
    if (rp.contains("full_attention") || rp.contains("sliding_attention")) {
      HYP_CHECK(!rp.contains("sliding_attention"),
                "{}: rope_parameters.sliding_attention: per-layer-type RoPE (sliding-window "
                "layers) is not supported yet",
                origin);
      read_rope_object(rp["full_attention"], origin + ": rope_parameters.full_attention",
                       c.max_seq_len, &c.rope_scaling, &c.rope_theta);
    } else {
      read_rope_object(rp, origin + ": rope_parameters", c.max_seq_len, &c.rope_scaling,
                       &c.rope_theta);
    }
  } else if (has("rope_scaling")) {
    read_rope_object(j["rope_scaling"], origin + ": rope_scaling", c.max_seq_len, &c.rope_scaling,
                     &c.rope_theta);
  }
  c.tie_embeddings = gemma;  // GemmaConfig's default: the head is the embedding
  if (j.contains("tie_word_embeddings")) {
    HYP_CHECK(j["tie_word_embeddings"].is_boolean(),
              "{}: key 'tie_word_embeddings' = {} is not a boolean", origin,
              j["tie_word_embeddings"].dump());
    c.tie_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  // The experts are MixtralConfig's (default 8); other families' configs have no such key
  // (transformers ignores it there, and so does this).
  if (std::string(mt->model_type) == "mixtral") {
    c.n_experts = get_int("num_local_experts", false, 8);
    c.n_experts_per_tok = get_int("num_experts_per_tok", false, 2);
    c.moe_ffn_dim = c.ffn_dim;
    c.ffn_dim = get_int("hyperion_dense_intermediate_size", false, c.ffn_dim);
    c.first_dense_layers = get_int("hyperion_first_dense_layers", false, 0);
    c.moe_layer_step = get_int("hyperion_moe_layer_step", false, 1);
    c.router_aux_loss_coef = get_num("router_aux_loss_coef", 0.0);
    if (j.contains("norm_topk_prob")) {
      HYP_CHECK(j["norm_topk_prob"].is_boolean(), "{}: key 'norm_topk_prob' = {} is not a boolean",
                origin, j["norm_topk_prob"].dump());
      c.norm_topk_prob = j["norm_topk_prob"].get<bool>();
    }
  }
  // hyperion_* keys change the model (hyperion writes them only for what Hugging Face
  // cannot express): one this reader does not know must not be silently ignored.
  for (const auto& [key, value] : j.items())
    HYP_CHECK(!key.starts_with("hyperion_") || key == "hyperion_dense_intermediate_size" ||
                  key == "hyperion_first_dense_layers" || key == "hyperion_moe_layer_step",
              "{}: unknown key '{}' = {}", origin, key, value.dump());
  c.pad_id = static_cast<int32_t>(get_int("pad_token_id", false, -1));
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
  // Per token and layer, as LlamaModel allocates them (see llama_model.h).
  const int64_t always = 4 * d + 8;                  // layer input (f32) + two rstd
  const int64_t norms = a * d * 2;                   // h, h2
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
  p.scratch_bytes =
      sat_add(sat_add(sat_mul(n, recompute + grads + a * c.vocab_size + a * d + 4), recompute_rows),
              grads_rows);
  return p;
}

}  // namespace hyperion
