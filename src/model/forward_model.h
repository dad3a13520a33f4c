// The decoder's forward alone, over micro-batches of batch x seq_len tokens: evaluation.
// One set of activations is reused by every layer (nothing is kept for a backward), there
// are no gradient buffers, and the parameter store is read-only. Its losses equal
// CausalLM::forward_loss's bit for bit (the same kernels on the same inputs).
#pragma once

#include <cstdint>
#include <vector>

#include "base/allocator.h"
#include "kernels/cross_entropy.h"
#include "model/bucket_hooks.h"
#include "model/decoder.h"
#include "model/linear.h"
#include "model/moe_block.h"
#include "model/param_store.h"

namespace hyperion {

class ForwardModel {
 public:
  // Computes in bf16 when the store has its bf16 copy, else in f32. `moe`: the MoE
  // layers' options (a trainer's capacity factor and expert parallelism), if any.
  ForwardModel(const ParamStore& params, int64_t batch, int64_t seq_len,
               const MoeOptions& moe = {});

  int64_t tokens_per_batch() const { return rows_.n(); }
  // Hooks for the following passes (FSDP gathers each bucket before use). Not owned.
  void set_hooks(BucketHooks* hooks) { hooks_ = hooks; }
  // Applies a LoRA adapter (null: none; model/lora.h). Not owned.
  void set_lora(const LoraAdapter* adapter) { decoder_.set_lora(adapter); }
  // Bytes of activations and logits this model allocated.
  int64_t allocated_bytes() const { return bytes_; }

  // Mean next-token loss of inputs/targets [batch * seq_len] (kIgnoreIndex targets skipped).
  CrossEntropyResult loss(const int32_t* inputs, const int32_t* targets);

 private:
  void* alloc(int64_t bytes);
  void use(int b, int next) {
    if (hooks_ != nullptr) hooks_->use(b, next);
  }
  void done(int b) {
    if (hooks_ != nullptr) hooks_->done(b, false);
  }

  DecoderConfig cfg_;
  PassRows rows_;
  MoeOptions moe_options_;
  MoeShape moe_shape_;
  DType act_;
  LinearWeights weights_;
  Decoder decoder_;
  SelfAttentionOnly self_attention_;
  BucketHooks* hooks_ = nullptr;
  std::vector<DeviceBuffer> storage_;  // from the backend's allocator
  int64_t bytes_ = 0;
  DecoderActs acts_;
  MoeInferenceBuffers moe_;
  MoeEpState ep_state_;
  void* logits_ = nullptr;
  int32_t* tokens_dev_ = nullptr;  // on a device: the uploaded inputs and targets
};

}  // namespace hyperion
