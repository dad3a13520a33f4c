// Finite-difference gradient check shared by the model tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model/param_store.h"

namespace hyperion::testing_util {

// A tiny Llama for device and model tests (vocab 37, dim 16, 2 layers, 4 heads over 2 kv
// heads, 16 positions); `experts` > 0 makes every layer a top-2 MoE of that many experts.
inline LlamaConfig tiny_test_config(int64_t experts = 0) {
  LlamaConfig c;
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

}  // namespace hyperion::testing_util
