#include "convert/hf_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/error.h"
#include "convert/family_formats.h"

namespace hyperion::convert {

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

std::string to_hf_config_json(const DecoderConfig& c) {
  nlohmann::ordered_json j;
  const FamilyInfo& fam = family_info(c.arch.family);
  const HfModelType& names = hf_model_type(c.arch.family);
  // A Llama with a window on every layer is transformers' Mistral (its LlamaConfig has none);
  // Gemma 2/3 list each layer's kind (layer_types).
  const bool gemma_n = fam.gemma2_features;
  HYP_CHECK(c.arch.sliding_window == 0 || gemma_n ||
                (c.arch.family == DecoderFamily::kLlama && c.arch.sliding_window_pattern == 0),
            "config.json: a {} model with sliding_window {} and pattern {} has no Hugging Face "
            "class that reads it",
            fam.decoder_block, c.arch.sliding_window, c.arch.sliding_window_pattern);
  const bool mistral = c.arch.sliding_window > 0 && !c.is_moe() && !gemma_n;
  j["architectures"] = {c.is_moe() ? "MixtralForCausalLM"
                        : mistral  ? "MistralForCausalLM"
                                   : names.architecture};
  j["model_type"] = c.is_moe() ? "mixtral" : mistral ? "mistral" : names.model_type;
  if (mistral) j["sliding_window"] = c.arch.sliding_window;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.dim;
  // Mixtral's intermediate_size is the expert's; a dense layer's is kept beside it.
  j["intermediate_size"] = c.is_moe() ? c.expert_ffn_dim() : c.ffn_dim;
  if (c.is_moe()) {
    j["num_local_experts"] = c.n_experts;
    j["num_experts_per_tok"] = c.n_experts_per_tok;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = false;
    j["sliding_window"] =
        c.arch.sliding_window > 0 ? nlohmann::json(c.arch.sliding_window) : nullptr;
    j["norm_topk_prob"] = c.norm_topk_prob;
    if (c.first_dense_layers > 0 || c.moe_layer_step > 1) {
      j["hyperion_dense_intermediate_size"] = c.ffn_dim;
      j["hyperion_first_dense_layers"] = c.first_dense_layers;
      j["hyperion_moe_layer_step"] = c.moe_layer_step;
    }
  }
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = gated_activation_name(c.arch.activation);
  // GemmaConfig reads hidden_activation (hidden_act is its legacy key).
  if (c.arch.family == DecoderFamily::kGemma || gemma_n)
    j["hidden_activation"] = gated_activation_name(c.arch.activation);
  if (gemma_n) {
    auto cap = [](double v) {
      return v > 0 ? nlohmann::ordered_json(v) : nlohmann::ordered_json();
    };
    j["query_pre_attn_scalar"] =
        c.arch.query_pre_attn_scalar > 0 ? c.arch.query_pre_attn_scalar : double(c.head_dim);
    j["attn_logit_softcapping"] = cap(c.arch.attn_logit_softcap);
    j["final_logit_softcapping"] = cap(c.arch.final_logit_softcap);
    // No window: one as long as the context (global in every transformers version).
    j["sliding_window"] = c.arch.sliding_window > 0 ? c.arch.sliding_window : c.max_seq_len;
    if (c.arch.family == DecoderFamily::kGemma3) {
      // Every layer local (pattern 0) is a pattern longer than the model for transformers
      // versions that divide by it.
      j["sliding_window_pattern"] =
          c.arch.sliding_window_pattern > 0 ? c.arch.sliding_window_pattern : c.n_layers + 1;
      j["rope_local_base_freq"] =
          c.arch.local_rope_theta > 0 ? c.arch.local_rope_theta : c.rope_theta;
    }
    nlohmann::ordered_json types = nlohmann::ordered_json::array();
    for (int64_t l = 0; l < c.n_layers; ++l)
      types.push_back(c.arch.layer_window(l) > 0 ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  if (c.rope_scaling.type != RopeScaling::Type::kNone)
    j["rope_scaling"] = rope_scaling_json(c.rope_scaling);
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] = c.eos_id;
  if (c.pad_id >= 0) j["pad_token_id"] = c.pad_id;
  // Qwen2 always has q/k/v biases (no key); elsewhere attention_bias puts one on all four.
  if (c.arch.family != DecoderFamily::kQwen2) j["attention_bias"] = c.arch.o_bias;
  if (c.arch.family == DecoderFamily::kQwen2 || c.arch.family == DecoderFamily::kQwen3) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  if (c.arch.family == DecoderFamily::kLlama && !mistral) j["mlp_bias"] = false;
  j["initializer_range"] = 0.02;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

namespace {

std::string hf_names(bool architectures) {
  std::string out;
  for (const HfModelType& m : hf_model_types())
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
  static const char* const kKnown[] = {"rope_type",
                                       "type",
                                       "rope_theta",
                                       "factor",
                                       "low_freq_factor",
                                       "high_freq_factor",
                                       "original_max_position_embeddings",
                                       "beta_fast",
                                       "beta_slow",
                                       "attention_factor",
                                       "mscale",
                                       "mscale_all_dim",
                                       "truncate",
                                       "partial_rotary_factor"};
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
  HYP_CHECK(
      original >= 0 && original <= double(int64_t{1} << 24) && original == std::floor(original),
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
    for (const char* key :
         {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      HYP_CHECK(r.contains(key) && !r[key].is_null(), "{}: rope_type llama3 needs '{}'", where,
                key);
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

DecoderConfig decoder_config_from_hf_json(const std::string& text, const std::string& origin) {
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
    const std::string v =
        j["model_type"].is_string() ? j["model_type"].get<std::string>() : j["model_type"].dump();
    for (const HfModelType& m : hf_model_types())
      if (v == m.model_type) mt = &m;
    HYP_CHECK(mt != nullptr, "{}: key 'model_type' = '{}' is not supported (supported: {})", origin,
              v, hf_names(false));
  }
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"]) {
      const std::string name = a.is_string() ? a.get<std::string>() : a.dump();
      const HfModelType* by_class = nullptr;
      for (const HfModelType& m : hf_model_types())
        if (name == m.architecture) by_class = &m;
      HYP_CHECK(by_class != nullptr, "{}: architectures '{}' is not supported ({})", origin, name,
                hf_names(true));
      HYP_CHECK(mt == nullptr || by_class->family == mt->family,
                "{}: architectures '{}' does not match model_type '{}'", origin, name,
                mt->model_type);
      if (mt == nullptr) mt = by_class;
    }
  if (mt == nullptr) mt = &hf_model_types()[0];
  const DecoderFamily family = mt->family;
  const bool gemma_n = family_info(family).gemma2_features;
  const bool gemma = family == DecoderFamily::kGemma || gemma_n;
  DecoderConfig c;
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
  // Soft caps, query_pre_attn_scalar and the local RoPE base: Gemma 2/3's keys (absent:
  // the config class's default; null: off). Elsewhere a cap changes the model: refused.
  auto family_num = [&](const char* key, double* field) {
    if (!j.contains(key)) return;
    if (j[key].is_null()) {
      *field = 0.0;
      return;
    }
    HYP_CHECK(j[key].is_number(), "{}: key '{}' = {} is not a number", origin, key, j[key].dump());
    *field = j[key].get<double>();
  };
  if (gemma_n) {
    family_num("attn_logit_softcapping", &c.arch.attn_logit_softcap);
    family_num("final_logit_softcapping", &c.arch.final_logit_softcap);
    family_num("query_pre_attn_scalar", &c.arch.query_pre_attn_scalar);
    if (family == DecoderFamily::kGemma3)
      family_num("rope_local_base_freq", &c.arch.local_rope_theta);
  } else {
    for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"})
      HYP_CHECK(!has(key), "{}: {} = {} is not supported for model_type '{}' (Gemma 2's)", origin,
                key, j.contains(key) ? j[key].dump() : "", mt->model_type);
  }
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
    HYP_CHECK(j[key].is_number(), "{}: key '{}' = {} is not a number", origin, key, j[key].dump());
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
    HYP_CHECK(!used || window >= c.max_seq_len || c.arch.family == DecoderFamily::kLlama || gemma_n,
              "{}: key 'sliding_window' = {} with use_sliding_window on a {} model (local "
              "attention from max_window_layers on) is not supported yet",
              origin, window, mt->model_type);
    HYP_CHECK(window >= 0, "{}: key 'sliding_window' = {} must be >= 0", origin, window);
    // Gemma 2/3 keep theirs (their pattern says which layers); elsewhere every layer is
    // local, as Mistral v0.1, and a window covering the context is none.
    if (gemma_n)
      c.arch.sliding_window = window;
    else if (used && window < c.max_seq_len)
      c.arch.sliding_window = window;
  }
  if (family == DecoderFamily::kGemma3 && has("sliding_window_pattern"))
    c.arch.sliding_window_pattern = get_int("sliding_window_pattern", false, 6);
  // transformers 5 lists each layer's attention: every layer local, all global, or every
  // N-th global (the only mixes this decoder runs).
  if (has("layer_types")) {
    HYP_CHECK(
        j["layer_types"].is_array() && static_cast<int64_t>(j["layer_types"].size()) == c.n_layers,
        "{}: key 'layer_types' must list num_hidden_layers ({}) entries", origin, c.n_layers);
    std::vector<bool> full;
    for (const auto& t : j["layer_types"]) {
      const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
      HYP_CHECK(type == "sliding_attention" || type == "full_attention",
                "{}: key 'layer_types' has '{}' (sliding_attention or full_attention)", origin,
                type);
      full.push_back(type == "full_attention");
    }
    const auto first_full = std::find(full.begin(), full.end(), true);
    bool as_configured = true;  // the window and pattern read so far say the same
    for (int64_t l = 0; l < c.n_layers; ++l)
      as_configured =
          as_configured && full[static_cast<size_t>(l)] == (c.arch.layer_window(l) == 0);
    if (as_configured) {
      // Nothing to infer.
    } else if (c.arch.sliding_window == 0 || first_full == full.begin()) {
      // No window (or one past the context), or the first layer global: all must be.
      HYP_CHECK(c.arch.sliding_window == 0 || std::count(full.begin(), full.end(), false) == 0,
                "{}: key 'layer_types' mixes local and global layers with layer 0 global; "
                "supported: all local, all global, or every N-th global",
                origin);
      c.arch.sliding_window = 0;
      c.arch.sliding_window_pattern = 0;
    } else {
      const int64_t n = first_full == full.end() ? 0 : (first_full - full.begin()) + 1;
      HYP_CHECK(n == 0 || gemma_n,
                "{}: key 'layer_types' mixes local and global layers: read for Gemma 2/3 only "
                "(model_type '{}')",
                origin, mt->model_type);
      for (int64_t l = 0; l < c.n_layers; ++l)
        HYP_CHECK(full[static_cast<size_t>(l)] == (n > 0 && (l + 1) % n == 0),
                  "{}: key 'layer_types' entry {} breaks the every-{}-th-global pattern "
                  "(supported: all local, all global, or every N-th global)",
                  origin, l, n);
      c.arch.sliding_window_pattern = n;
    }
  }
  // RoPE: rope_scaling (+ rope_theta) as on the Hub, or transformers 5's rope_parameters.
  if (has("rope_parameters")) {
    HYP_CHECK(!has("rope_scaling"), "{}: both rope_scaling and rope_parameters are set; give one",
              origin);
    const nlohmann::json& rp = j["rope_parameters"];
    HYP_CHECK(rp.is_object(), "{}: rope_parameters must be an object, got {}", origin, rp.dump());
    if (rp.contains("full_attention") || rp.contains("sliding_attention")) {
      HYP_CHECK(rp.contains("full_attention"),
                "{}: rope_parameters has sliding_attention but no full_attention", origin);
      // The per-layer form: one RoPE per kind of layer, and only the kinds this decoder has.
      for (const auto& [key, value] : rp.items())
        HYP_CHECK(key == "full_attention" || key == "sliding_attention",
                  "{}: rope_parameters.{} is not a kind of layer this decoder has "
                  "(full_attention, sliding_attention): a RoPE it would ignore",
                  origin, key);
      read_rope_object(rp["full_attention"], origin + ": rope_parameters.full_attention",
                       c.max_seq_len, &c.rope_scaling, &c.rope_theta);
      if (rp.contains("sliding_attention")) {
        HYP_CHECK(family == DecoderFamily::kGemma3,
                  "{}: rope_parameters.sliding_attention: a RoPE of the local layers' own is "
                  "read for Gemma 3 only (model_type '{}')",
                  origin, mt->model_type);
        // The local layers' own RoPE (Gemma 3): a base, never scaled.
        RopeScaling local;
        double theta = c.arch.local_rope_theta > 0 ? c.arch.local_rope_theta : c.rope_theta;
        read_rope_object(rp["sliding_attention"], origin + ": rope_parameters.sliding_attention",
                         c.max_seq_len, &local, &theta);
        HYP_CHECK(local.type == RopeScaling::Type::kNone,
                  "{}: rope_parameters.sliding_attention.rope_type '{}': the local layers' RoPE "
                  "is unscaled here (default only)",
                  origin, rope_type_name(local.type));
        if (theta != c.rope_theta || family == DecoderFamily::kGemma3)
          c.arch.local_rope_theta = theta;
      }
    } else {
      read_rope_object(rp, origin + ": rope_parameters", c.max_seq_len, &c.rope_scaling,
                       &c.rope_theta);
    }
  } else if (has("rope_scaling")) {
    read_rope_object(j["rope_scaling"], origin + ": rope_scaling", c.max_seq_len, &c.rope_scaling,
                     &c.rope_theta);
  }
  c.tie_embeddings = gemma;  // Gemma*Config's default: the head is the embedding
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
  // Token ids as sent: an integer that is not an int32 is refused printing the file's own
  // text (4294967303 used to become 7, and 10^12 was printed as -727379968).
  auto token_id = [&](const nlohmann::json& v, const std::string& what) -> int32_t {
    HYP_CHECK(v.is_number_integer(), "{}: key '{}' = {} is not an integer", origin, what,
              v.dump());
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t{INT32_MAX}
                                             : v.get<int64_t>() >= INT32_MIN &&
                                                   v.get<int64_t>() <= INT32_MAX;
    HYP_CHECK(fits, "{}: key '{}' = {} is not a token id (at most 2^31 - 1)", origin, what,
              v.dump());
    return static_cast<int32_t>(v.get<int64_t>());
  };
  auto id_key = [&](const char* key, int32_t fallback) {
    return has(key) ? token_id(j[key], key) : fallback;
  };
  c.pad_id = id_key("pad_token_id", -1);
  c.bos_id = id_key("bos_token_id", 1);
  // eos_token_id may be a list in newer configs; take the first.
  if (j.contains("eos_token_id") && j["eos_token_id"].is_array() && !j["eos_token_id"].empty())
    c.eos_id = token_id(j["eos_token_id"][0], "eos_token_id[0]");
  else
    c.eos_id = id_key("eos_token_id", 2);
  c.validate(origin);
  return c;
}

}  // namespace hyperion::convert
