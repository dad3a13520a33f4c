#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "dist/communicator.h"
#include "kernels/adamw.h"
#include "kernels/backend.h"

namespace hyperion {

namespace {

int64_t total_size(const std::vector<OwnedRange>& r) {
  int64_t t = 0;
  for (const OwnedRange& x : r) t += x.size();
  return t;
}

}  // namespace

AdamW::AdamW(ParamStore& params, const OptimizerOptions& options, std::vector<OwnedRange> owned,
             dist::Communicator* comm)
    : params_(params),
      options_(options),
      owned_(owned.empty() ? std::vector<OwnedRange>{{0, params.size(), true}} : std::move(owned)),
      comm_(comm),
      elements_(total_size(owned_)) {
  // The moments live where the parameters do; every update runs on that device's backend.
  KernelBackend& k = backend_for(params.device());
  const size_t bytes = static_cast<size_t>(elements_) * sizeof(float);
  m_ = DeviceBuffer(k.allocator(), bytes);
  v_ = DeviceBuffer(k.allocator(), bytes);
  int64_t at = 0, prev_end = 0;
  for (const OwnedRange& r : owned_) {
    HYP_CHECK(r.begin >= prev_end && r.end >= r.begin && r.end <= params.size(),
              "optimizer: owned ranges must be sorted, disjoint and inside the store");
    HYP_CHECK(r.replicated || comm != nullptr, "optimizer: sharded ranges need a communicator");
    packed_.push_back(at);
    at += r.size();
    prev_end = r.end;
  }
  k.zero(m_.data(), bytes);
  k.zero(v_.data(), bytes);
}

float* AdamW::host_base(int which) {
  if (!on_device()) return (which == 0 ? m_ : v_).as<float>();
  std::vector<float>& h = which == 0 ? host_m_ : host_v_;
  if (h.empty()) h.resize(static_cast<size_t>(elements_));
  return h.data();
}

void AdamW::moments_to_host() const {
  if (!on_device() || elements_ == 0) return;
  auto* self = const_cast<AdamW*>(this);
  KernelBackend& k = backend_for(params_.device());
  k.download(m_.data(), self->host_base(0), m_.bytes());
  k.download(v_.data(), self->host_base(1), v_.bytes());
}

void AdamW::moments_to_device() {
  if (!on_device() || elements_ == 0) return;
  KernelBackend& k = backend_for(params_.device());
  k.upload(host_base(0), m_.data(), m_.bytes());
  k.upload(host_base(1), v_.data(), v_.bytes());
}

float* AdamW::locate(float* base, int64_t i) {
  auto it = std::upper_bound(owned_.begin(), owned_.end(), i,
                             [](int64_t x, const OwnedRange& r) { return x < r.end; });
  if (it == owned_.end() || i < it->begin) return nullptr;
  const size_t k = static_cast<size_t>(it - owned_.begin());
  return base + packed_[k] + (i - it->begin);
}

OptimizerStepResult AdamW::step(double lr) {
  OptimizerStepResult r;
  KernelBackend& kern = backend_for(params_.device());
  auto device_view = [&](float* p, Shape shape) { return kern.view(p, DType::kF32, shape); };
  // Squares of the replicated ranges (the same on every rank) and of this rank's shards.
  std::vector<TensorView> replicated, shards;
  for (const OwnedRange& o : owned_) {
    if (o.size() == 0) continue;
    (o.replicated ? replicated : shards)
        .push_back(device_view(params_.grads() + o.begin, Shape{o.size()}));
  }
  const double rep = replicated.empty() ? 0.0 : kern.global_l2_norm(replicated);
  double sq = rep * rep;
  const bool sharded =
      std::any_of(owned_.begin(), owned_.end(), [](const OwnedRange& o) { return !o.replicated; });
  if (sharded) {
    const double sh = shards.empty() ? 0.0 : kern.global_l2_norm(shards);
    float part = static_cast<float>(sh * sh);
    comm_->all_reduce(&part, 1, dist::ReduceOp::kSum);
    sq += part;
  }
  r.grad_norm = std::sqrt(sq);
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
  const bool bf16 = params_.has_bf16();
  for (size_t i = 0; i < params_.infos().size(); ++i) {
    const ParamInfo& p = params_.infos()[i];
    const bool no_decay = options_.exclude_norms_and_embeddings && p.kind != ParamKind::kMatrix;
    hp.weight_decay = no_decay ? 0.0f : static_cast<float>(options_.weight_decay);
    const int idx = static_cast<int>(i);
    const int64_t t0 = p.offset, t1 = p.offset + p.numel;
    if (owned_.size() == 1 && owned_[0].begin <= t0 && owned_[0].end >= t1) {
      // The common case: the whole tensor is owned (its original shape for the kernel).
      kern.adamw_step(
          params_.param(idx), params_.grad(idx), device_view(locate(m_.as<float>(), t0), p.shape),
          device_view(locate(v_.as<float>(), t0), p.shape), hp, params_.param_bf16(idx));
      continue;
    }
    for (size_t k = 0; k < owned_.size(); ++k) {
      const int64_t lo = std::max(t0, owned_[k].begin), hi = std::min(t1, owned_[k].end);
      if (lo >= hi) continue;
      const Shape flat{hi - lo};
      const int64_t at = packed_[k] + (lo - owned_[k].begin);
      kern.adamw_step(
          device_view(params_.params() + lo, flat), device_view(params_.grads() + lo, flat),
          device_view(m_.as<float>() + at, flat), device_view(v_.as<float>() + at, flat), hp,
          bf16 ? kern.view(params_.params_bf16() + lo, DType::kBF16, flat) : TensorView());
    }
  }
  return r;
}

}  // namespace hyperion
