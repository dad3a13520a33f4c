// AdamW over a ParamStore's flat buffers: one fused kernel call per tensor (weight decay
// is off for norms and embeddings when configured), global grad-norm clipping folded into
// the kernel's grad_scale, and the bf16 compute copy refreshed in the same pass.
//
// Sharding (ZeRO-1, FSDP, expert parallel): the optimizer updates only the element
// ranges this rank owns, and keeps f32 moments for those alone, packed back to back in
// range order. A range is `replicated` when every rank holds and updates the same values
// (data parallel), else it is this rank's shard. The gradient norm is the global one:
// replicated squares counted once, shard squares summed over ranks.
#pragma once

#include <cstdint>
#include <vector>

#include "base/aligned.h"
#include "model/param_store.h"

namespace hyperion::dist {
class Communicator;
}

namespace hyperion {

struct OptimizerOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  bool exclude_norms_and_embeddings = true;
  double clip_norm = 1.0;  // 0: no clipping
};

struct OptimizerStepResult {
  double grad_norm = 0;  // global L2 norm of the gradients before clipping
  bool skipped = false;  // non-finite gradients: the step was not applied
};

// [begin, end) elements of the ParamStore buffers.
struct OwnedRange {
  int64_t begin = 0, end = 0;
  bool replicated = true;
  int64_t size() const { return end - begin; }
};

class AdamW {
 public:
  // `owned` empty: the whole store, replicated. `comm` sums the shard squares of the
  // gradient norm (needed when any range is not replicated).
  AdamW(ParamStore& params, const OptimizerOptions& options, std::vector<OwnedRange> owned = {},
        dist::Communicator* comm = nullptr);

  // Applies one update with learning rate `lr` from params.grads(), advancing the step
  // counter. Non-finite gradients skip the update (reported, never written to weights).
  OptimizerStepResult step(double lr);

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  const std::vector<OwnedRange>& owned() const { return owned_; }
  // Moments of owned element `i` (a ParamStore offset inside an owned range) in host
  // memory, or null when this rank does not own it: the moments themselves on the host;
  // on a device their host copy, which moments_to_host() refreshes (before reading) and
  // moments_to_device() writes back (after writing).
  float* m_at(int64_t i) { return locate(host_base(0), i); }
  float* v_at(int64_t i) { return locate(host_base(1), i); }
  const float* m_at(int64_t i) const { return const_cast<AdamW*>(this)->m_at(i); }
  const float* v_at(int64_t i) const { return const_cast<AdamW*>(this)->v_at(i); }
  void moments_to_host() const;
  void moments_to_device();
  int64_t moment_elements() const { return elements_; }

 private:
  float* locate(float* base, int64_t i);
  float* host_base(int which);
  bool on_device() const { return m_.device() != Device::kHost; }

  ParamStore& params_;
  OptimizerOptions options_;
  std::vector<OwnedRange> owned_;
  std::vector<int64_t> packed_;  // owned_[k] starts at packed_[k] in m_ and v_
  dist::Communicator* comm_;
  int64_t elements_ = 0;
  DeviceBuffer m_, v_;  // on the parameters' device
  mutable std::vector<float> host_m_, host_v_;  // their host copies (device stores only)
  int64_t step_ = 0;
};

}  // namespace hyperion
