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
// through it. Per step, the host sends one upload (the rows' token ids, positions and
// logit rows, their cache slots and page tables, packed: PagedStepTables) that every layer
// reads, and gets back only the logits (or greedy ids) of the rows that sample.
//
// On a backend that can record (a GPU), a decode-only step of a dense model runs as a
// recording (a CUDA graph) per padded batch size: recorded the second time that size
// runs, replayed after, so the host queues one launch instead of a few hundred. The
// recording reads its inputs from the fixed step buffer, padding rows included (they
// write no KV and attend to nothing), so it is valid for any rows of that size.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
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
  bool graphs = true;  // record and replay decode steps where the backend can
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
  // Each row's LoRA slot (model/lora_bank.h; 0: the base alone). Empty: every row 0.
  std::vector<int32_t> lora_slots;
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
  // The step's tables in the backend's memory (null in padded mode: per-call tables).
  const PagedStepTables* tables = nullptr;
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

  const DecoderConfig& config() const { return cfg_; }
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
  // Decode steps replayed from a recording, and recordings made (a GPU with graphs on).
  int64_t replayed_steps() const { return replayed_steps_; }
  int64_t recordings() const { return recordings_; }

  // Serves LoRA adapters from `bank` (its slots named per row by StepBatch::lora_slots);
  // null: none. Not owned.
  void set_lora_bank(const LoraBank* bank) { bank_ = bank; }

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
  // Fills the step buffer (host staging, then one upload on a device) for n padded rows
  // and mp padded logit rows, and points tables_ and the id pointers at it.
  void pack_step(const StepBatch& batch, int64_t n, int64_t mp);
  // Queues the step's device work (embedding to logits) from the packed inputs.
  void queue_step(const StepBatch& batch, int64_t n, int64_t mp);
  // Runs a decode-only step through its size's recording (making it when due); false
  // when it must run as usual.
  bool run_recorded(const StepBatch& batch, int64_t n, int64_t mp);

  // The step's LoRA rows (set_lora_bank): built per step from the batch's slots, the
  // permutation uploaded to the device.
  void prepare_lora_rows(const StepBatch& batch, int64_t n);
  const LoraBank* bank_ = nullptr;
  LoraRows lora_rows_;
  bool lora_step_ = false;  // this step's rows use an adapter
  std::vector<int32_t> lora_slot_scratch_, lora_perm_, lora_inverse_;
  DeviceBuffer lora_index_;  // perm and inverse in the device's memory

  DecoderConfig cfg_;
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
  // The step's index arrays, packed for one upload (StepLayout in model_runner.cc):
  // tokens, positions and logit rows (i32), then slots, table starts and lengths (i64) of
  // the n = padded_rows(rows) rows, then the page tables (i32). Padding rows hold token 0
  // at position 0, slot -1 and length 0.
  AlignedBuffer<unsigned char> staging_;
  DeviceBuffer step_;  // its device copy (a device backend only), fixed per capacity
  int64_t pages_per_row_ = 0;  // page-table entries a row may need: ceil(max_positions / page)
  // The widest window of any layer (0: some layer reads every key): table entries before
  // it are never read.
  int64_t table_window_ = 0;
  const int32_t* tokens_ = nullptr;  // into the step buffer of the backend's memory
  const int32_t* positions_ = nullptr;
  const int32_t* logit_ids_ = nullptr;
  PagedStepTables tables_;
  // Recorded decode steps by padded row count, and how often each size ran without one.
  struct Recorded {
    std::unique_ptr<KernelBackend::Recording> rec;
    int64_t plain_runs = 0;
    int64_t failures = 0;
  };
  std::map<int64_t, Recorded> recorded_;
  int64_t replayed_steps_ = 0, recordings_ = 0;
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
