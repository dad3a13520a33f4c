// The decoder features the Hugging Face families beyond Llama 2 need: scaled RoPE
// (linear, Llama 3.1, YaRN), attention biases (Qwen2; attention_bias on q/k/v/o), and
// per-head q/k RMSNorm (Qwen3). Backward against finite differences under every remat
// policy, generation against the full forward, config.json in both RoPE spellings.
// (The forward against an independent float64 PyTorch model: tests/model/torch_reference.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "convert/family_formats.h"
#include "convert/hf_config.h"
#include "kernels/rope.h"
#include "model/causal_lm.h"
#include "model/generator.h"
#include "model/param_store.h"
#include "model_test_util.h"

namespace hyperion {
namespace {

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

struct FamilyCase {
  const char* name;
  DecoderConfig config;
};

std::vector<FamilyCase> family_cases() {
  std::vector<FamilyCase> out;
  DecoderConfig base = testing_util::tiny_test_config();
  {
    DecoderConfig c = base;
    c.arch = family_info(DecoderFamily::kQwen2).defaults;
    c.rope_theta = 1000;
    c.rope_scaling.type = RopeScaling::Type::kYarn;
    c.rope_scaling.factor = 4;
    c.rope_scaling.original_max_positions = 4;  // positions past it in every test
    out.push_back({"qwen2-yarn", c});
  }
  {
    DecoderConfig c = base;
    c.arch = family_info(DecoderFamily::kQwen3).defaults;
    c.head_dim = 6;  // not dim / heads
    c.rope_scaling.type = RopeScaling::Type::kLinear;
    c.rope_scaling.factor = 2;
    out.push_back({"qwen3-linear", c});
  }
  {
    DecoderConfig c = base;
    c.head_dim = 8;
    c.rope_theta = 50;
    c.arch.qkv_bias = c.arch.o_bias = true;
    c.rope_scaling.type = RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = 8;
    c.rope_scaling.low_freq_factor = 1;
    c.rope_scaling.high_freq_factor = 4;
    c.rope_scaling.original_max_positions = 32;
    out.push_back({"llama3-bias", c});
  }
  {
    DecoderConfig c = base;  // Mistral v0.1: every layer local
    c.arch.sliding_window = 3;
    out.push_back({"mistral-window", c});
  }
  {
    DecoderConfig c = base;  // Gemma 2's pattern: layer 0 local, layer 1 global
    c.arch.sliding_window = 2;
    c.arch.sliding_window_pattern = 2;
    out.push_back({"window-pattern", c});
  }
  {
    // Gemma 2: post-norms, scores and logits soft-capped (caps small enough to bend these
    // values), query_pre_attn_scalar, every other layer local.
    DecoderConfig c = base;
    c.arch = family_info(DecoderFamily::kGemma2).defaults;
    c.tie_embeddings = true;
    c.head_dim = 6;
    c.arch.sliding_window = 3;
    c.arch.attn_logit_softcap = 0.8;
    c.arch.final_logit_softcap = 1.5;
    c.arch.query_pre_attn_scalar = 3;
    out.push_back({"gemma2", c});
  }
  {
    // Gemma 3: post-norms, q/k norms, the local layers' own RoPE base.
    DecoderConfig c = base;
    c.arch = family_info(DecoderFamily::kGemma3).defaults;
    c.tie_embeddings = true;
    c.rope_theta = 1000;
    c.arch.local_rope_theta = 7;
    c.arch.sliding_window = 3;
    c.arch.sliding_window_pattern = 2;
    c.arch.query_pre_attn_scalar = 5;
    out.push_back({"gemma3", c});
  }
  return out;
}

// Moves norms off 1 and biases off 0, so their gradients and effects are not degenerate.
void perturb(ParamStore& ps) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-0.3f, 0.3f);
  for (const ParamInfo& info : ps.infos())
    if (info.kind == ParamKind::kNorm || info.kind == ParamKind::kBias)
      for (int64_t i = 0; i < info.numel; ++i) ps.params()[info.offset + i] += u(rng);
}

TEST(FamilyFeatures, ParametersOfEachFamily) {
  for (const FamilyCase& fc : family_cases()) {
    const ParamStore ps(fc.config, false, false);
    const bool bias = fc.config.arch.qkv_bias, o_bias = fc.config.arch.o_bias;
    const bool qkn = fc.config.arch.qk_norm;
    EXPECT_EQ(ps.find("model.layers.1.self_attn.q_proj.bias") != nullptr, bias) << fc.name;
    EXPECT_EQ(ps.find("model.layers.1.self_attn.v_proj.bias") != nullptr, bias) << fc.name;
    EXPECT_EQ(ps.find("model.layers.1.self_attn.o_proj.bias") != nullptr, o_bias) << fc.name;
    EXPECT_EQ(ps.find("model.layers.0.self_attn.q_norm.weight") != nullptr, qkn) << fc.name;
    const bool post = fc.config.arch.post_norms;
    EXPECT_EQ(ps.find("model.layers.1.pre_feedforward_layernorm.weight") != nullptr, post);
    EXPECT_EQ(ps.find("model.layers.1.post_feedforward_layernorm.weight") != nullptr, post);
    EXPECT_NE(ps.find("model.layers.1.post_attention_layernorm.weight"), nullptr);
    if (qkn) {
      EXPECT_EQ(ps.find("model.layers.0.self_attn.k_norm.weight")->shape,
                Shape{fc.config.head_dim});
    }
    int64_t n = 0;
    for (const ParamInfo& i : ps.infos()) n += i.numel;
    EXPECT_EQ(n, fc.config.total_params()) << fc.name;
  }
}

TEST(FamilyFeatures, GradientsMatchFiniteDifferencesUnderEveryRemat) {
  for (const FamilyCase& fc : family_cases()) {
    SCOPED_TRACE(fc.name);
    ParamStore ps(fc.config, false);
    ps.init(17, 0.4);
    perturb(ps);
    const int64_t b = 2, t = 7;  // past the YaRN case's original context of 4
    testing_util::expect_gradients_under_every_remat(
        ps, b, t, random_tokens(b * t, fc.config.vocab_size, 8),
        random_tokens(b * t, fc.config.vocab_size, 9));
  }
}

TEST(FamilyFeatures, MemoryPlanMatchesAllocation) {
  for (const FamilyCase& fc : family_cases())
    for (RematPolicy r : {RematPolicy::kNone, RematPolicy::kMinimal, RematPolicy::kFull}) {
      ParamStore ps(fc.config, true);
      CausalLM m(ps, {2, 8, true, r});
      const MemoryPlan plan = memory_plan(fc.config, 2, 8, true, r);
      EXPECT_EQ(plan.activation_bytes, m.activation_bytes()) << fc.name;
      EXPECT_EQ(plan.scratch_bytes, m.scratch_bytes()) << fc.name;
    }
}

// Incremental decoding (the contiguous KV cache, in-place qk-norm and biases) gives the
// full forward's logits at every position.
TEST(FamilyFeatures, GenerationMatchesTheFullForward) {
  for (const FamilyCase& fc : family_cases()) {
    SCOPED_TRACE(fc.name);
    const DecoderConfig& c = fc.config;
    ParamStore ps(c, false);
    ps.init(21, 0.3);
    perturb(ps);
    testing_util::expect_generation_matches_forward(ps, random_tokens(10, c.vocab_size, 4));
  }
}

// Every family (and Mixtral, the llama row with experts): Hugging Face and GGUF names are
// present and unique (but for the stacked experts, which share their GGUF tensor), and
// config.json round-trips the whole shape.
TEST(FamilyTable, NamesAndConfigRoundTripAgreeForEveryFamily) {
  std::vector<DecoderConfig> configs;
  for (DecoderFamily f : {DecoderFamily::kLlama, DecoderFamily::kGemma, DecoderFamily::kQwen2,
                          DecoderFamily::kQwen3, DecoderFamily::kGemma2, DecoderFamily::kGemma3}) {
    DecoderConfig c = testing_util::tiny_test_config();
    c.arch = family_info(f).defaults;
    c.tie_embeddings = family_info(f).tied_head;
    configs.push_back(c);
  }
  configs.push_back(testing_util::tiny_test_config(4));  // Mixtral
  for (const DecoderConfig& c : configs) {
    const FamilyInfo& fam = family_info(c.arch.family);
    SCOPED_TRACE(fam.decoder_block);
    EXPECT_EQ(find_family(fam.decoder_block), &fam);
    const convert::HfModelType& own = convert::hf_model_type(fam.family);
    EXPECT_EQ(own.family, fam.family);
    EXPECT_EQ(find_family(own.model_type), &fam);
    EXPECT_EQ(convert::gguf_arch(fam.family).family, fam.family);
    EXPECT_NE(std::string(convert::gguf_arch(fam.family).arch), "");
    std::set<std::string> hf, gguf;
    const std::vector<ParamInfo> layout = ParamStore::layout(c);
    const std::vector<std::string> gguf_names = convert::gguf_tensor_names(c, layout);
    ASSERT_EQ(gguf_names.size(), layout.size());
    for (size_t i = 0; i < layout.size(); ++i) {
      const ParamInfo& p = layout[i];
      EXPECT_TRUE(hf.insert(p.name).second) << p.name;
      EXPECT_FALSE(gguf_names[i].empty()) << p.name;
      const bool expert = p.name.find(".experts.") != std::string::npos;
      EXPECT_TRUE(gguf.insert(gguf_names[i]).second || expert) << gguf_names[i];
      // Both names say the same layer.
      if (p.layer >= 0) {
        EXPECT_EQ(p.name.rfind("model.layers." + std::to_string(p.layer) + ".", 0), 0u);
        EXPECT_EQ(gguf_names[i].rfind("blk." + std::to_string(p.layer) + ".", 0), 0u);
      }
    }
    const DecoderConfig back =
        convert::decoder_config_from_hf_json(convert::to_hf_config_json(c), "config.json");
    EXPECT_TRUE(back.arch == c.arch);
    EXPECT_EQ(back.total_params(), c.total_params());
    EXPECT_EQ(back.n_experts, c.n_experts);
    EXPECT_EQ(back.tie_embeddings, c.tie_embeddings);
    EXPECT_EQ(back.rope_theta, c.rope_theta);
    EXPECT_EQ(back.norm_eps, c.norm_eps);
    std::vector<std::string> names, back_names;
    for (size_t i = 0; i < layout.size(); ++i)
      names.push_back(layout[i].name + " " + gguf_names[i]);
    const std::vector<ParamInfo> back_layout = ParamStore::layout(back);
    const std::vector<std::string> back_gguf = convert::gguf_tensor_names(back, back_layout);
    for (size_t i = 0; i < back_layout.size(); ++i)
      back_names.push_back(back_layout[i].name + " " + back_gguf[i]);
    EXPECT_EQ(back_names, names);
  }
}

TEST(RopeScaling, InverseFrequenciesAsModelingRopeUtils) {
  // Llama 3.1 8B: head_dim 128, theta 500000, factor 8, low 1, high 4, original 8192.
  RopeScaling s;
  s.type = RopeScaling::Type::kLlama3;
  s.factor = 8;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_positions = 8192;
  const std::vector<double> plain = rope_inv_freq(128, 500000.0, RopeScaling{});
  const std::vector<double> f = rope_inv_freq(128, 500000.0, s);
  ASSERT_EQ(f.size(), 64u);
  for (size_t i = 0; i < f.size(); ++i) {
    const double wavelen = 2 * M_PI / plain[i];
    if (wavelen < 8192.0 / 4) {  // high: kept
      EXPECT_DOUBLE_EQ(f[i], plain[i]) << i;
    }
    if (wavelen > 8192.0) {  // low: / 8
      EXPECT_DOUBLE_EQ(f[i], plain[i] / 8) << i;
    }
    if (wavelen >= 8192.0 / 4 && wavelen <= 8192.0) {  // blended
      const double smooth = (8192.0 / wavelen - 1) / 3;
      EXPECT_NEAR(f[i], (1 - smooth) * plain[i] / 8 + smooth * plain[i], 1e-15) << i;
    }
  }
  EXPECT_EQ(rope_attention_factor(s), 1.0);
  RopeScaling lin;
  lin.type = RopeScaling::Type::kLinear;
  lin.factor = 4;
  const std::vector<double> fl = rope_inv_freq(16, 10000.0, lin);
  const std::vector<double> pl = rope_inv_freq(16, 10000.0, RopeScaling{});
  for (size_t i = 0; i < fl.size(); ++i) EXPECT_DOUBLE_EQ(fl[i], pl[i] / 4);
  // YaRN: the first dimensions (fast rotations) keep their frequency, the last are
  // interpolated; cos and sin carry 0.1 ln(factor) + 1.
  RopeScaling y;
  y.type = RopeScaling::Type::kYarn;
  y.factor = 4;
  y.original_max_positions = 4096;
  const std::vector<double> fy = rope_inv_freq(128, 1e6, y);
  const std::vector<double> py = rope_inv_freq(128, 1e6, RopeScaling{});
  EXPECT_DOUBLE_EQ(fy[0], py[0]);
  EXPECT_DOUBLE_EQ(fy[63], py[63] / 4);
  EXPECT_DOUBLE_EQ(rope_attention_factor(y), 0.1 * std::log(4.0) + 1.0);
  const RopeTable table(8, 128, 1e6, y);
  EXPECT_NEAR(table.cos[0], rope_attention_factor(y), 1e-7);  // position 0: cos 1 x factor
  // The table's key follows every input.
  EXPECT_NE(table.key(), RopeTable(8, 128, 1e6).key());
  RopeScaling y2 = y;
  y2.beta_fast = 16;
  EXPECT_NE(table.key(), RopeTable(8, 128, 1e6, y2).key());
  EXPECT_EQ(table.key(), RopeTable(8, 128, 1e6, y).key());
}

const char* kQwenBase = R"("vocab_size": 37, "hidden_size": 16, "intermediate_size": 24,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
    "max_position_embeddings": 64)";

DecoderConfig parse(const std::string& body) {
  return convert::decoder_config_from_hf_json("{" + body + "}", "dir/config.json");
}

std::string error_of(const std::string& body) {
  try {
    parse(body);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(FamilyConfig, HfJsonRoundTripOfEveryFeature) {
  for (const FamilyCase& fc : family_cases()) {
    const DecoderFamily f = fc.config.arch.family;
    const bool layer_types = f == DecoderFamily::kGemma2 || f == DecoderFamily::kGemma3;
    if (fc.config.arch.sliding_window_pattern > 0 && !layer_types) {
      // No Hugging Face class of the llama family reads a pattern.
      EXPECT_THROW(convert::to_hf_config_json(fc.config), Error) << fc.name;
      continue;
    }
    const std::string json = convert::to_hf_config_json(fc.config);
    const DecoderConfig back = convert::decoder_config_from_hf_json(json, "config.json");
    EXPECT_TRUE(back.arch == fc.config.arch) << fc.name << "\n" << json;
    EXPECT_TRUE(back.rope_scaling == fc.config.rope_scaling) << fc.name << "\n" << json;
    EXPECT_EQ(back.head_dim, fc.config.head_dim);
  }
  // Qwen2's biases come with the family (its config.json has no key for them).
  const DecoderConfig q2 = parse(std::string(R"("model_type": "qwen2", )") + kQwenBase +
                                 R"(, "use_sliding_window": false, "sliding_window": 32)");
  EXPECT_TRUE(q2.arch.qkv_bias);
  EXPECT_FALSE(q2.arch.o_bias);
  EXPECT_EQ(q2.arch.family, DecoderFamily::kQwen2);
  const DecoderConfig q3 =
      parse(std::string(R"("architectures": ["Qwen3ForCausalLM"], )") + kQwenBase);
  EXPECT_TRUE(q3.arch.qk_norm);
  EXPECT_FALSE(q3.arch.qkv_bias);
  // Llama's attention_bias: all four projections.
  const DecoderConfig lb =
      parse(std::string(R"("model_type": "llama", "attention_bias": true, )") + kQwenBase);
  EXPECT_TRUE(lb.arch.qkv_bias && lb.arch.o_bias);
}

// Sliding windows as config.json says them: Mistral's sliding_window (every layer local;
// a window covering the context is none), transformers 5's layer_types when they agree,
// Qwen's switched-off window; the training keys; the layer pattern.
TEST(FamilyConfig, SlidingWindowKeys) {
  const DecoderConfig m =
      parse(std::string(R"("model_type": "mistral", "sliding_window": 4, )") + kQwenBase);
  EXPECT_EQ(m.arch.sliding_window, 4);
  EXPECT_EQ(m.arch.layer_window(0), 4);
  EXPECT_NE(convert::to_hf_config_json(m).find("MistralForCausalLM"), std::string::npos);
  const DecoderConfig wide =
      parse(std::string(R"("model_type": "mistral", "sliding_window": 1000000, )") + kQwenBase);
  EXPECT_EQ(wide.arch.sliding_window, 0);
  const DecoderConfig off = parse(std::string(R"("model_type": "qwen2", "sliding_window": 4, )"
                                              R"("use_sliding_window": false, )") +
                                  kQwenBase);
  EXPECT_EQ(off.arch.sliding_window, 0);
  const std::string mixed = error_of(
      std::string(R"("model_type": "mistral", "sliding_window": 4, )"
                  R"("layer_types": ["sliding_attention", "full_attention"], )") +
      kQwenBase);
  EXPECT_NE(mixed.find("layer_types"), std::string::npos) << mixed;
  DecoderArch a;
  a.sliding_window = 8;
  a.sliding_window_pattern = 6;  // Gemma 3: every 6th layer global
  EXPECT_EQ(a.layer_window(0), 8);
  EXPECT_EQ(a.layer_window(4), 8);
  EXPECT_EQ(a.layer_window(5), 0);
  EXPECT_EQ(a.layer_window(11), 0);
  a.sliding_window = 0;
  EXPECT_EQ(a.layer_window(0), 0);
}

TEST(FamilyConfig, RopeInBothSpellings) {
  // As Llama 3.2's config.json on the Hub ...
  const DecoderConfig hub = parse(std::string(R"("model_type": "llama", "rope_theta": 500000.0,
      "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"}, )") +
                                kQwenBase);
  // ... and as transformers 5 writes it.
  const DecoderConfig v5 = parse(std::string(R"("model_type": "llama",
      "rope_parameters": {"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0,
                          "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
                          "rope_theta": 500000.0}, )") +
                               kQwenBase);
  EXPECT_TRUE(hub.rope_scaling == v5.rope_scaling);
  EXPECT_EQ(hub.rope_theta, 500000.0);
  EXPECT_EQ(v5.rope_theta, 500000.0);
  EXPECT_EQ(hub.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(hub.rope_scaling.factor, 32.0);
  // The older "type" key, and transformers 5's default entry.
  EXPECT_EQ(parse(std::string(R"("rope_scaling": {"type": "linear", "factor": 2.0}, )") + kQwenBase)
                .rope_scaling.type,
            RopeScaling::Type::kLinear);
  const DecoderConfig d = parse(
      std::string(R"("rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, )") +
      kQwenBase);
  EXPECT_EQ(d.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(d.rope_theta, 1e6);
  // Per layer type, with only full-attention layers.
  const DecoderConfig per = parse(std::string(R"("rope_parameters": {"full_attention":
      {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
       "rope_theta": 1000.0}}, )") +
                                kQwenBase);
  EXPECT_EQ(per.rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(per.rope_theta, 1000.0);
}

TEST(FamilyConfig, BadRopeAndUnsupportedKeysAreNamed) {
  struct Bad {
    std::string body;
    std::vector<std::string> words;
  };
  const std::vector<Bad> bad = {
      {R"("rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, )", {"rope_type", "dynamic"}},
      {R"("rope_scaling": {"rope_type": "longrope", "factor": 2.0}, )", {"longrope"}},
      {R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0}, )",
       {"llama3", "low_freq_factor"}},
      {R"("rope_scaling": {"rope_type": "linear"}, )", {"factor"}},
      {R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0,
          "original_max_position_embeddings": 1e300}, )",
       {"original_max_position_embeddings"}},
      {R"("rope_scaling": {"rope_type": "linear", "factor": 0.5}, )", {"factor", "0.5"}},
      {R"("rope_scaling": {"rope_type": "linear", "factor": 2.0, "foo": 1}, )", {"foo"}},
      {R"("rope_scaling": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}, )",
       {"partial_rotary_factor"}},
      {R"("rope_scaling": {"rope_type": "linear", "factor": 2.0},
          "rope_parameters": {"rope_type": "linear", "factor": 2.0}, )",
       {"rope_scaling", "rope_parameters"}},
      {R"("rope_parameters": {"full_attention": {"rope_type": "default"},
          "sliding_attention": {"rope_type": "default"}}, )",
       {"sliding_attention"}},
      {R"("model_type": "qwen2", "sliding_window": 8, "use_sliding_window": true, )",
       {"sliding_window", "8"}},
      {R"("model_type": "phi3", )", {"model_type", "phi3"}},
      {R"("model_type": "qwen3", "architectures": ["LlamaForCausalLM"], )",
       {"architectures", "LlamaForCausalLM"}},
      {R"("mlp_bias": true, )", {"mlp_bias"}},
      // A per-layer RoPE for a kind of layer the decoder does not have would be ignored.
      {R"("rope_parameters": {"full_attention": {"rope_type": "default"},
          "chunked_attention": {"rope_type": "default"}}, )",
       {"rope_parameters.chunked_attention"}},
      // Token ids are printed as sent, never truncated to 32 bits.
      {R"("bos_token_id": 4294967303, )", {"bos_token_id", "4294967303", "not a token id"}},
      {R"("eos_token_id": 1000000000000, )", {"eos_token_id", "1000000000000"}},
      {R"("eos_token_id": [4294967298, 2], )", {"eos_token_id[0]", "4294967298"}},
      {R"("pad_token_id": "0", )", {"pad_token_id", "not an integer"}},
  };
  for (const Bad& b : bad) {
    const std::string e = error_of(b.body + kQwenBase);
    EXPECT_NE(e.find("dir/config.json"), std::string::npos) << e;
    for (const std::string& w : b.words) EXPECT_NE(e.find(w), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace hyperion
