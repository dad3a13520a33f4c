#include "model/llama_generator.h"

#include <cstring>

#include "base/error.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu.h"
#include "model/linear.h"

namespace hyperion {

LlamaGenerator::LlamaGenerator(const ParamStore& params, int64_t max_len)
    : params_(params),
      cfg_(params.config()),
      act_(params.has_bf16() ? DType::kBF16 : DType::kF32),
      max_len_(max_len),
      rope_(std::max<int64_t>(max_len, 1), params.config().head_dim, params.config().rope_theta) {
  HYP_CHECK(max_len > 0 && max_len <= cfg_.max_seq_len,
            "generator: max_len {} must be in [1, max_seq_len={}]", max_len, cfg_.max_seq_len);
  const size_t bytes = static_cast<size_t>(max_len * cfg_.kv_dim()) * dtype_size(act_);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    k_cache_.emplace_back(bytes);
    v_cache_.emplace_back(bytes);
  }
  logits_ = AlignedBuffer<float>(static_cast<size_t>(cfg_.vocab_size));
}

void LlamaGenerator::ensure_capacity(int64_t n) {
  if (n <= capacity_) return;
  const size_t a = dtype_size(act_);
  const size_t d = static_cast<size_t>(cfg_.dim), q = static_cast<size_t>(cfg_.q_dim());
  const size_t f = static_cast<size_t>(cfg_.ffn_dim), rows = static_cast<size_t>(n);
  x_ = AlignedBuffer<float>(rows * d);
  rstd_ = AlignedBuffer<float>(rows);
  lse_ = AlignedBuffer<float>(rows * static_cast<size_t>(cfg_.n_heads));
  h_ = AlignedBuffer<unsigned char>(rows * d * a);
  q_ = AlignedBuffer<unsigned char>(rows * q * a);
  att_ = AlignedBuffer<unsigned char>(rows * q * a);
  g_ = AlignedBuffer<unsigned char>(rows * f * a);
  u_ = AlignedBuffer<unsigned char>(rows * f * a);
  if (cfg_.is_moe()) moe_.reserve(moe_shape(cfg_, MoeOptions{}, 1, n, 1), act_);
  capacity_ = n;
}

const float* LlamaGenerator::feed(const int32_t* tokens, int64_t n) {
  HYP_CHECK(n > 0, "generator: feed needs at least one token");
  HYP_CHECK(pos_ + n <= max_len_,
            "generator: {} cached + {} new tokens exceed the context of {} positions", pos_, n,
            max_len_);
  ensure_capacity(n);
  const int64_t d = cfg_.dim, f = cfg_.ffn_dim, hq = cfg_.n_heads, hkv = cfg_.n_kv_heads;
  const int64_t hd = cfg_.head_dim, kv = cfg_.kv_dim();
  const size_t a = dtype_size(act_);
  const float eps = static_cast<float>(cfg_.norm_eps);
  const ParamStore& ps = params_;
  embedding_forward(ps.param(ps.embed()),
                    TensorView(const_cast<int32_t*>(tokens), DType::kI32, {n}),
                    TensorView(x_.data(), DType::kF32, {n, d}));
  const TensorView xv(x_.data(), DType::kF32, {n, d});
  const TensorView rstd(rstd_.data(), DType::kF32, {n});
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const LayerParamIndex& p = ps.layer(l);
    unsigned char* kc = k_cache_[static_cast<size_t>(l)].data();
    unsigned char* vc = v_cache_[static_cast<size_t>(l)].data();
    unsigned char* k_new = kc + static_cast<size_t>(pos_ * kv) * a;
    unsigned char* v_new = vc + static_cast<size_t>(pos_ * kv) * a;
    rmsnorm_forward(xv, ps.param(p.input_norm), eps, TensorView(h_.data(), act_, {n, d}), rstd);
    linear::forward(h_.data(), act_, ps.compute_weight(p.q), q_.data(), act_, n);
    linear::forward(h_.data(), act_, ps.compute_weight(p.k), k_new, act_, n);
    linear::forward(h_.data(), act_, ps.compute_weight(p.v), v_new, act_, n);
    const TensorView qv(q_.data(), act_, {1, n, hq, hd}), knv(k_new, act_, {1, n, hkv, hd});
    rope_forward(qv, qv, pos_, rope_);
    rope_forward(knv, knv, pos_, rope_);
    const int64_t tk = pos_ + n;
    attention_forward(qv, TensorView(kc, act_, {1, tk, hkv, hd}),
                      TensorView(vc, act_, {1, tk, hkv, hd}),
                      TensorView(att_.data(), act_, {1, n, hq, hd}),
                      TensorView(lse_.data(), DType::kF32, {1, hq, n}));
    linear::forward(att_.data(), act_, ps.compute_weight(p.o), x_.data(), DType::kF32, n, 1.0f);
    rmsnorm_forward(xv, ps.param(p.post_norm), eps, TensorView(h_.data(), act_, {n, d}), rstd);
    if (p.moe()) {
      MoeActs m = moe_.acts();
      moe::forward(ps, p, moe_shape(cfg_, MoeOptions{}, 1, n, 1), MoeOptions{}, h_.data(), act_, m,
                   x_.data());
      continue;
    }
    linear::forward(h_.data(), act_, ps.compute_weight(p.gate), g_.data(), act_, n);
    linear::forward(h_.data(), act_, ps.compute_weight(p.up), u_.data(), act_, n);
    swiglu_forward(TensorView(g_.data(), act_, {n, f}), TensorView(u_.data(), act_, {n, f}),
                   TensorView(g_.data(), act_, {n, f}));
    linear::forward(g_.data(), act_, ps.compute_weight(p.down), x_.data(), DType::kF32, n, 1.0f);
  }
  // Only the last position's logits are needed.
  const TensorView last(x_.data() + (n - 1) * d, DType::kF32, {1, d});
  rmsnorm_forward(last, ps.param(ps.final_norm()), eps, TensorView(h_.data(), act_, {1, d}),
                  TensorView(rstd_.data(), DType::kF32, {1}));
  linear::forward(h_.data(), act_, ps.compute_weight(ps.lm_head()), logits_.data(), DType::kF32, 1);
  pos_ += n;
  return logits_.data();
}

std::vector<int32_t> generate_tokens(LlamaGenerator& gen, const std::vector<int32_t>& prompt,
                                     const GenerateOptions& options,
                                     const std::function<void(int32_t)>& on_token) {
  HYP_CHECK(!prompt.empty(), "generate: the prompt must hold at least one token (BOS)");
  validate(options.sampling);
  Sampler sampler(options.sampling);
  std::vector<int32_t> out;
  const float* logits = gen.feed(prompt.data(), static_cast<int64_t>(prompt.size()));
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    const int32_t tok = sampler.sample(logits, gen.vocab_size());
    out.push_back(tok);
    if (on_token) on_token(tok);
    if (options.stop_at_eos && tok == options.eos_id) break;
    if (gen.position() >= gen.max_len()) break;
    logits = gen.feed(&tok, 1);
  }
  return out;
}

}  // namespace hyperion
