// The small Llama the serving tests run: 2 layers, GQA (4 query / 2 kv heads of 16),
// 128 positions, with an init larger than training's so greedy choices are not decided
// by round-off; and the engine settings and requests the engine tests share.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/fill.h"
#include "model/decoder_config.h"
#include "model/generator.h"
#include "model/lora.h"
#include "model/param_store.h"
#include "serve/engine.h"
#include "serve/engine_config.h"
#include "serve/request.h"

namespace hyperion::testing_util {

inline DecoderConfig small_serving_config(int64_t vocab = 97, bool moe = false) {
  DecoderConfig c;
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

inline std::unique_ptr<ParamStore> small_serving_params(const DecoderConfig& c, bool bf16,
                                                        uint64_t seed) {
  auto p = std::make_unique<ParamStore>(c, bf16);
  p->init(seed, 0.3);
  if (bf16) p->sync_bf16();
  return p;
}

// f32 weights and KV (token-for-token comparisons), 4-token pages and 7-token prefill
// chunks (page crossings and chunked prefill at test sizes), 4 slots.
inline serve::EngineConfig f32_engine_config() {
  serve::EngineConfig c;
  c.weights = serve::WeightFormat::kF32;
  c.kv_dtype = DType::kF32;
  c.kv_page_tokens = 4;
  c.prefill_chunk = 7;
  c.max_concurrent_decodes = 4;
  return c;
}

// BOS then n - 1 ids in [3, 97) (the small config's vocabulary past bos/eos/pad), seeded.
inline std::vector<int32_t> random_prompt(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  t[0] = 1;
  for (size_t i = 1; i < t.size(); ++i) t[i] = static_cast<int32_t>(3 + rng() % 94);
  return t;
}

// A greedy request that ignores EOS: exactly max_tokens tokens come out.
inline serve::GenerationRequest greedy_request(std::vector<int32_t> prompt, int64_t max_tokens) {
  serve::GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// What the single-sequence generator gives for `prompt` (with `adapter`, or the base alone
// when null), EOS not stopping it: the reference the engine's outputs are held to.
inline std::vector<int32_t> generator_tokens(const ParamStore& p, const LoraAdapter* adapter,
                                             const std::vector<int32_t>& prompt, int64_t max_tokens,
                                             SamplingParams sp = {0.0f, 0, 1.0f, 0}) {
  Generator gen(p, p.config().max_seq_len);
  gen.set_lora(adapter);
  GenerateOptions o;
  o.sampling = sp;
  o.max_tokens = max_tokens;
  o.stop_at_eos = false;
  return generate_tokens(gen, prompt, o);
}

// One request's output through the engine: its tokens, their log-probabilities and the
// final event.
struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  serve::FinishReason finish = serve::FinishReason::kNone;
  serve::TokenEvent last;
};

// Runs the requests through one engine (all queued at once) and returns each output.
inline std::vector<Collected> run_all(serve::Engine& engine, const std::vector<serve::GenerationRequest>& reqs) {
  std::vector<Collected> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    engine.add(reqs[i], [&out, i](const serve::TokenEvent& ev) {
      if (ev.token >= 0) {
        out[i].tokens.push_back(ev.token);
        out[i].logprobs.push_back(ev.logprob);
      }
      if (ev.finish != serve::FinishReason::kNone) {
        out[i].finish = ev.finish;
        out[i].last = ev;
      }
    });
  engine.run_until_idle();
  return out;
}

// A trained-looking LoRA adapter for `base`: kaiming A, B with values (seeded); targets as
// lora_target_modules takes them ("all-linear", "q_proj,v_proj").
inline std::unique_ptr<LoraAdapter> random_adapter(const ParamStore& base, int64_t rank, const std::string& targets,
                                                   uint64_t seed) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = 2.0 * static_cast<double>(rank);
  l.targets = parse_lora_targets(targets, "test");
  auto a = std::make_unique<LoraAdapter>(base, l, false, false);
  a->init(seed);
  ParamStore& s = a->store();
  for (size_t i = 1; i < s.infos().size(); i += 2)
    fill_normal(s.param(static_cast<int>(i)), seed + 100 + i, 0.0f, 0.3f);
  return a;
}

}  // namespace hyperion::testing_util
