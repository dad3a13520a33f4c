// The small Llama the serving tests run: 2 layers, GQA (4 query / 2 kv heads of 16),
// 128 positions, with an init larger than training's so greedy choices are not decided
// by round-off.
#pragma once

#include <memory>

#include "model/llama_config.h"
#include "model/param_store.h"

namespace hyperion::testing_util {

inline LlamaConfig small_serving_config(int64_t vocab = 97, bool moe = false) {
  LlamaConfig c;
  c.vocab_size = vocab;
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.ffn_dim = 96;
  c.max_seq_len = 128;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000;
  if (moe) {
    c.n_experts = 4;
    c.n_experts_per_tok = 2;
    c.moe_ffn_dim = 48;
  }
  return c;
}

inline std::unique_ptr<ParamStore> small_serving_params(const LlamaConfig& c, bool bf16,
                                                        uint64_t seed) {
  auto p = std::make_unique<ParamStore>(c, bf16);
  p->init(seed, 0.3);
  if (bf16) p->sync_bf16();
  return p;
}

}  // namespace hyperion::testing_util
