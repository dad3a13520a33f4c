// Multi-process training state: which parameters, gradients and optimizer moments a rank
// owns, and the collectives that keep the ranks consistent, driven by the model's bucket
// hooks so communication overlaps compute.
//
// The trainer scales each rank's backward by 1 / (accumulation x ranks), so every
// reduction here is a plain sum and yields the global-batch mean.
//
//   data    every rank holds everything; each bucket's gradient is all-reduced as soon
//           as its backward finishes (last micro-batch only).
//   zero1   (shard_optimizer_over_data) the optimizer state is sharded: gradients are
//           reduce-scattered per bucket, each rank updates its shard, then the
//           parameters are all-gathered.
//   fsdp    (ZeRO-3) parameters, gradients and optimizer state are sharded: a bucket's
//           parameters are all-gathered just before use (the next bucket prefetched) and
//           their pages released after it; gradients are reduce-scattered as each
//           bucket's backward finishes (every micro-batch) and the full-size gradient
//           pages released, so a rank holds about two buckets of full parameters and
//           gradients at a time besides its shards.
//   expert  experts sharded over ranks (the MoE layers exchange tokens, see
//           model/moe_block.h; an expert's gradient already sums every rank's tokens);
//           everything else data parallel.
//
// A bucket (ParamStore::bucket_range) is split into world_size contiguous pieces, piece r
// owned by rank r (boundaries on 16-element multiples).
//
// A store without gradients (LoRA's frozen base) only gathers and releases under fsdp;
// SplitHooks pairs its gathers with another sync's reductions (the adapters').
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "model/causal_lm.h"
#include "model/param_store.h"
#include "train/optimizer.h"

namespace hyperion {

enum class ParallelMode { kData, kZero1, kFsdp, kExpert };
const char* parallel_mode_name(ParallelMode m);

// The memory one rank of `mode` over `world` ranks holds during its training steps, from
// the one-process plan `full` (memory_plan): fsdp shards the weights, their bf16 copy,
// the gradients and the AdamW state; zero1 the AdamW state; expert the experts' share of
// all four. Activations and scratch are every rank's own. A lower bound, so the memory
// check refuses only runs that cannot fit: fsdp's buckets in flight and the moments
// every weight is gathered (fsdp saving, expert parallelism sampling) are not counted.
MemoryPlan rank_memory_plan(const MemoryPlan& full, const DecoderConfig& c, ParallelMode mode,
                            int world);

class GradientSync final : public BucketHooks {
 public:
  // overlap = false: every collective waits until the micro-batch's backward is done
  // (and FSDP gathers without prefetch): the baseline the overlap is measured against.
  GradientSync(ParamStore& params, dist::Communicator& comm, ParallelMode mode, bool overlap);

  ParallelMode mode() const { return mode_; }
  // The element ranges this rank's optimizer updates (for AdamW).
  std::vector<OwnedRange> owned_ranges() const;
  // The rank that writes tensor i to a checkpoint (its owner for experts, else balanced).
  std::vector<int> tensor_writers() const;

  // Gradient lifecycle of one optimizer step.
  void zero_grads();
  void begin_micro_batch(bool last);
  void end_micro_batch();  // waits for this micro-batch's reductions
  void after_optimizer_step();
  // Full, current parameters on every rank (FSDP: before saving, evaluating). With
  // `experts`, expert parallel ranks also fetch every other rank's experts (before
  // sampling outside the parallel model); training goes on only after a reload.
  void gather_all(bool experts = false);
  // Drops non-owned parameter pages after loading (fsdp, expert).
  void release_unowned();

  // BucketHooks.
  void use(int b, int next) override;
  void done(int b, bool again) override;
  void grads_ready(int b) override;

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // ParamStore elements
    int64_t reduce_end = 0;      // data/expert: the all-reduced part [begin, reduce_end)
    std::vector<size_t> counts;  // elements of each rank's piece
    int64_t own_begin = 0, own_end = 0;
    enum State { kReleased, kInFlight, kResident } state = kResident;
    dist::Communicator::Request gather = 0, reduce = 0;
    bool reduce_pending = false;
  };
  void issue_gather(Bucket& b);
  void issue_reduce(int b);
  void finish_reduce(int b);
  void release_params(const Bucket& b);
  void sync_bf16(int64_t begin, int64_t end);

  ParamStore& params_;
  dist::Communicator& comm_;
  ParallelMode mode_;
  bool overlap_;
  int world_, rank_;
  std::vector<Bucket> buckets_;
  // Expert parallel: this rank's expert ranges (each [begin, end)), all MoE layers.
  std::vector<std::pair<int64_t, int64_t>> own_experts_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> experts_of_rank_;
  bool last_micro_ = true;
  std::vector<int> pending_;  // buckets with a reduction in flight, in issue order
};

// The model's bucket hooks split over two syncs: `params` gathers and releases the
// parameters around each use (a frozen base under fsdp), `grads` reduces the gradients
// (the adapters'). Bucket b is layer b's in both stores.
class SplitHooks final : public BucketHooks {
 public:
  SplitHooks(BucketHooks& params, BucketHooks& grads) : params_(params), grads_(grads) {}
  void use(int b, int next) override { params_.use(b, next); }
  void done(int b, bool again) override { params_.done(b, again); }
  void grads_ready(int b) override { grads_.grads_ready(b); }

 private:
  BucketHooks& params_;
  BucketHooks& grads_;
};

}  // namespace hyperion
