// AdamW over a ParamStore's flat buffers: first and second moments in f32 at the same
// offsets as the parameters, one fused kernel call per tensor (weight decay is off for
// norms and embeddings when configured), global grad-norm clipping folded into the
// kernel's grad_scale, and the bf16 compute copy refreshed in the same pass.
#pragma once

#include <cstdint>

#include "base/aligned.h"
#include "model/param_store.h"

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

class AdamW {
 public:
  AdamW(ParamStore& params, const OptimizerOptions& options);

  // Applies one update with learning rate `lr` from params.grads(), advancing the step
  // counter. Non-finite gradients skip the update (reported, never written to weights).
  OptimizerStepResult step(double lr);

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  const float* m() const { return m_.data(); }
  const float* v() const { return v_.data(); }

 private:
  ParamStore& params_;
  OptimizerOptions options_;
  AlignedBuffer<float> m_, v_;
  int64_t step_ = 0;
};

}  // namespace hyperion
