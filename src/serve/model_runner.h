// The serving engine's forward pass: one batched step over a flat list of token rows
// from many requests at once (decode rows of every live slot plus prefill chunks),
// with keys and values kept in a paged KV cache (kernels/paged_attention.h).
//
// Decode rows attend with paged_attention (ragged or padded), reading the pages in
// place. A prefill chunk reads its sequence's cached context back into a contiguous
// scratch (paged_kv_read) and runs the tiled causal flash-attention kernel: the
// one-query-at-a-time decode kernel would redo the work per row.
//
// Row i carries a token, its absolute position in its sequence, the cache slot its key
// and value go to (page * page_tokens + offset) and its sequence's page table; it
// attends to positions [0, position] of that table, so a prefill chunk (rows at
// consecutive positions of one sequence) is causal by construction. Logits are computed
// only for the rows asked for (the last prompt row of a finished prefill and every
// decode row).
//
// The layers are the decoder's (model/decoder.h), the paged cache its KvSource.
// Weights: f32 or bf16 from the ParamStore (its bf16 copy), or int8 per output channel
// (`quantize_weights=int8`, host only), see model/linear.h.
//
// One runner for every device: the KV pool, the step's activations and the logits are
// allocated through the backend of the device the weights live on, and every op goes
// through it. Per step, the host sends one upload (the rows' token ids, positions and the
// logit rows, packed) beside the page tables and slots the paged ops take from host
// memory (kernels/backend.h), and gets back only the logits of the rows that sample.
#pragma once

#include <cstdint>
#include <vector>

#include "base/aligned.h"
#include "kernels/paged_attention.h"
#include "model/decoder.h"
#include "model/linear.h"
#include "model/moe_block.h"
#include "model/param_store.h"

namespace hyperion::serve {

using hyperion::WeightFormat;

struct RunnerOptions {
  WeightFormat weights = WeightFormat::kBF16;
  DType kv_dtype = DType::kBF16;  // kF32 | kBF16 | kI8 | kE4M3
  int64_t num_pages = 0;
  int64_t page_tokens = 16;
  int64_t max_positions = 0;  // longest sequence (rope table size)
  bool padded_attention = false;
};

// One step's rows (plain arrays, all of length n except logit_rows).
struct StepBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;           // KV cache slot of each row
  std::vector<PagedAttentionRow> attn;  // page table and visible length (position + 1)
  std::vector<int32_t> logit_rows;      // rows whose next-token logits are wanted
  // Rows [0, decode_rows) are single-token decode rows (paged attention straight from
  // the cache); every later row belongs to a prefill segment: consecutive rows of one
  // sequence at consecutive positions, given as (first row, row count).
  int64_t decode_rows = 0;
  std::vector<std::pair<int64_t, int64_t>> segments;
  void clear();
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

// The row count the matmuls of a step with n rows run on (see forward()).
int64_t padded_rows(int64_t n);

// The paged KV cache as the decoder's key/value source for one step's batch.
class PagedKvSource final : public KvSource {
 public:
  void attend(const Decoder& dec, int l, const PassRows& rows, DecoderActs& s) override;
  const StepBatch* batch = nullptr;
  const std::vector<PagedKvCache>* caches = nullptr;
  PagedAttentionParams params;
  int64_t rows = 0;               // the batch's rows (s.k, s.v hold the padded count)
  unsigned char* kctx = nullptr;  // a prefill segment's context [max_positions, kv]
  unsigned char* vctx = nullptr;
  float* lse = nullptr;  // [rows, Hq] scratch of the prefill attention
};

class ModelRunner {
 public:
  // `params` must hold a bf16 copy for WeightFormat::kBF16 and outlive the runner.
  ModelRunner(const ParamStore& params, const RunnerOptions& options);

  const LlamaConfig& config() const { return cfg_; }
  const RunnerOptions& options() const { return opt_; }
  DType act_dtype() const { return act_; }
  // Bytes of KV cache per token over all layers (with scales), and the whole pool.
  int64_t kv_bytes_per_token() const;
  int64_t kv_cache_bytes() const {
    return kv_bytes_per_token() * opt_.num_pages * opt_.page_tokens;
  }
  // Bytes of KV cache one decode row reads at `context` positions: every layer's keys and
  // values, a sliding-window layer's only within its window.
  int64_t kv_bytes_read(int64_t context) const;
  // Bytes of weights read per decode step (matrices in their serving format).
  int64_t weight_bytes() const { return weights_.weight_bytes(); }
  // Seconds the constructor took to back the whole KV pool with memory (commit_pages):
  // a fresh page written inside a decode step would fault and be zeroed there (2 MiB at a
  // time with huge pages), stalling that step (80-90 ms in a VM whose memory the host had
  // not backed yet). llama.cpp clears its KV buffer at start for the same effect.
  double kv_commit_seconds() const { return kv_commit_seconds_; }
  // Seconds spent queueing steps' work up to the logits, summed over every forward (on the
  // host backend the work itself): on a device, a figure near the steps' own time means
  // the step is bound by the host's launches, not by the device.
  double queue_seconds() const { return queue_seconds_; }

  // Runs the batch; returns logits f32 [logit_rows.size(), vocab] in host memory (valid
  // until the next call). Positions must be < max_positions; slots and page ids are the
  // caller's.
  const float* forward(const StepBatch& batch);
  // The same step, but only each logit row's greedy token comes back (argmax on the
  // device, ties to the lower id as the sampler's; -1 for a row with no finite logit):
  // [logit_rows.size()] in host memory, valid until the next call.
  const int32_t* forward_greedy(const StepBatch& batch);

 private:
  // The step up to the LM head: the logits [logit_rows.size(), vocab] in the device's memory.
  const float* run(const StepBatch& batch);
  void ensure_capacity(int64_t n);

  LlamaConfig cfg_;
  RunnerOptions opt_;
  DType act_;
  LinearWeights weights_;
  Decoder decoder_;
  PagedKvSource kv_;
  KernelBackend& kern_;  // the weights' device
  std::vector<DeviceBuffer> k_pages_, v_pages_, k_scales_, v_scales_;
  double kv_commit_seconds_ = 0;
  double queue_seconds_ = 0;
  std::vector<PagedKvCache> caches_;
  int64_t capacity_ = 0;
  // The step's index arrays, packed for one upload: tokens [n] | positions [n] | logit
  // rows [padded m] (n = padded_rows(rows); padding rows hold token 0 at position 0).
  std::vector<int32_t> staging_;
  DeviceBuffer ids_;  // their device copy (a device backend only)
  DeviceBuffer x_, rstd_, xl_, logits_;
  DeviceBuffer h_, q_, k_, v_, att_, g_, u_;
  DeviceBuffer kctx_, vctx_;  // a prefill segment's context [max_positions, kv]
  DeviceBuffer lse_;
  AlignedBuffer<float> logits_host_;  // a device's logits, downloaded
  DeviceBuffer greedy_;                // forward_greedy's ids on a device
  std::vector<int32_t> greedy_host_;
  MoeInferenceBuffers moe_;
};

}  // namespace hyperion::serve
