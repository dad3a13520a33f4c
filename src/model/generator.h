// Autoregressive inference of one sequence with a contiguous KV cache, on the decoder
// that training and serving run (model/decoder.h): prefill feeds the prompt in one pass
// (causal attention of the new tokens against everything cached), then each decode step
// feeds one token. Weights are read from a ParamStore (the f32 master weights, or its
// bf16 copy when it has one). MoE layers route every token (dropless: inference never
// drops a token).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "base/aligned.h"
#include "model/decoder.h"
#include "model/linear.h"
#include "model/moe_block.h"
#include "model/param_store.h"
#include "model/sampler.h"

namespace hyperion {

// Keys and values of one sequence, contiguous per layer: [max_len, Hkv, hd]. The
// projections write new rows in place at the sequence's position.
class ContiguousKvCache final : public KvSource {
 public:
  // The cache lives in `alloc`'s memory (the model's device).
  ContiguousKvCache(const DecoderConfig& cfg, DType act, int64_t max_len, Allocator& alloc);
  void place(const Decoder& dec, int l, const PassRows& rows, DecoderActs& s) override;
  void attend(const Decoder& dec, int l, const PassRows& rows, DecoderActs& s) override;

 private:
  int64_t row_bytes_;
  std::vector<DeviceBuffer> k_, v_;
};

class Generator {
 public:
  // Caches up to `max_len` positions (<= the model's max_seq_len).
  Generator(const ParamStore& params, int64_t max_len);

  void reset() { pos_ = 0; }
  // Applies a LoRA adapter (null: none; model/lora.h). Not owned.
  void set_lora(const LoraAdapter* adapter) { decoder_.set_lora(adapter); }
  int64_t position() const { return pos_; }
  int64_t max_len() const { return max_len_; }
  int64_t vocab_size() const { return cfg_.vocab_size; }
  // Appends n tokens (a host array) at the current position and returns the logits (f32
  // [vocab], host memory: downloaded from a device) that follow the last one. Errors if
  // the cache would overflow.
  const float* feed(const int32_t* tokens, int64_t n);

 private:
  void ensure_capacity(int64_t n);

  DecoderConfig cfg_;
  DType act_;
  int64_t max_len_;
  int64_t pos_ = 0;
  LinearWeights weights_;
  Decoder decoder_;
  ContiguousKvCache cache_;
  int64_t capacity_ = 0;  // rows of the per-call buffers below
  // Per-call buffers on the model's device; tokens_ holds the fed ids there (a device
  // model only) and logits_host_ the returned logits.
  DeviceBuffer x_, rstd_, lse_, logits_, h_, q_, att_, g_, u_, tokens_;
  AlignedBuffer<float> logits_host_;
  // MoE layers: routing state and expert buffers for up to capacity_ tokens.
  MoeInferenceBuffers moe_;
};

// Restricts which token may come next (structured output: the CLI wraps a grammar
// matcher, text/grammar/matcher.h, which this layer does not know).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets logits[t] = -inf for every token t that may not come next; false when no token
  // may (the generation ends there).
  virtual bool mask(float* logits, int64_t vocab) = 0;
  // Follows the chosen token (one the mask allowed).
  virtual void accept(int32_t token) = 0;
  // Nothing may follow: the generation is complete.
  virtual bool finished() const = 0;
};

struct GenerateOptions {
  SamplingParams sampling;
  int64_t max_tokens = 64;
  bool stop_at_eos = true;
  int32_t eos_id = 2;
  // More tokens that end the generation like EOS (a chat format's end of turn:
  // <|eot_id|>, <|im_end|>, <end_of_turn>).
  std::vector<int32_t> end_ids;
  // Not owned; null: any token may come next.
  TokenConstraint* constraint = nullptr;
};

// Feeds the prompt, then samples up to max_tokens tokens (stopping after EOS when asked;
// with a constraint, also when it is finished or allows nothing, and an end token is
// allowed only where it says so).
// `on_token` sees each new token as it is produced (streaming). Returns the new tokens.
std::vector<int32_t> generate_tokens(Generator& gen, const std::vector<int32_t>& prompt,
                                     const GenerateOptions& options,
                                     const std::function<void(int32_t)>& on_token = {});

}  // namespace hyperion
