#include "train/optimizer.h"

#include <cmath>
#include <cstring>

#include "kernels/adamw.h"
#include "kernels/global_norm.h"

namespace hyperion {

AdamW::AdamW(ParamStore& params, const OptimizerOptions& options)
    : params_(params),
      options_(options),
      m_(static_cast<size_t>(params.size())),
      v_(static_cast<size_t>(params.size())) {
  std::memset(m_.data(), 0, m_.size() * sizeof(float));
  std::memset(v_.data(), 0, v_.size() * sizeof(float));
}

OptimizerStepResult AdamW::step(double lr) {
  OptimizerStepResult r;
  const int64_t n = params_.size();
  const TensorView all_grads(params_.grads(), DType::kF32, {n});
  r.grad_norm = global_l2_norm(std::span<const TensorView>(&all_grads, 1));
  if (!std::isfinite(r.grad_norm)) {
    r.skipped = true;
    return r;
  }
  float scale = 1.0f;
  if (options_.clip_norm > 0 && r.grad_norm > options_.clip_norm)
    scale = static_cast<float>(options_.clip_norm / (r.grad_norm + 1e-6));
  ++step_;
  AdamWParams hp;
  hp.lr = static_cast<float>(lr);
  hp.beta1 = static_cast<float>(options_.beta1);
  hp.beta2 = static_cast<float>(options_.beta2);
  hp.eps = static_cast<float>(options_.eps);
  hp.step = step_;
  hp.grad_scale = scale;
  for (size_t i = 0; i < params_.infos().size(); ++i) {
    const ParamInfo& p = params_.infos()[i];
    const bool no_decay = options_.exclude_norms_and_embeddings && p.kind != ParamKind::kMatrix;
    hp.weight_decay = no_decay ? 0.0f : static_cast<float>(options_.weight_decay);
    const int idx = static_cast<int>(i);
    adamw_step(params_.param(idx), params_.grad(idx),
               TensorView(m_.data() + p.offset, DType::kF32, p.shape),
               TensorView(v_.data() + p.offset, DType::kF32, p.shape), hp, params_.param_bf16(idx));
  }
  return r;
}

}  // namespace hyperion
