#include "model/causal_lm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/threads.h"
#include "tensor/convert.h"

namespace hyperion {

void* CausalLM::alloc(int64_t bytes, int64_t* counter) {
  storage_.emplace_back(decoder_.kernels().allocator(), static_cast<size_t>(bytes));
  *counter += bytes;
  return storage_.back().data();
}

CausalLM::CausalLM(ParamStore& params, const ModelOptions& options)
    : params_(params),
      cfg_(params.config()),
      options_(options),
      act_(options.bf16 ? DType::kBF16 : DType::kF32),
      // (f32 when the store lacks the bf16 copy: the check below then names the mismatch.)
      weights_(params,
               options.bf16 && params.has_bf16() ? WeightFormat::kBF16 : WeightFormat::kF32),
      decoder_(params, weights_, options.seq_len) {
  HYP_CHECK(options.batch > 0 && options.seq_len > 0,
            "model: batch ({}) and seq_len ({}) must be > 0", options.batch, options.seq_len);
  HYP_CHECK(options.seq_len <= cfg_.max_seq_len,
            "model: seq_len {} exceeds the model's max_seq_len {}", options.seq_len,
            cfg_.max_seq_len);
  HYP_CHECK(options.bf16 == params.has_bf16(),
            "model: bf16 compute needs a ParamStore with a bf16 copy (and f32 compute none)");
  const int64_t n = tokens_per_batch();
  if (options.quant.enabled()) {
    HYP_CHECK(cfg_.n_moe_layers() == 0,
              "quantization: {} training covers dense models; the MoE experts' grouped GEMMs "
              "are not quantised yet",
              quant_mode_name(options.quant.mode));
    quant_ = std::make_unique<QuantizedMatmuls>(params, options.quant, n);
    decoder_.set_quantized(quant_.get());
  }
  const int64_t a = static_cast<int64_t>(dtype_size(act_));
  const int64_t d = cfg_.dim, q = cfg_.q_dim(), kv = cfg_.kv_dim(), f = cfg_.ffn_dim;
  const int64_t lse = options.batch * cfg_.n_heads * options.seq_len * 4;
  const RematPolicy remat = options.remat;
  int64_t* act = &activation_bytes_;
  int64_t* scr = &scratch_bytes_;

  const bool qk_norm = cfg_.arch.qk_norm;
  const int64_t n_moe = cfg_.n_moe_layers();
  const bool any_dense = n_moe < cfg_.n_layers;
  if (n_moe > 0)
    moe_shape_ = hyperion::moe_shape(cfg_, options.moe, options.batch, options.seq_len);
  const MoeShape& ms = moe_shape_;
  const int64_t rows = ms.rows, fe = ms.f, ne = ms.e, topk = ms.k;
  plans_.resize(static_cast<size_t>(cfg_.n_layers));
  if (options.moe.ep.enabled()) ep_states_.resize(static_cast<size_t>(cfg_.n_layers));

  // The shared recompute set (used for whatever a layer does not keep).
  // With quantised matmuls the norms' and the activation's outputs are only matmul
  // inputs, kept quantised in the slots: one shared bf16 set serves every layer.
  const bool shared_inputs = remat != RematPolicy::kNone || quant_ != nullptr;
  LayerActs shared;
  if (shared_inputs) {
    shared.h = alloc(n * d * a, scr);
    shared.h2 = alloc(n * d * a, scr);
    if (any_dense) shared.a = alloc(n * f * a, scr);
  }
  if (remat != RematPolicy::kNone) {
    if (n_moe > 0) {
      shared.moe.xs = alloc(rows * d * a, scr);
      shared.moe.a = alloc(rows * fe * a, scr);
    }
    if (remat == RematPolicy::kFull) {
      shared.q = alloc(n * q * a, scr);
      shared.k = alloc(n * kv * a, scr);
      shared.v = alloc(n * kv * a, scr);
      shared.att = alloc(n * q * a, scr);
      shared.lse = static_cast<float*>(alloc(lse, scr));
      shared.x2 = static_cast<float*>(alloc(n * d * 4, scr));
      if (qk_norm) {
        shared.q_pre = alloc(n * q * a, scr);
        shared.k_pre = alloc(n * kv * a, scr);
        shared.rstd_q = static_cast<float*>(alloc(n * cfg_.n_heads * 4, scr));
        shared.rstd_k = static_cast<float*>(alloc(n * cfg_.n_kv_heads * 4, scr));
      }
      if (any_dense) {
        shared.g = alloc(n * f * a, scr);
        shared.u = alloc(n * f * a, scr);
      }
      if (n_moe > 0) {
        shared.moe.g = alloc(rows * fe * a, scr);
        shared.moe.u = alloc(rows * fe * a, scr);
        shared.moe.y = alloc(rows * d * a, scr);
      }
    }
  }
  // A post-norm's output before its residual add: one scratch for every layer.
  if (cfg_.arch.post_norms) shared.post_y = static_cast<float*>(alloc(n * d * 4, scr));
  layers_.resize(static_cast<size_t>(cfg_.n_layers));
  for (size_t l = 0; l < layers_.size(); ++l) {
    LayerActs& la = layers_[l];
    const bool moe = cfg_.is_moe_layer(static_cast<int64_t>(l));
    la = shared;
    la.x = static_cast<float*>(alloc(n * d * 4, act));
    la.rstd1 = static_cast<float*>(alloc(n * 4, act));
    la.rstd2 = static_cast<float*>(alloc(n * 4, act));
    if (cfg_.arch.post_norms) {
      // The blocks' outputs before their post-norms: kept under every policy (the norms'
      // backward reads them; a full recompute rewrites them).
      la.ao = static_cast<float*>(alloc(n * d * 4, act));
      la.mo = static_cast<float*>(alloc(n * d * 4, act));
      la.rstd_ao = static_cast<float*>(alloc(n * 4, act));
      la.rstd_mo = static_cast<float*>(alloc(n * 4, act));
    }
    if (moe) {
      // Routing state is small (n x E): every policy keeps it.
      la.moe.logits = static_cast<float*>(alloc(n * ne * 4, act));
      la.moe.probs = static_cast<float*>(alloc(n * ne * 4, act));
      la.moe.experts = static_cast<int32_t*>(alloc(n * topk * 4, act));
      la.moe.weights = static_cast<float*>(alloc(n * topk * 4, act));
      la.moe.plan = &plans_[l];
      if (!ep_states_.empty()) la.moe.ep_state = &ep_states_[l];
    }
    if (remat != RematPolicy::kFull) {
      la.q = alloc(n * q * a, act);
      la.k = alloc(n * kv * a, act);
      la.v = alloc(n * kv * a, act);
      la.att = alloc(n * q * a, act);
      la.lse = static_cast<float*>(alloc(lse, act));
      la.x2 = static_cast<float*>(alloc(n * d * 4, act));
      if (qk_norm) {
        la.q_pre = alloc(n * q * a, act);
        la.k_pre = alloc(n * kv * a, act);
        la.rstd_q = static_cast<float*>(alloc(n * cfg_.n_heads * 4, act));
        la.rstd_k = static_cast<float*>(alloc(n * cfg_.n_kv_heads * 4, act));
      }
      if (moe) {
        la.moe.g = alloc(rows * fe * a, act);
        la.moe.u = alloc(rows * fe * a, act);
        la.moe.y = alloc(rows * d * a, act);
      } else {
        la.g = alloc(n * f * a, act);
        la.u = alloc(n * f * a, act);
      }
    }
    if (!shared_inputs) {
      la.h = alloc(n * d * a, act);
      la.h2 = alloc(n * d * a, act);
      if (moe) {
        la.moe.xs = alloc(rows * d * a, act);
        la.moe.a = alloc(rows * fe * a, act);
      } else {
        la.a = alloc(n * f * a, act);
      }
    }
  }
  if (quant_) {
    // The slots' quantised linear inputs (1 byte each, + per-token f32 scales for int8),
    // allocated by the first pass.
    const int64_t per_token = d + q + d + f + (options.quant.mode == QuantMode::kInt8 ? 16 : 0);
    activation_bytes_ +=
        n * per_token * cfg_.n_layers + (options.quant.quantize_logits ? n * (d + 4) : 0);
  }
  if (decoder_.kernels().device() != Device::kHost)
    tokens_dev_ = static_cast<int32_t*>(alloc(3 * n * 4, scr));  // inputs, targets, positions
  x_final_ = static_cast<float*>(alloc(n * d * 4, act));
  hf_ = alloc(n * d * a, scr);
  rstd_f_ = static_cast<float*>(alloc(n * 4, scr));
  logits_ = alloc(n * cfg_.vocab_size * a, scr);
  DecoderGrads& g = grads_;
  g.dres = static_cast<float*>(alloc(n * d * 4, scr));
  g.dres_c = act_ == DType::kBF16 ? alloc(n * d * 2, scr) : nullptr;
  g.dh = static_cast<float*>(alloc(n * d * 4, scr));
  g.datt = alloc(n * q * a, scr);
  g.dq = alloc(n * q * a, scr);
  g.dk = alloc(n * kv * a, scr);
  g.dv = alloc(n * kv * a, scr);
  if (any_dense) g.da = alloc(n * f * a, scr);
  if (n_moe > 0) {
    g.moe.dy = alloc(rows * d * a, scr);
    g.moe.da = alloc(rows * fe * a, scr);
    g.moe.dxs = static_cast<float*>(alloc(rows * d * 4, scr));
    g.moe.dlogits = static_cast<float*>(alloc(n * ne * 4, scr));
    g.moe.dprobs = static_cast<float*>(alloc(n * ne * 4, scr));
    g.moe.dlogits_c = alloc(n * ne * a, scr);
    g.moe.dweights = static_cast<float*>(alloc(n * topk * 4, scr));
  }
}

const int32_t* CausalLM::on_device(const int32_t* host_tokens, int slot) {
  if (tokens_dev_ == nullptr) return host_tokens;
  const int64_t n = tokens_per_batch();
  int32_t* dst = tokens_dev_ + slot * n;
  decoder_.kernels().upload(host_tokens, dst, static_cast<size_t>(n) * sizeof(int32_t));
  return dst;
}

void CausalLM::embed(const int32_t* inputs) {
  inputs_ = inputs;
  decoder_.embed(inputs, tokens_per_batch(), layers_.empty() ? x_final_ : layers_[0].x);
}

void CausalLM::layer_forward(int l, LayerActs& s, float* x_out) {
  decoder_.attention_block(l, rows(), s, self_attention_);
  decoder_.mlp_block(l, tokens_per_batch(), s, moe_shape_, options_.moe, x_out);
}

void CausalLM::recompute(int l) {
  LayerActs& s = layers_[static_cast<size_t>(l)];
  switch (options_.remat) {
    case RematPolicy::kNone:
      // Quantised matmuls share one set of linear inputs; adapters read them in the backward.
      if (quant_ != nullptr && decoder_.lora() != nullptr)
        decoder_.recompute_elementwise(l, tokens_per_batch(), s, moe_shape_);
      return;
    case RematPolicy::kFull:
      layer_forward(l, s, nullptr);
      return;
    case RematPolicy::kMinimal:
      decoder_.recompute_elementwise(l, tokens_per_batch(), s, moe_shape_);
      return;
  }
}

void CausalLM::layer_backward(int l) {
  recompute(l);
  decoder_.layer_backward(l, rows(), layers_[static_cast<size_t>(l)], grads_, moe_shape_,
                          options_.moe, dloss_);
}

CrossEntropyResult CausalLM::head(const int32_t* targets, bool backward, float dloss) {
  const int64_t n = tokens_per_batch(), v = cfg_.vocab_size;
  decoder_.head(x_final_, n, hf_, rstd_f_, logits_, act_);
  KernelBackend& k = decoder_.kernels();
  const TensorView lv = k.view(logits_, act_, {n, v});
  const TensorView tv = k.view(const_cast<int32_t*>(targets), DType::kI32, {n});
  const float cap = decoder_.final_logit_softcap();
  if (!backward) return k.cross_entropy_forward(lv, tv, cap);
  CrossEntropyResult r = k.cross_entropy_fused(lv, tv, lv, dloss, cap);
  decoder_.head_backward(x_final_, n, hf_, rstd_f_, logits_, grads_);
  return r;
}

void CausalLM::update_moe_stats() {
  MoeStats st;
  const MoeShape& ms = moe_shape_;
  int64_t moe_layers = 0, dropped = 0;
  st.load_min = 1e300;
  st.load_max = 0.0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!params_.layer(static_cast<int>(l)).moe()) continue;
    const MoeActs& m = layers_[l].moe;
    st.lb_loss += m.lb_loss;
    st.z_loss += m.z_loss;
    dropped += m.plan->dropped;
    const double share = double(ms.n * ms.k) / double(ms.e);
    double sum = 0, sq = 0;
    for (int64_t load : m.plan->expert_load) {
      const double x = double(load) / share;
      st.load_min = std::min(st.load_min, x);
      st.load_max = std::max(st.load_max, x);
      sum += x;
      sq += x * x;
    }
    const double mean = sum / double(ms.e);
    st.load_cv += std::sqrt(std::max(0.0, sq / double(ms.e) - mean * mean)) / mean;
    ++moe_layers;
  }
  if (moe_layers > 0) {
    st.load_cv /= double(moe_layers);
    st.dropped_fraction = double(dropped) / double(moe_layers * ms.n * ms.k);
  } else {
    st.load_min = st.load_max = 0.0;
  }
  moe_stats_ = st;
}

void CausalLM::forward_layers(const int32_t* inputs, bool backward) {
  const int nl = static_cast<int>(cfg_.n_layers);
  const int tail = nl + 1;
  use(0, nl > 0 ? 1 : tail);
  embed(inputs);
  done(0);
  for (int l = 0; l < nl; ++l) {
    use(l + 1, l + 1 < nl ? l + 2 : tail);
    layer_forward(l, layers_[static_cast<size_t>(l)],
                  l + 1 < nl ? layers_[static_cast<size_t>(l + 1)].x : x_final_);
    done(l + 1, backward && l + 1 == nl);
  }
  update_moe_stats();
}

CrossEntropyResult CausalLM::forward_backward(const int32_t* host_inputs,
                                                const int32_t* host_targets, float dloss) {
  const int32_t* inputs = on_device(host_inputs, 0);
  const int32_t* targets = on_device(host_targets, 1);
  dloss_ = dloss;
  if (quant_) quant_->begin_pass(true);
  const int nl = static_cast<int>(cfg_.n_layers);
  const int tail = nl + 1;
  const bool tied = params_.lm_head() == params_.embed();
  forward_layers(inputs, true);
  // The head reads the tail bucket (and the embedding when tied), then backward walks
  // the layers down.
  const int after_head = nl > 0 ? nl : -1;
  use(tail, tied ? 0 : after_head);
  if (tied) use(0, after_head);
  CrossEntropyResult r = head(targets, true, dloss);
  done(tail);
  if (tied) done(0);
  grads_ready(tail);
  for (int l = nl - 1; l >= 0; --l) {
    use(l + 1, l > 0 ? l : -1);
    layer_backward(l);
    done(l + 1);
    grads_ready(l + 1);
  }
  decoder_.embed_backward(inputs, tokens_per_batch(), grads_);
  grads_ready(0);
  return r;
}

StepLoss CausalLM::forward_backward(const Batch& batch, float dloss) {
  HYP_CHECK(batch.rows == options_.batch && batch.seq_len == options_.seq_len &&
                static_cast<int64_t>(batch.inputs.size()) == tokens_per_batch() &&
                batch.targets.size() == batch.inputs.size(),
            "model: a batch of {} x {} tokens for a model of {} x {}", batch.rows, batch.seq_len,
            options_.batch, options_.seq_len);
  if (batch.positions.empty()) {
    const CrossEntropyResult r = forward_backward(batch.inputs.data(), batch.targets.data(), dloss);
    return {r.loss, r.count, aux_loss()};
  }
  // Packed rows: a document starts at each row's first token and wherever the position
  // goes back to 0; within one the positions count up by one.
  const int64_t t = options_.seq_len;
  HYP_CHECK(static_cast<int64_t>(batch.positions.size()) == tokens_per_batch(),
            "model: a packed batch has {} positions for {} tokens", batch.positions.size(), tokens_per_batch());
  packed_docs_.clear();
  for (int64_t i = 0; i < tokens_per_batch(); ++i) {
    const int32_t p = batch.positions[static_cast<size_t>(i)];
    if (i % t == 0 || p == 0) {
      HYP_CHECK(p == 0, "model: packed position {} at token {} starts a row; documents start at 0", p, i);
      packed_docs_.push_back({i, 0});
    } else {
      HYP_CHECK(p == batch.positions[static_cast<size_t>(i - 1)] + 1,
                "model: packed positions must count up by one within a document (token {}: {} after {})", i, p,
                batch.positions[static_cast<size_t>(i - 1)]);
    }
    ++packed_docs_.back().length;
  }
  packed_positions_ = on_device(batch.positions.data(), 2);
  struct Unpack {
    const int32_t*& p;
    ~Unpack() { p = nullptr; }
  } unpack{packed_positions_};
  const CrossEntropyResult r = forward_backward(batch.inputs.data(), batch.targets.data(), dloss);
  return {r.loss, r.count, aux_loss()};
}

CrossEntropyResult CausalLM::forward_loss(const int32_t* host_inputs,
                                            const int32_t* host_targets) {
  const int32_t* inputs = on_device(host_inputs, 0);
  const int32_t* targets = on_device(host_targets, 1);
  if (quant_) quant_->begin_pass(false);
  const int tail = static_cast<int>(cfg_.n_layers) + 1;
  const bool tied = params_.lm_head() == params_.embed();
  forward_layers(inputs, false);
  use(tail, tied ? 0 : -1);
  if (tied) use(0, -1);
  CrossEntropyResult r = head(targets, false, 0.0f);
  done(tail);
  if (tied) done(0);
  return r;
}

void CausalLM::forward_logits(const int32_t* inputs, float* logits) {
  const int64_t n = tokens_per_batch();
  std::vector<int32_t> targets(static_cast<size_t>(n), kIgnoreIndex);
  forward_loss(inputs, targets.data());
  // The model's logits: soft-capped where the family caps them (the loss capped its copy).
  decoder_.cap_logits(logits_, n, act_);
  KernelBackend& k = decoder_.kernels();
  const size_t count = static_cast<size_t>(n * cfg_.vocab_size);
  if (k.device() == Device::kHost) {
    k.convert(logits_, act_, logits, DType::kF32, count);
    return;
  }
  if (logits_f32_dev_ == nullptr) {
    int64_t unused = 0;
    logits_f32_dev_ = static_cast<float*>(alloc(static_cast<int64_t>(count) * 4, &unused));
  }
  k.convert(logits_, act_, logits_f32_dev_, DType::kF32, count);
  k.download(logits_f32_dev_, logits, count * sizeof(float));
}

}  // namespace hyperion
