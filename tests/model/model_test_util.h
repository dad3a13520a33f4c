// Finite-difference gradient check shared by the model tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model/causal_lm.h"
#include "model/generator.h"
#include "model/param_store.h"

namespace hyperion::testing_util {

// A tiny Llama for device and model tests (vocab 37, dim 16, 2 layers, 4 heads over 2 kv
// heads, 16 positions); `experts` > 0 makes every layer a top-2 MoE of that many experts.
inline DecoderConfig tiny_test_config(int64_t experts = 0) {
  DecoderConfig c;
  c.vocab_size = 37;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.ffn_dim = 24;
  c.max_seq_len = 16;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000;
  if (experts > 0) {
    c.n_experts = experts;
    c.n_experts_per_tok = 2;
    c.moe_ffn_dim = 8;
  }
  return c;
}

// Gemma 2's features at test scale: post-norms, scores capped at 1 and logits at 3 (so
// the caps bite), a scale of its own, every other layer local over `window` positions.
inline void use_gemma2_features(DecoderConfig& c, int64_t window) {
  c.arch = family_info(DecoderFamily::kGemma2).defaults;
  c.tie_embeddings = true;
  c.arch.sliding_window = window;
  c.arch.attn_logit_softcap = 1.0;
  c.arch.final_logit_softcap = 3.0;
  c.arch.query_pre_attn_scalar = 10;
}

// Gemma 3's: q/k norms, post-norms, every other layer local over `window` positions with
// a RoPE base of its own.
inline void use_gemma3_features(DecoderConfig& c, int64_t window) {
  c.arch = family_info(DecoderFamily::kGemma3).defaults;
  c.tie_embeddings = true;
  c.arch.sliding_window = window;
  c.arch.sliding_window_pattern = 2;
  c.arch.local_rope_theta = 50;
}

struct FdOptions {
  int per_tensor = 4;  // elements checked per tensor
  double h = 5e-3;     // central differences at h and 2h, Richardson-extrapolated
  double rel = 2e-3, abs = 2e-4;
};

// For `per_tensor` random elements of every tensor (embedding elements from the rows of
// `tokens`, which the batch uses), compares ps.grads() with (4 D(h) - D(2h)) / 3 of the
// central differences D of objective(): the O(h^2) truncation error cancels, leaving the
// f32 rounding of the objective. Returns the number of elements checked.
template <typename Objective>
int check_gradients_fd(ParamStore& ps, const std::vector<int32_t>& tokens, Objective&& objective,
                       const FdOptions& o, uint32_t seed = 9) {
  std::mt19937 rng(seed);
  const int64_t dim = ps.config().dim;
  int checked = 0;
  for (const ParamInfo& p : ps.infos()) {
    for (int rep = 0; rep < o.per_tensor; ++rep) {
      int64_t i = static_cast<int64_t>(rng() % p.numel);
      if (p.kind == ParamKind::kEmbedding)
        i = tokens[static_cast<size_t>(rep)] * dim + static_cast<int64_t>(rng() % dim);
      float* w = ps.params() + p.offset + i;
      const float saved = *w;
      auto central = [&](double h) {
        *w = saved + static_cast<float>(h);
        const double lp = objective();
        *w = saved - static_cast<float>(h);
        const double lm = objective();
        *w = saved;
        return (lp - lm) / (2 * h);
      };
      const double fd = (4 * central(o.h) - central(2 * o.h)) / 3;
      const double an = ps.grads()[p.offset + i];
      EXPECT_NEAR(an, fd, o.rel * std::max(std::fabs(fd), std::fabs(an)) + o.abs)
          << p.name << "[" << i << "]";
      ++checked;
    }
  }
  return checked;
}

// Incremental decoding (a prefill of `prefill` tokens, then one token at a time through the
// contiguous KV cache) gives the full forward's logits at every position, to 1e-4.
inline void expect_generation_matches_forward(const ParamStore& ps,
                                              const std::vector<int32_t>& tokens,
                                              int64_t prefill = 4) {
  const int64_t t = static_cast<int64_t>(tokens.size()), v = ps.config().vocab_size;
  CausalLM m(const_cast<ParamStore&>(ps), {1, t, false, RematPolicy::kNone});
  std::vector<float> full(static_cast<size_t>(t * v));
  m.forward_logits(tokens.data(), full.data());
  Generator gen(ps, t);
  const float* l = gen.feed(tokens.data(), prefill);
  for (int64_t j = 0; j < v; ++j)
    ASSERT_NEAR(l[j], full[static_cast<size_t>((prefill - 1) * v + j)], 1e-4);
  for (int64_t i = prefill; i < t; ++i) {
    l = gen.feed(&tokens[static_cast<size_t>(i)], 1);
    for (int64_t j = 0; j < v; ++j)
      ASSERT_NEAR(l[j], full[static_cast<size_t>(i * v + j)], 1e-4) << i;
  }
}

// The f32 gradients of a [b, t] batch under every remat policy: those of kNone agree with
// finite differences (more than 40 elements checked), the others equal them bit for bit.
inline void expect_gradients_under_every_remat(ParamStore& ps, int64_t b, int64_t t,
                                               const std::vector<int32_t>& in,
                                               const std::vector<int32_t>& tg) {
  std::vector<float> first;
  for (RematPolicy r : {RematPolicy::kNone, RematPolicy::kMinimal, RematPolicy::kFull}) {
    CausalLM m(ps, {b, t, false, r});
    ps.zero_grads();
    m.forward_backward(in.data(), tg.data(), 1.0f);
    std::vector<float> g(ps.grads(), ps.grads() + ps.size());
    if (first.empty()) {
      first = g;
      const int checked = check_gradients_fd(
          ps, in, [&] { return m.forward_loss(in.data(), tg.data()).loss; }, FdOptions{});
      EXPECT_GT(checked, 40);
    } else {
      EXPECT_EQ(g, first) << remat_policy_name(r);
    }
  }
}

}  // namespace hyperion::testing_util
