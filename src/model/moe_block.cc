#include "model/moe_block.h"

#include "base/error.h"
#include "base/threads.h"
#include "kernels/backend.h"
#include "model/linear.h"

namespace hyperion {

void MoeInferenceBuffers::reserve(const MoeShape& s, DType act, Allocator& alloc) {
  const size_t as = dtype_size(act);
  const size_t n = static_cast<size_t>(s.n), rows = static_cast<size_t>(s.rows);
  const size_t pairs = n * static_cast<size_t>(s.k), e = static_cast<size_t>(s.e);
  const size_t d = static_cast<size_t>(s.d), f = static_cast<size_t>(s.f);
  logits = DeviceBuffer(alloc, n * e * 4);
  probs = DeviceBuffer(alloc, n * e * 4);
  weights = DeviceBuffer(alloc, pairs * 4);
  experts = DeviceBuffer(alloc, pairs * 4);
  xs = DeviceBuffer(alloc, rows * d * as);
  g = DeviceBuffer(alloc, rows * f * as);
  u = DeviceBuffer(alloc, rows * f * as);
  a = DeviceBuffer(alloc, rows * f * as);
  y = DeviceBuffer(alloc, rows * d * as);
}

MoeActs MoeInferenceBuffers::acts() {
  MoeActs m;
  m.logits = logits.as<float>();
  m.probs = probs.as<float>();
  m.experts = experts.as<int32_t>();
  m.weights = weights.as<float>();
  m.plan = &plan;
  m.xs = xs.data();
  m.g = g.data();
  m.u = u.data();
  m.a = a.data();
  m.y = y.data();
  return m;
}

MoeShape moe_shape(const DecoderConfig& c, const MoeOptions& o, int64_t batch, int64_t seq_len,
                   int64_t row_align) {
  MoeShape s;
  s.b = batch;
  s.t = seq_len;
  s.n = batch * seq_len;
  s.d = c.dim;
  s.f = c.expert_ffn_dim();
  s.e = c.n_experts;
  s.k = c.n_experts_per_tok;
  s.normalize = c.norm_topk_prob;
  if (o.capacity_factor > 0) {
    s.capacity = moe_capacity(seq_len, s.k, s.e, o.capacity_factor);
    s.rows = s.e * s.b * s.capacity;
  } else {
    s.row_align = row_align;
    s.rows = moe_dropless_max_rows(s.n, s.k, s.e, row_align);
  }
  return s;
}

namespace moe {

namespace {

std::span<const int64_t> sizes_of(const MoeActs& m) {
  return {m.plan->group_sizes.data(), m.plan->group_sizes.size()};
}

// The experts' backward on this rank's own plan rows (no expert parallelism):
// sc.dy -> sc.dxs, accumulating every expert's weight gradients.
void experts_backward(const ParamStore& ps, const LayerParamIndex& p, const MoeShape& s, DType act,
                      MoeActs& m, const MoeGradScratch& sc) {
  KernelBackend& kern = backend_for(ps.device());
  const int ne = static_cast<int>(s.e);
  const auto sizes = sizes_of(m);
  const int64_t rows = m.plan->rows;
  const TensorView dy = kern.view(sc.dy, act, {rows, s.d});
  const TensorView da = kern.view(sc.da, act, {rows, s.f});
  kern.grouped_gemm_input_grad(dy, ps.stacked_compute_weight(p.down, ne), sizes, da, 0.0f);
  kern.grouped_gemm_weight_grad(kern.view(m.a, act, {rows, s.f}), dy, sizes,
                                ps.stacked_grad(p.down, ne));
  // dg and du overwrite the saved g and u (read before written, never needed again).
  const TensorView g = kern.view(m.g, act, {rows, s.f});
  const TensorView u = kern.view(m.u, act, {rows, s.f});
  kern.gated_backward(GatedActivation::kSilu, da, g, u, g, u);
  const TensorView dxs = kern.view(sc.dxs, DType::kF32, {rows, s.d});
  kern.grouped_gemm_input_grad(g, ps.stacked_compute_weight(p.gate, ne), sizes, dxs, 0.0f);
  kern.grouped_gemm_input_grad(u, ps.stacked_compute_weight(p.up, ne), sizes, dxs, 1.0f);
  const TensorView xs = kern.view(m.xs, act, {rows, s.d});
  kern.grouped_gemm_weight_grad(xs, g, sizes, ps.stacked_grad(p.gate, ne));
  kern.grouped_gemm_weight_grad(xs, u, sizes, ps.stacked_grad(p.up, ne));
}

}  // namespace

void forward(const ParamStore& ps, const LayerParamIndex& p, const MoeShape& s, const MoeOptions& o,
             const void* h, DType act, MoeActs& m, float* out) {
  const int ne = static_cast<int>(s.e);
  // Every op through the device's backend; the dispatch plan is built on the host.
  KernelBackend& kern = backend_for(ps.device());
  linear::forward(kern, h, act, ps.compute_weight(p.router), m.logits, DType::kF32, s.n);
  kern.router_topk_forward(m.logits, s.n, s.e, s.k, s.normalize, m.probs, m.experts, m.weights);
  // The plan is made on the host, from the routed ids (downloaded from a device).
  const int32_t* routed = m.experts;
  std::vector<int32_t> routed_host;
  if (kern.device() != Device::kHost) {
    routed_host.resize(static_cast<size_t>(s.n * s.k));
    kern.download(m.experts, routed_host.data(), routed_host.size() * sizeof(int32_t));
    routed = routed_host.data();
  }
  moe_dispatch_plan(routed, s.b, s.t, s.k, s.e, s.capacity, m.plan, s.row_align);
  HYP_CHECK(m.plan->rows <= s.rows, "moe: dispatch produced {} rows, buffers hold {}", m.plan->rows,
            s.rows);
  const int64_t rows = m.plan->rows;
  m.lb_loss = o.load_balance_weight > 0
                  ? kern.load_balance_loss(m.probs, m.experts, s.b, s.t, s.e, s.k,
                                           o.load_balance_weight, nullptr, 0.0f)
                  : 0.0f;
  m.z_loss = o.z_loss_weight > 0
                 ? kern.router_z_loss(m.logits, s.n, s.e, o.z_loss_weight, nullptr, 0.0f)
                 : 0.0f;

  kern.moe_gather_rows(h, act, m.plan->row_token.data(), rows, s.d, m.xs);
  if (m.ep_state != nullptr) m.ep_state->active = o.ep.enabled();
  if (o.ep.enabled()) {
    detail::ep_experts_forward(ps, p, s, o.ep, act, m);
    if (out != nullptr)
      kern.moe_combine(m.y, act, m.plan->pair_row.data(), m.weights, s.n, s.k, s.d, out);
    return;
  }
  const auto sizes = sizes_of(m);
  const TensorView xs = kern.view(m.xs, act, {rows, s.d});
  const TensorView g = kern.view(m.g, act, {rows, s.f});
  const TensorView u = kern.view(m.u, act, {rows, s.f});
  const TensorView a = kern.view(m.a, act, {rows, s.f});
  kern.grouped_gemm(xs, ps.stacked_compute_weight(p.gate, ne), sizes, g, 0.0f);
  kern.grouped_gemm(xs, ps.stacked_compute_weight(p.up, ne), sizes, u, 0.0f);
  kern.gated_forward(GatedActivation::kSilu, g, u, a);
  kern.grouped_gemm(a, ps.stacked_compute_weight(p.down, ne), sizes,
                    kern.view(m.y, act, {rows, s.d}), 0.0f);
  if (out != nullptr)
    kern.moe_combine(m.y, act, m.plan->pair_row.data(), m.weights, s.n, s.k, s.d, out);
}

void recompute(KernelBackend& kern, const MoeShape& s, const void* h, DType act, MoeActs& m) {
  // The expert-parallel backward reads only the exchanged state, kept by the forward.
  if (m.ep_state != nullptr && m.ep_state->active) return;
  const int64_t rows = m.plan->rows;
  kern.moe_gather_rows(h, act, m.plan->row_token.data(), rows, s.d, m.xs);
  kern.gated_forward(GatedActivation::kSilu, kern.view(m.g, act, {rows, s.f}),
                     kern.view(m.u, act, {rows, s.f}), kern.view(m.a, act, {rows, s.f}));
}

void backward(const ParamStore& ps, const LayerParamIndex& p, const MoeShape& s,
              const MoeOptions& o, const void* h, DType act, MoeActs& m, const float* dout,
              float dloss, const MoeGradScratch& sc, float* dh) {
  KernelBackend& kern = backend_for(ps.device());
  const int64_t rows = m.plan->rows;
  // Combine: out = sum_j w_j y_j  ->  dy rows and d(weights).
  kern.moe_combine_backward(dout, m.y, act, m.plan->pair_row.data(), m.plan->row_token.data(),
                            m.weights, s.n, s.k, s.d, rows, sc.dy, sc.dweights);
  if (o.ep.enabled())
    detail::ep_experts_backward(ps, p, s, o.ep, act, m, sc);
  else
    experts_backward(ps, p, s, act, m, sc);

  // Router: the combine weights' gradient, plus the aux losses' through probs / logits.
  const float* dprobs = nullptr;
  if (o.load_balance_weight > 0) {
    kern.zero(sc.dprobs, static_cast<size_t>(s.n * s.e) * sizeof(float));
    kern.load_balance_loss(m.probs, m.experts, s.b, s.t, s.e, s.k, o.load_balance_weight, sc.dprobs,
                           dloss);
    dprobs = sc.dprobs;
  }
  kern.router_topk_backward(m.probs, m.experts, m.weights, sc.dweights, dprobs, s.n, s.e, s.k,
                            s.normalize, sc.dlogits);
  if (o.z_loss_weight > 0)
    kern.router_z_loss(m.logits, s.n, s.e, o.z_loss_weight, sc.dlogits, dloss);
  const void* dl = sc.dlogits;
  if (act == DType::kBF16) {
    kern.convert(sc.dlogits, DType::kF32, sc.dlogits_c, DType::kBF16,
                 static_cast<size_t>(s.n * s.e));
    dl = sc.dlogits_c;
  }
  linear::backward_input(kern, dl, act, ps.compute_weight(p.router), dh, DType::kF32, s.n);
  linear::backward_weight(kern, dl, h, act, ps.grad(p.router), s.n);
  kern.moe_scatter_add_rows(sc.dxs, DType::kF32, m.plan->pair_row.data(), s.n, s.k, s.d, dh);
}

}  // namespace moe

}  // namespace hyperion
