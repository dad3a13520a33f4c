// The decoder (model/decoder.h) for training: activation storage per the remat policy,
// the bucket hooks of data-parallel and FSDP training, and the loss. Explicit forward
// and backward per layer on the kernel layer, in the style of llm.c.
//
//   x = embed(tokens)                                   residual stream, always f32
//   per layer:  h  = rmsnorm(x) ; q,k,v = h Wq^T, h Wk^T, h Wv^T ; rope(q, k)
//               x2 = x + attention(q, k, v) Wo^T
//               h2 = rmsnorm(x2) ; x' = x2 + (silu(h2 Wg^T) * h2 Wu^T) Wd^T
//   logits = rmsnorm(x) Wlm^T ; loss = cross_entropy(logits, targets)
//
// Compute dtype: bf16 (matmul inputs/outputs, attention, activations saved for backward,
// with f32 accumulation everywhere and f32 master weights/gradients) or f32 throughout.
// The residual adds are fused into the output projections (GEMM beta = 1 into the f32
// stream), and the residual gradient into the norm backward (accumulate mode).
//
// Rematerialisation (what the forward saves per layer for the backward):
//   none     everything: h, q, k, v, attention out + lse, x2, h2, gate, up, swiglu out
//   minimal  the matmul outputs (q, k, v, attention out + lse, x2, gate, up); the norms
//            and the swiglu output are recomputed in the backward (cheap, memory-bound)
//   full     only the layer input; the backward reruns the layer's forward first
// Every policy gives bitwise-identical losses and gradients (recomputation repeats the
// same deterministic kernels).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/allocator.h"
#include "kernels/cross_entropy.h"
#include "model/bucket_hooks.h"
#include "model/decoder.h"
#include "model/decoder_config.h"
#include "model/linear.h"
#include "model/moe_block.h"
#include "model/param_store.h"
#include "model/quantized_matmul.h"
#include "model/trainable_model.h"

namespace hyperion {

struct ModelOptions {
  // A constructor rather than an aggregate, so `{batch, seq_len, bf16, remat}` stays valid
  // (and warning-free) for dense models.
  ModelOptions(int64_t batch_ = 1, int64_t seq_len_ = 128, bool bf16_ = true,
               RematPolicy remat_ = RematPolicy::kMinimal, MoeOptions moe_ = {})
      : batch(batch_), seq_len(seq_len_), bf16(bf16_), remat(remat_), moe(moe_) {}
  int64_t batch;
  int64_t seq_len;
  bool bf16;
  RematPolicy remat;
  MoeOptions moe;      // used by the MoE layers, if the config has any
  QuantOptions quant;  // quantised matmuls (model/quantized_matmul.h); off by default
};

class CausalLM final : public TrainableModel {
 public:
  // Allocates the activation buffers for micro-batches of batch x seq_len tokens. The
  // parameters (and their gradients) stay owned by `params`.
  CausalLM(ParamStore& params, const ModelOptions& options);

  const ModelOptions& options() const { return options_; }
  // Hooks for the following passes (null: none). Not owned.
  void set_hooks(BucketHooks* hooks) override { hooks_ = hooks; }
  ParamStore& params() override { return params_; }
  Batch make_batch() const override { return Batch::tokens(options_.batch, options_.seq_len); }
  int64_t items_per_batch() const override { return tokens_per_batch(); }
  StepLoss forward_backward(const Batch& batch, float dloss) override;
  DType act_dtype() const { return act_; }
  int64_t tokens_per_batch() const { return options_.batch * options_.seq_len; }

  // Forward and backward over one micro-batch (inputs and targets [batch * seq_len],
  // row-major host arrays, uploaded when the model lives on a device; a target of
  // kIgnoreIndex is skipped). ACCUMULATES the gradient of
  // dloss x mean loss into params.grads(), so gradient accumulation over micro-batches
  // passes dloss = 1 / steps. Returns the micro-batch's mean loss.
  CrossEntropyResult forward_backward(const int32_t* inputs, const int32_t* targets, float dloss);
  // Forward only: the mean loss (evaluation).
  CrossEntropyResult forward_loss(const int32_t* inputs, const int32_t* targets);
  // Forward only: the logits of every position as f32 [batch * seq_len, vocab], into a
  // host array (downloaded from a device).
  void forward_logits(const int32_t* inputs, float* logits);

  // Sum of the MoE layers' weighted auxiliary losses (load balance + z) of the last
  // forward: forward_backward's gradient includes it, its returned loss does not.
  float aux_loss() const { return moe_stats_.lb_loss + moe_stats_.z_loss; }
  const MoeStats& moe_stats() const override { return moe_stats_; }
  QuantizedMatmuls* quantized() override { return quant_.get(); }
  // Applies a LoRA adapter in every pass (null: none; model/lora.h). With a base store
  // without gradients the base is frozen and only the adapter's gradients accumulate.
  void set_lora(const LoraAdapter* adapter) { decoder_.set_lora(adapter); }
  const LoraAdapter* lora() const { return decoder_.lora(); }
  // The adapter's dropout in the following passes, masks keyed by `key` (0: off; see
  // Decoder::set_lora_dropout_key).
  void set_lora_dropout_key(uint64_t key) { decoder_.set_lora_dropout_key(key); }
  const MoeShape& moe_shape() const { return moe_shape_; }

  // Bytes of saved activations (all layers) and of scratch (recompute, gradients,
  // logits) this model allocated.
  int64_t activation_bytes() const { return activation_bytes_; }
  int64_t scratch_bytes() const { return scratch_bytes_; }

 private:
  // A layer's activations point either at its own saved storage or at the shared
  // recompute scratch, depending on the remat policy.
  using LayerActs = DecoderActs;

  void embed(const int32_t* inputs);
  // Runs layer l's forward from acts.x; writes x_out unless it is null (recompute).
  void layer_forward(int l, LayerActs& acts, float* x_out);
  void update_moe_stats();
  // Recomputes what the remat policy did not keep, before layer l's backward.
  void recompute(int l);
  // dres: gradient w.r.t. the layer output on entry, w.r.t. its input on exit.
  void layer_backward(int l);
  // Final norm + LM head + loss (and its backward when dloss != 0).
  CrossEntropyResult head(const int32_t* targets, bool backward, float dloss);

  void* alloc(int64_t bytes, int64_t* counter);

  void use(int b, int next) {
    if (hooks_ != nullptr) hooks_->use(b, next);
  }
  void done(int b, bool again = false) {
    if (hooks_ != nullptr) hooks_->done(b, again);
  }
  void grads_ready(int b) {
    if (hooks_ != nullptr) hooks_->grads_ready(b);
  }
  // Forward through every layer, with the hooks (backward: keep the last layer).
  void forward_layers(const int32_t* inputs, bool backward);

  PassRows rows() const {
    PassRows r{options_.batch, options_.seq_len};
    r.positions = packed_positions_;
    r.documents = packed_positions_ != nullptr ? &packed_docs_ : nullptr;
    return r;
  }
  // A packed batch (Batch::positions) during its forward_backward: the positions in the
  // backend's memory and the documents they delimit; null outside one.
  const int32_t* packed_positions_ = nullptr;
  std::vector<PackedDocument> packed_docs_;

  BucketHooks* hooks_ = nullptr;
  ParamStore& params_;
  DecoderConfig cfg_;
  ModelOptions options_;
  DType act_;
  LinearWeights weights_;
  Decoder decoder_;
  std::unique_ptr<QuantizedMatmuls> quant_;
  SelfAttentionOnly self_attention_;
  std::vector<DeviceBuffer> storage_;  // from the backend's allocator
  int64_t activation_bytes_ = 0, scratch_bytes_ = 0;

  std::vector<LayerActs> layers_;
  MoeShape moe_shape_;
  std::vector<MoeDispatch> plans_;     // per layer (empty for dense layers)
  std::vector<MoeEpState> ep_states_;  // per layer, expert parallel only
  DecoderGrads grads_;
  MoeStats moe_stats_;
  float dloss_ = 0.0f;
  float* x_final_ = nullptr;  // output of the last layer [N, D] f32
  const int32_t* inputs_ = nullptr;
  // On a device: the batch's token ids uploaded there (inputs, then targets) and the f32
  // logits forward_logits downloads; null on the host, which reads the caller's arrays.
  int32_t* tokens_dev_ = nullptr;
  float* logits_f32_dev_ = nullptr;
  const int32_t* on_device(const int32_t* host_tokens, int slot);
  // Head and gradient buffers.
  void* hf_ = nullptr;
  float* rstd_f_ = nullptr;
  void* logits_ = nullptr;  // [N, V]
};

}  // namespace hyperion
