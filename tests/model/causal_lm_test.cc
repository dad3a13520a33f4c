#include "model/causal_lm.h"
#include "convert/hf_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/error.h"
#include "kernels/cross_entropy.h"
#include "model/param_store.h"
#include "model_test_util.h"

namespace hyperion {
namespace {

DecoderConfig tiny_config(bool tied = false) {
  DecoderConfig c = testing_util::tiny_test_config();
  c.tie_embeddings = tied;
  return c;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// ---- An independent reference forward in double, written from the HF definitions. ----
using Mat = std::vector<double>;

Mat get(const ParamStore& ps, const std::string& name) {
  const ParamInfo* p = ps.find(name);
  EXPECT_NE(p, nullptr) << name;
  return Mat(ps.params() + p->offset, ps.params() + p->offset + p->numel);
}

// y[t, o] = sum_i x[t, i] W[o, i]
Mat matmul_t(const Mat& x, const Mat& w, int64_t rows, int64_t in, int64_t out) {
  Mat y(static_cast<size_t>(rows * out), 0.0);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += x[t * in + i] * w[o * in + i];
      y[t * out + o] = s;
    }
  return y;
}

Mat rmsnorm(const Mat& x, const Mat& w, int64_t rows, int64_t d, double eps) {
  Mat y(x.size());
  for (int64_t t = 0; t < rows; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += x[t * d + i] * x[t * d + i];
    const double r = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t i = 0; i < d; ++i) y[t * d + i] = x[t * d + i] * r * w[i];
  }
  return y;
}

void rope(Mat& x, int64_t seq, int64_t heads, int64_t hd, double theta) {
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      double* v = &x[(t * heads + h) * hd];
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double ang = t * std::pow(theta, -2.0 * i / hd);
        const double a = v[i], b = v[i + hd / 2];
        v[i] = a * std::cos(ang) - b * std::sin(ang);
        v[i + hd / 2] = b * std::cos(ang) + a * std::sin(ang);
      }
    }
}

// Logits [seq, vocab] of one sequence.
Mat reference_logits(const ParamStore& ps, const int32_t* tokens, int64_t seq) {
  const DecoderConfig& c = ps.config();
  const int64_t d = c.dim, hd = c.head_dim, hq = c.n_heads, hkv = c.n_kv_heads, f = c.ffn_dim;
  Mat emb = get(ps, "model.embed_tokens.weight");
  Mat x(static_cast<size_t>(seq * d));
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t i = 0; i < d; ++i) x[t * d + i] = emb[tokens[t] * d + i];
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Mat h = rmsnorm(x, get(ps, p + "input_layernorm.weight"), seq, d, c.norm_eps);
    Mat q = matmul_t(h, get(ps, p + "self_attn.q_proj.weight"), seq, d, hq * hd);
    Mat k = matmul_t(h, get(ps, p + "self_attn.k_proj.weight"), seq, d, hkv * hd);
    Mat v = matmul_t(h, get(ps, p + "self_attn.v_proj.weight"), seq, d, hkv * hd);
    rope(q, seq, hq, hd, c.rope_theta);
    rope(k, seq, hkv, hd, c.rope_theta);
    Mat att(static_cast<size_t>(seq * hq * hd), 0.0);
    for (int64_t head = 0; head < hq; ++head) {
      const int64_t kh = head / (hq / hkv);
      for (int64_t i = 0; i < seq; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < hd; ++e)
            dot += q[(i * hq + head) * hd + e] * k[(j * hkv + kh) * hd + e];
          s[j] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - mx));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < hd; ++e)
            att[(i * hq + head) * hd + e] += s[j] / z * v[(j * hkv + kh) * hd + e];
      }
    }
    Mat o = matmul_t(att, get(ps, p + "self_attn.o_proj.weight"), seq, hq * hd, d);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    Mat h2 = rmsnorm(x, get(ps, p + "post_attention_layernorm.weight"), seq, d, c.norm_eps);
    Mat g = matmul_t(h2, get(ps, p + "mlp.gate_proj.weight"), seq, d, f);
    Mat u = matmul_t(h2, get(ps, p + "mlp.up_proj.weight"), seq, d, f);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    Mat dn = matmul_t(g, get(ps, p + "mlp.down_proj.weight"), seq, f, d);
    for (size_t i = 0; i < x.size(); ++i) x[i] += dn[i];
  }
  Mat hf = rmsnorm(x, get(ps, "model.norm.weight"), seq, d, c.norm_eps);
  Mat lm = c.tie_embeddings ? emb : get(ps, "lm_head.weight");
  return matmul_t(hf, lm, seq, d, c.vocab_size);
}

class CausalLMTest : public testing::TestWithParam<bool> {};  // param: tied embeddings

TEST_P(CausalLMTest, F32LogitsMatchIndependentReference) {
  DecoderConfig c = tiny_config(GetParam());
  ParamStore ps(c, false);
  ps.init(7, 0.3);
  const int64_t b = 2, t = 9;
  CausalLM m(ps, {b, t, false, RematPolicy::kNone});
  auto tok = random_tokens(b * t, c.vocab_size, 3);
  std::vector<float> logits(static_cast<size_t>(b * t * c.vocab_size));
  m.forward_logits(tok.data(), logits.data());
  for (int64_t s = 0; s < b; ++s) {
    Mat ref = reference_logits(ps, tok.data() + s * t, t);
    for (int64_t i = 0; i < t * c.vocab_size; ++i) {
      const double got = logits[static_cast<size_t>(s * t * c.vocab_size + i)];
      ASSERT_NEAR(got, ref[i], 1e-4 * std::fabs(ref[i]) + 2e-5) << "seq " << s << " i " << i;
    }
  }
}

// Loss of the model in f32 for finite differences.
double loss_of(CausalLM& m, const std::vector<int32_t>& in, const std::vector<int32_t>& tg) {
  return m.forward_loss(in.data(), tg.data()).loss;
}

TEST_P(CausalLMTest, GradientsMatchFiniteDifferences) {
  DecoderConfig c = tiny_config(GetParam());
  ParamStore ps(c, false);
  ps.init(11, 0.4);
  const int64_t b = 2, t = 6;
  CausalLM m(ps, {b, t, false, RematPolicy::kNone});
  auto in = random_tokens(b * t, c.vocab_size, 5);
  auto tg = random_tokens(b * t, c.vocab_size, 6);
  tg[3] = kIgnoreIndex;
  ps.zero_grads();
  m.forward_backward(in.data(), tg.data(), 1.0f);
  const int checked = testing_util::check_gradients_fd(
      ps, in, [&] { return loss_of(m, in, tg); }, testing_util::FdOptions{});
  EXPECT_GT(checked, 40);
}

// Gemma's fields ((1 + w) norms, GELU-tanh, sqrt(dim) embedding scale, tied head) in the
// backward, against finite differences; every remat policy gives the same gradients.
TEST(GemmaModel, GradientsMatchFiniteDifferencesUnderEveryRemat) {
  DecoderConfig c = tiny_config(true);
  c.arch = family_info(DecoderFamily::kGemma).defaults;
  c.head_dim = 6;  // not dim / heads
  ParamStore ps(c, false);
  ps.init(13, 0.4);
  for (const ParamInfo& info : ps.infos())  // norms start at 0 (scale 1): move them off it
    if (info.kind == ParamKind::kNorm)
      for (int64_t i = 0; i < info.numel; ++i)
        ps.params()[info.offset + i] = 0.1f * float(i % 5) - 0.2f;
  const int64_t b = 2, t = 6;
  testing_util::expect_gradients_under_every_remat(ps, b, t, random_tokens(b * t, c.vocab_size, 8),
                                                   random_tokens(b * t, c.vocab_size, 9));
}

TEST(GemmaConfig, HfJsonRoundTripAndLegacyActivation) {
  DecoderConfig c = tiny_config(true);
  c.arch = family_info(DecoderFamily::kGemma).defaults;
  const std::string json = convert::to_hf_config_json(c);
  EXPECT_NE(json.find("\"GemmaForCausalLM\""), std::string::npos);
  EXPECT_NE(json.find("\"model_type\": \"gemma\""), std::string::npos);
  EXPECT_NE(json.find("\"hidden_activation\": \"gelu_pytorch_tanh\""), std::string::npos);
  const DecoderConfig back = convert::decoder_config_from_hf_json(json, "config.json");
  EXPECT_TRUE(back.arch == c.arch);
  EXPECT_TRUE(back.tie_embeddings);
  // Hugging Face's Gemma runs the tanh form when only the legacy hidden_act "gelu" is set.
  const std::string legacy =
      R"({"model_type": "gemma", "vocab_size": 37, "hidden_size": 16, "intermediate_size": 24,
          "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 4, "hidden_act": "gelu"})";
  const DecoderConfig l = convert::decoder_config_from_hf_json(legacy, "config.json");
  EXPECT_EQ(l.arch.activation, GatedActivation::kGeluTanh);
  EXPECT_TRUE(l.tie_embeddings);
  // The exact erf GELU and softcapping are refused by name.
  for (const char* bad :
       {R"({"model_type": "gemma", "vocab_size": 37, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_activation": "gelu"})",
        R"({"model_type": "gemma", "vocab_size": 37, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 2, "num_attention_heads": 4, "final_logit_softcapping": 30.0})"}) {
    try {
      convert::decoder_config_from_hf_json(bad, "dir/config.json");
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dir/config.json"), std::string::npos) << e.what();
    }
  }
  // Soft caps are Gemma 2/3's (Gemma's config.json could not carry one), finite and >= 0.
  // A window pattern needs a window and N >= 2.
  DecoderConfig room = c;
  room.arch.final_logit_softcap = 30.0;
  EXPECT_THROW(room.validate("preset"), Error);
  room.arch.family = DecoderFamily::kGemma2;
  room.arch.post_norms = true;
  EXPECT_NO_THROW(room.validate("preset"));
  room.arch.final_logit_softcap = -1.0;
  EXPECT_THROW(room.validate("preset"), Error);
  room = c;
  room.arch.sliding_window = 512;
  EXPECT_NO_THROW(room.validate("preset"));
  room.arch.sliding_window_pattern = 1;
  EXPECT_THROW(room.validate("preset"), Error);
  room.arch.sliding_window = 0;
  room.arch.sliding_window_pattern = 6;
  EXPECT_THROW(room.validate("preset"), Error);
}

TEST_P(CausalLMTest, RematPoliciesGiveIdenticalGradients) {
  for (bool bf16 : {false, true}) {
    DecoderConfig c = tiny_config(GetParam());
    std::vector<std::vector<float>> grads;
    std::vector<double> losses;
    for (RematPolicy r : {RematPolicy::kNone, RematPolicy::kMinimal, RematPolicy::kFull}) {
      ParamStore ps(c, bf16);
      ps.init(3, 0.3);
      CausalLM m(ps, {2, 8, bf16, r});
      auto in = random_tokens(16, c.vocab_size, 1);
      auto tg = random_tokens(16, c.vocab_size, 2);
      losses.push_back(m.forward_backward(in.data(), tg.data(), 0.5f).loss);
      grads.emplace_back(ps.grads(), ps.grads() + ps.size());
    }
    for (size_t i = 1; i < grads.size(); ++i) {
      EXPECT_EQ(losses[i], losses[0]) << "bf16=" << bf16;
      EXPECT_EQ(std::memcmp(grads[i].data(), grads[0].data(), grads[0].size() * 4), 0)
          << "remat policy " << i << " bf16=" << bf16;
    }
  }
}

TEST_P(CausalLMTest, Bf16CloseToF32) {
  DecoderConfig c = tiny_config(GetParam());
  ParamStore p32(c, false), p16(c, true);
  p32.init(5, 0.3);
  p16.init(5, 0.3);
  CausalLM m32(p32, {2, 8, false, RematPolicy::kMinimal});
  CausalLM m16(p16, {2, 8, true, RematPolicy::kMinimal});
  auto in = random_tokens(16, c.vocab_size, 1);
  auto tg = random_tokens(16, c.vocab_size, 2);
  const double l32 = m32.forward_backward(in.data(), tg.data(), 1.0f).loss;
  const double l16 = m16.forward_backward(in.data(), tg.data(), 1.0f).loss;
  EXPECT_NEAR(l16, l32, 0.02 * l32);
  double num = 0, den = 0;
  for (int64_t i = 0; i < p32.size(); ++i) {
    num += std::pow(p16.grads()[i] - p32.grads()[i], 2);
    den += std::pow(p32.grads()[i], 2);
  }
  EXPECT_LT(std::sqrt(num / den), 0.05);
}

INSTANTIATE_TEST_SUITE_P(Tying, CausalLMTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& i) {
                           return i.param ? "tied" : "untied";
                         });

TEST(ParamStore, LayoutIsContiguousPerLayerAndAligned) {
  DecoderConfig c = tiny_config();
  ParamStore ps(c, true);
  EXPECT_EQ(ps.infos().front().name, "model.embed_tokens.weight");
  EXPECT_EQ(ps.infos().back().name, "lm_head.weight");
  for (const ParamInfo& p : ps.infos()) EXPECT_EQ(p.offset % 16, 0) << p.name;
  auto r0 = ps.layer_range(0), r1 = ps.layer_range(1);
  EXPECT_EQ(r0.second, r1.first);
  EXPECT_EQ(r0.first, ps.find("model.layers.0.input_layernorm.weight")->offset);
  EXPECT_EQ(r1.second, ps.find("model.norm.weight")->offset);
  int64_t total = 0;
  for (const ParamInfo& p : ps.infos()) total += p.numel;
  EXPECT_EQ(total, c.total_params());
  ParamStore tied(tiny_config(true), false);
  EXPECT_EQ(tied.find("lm_head.weight"), nullptr);
  EXPECT_EQ(tied.lm_head(), tied.embed());
}

TEST(ParamStore, LayoutAndBytesWithoutAllocatingAndInferenceWithoutGradients) {
  const DecoderConfig c = tiny_config();
  const ParamStore full(c, true);
  const std::vector<ParamInfo> layout = ParamStore::layout(c);
  ASSERT_EQ(layout.size(), full.infos().size());
  for (size_t i = 0; i < layout.size(); ++i) {
    EXPECT_EQ(layout[i].name, full.infos()[i].name);
    EXPECT_EQ(layout[i].offset, full.infos()[i].offset);
  }
  EXPECT_EQ(ParamStore::bytes(c, {true, true}), full.size() * (4 + 4 + 2));
  EXPECT_EQ(ParamStore::bytes(c, {false, false}), full.size() * 4);
  const ParamStore inference(c, true, /*gradients=*/false);
  EXPECT_FALSE(inference.has_grads());
  EXPECT_TRUE(full.has_grads());
  EXPECT_THROW(inference.grad(0), Error);
}

TEST(DecoderConfig, UnsupportedKeysAndAbsurdSizesAreRefusedByName) {
  const std::string base = convert::to_hf_config_json(tiny_config());
  auto with = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = nlohmann::json::parse(base);
    j[key] = value;
    return j.dump();
  };
  auto message = [](const std::string& text) {
    try {
      convert::decoder_config_from_hf_json(text, "m/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(with("hidden_act", "gelu")).find("m/config.json: hidden_act 'gelu'"),
            std::string::npos);
  EXPECT_NE(message(with("model_type", "phi3")).find("'model_type' = 'phi3' is not supported"),
            std::string::npos);
  EXPECT_NE(message(with("architectures", {"GPT2LMHeadModel"})).find("GPT2LMHeadModel"),
            std::string::npos);
  EXPECT_NE(message(with("mlp_bias", true)).find("mlp_bias"), std::string::npos);
  EXPECT_NE(message(with("attention_bias", 1)).find("attention_bias"), std::string::npos);
  EXPECT_NE(message(with("rope_scaling", {{"rope_type", "llama3"}})).find("rope_scaling"),
            std::string::npos);
  EXPECT_EQ(message(with("rope_scaling", nullptr)), "");
  EXPECT_EQ(message(with("attention_bias", false)), "");
  EXPECT_NE(message(with("vocab_size", 1000000000000)).find("vocab_size = 1000000000000"),
            std::string::npos);
  // Errors name the config.json key the user wrote, not the decoder's field.
  EXPECT_NE(message(with("num_hidden_layers", 1000000))
                .find("m/config.json: num_hidden_layers = 1000000 is out of range"),
            std::string::npos);
  EXPECT_NE(message(with("hidden_size", 1000000)).find("hidden_size = 1000000 is out of range"),
            std::string::npos);
  EXPECT_NE(message(with("intermediate_size", 10000000))
                .find("intermediate_size = 10000000 is out of range"),
            std::string::npos);
  EXPECT_NE(message(with("max_position_embeddings", 1000000000))
                .find("max_position_embeddings = 1000000000 is out of range"),
            std::string::npos);
  EXPECT_NE(message(with("num_key_value_heads", 3))
                .find("num_key_value_heads (3) must divide num_attention_heads"),
            std::string::npos);
  EXPECT_NE(message(with("head_dim", 0)).find("head_dim must be > 0"), std::string::npos);
}

TEST(DecoderConfig, MemoryPlanSaturatesInsteadOfWrapping) {
  // The largest dense shape validate() accepts, 2^16 sequences of 2^24 tokens: the
  // activations alone pass 2^63 bytes, and the plan must say so rather than wrap.
  DecoderConfig c;
  c.vocab_size = int64_t{1} << 24;
  c.dim = int64_t{1} << 17;
  c.n_layers = 4096;
  c.n_heads = 4096;
  c.n_kv_heads = 4096;
  c.head_dim = 4096;
  c.ffn_dim = int64_t{1} << 20;
  c.max_seq_len = int64_t{1} << 24;
  c.validate("x");
  const int64_t max = std::numeric_limits<int64_t>::max();
  for (const RematPolicy r : {RematPolicy::kNone, RematPolicy::kMinimal, RematPolicy::kFull}) {
    const MemoryPlan p = memory_plan(c, 65536, int64_t{1} << 24, true, r);
    EXPECT_EQ(p.activation_bytes, max);
    EXPECT_EQ(p.scratch_bytes, max);
    EXPECT_EQ(p.total(), max);
    EXPECT_GT(p.weight_bytes, 0);
  }
  // An ordinary plan is unchanged by the saturation.
  const DecoderConfig t = tiny_config();
  const MemoryPlan small = memory_plan(t, 2, 8, true, RematPolicy::kNone);
  EXPECT_EQ(small.weight_bytes, 4 * t.total_params());
  EXPECT_EQ(small.total(), small.weight_bytes + small.compute_weight_bytes + small.grad_bytes +
                               small.optimizer_bytes + small.activation_bytes +
                               small.scratch_bytes);
}

TEST(DecoderConfig, HfJsonRoundTripAndErrors) {
  DecoderConfig c = tiny_config(true);
  DecoderConfig back =
      convert::decoder_config_from_hf_json(convert::to_hf_config_json(c), "config.json");
  EXPECT_EQ(back.dim, c.dim);
  EXPECT_EQ(back.n_kv_heads, c.n_kv_heads);
  EXPECT_EQ(back.tie_embeddings, true);
  EXPECT_DOUBLE_EQ(back.rope_theta, c.rope_theta);
  try {
    convert::decoder_config_from_hf_json(R"({"vocab_size": 10, "hidden_size": "x"})",
                                         "dir/config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dir/config.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("hidden_size"), std::string::npos);
  }
  EXPECT_THROW(convert::decoder_config_from_hf_json("{", "c.json"), Error);
}

TEST(DecoderConfig, FlopsFormula) {
  DecoderConfig c = tiny_config();
  const int64_t per_layer = 16 * 16 + 2 * 16 * 8 + 16 * 16 + 3 * 16 * 24 + 2 * 16;
  EXPECT_EQ(c.layer_params(), per_layer);
  EXPECT_EQ(c.non_embedding_params(), 2 * per_layer + 16 + 37 * 16);
  EXPECT_DOUBLE_EQ(c.train_flops_per_token(8),
                   6.0 * (2 * per_layer + 16 + 37 * 16) + 6.0 * 2 * 8 * 16);
  // A window of 2 on layer 0 (layer 1 global): over 8 positions it keeps 15 of the 36
  // causal pairs (1 + 2 * 7), so that layer's attention term shrinks to 15/36.
  c.arch.sliding_window = 2;
  c.arch.sliding_window_pattern = 2;
  EXPECT_DOUBLE_EQ(c.train_flops_per_token(8),
                   6.0 * (2 * per_layer + 16 + 37 * 16) + 6.0 * (1.0 + 15.0 / 36.0) * 8 * 16);
  // A window as long as the sequence is no window.
  EXPECT_DOUBLE_EQ(c.train_flops_per_token(2), 6.0 * (2 * per_layer + 16 + 37 * 16) + 6.0 * 2 * 2 * 16);
}

}  // namespace
}  // namespace hyperion
