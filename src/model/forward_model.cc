#include "model/forward_model.h"

#include "base/error.h"

namespace hyperion {

ForwardModel::ForwardModel(const ParamStore& params, int64_t batch, int64_t seq_len,
                           const MoeOptions& moe)
    : cfg_(params.config()),
      rows_{batch, seq_len},
      moe_options_(moe),
      act_(params.has_bf16() ? DType::kBF16 : DType::kF32),
      weights_(params, params.has_bf16() ? WeightFormat::kBF16 : WeightFormat::kF32),
      decoder_(params, weights_, seq_len) {
  HYP_CHECK(batch > 0 && seq_len > 0, "model: batch ({}) and seq_len ({}) must be > 0", batch,
            seq_len);
  HYP_CHECK(seq_len <= cfg_.max_seq_len, "model: seq_len {} exceeds the model's max_seq_len {}",
            seq_len, cfg_.max_seq_len);
  const int64_t n = rows_.n(), a = static_cast<int64_t>(dtype_size(act_));
  const int64_t d = cfg_.dim, q = cfg_.q_dim(), kv = cfg_.kv_dim(), f = cfg_.ffn_dim;
  const bool dense = cfg_.n_moe_layers() < cfg_.n_layers;
  auto* x = static_cast<float*>(alloc(n * d * 4));
  auto* rstd = static_cast<float*>(alloc(n * 4));
  void* h = alloc(n * d * a);
  void* q_buf = alloc(n * q * a);
  void* k_buf = alloc(n * kv * a);
  void* v_buf = alloc(n * kv * a);
  void* att = alloc(n * q * a);
  auto* lse = static_cast<float*>(alloc(batch * cfg_.n_heads * seq_len * 4));
  void* g = dense ? alloc(n * f * a) : nullptr;
  void* u = dense ? alloc(n * f * a) : nullptr;
  acts_ = in_place_acts(x, rstd, h, q_buf, k_buf, v_buf, att, lse, g, u);
  DecoderActs& s = acts_;
  if (cfg_.is_moe()) {
    moe_shape_ = moe_shape(cfg_, moe, batch, seq_len);
    moe_.reserve(moe_shape_, act_, decoder_.kernels().allocator());
    s.moe = moe_.acts();
    if (moe.ep.enabled()) s.moe.ep_state = &ep_state_;
  }
  logits_ = alloc(n * cfg_.vocab_size * a);
  if (decoder_.kernels().device() != Device::kHost)
    tokens_dev_ = static_cast<int32_t*>(alloc(2 * n * 4));
}

void* ForwardModel::alloc(int64_t bytes) {
  storage_.emplace_back(decoder_.kernels().allocator(), static_cast<size_t>(bytes));
  bytes_ += bytes;
  return storage_.back().data();
}

CrossEntropyResult ForwardModel::loss(const int32_t* inputs, const int32_t* targets) {
  const ParamStore& ps = decoder_.params();
  const int nl = static_cast<int>(cfg_.n_layers);
  const int tail = nl + 1;
  const int64_t n = rows_.n();
  if (tokens_dev_ != nullptr) {  // host token ids, uploaded to the model's device
    KernelBackend& k = decoder_.kernels();
    k.upload(inputs, tokens_dev_, static_cast<size_t>(n) * 4);
    k.upload(targets, tokens_dev_ + n, static_cast<size_t>(n) * 4);
    inputs = tokens_dev_;
    targets = tokens_dev_ + n;
  }
  // The same bucket order as CausalLM::forward_loss: embedding, layers, then the tail
  // (and the embedding again when it is the head).
  use(0, nl > 0 ? 1 : tail);
  decoder_.embed(inputs, n, acts_.x);
  done(0);
  for (int l = 0; l < nl; ++l) {
    use(l + 1, l + 1 < nl ? l + 2 : tail);
    decoder_.attention_block(l, rows_, acts_, self_attention_);
    decoder_.mlp_block(l, n, acts_, moe_shape_, moe_options_, acts_.x);
    done(l + 1);
  }
  const bool tied = ps.lm_head() == ps.embed();
  use(tail, tied ? 0 : -1);
  if (tied) use(0, -1);
  // The norm's output and rstd reuse the layer scratch (h, rstd1).
  decoder_.head(acts_.x, n, acts_.h, acts_.rstd1, logits_, act_);
  done(tail);
  if (tied) done(0);
  return decoder_.kernels().cross_entropy_forward(
      decoder_.kernels().view(logits_, act_, {n, cfg_.vocab_size}),
      decoder_.kernels().view(const_cast<int32_t*>(targets), DType::kI32, {n}),
      decoder_.final_logit_softcap());
}

}  // namespace hyperion
