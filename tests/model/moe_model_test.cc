// A Llama decoder with MoE layers: gradients of the whole objective (cross-entropy +
// load-balance + z-loss) against finite differences for every tensor incl. the router,
// remat policies, the KV-cache generator, configs and parameter counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/error.h"
#include "convert/hf_config.h"
#include "kernels/cross_entropy.h"
#include "model/causal_lm.h"
#include "model/generator.h"
#include "model/param_store.h"
#include "model_test_util.h"

namespace hyperion {
namespace {

// Two layers: layer 0 dense, layer 1 MoE (interleave step 2), 4 experts, top-2.
DecoderConfig mixed_config() {
  DecoderConfig c;
  c.vocab_size = 29;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.ffn_dim = 24;
  c.max_seq_len = 16;
  c.n_experts = 4;
  c.n_experts_per_tok = 2;
  c.moe_ffn_dim = 12;
  c.moe_layer_step = 2;
  return c;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

TEST(MoeModel, LayoutNamesAndCounts) {
  const DecoderConfig c = mixed_config();
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  ParamStore ps(c, true);
  EXPECT_FALSE(ps.layer(0).moe());
  EXPECT_TRUE(ps.layer(1).moe());
  EXPECT_NE(ps.find("model.layers.0.mlp.gate_proj.weight"), nullptr);
  EXPECT_NE(ps.find("model.layers.1.block_sparse_moe.gate.weight"), nullptr);
  for (int e = 0; e < 4; ++e)
    for (const char* w : {"w1", "w2", "w3"})
      EXPECT_NE(ps.find("model.layers.1.block_sparse_moe.experts." + std::to_string(e) + "." + w +
                        ".weight"),
                nullptr);
  // Stacked experts are back to back, so the grouped GEMM sees one [E, F, D] tensor.
  const LayerParamIndex& p = ps.layer(1);
  for (int first : {p.gate, p.up, p.down})
    for (int e = 1; e < 4; ++e)
      EXPECT_EQ(ps.infos()[static_cast<size_t>(first + e)].offset,
                ps.infos()[static_cast<size_t>(first)].offset + e * 12 * 16);
  int64_t total = 0;
  for (const ParamInfo& i : ps.infos()) total += i.numel;
  EXPECT_EQ(total, c.total_params());
  // Active: the router and 2 of the 4 experts.
  EXPECT_EQ(c.non_embedding_params() - c.active_non_embedding_params(), 2 * 3 * 16 * 12);
  const auto r = ps.layer_range(1);
  EXPECT_EQ(r.second, ps.infos()[static_cast<size_t>(ps.final_norm())].offset);
}

TEST(MoeModel, HfConfigRoundTrip) {
  DecoderConfig c = mixed_config();
  c.norm_topk_prob = false;
  const std::string j = convert::to_hf_config_json(c);
  EXPECT_NE(j.find("MixtralForCausalLM"), std::string::npos);
  EXPECT_NE(j.find("\"num_local_experts\": 4"), std::string::npos);
  const DecoderConfig r = convert::decoder_config_from_hf_json(j, "config.json");
  EXPECT_EQ(r.n_experts, 4);
  EXPECT_EQ(r.n_experts_per_tok, 2);
  EXPECT_EQ(r.expert_ffn_dim(), 12);
  EXPECT_EQ(r.ffn_dim, 24);
  EXPECT_EQ(r.moe_layer_step, 2);
  EXPECT_FALSE(r.norm_topk_prob);
  EXPECT_EQ(r.total_params(), c.total_params());
  // An all-MoE config is plain Mixtral: no hyperion_* keys.
  DecoderConfig all = mixed_config();
  all.moe_layer_step = 1;
  EXPECT_EQ(convert::to_hf_config_json(all).find("hyperion_"), std::string::npos);
  DecoderConfig bad = mixed_config();
  bad.n_experts_per_tok = 5;
  EXPECT_THROW(bad.validate("x"), Error);
}

TEST(MoeModel, Mixtral8x7bParameterCounts) {
  DecoderConfig c;
  c.vocab_size = 32000;
  c.dim = 4096;
  c.n_layers = 32;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.head_dim = 128;
  c.ffn_dim = 14336;
  c.n_experts = 8;
  c.n_experts_per_tok = 2;
  EXPECT_EQ(c.total_params(), 46702792704);  // Mixtral-8x7B as published
  EXPECT_EQ(c.active_non_embedding_params() + c.embedding_params(), 12879925248);
}

double objective(CausalLM& m, const std::vector<int32_t>& in, const std::vector<int32_t>& tg) {
  const double ce = m.forward_loss(in.data(), tg.data()).loss;
  return ce + m.aux_loss();
}

class MoeModelTest : public testing::TestWithParam<double> {};  // param: capacity factor

TEST_P(MoeModelTest, GradientsMatchFiniteDifferences) {
  const DecoderConfig c = mixed_config();
  ParamStore ps(c, false);
  ps.init(11, 0.4);
  const int64_t b = 2, t = 6;
  ModelOptions mo{b, t, false, RematPolicy::kNone};
  mo.moe.capacity_factor = GetParam();
  mo.moe.load_balance_weight = 0.3f;
  mo.moe.z_loss_weight = 0.02f;
  CausalLM m(ps, mo);
  auto in = random_tokens(b * t, c.vocab_size, 5);
  auto tg = random_tokens(b * t, c.vocab_size, 6);
  ps.zero_grads();
  m.forward_backward(in.data(), tg.data(), 1.0f);
  EXPECT_GT(m.moe_stats().lb_loss, 0.0f);
  EXPECT_GT(m.moe_stats().z_loss, 0.0f);
  if (GetParam() > 0) {
    EXPECT_GT(m.moe_stats().dropped_fraction, 0.0);
  }
  testing_util::FdOptions fo;
  fo.per_tensor = 3;
  fo.h = 2.5e-3;
  fo.rel = 3e-3;
  fo.abs = 3e-4;
  const int checked = testing_util::check_gradients_fd(
      ps, in, [&] { return objective(m, in, tg); }, fo);
  EXPECT_GT(checked, 80);
}

TEST_P(MoeModelTest, RematPoliciesGiveIdenticalGradients) {
  for (bool bf16 : {false, true}) {
    const DecoderConfig c = mixed_config();
    std::vector<std::vector<float>> grads;
    std::vector<double> losses;
    for (RematPolicy r : {RematPolicy::kNone, RematPolicy::kMinimal, RematPolicy::kFull}) {
      ParamStore ps(c, bf16);
      ps.init(3, 0.3);
      ModelOptions mo{2, 8, bf16, r};
      mo.moe.capacity_factor = GetParam();
      mo.moe.load_balance_weight = 0.01f;
      mo.moe.z_loss_weight = 0.001f;
      CausalLM m(ps, mo);
      auto in = random_tokens(16, c.vocab_size, 1);
      auto tg = random_tokens(16, c.vocab_size, 2);
      losses.push_back(m.forward_backward(in.data(), tg.data(), 0.5f).loss + m.aux_loss());
      grads.emplace_back(ps.grads(), ps.grads() + ps.size());
    }
    for (size_t i = 1; i < grads.size(); ++i) {
      EXPECT_EQ(losses[i], losses[0]) << "bf16=" << bf16;
      EXPECT_EQ(std::memcmp(grads[i].data(), grads[0].data(), grads[0].size() * 4), 0)
          << "remat policy " << i << " bf16=" << bf16;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, MoeModelTest, testing::Values(-1.0, 0.75),
                         [](const testing::TestParamInfo<double>& i) {
                           return i.param > 0 ? "capped" : "dropless";
                         });

TEST(MoeModel, GeneratorMatchesFullForward) {
  DecoderConfig c = mixed_config();
  c.max_seq_len = 32;
  ParamStore ps(c, false);
  ps.init(3, 0.3);
  testing_util::expect_generation_matches_forward(ps, random_tokens(10, c.vocab_size, 4));
}

TEST(MoeModel, MemoryPlanMatchesAllocation) {
  const DecoderConfig c = mixed_config();
  for (double cf : {-1.0, 1.25})
    for (RematPolicy r : {RematPolicy::kNone, RematPolicy::kMinimal, RematPolicy::kFull}) {
      ParamStore ps(c, true);
      ModelOptions mo{2, 8, true, r};
      mo.moe.capacity_factor = cf;
      CausalLM m(ps, mo);
      const MemoryPlan plan = memory_plan(c, 2, 8, true, r, cf);
      EXPECT_EQ(plan.activation_bytes, m.activation_bytes()) << remat_policy_name(r) << " " << cf;
      EXPECT_EQ(plan.scratch_bytes, m.scratch_bytes()) << remat_policy_name(r) << " " << cf;
    }
}

}  // namespace
}  // namespace hyperion
