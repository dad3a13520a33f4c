#include "diffusion/nn.h"

#include <atomic>
#include <vector>

#include "base/error.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/conv2d.h"
#include "kernels/dense_ops.h"
#include "kernels/gemm.h"
#include "kernels/group_norm.h"
#include "kernels/layer_norm.h"
#include "kernels/upsample.h"
#include "tensor/convert.h"

namespace hyperion::diffusion {

using Init = ParamEntry::Init;

namespace {
std::atomic<int64_t> g_macs{0};

// Activations rounded to bf16 for a mixed-precision matmul or convolution, in thread-local
// scratch reused call to call (two slots: a backward reads two at once).
const bf16* to_bf16(const float* x, int64_t n, int slot) {
  thread_local std::vector<bf16> scratch[2];
  std::vector<bf16>& b = scratch[slot];
  if (b.size() < size_t(n)) b.resize(size_t(n));
  convert_f32_to_bf16(x, b.data(), size_t(n));
  return b.data();
}

}  // namespace

int64_t layer_macs() {
  return g_macs.load();
}

void reset_layer_macs() {
  g_macs = 0;
}

Linear Linear::declare(ParamTable& p, const std::string& name, int64_t in, int64_t out, bool bias) {
  Linear l;
  l.in = in;
  l.out = out;
  l.w = p.add(name + ".weight", {out, in});
  p.keep_bf16(l.w);
  if (bias) l.b = p.add(name + ".bias", {out}, Init::kZero);
  return l;
}

void Linear::forward(const ParamTable& p, const float* x, int64_t rows, float* y, bool accumulate) const {
  const bool mixed = p.bf16_compute();
  GemmArgs g = mixed ? contiguous_gemm_args(Trans::kN, Trans::kT, rows, out, in, to_bf16(x, rows * in, 0),
                                            DType::kBF16, p.data_bf16(w), DType::kBF16, y, DType::kF32,
                                            accumulate ? 1.0f : 0.0f)
                     : contiguous_gemm_args(Trans::kN, Trans::kT, rows, out, in, x, DType::kF32, p.data(w),
                                            DType::kF32, y, DType::kF32, accumulate ? 1.0f : 0.0f);
  if (b >= 0) g.bias = p.data(b);
  gemm(g);
  g_macs += rows * in * out;
}

void Linear::backward(ParamTable& p, const float* x, const float* dy, int64_t rows, float* dx,
                      bool accumulate_dx) const {
  const ParamTable& values = p;  // reads only (the gradients are p's)
  if (values.bf16_compute()) {
    const bf16* dy16 = to_bf16(dy, rows * out, 0);
    if (dx)
      gemm_contiguous(Trans::kN, Trans::kN, rows, in, out, dy16, DType::kBF16, values.data_bf16(w), DType::kBF16,
                      dx, DType::kF32, accumulate_dx ? 1.0f : 0.0f);
    gemm_contiguous(Trans::kT, Trans::kN, out, in, rows, dy16, DType::kBF16, to_bf16(x, rows * in, 1),
                    DType::kBF16, p.grad(w), DType::kF32, 1.0f);
  } else {
    if (dx)
      gemm_contiguous(Trans::kN, Trans::kN, rows, in, out, dy, DType::kF32, values.data(w), DType::kF32, dx,
                      DType::kF32, accumulate_dx ? 1.0f : 0.0f);
    gemm_contiguous(Trans::kT, Trans::kN, out, in, rows, dy, DType::kF32, x, DType::kF32, p.grad(w), DType::kF32,
                    1.0f);
  }
  if (b >= 0) column_sums(dy, rows, out, p.grad(b), /*accumulate=*/true);
  g_macs += 2 * rows * in * out;
}

Conv Conv::declare(ParamTable& p, const std::string& name, int64_t in, int64_t out, int64_t kernel,
                   int64_t stride, int64_t padding) {
  Conv c;
  c.in = in;
  c.out = out;
  c.kernel = kernel;
  c.stride = stride;
  c.padding = padding < 0 ? kernel / 2 : padding;
  c.w = p.add(name + ".weight", {out, in, kernel, kernel});
  if (c.is_pointwise()) p.keep_bf16(c.w);  // runs as a GEMM
  c.b = p.add(name + ".bias", {out}, Init::kZero);
  return c;
}

Act Conv::forward(const ParamTable& p, const Act& x) const {
  HYP_CHECK(x.c == in, "conv: input has {} channels, the layer takes {}", x.c, in);
  Conv2dShape s{x.n, x.h, x.w, in, out, kernel, stride, padding};
  Act y(x.n, s.out_height(), s.out_width(), out);
  if (is_pointwise()) {
    // A 1x1 convolution is a linear layer over the pixels (weights [O, I, 1, 1] = [O, I]).
    as_linear().forward(p, x.data(), x.rows(), y.data());
    return y;
  }
  if (p.bf16_compute()) conv2d_forward_bf16(s, to_bf16(x.data(), x.numel(), 0), p.data(w), p.data(b), y.data());
  else conv2d_forward(s, x.data(), p.data(w), p.data(b), y.data());
  g_macs += int64_t(s.macs());
  return y;
}

Linear Conv::as_linear() const {
  Linear l;
  l.w = w;
  l.b = b;
  l.in = in;
  l.out = out;
  return l;
}

void Conv::backward(ParamTable& p, const Act& x, const Act& dy, Act* dx) const {
  if (is_pointwise()) {
    if (dx) *dx = Act(x.n, x.h, x.w, in);
    as_linear().backward(p, x.data(), dy.data(), x.rows(), dx ? dx->data() : nullptr);
    return;
  }
  Conv2dShape s{x.n, x.h, x.w, in, out, kernel, stride, padding};
  if (dx) *dx = Act(x.n, x.h, x.w, in);
  const ParamTable& values = p;  // reads only (the gradients are p's)
  if (values.bf16_compute())
    conv2d_backward_bf16(s, to_bf16(dy.data(), dy.numel(), 0), to_bf16(x.data(), x.numel(), 1), values.data(w),
                         dx ? dx->data() : nullptr, p.grad(w), p.grad(b));
  else
    conv2d_backward(s, dy.data(), x.data(), values.data(w), dx ? dx->data() : nullptr, p.grad(w), p.grad(b));
  g_macs += 2 * int64_t(s.macs());
}

GroupNorm GroupNorm::declare(ParamTable& p, const std::string& name, int64_t channels, int64_t groups,
                             float eps) {
  GroupNorm g;
  g.channels = channels;
  g.groups = groups;
  g.eps = eps;
  g.gamma = p.add(name + ".weight", {channels}, Init::kOne);
  g.beta = p.add(name + ".bias", {channels}, Init::kZero);
  return g;
}

Act GroupNorm::forward(const ParamTable& p, const Act& x, bool silu) const {
  HYP_CHECK(x.c == channels, "group_norm: input has {} channels, the layer takes {}", x.c, channels);
  Act y(x.n, x.h, x.w, x.c);
  std::vector<float> mean(size_t(x.n * groups)), rstd(mean.size());
  group_norm_forward({x.n, x.h * x.w, channels, groups}, x.data(), p.data(gamma), p.data(beta), eps,
                     y.data(), mean.data(), rstd.data());
  if (silu) activation_forward(Activation::kSilu, y.data(), y.data(), y.numel());
  return y;
}

Act GroupNorm::forward(const ParamTable& p, const Act& x, bool silu, Saved* saved) const {
  if (!saved) return forward(p, x, silu);
  HYP_CHECK(x.c == channels, "group_norm: input has {} channels, the layer takes {}", x.c, channels);
  saved->pre = Act(x.n, x.h, x.w, x.c);
  saved->mean = FloatBuffer(size_t(x.n * groups));
  saved->rstd = FloatBuffer(size_t(x.n * groups));
  group_norm_forward({x.n, x.h * x.w, channels, groups}, x.data(), p.data(gamma), p.data(beta), eps,
                     saved->pre.data(), saved->mean.data(), saved->rstd.data());
  if (!silu) return saved->pre;
  Act y(x.n, x.h, x.w, x.c);
  activation_forward(Activation::kSilu, saved->pre.data(), y.data(), y.numel());
  return y;
}

Act GroupNorm::backward(ParamTable& p, const Act& x, const Saved& saved, bool silu, const Act& dy) const {
  Act d(x.n, x.h, x.w, x.c);
  if (silu) activation_backward(Activation::kSilu, dy.data(), saved.pre.data(), d.data(), d.numel());
  else std::copy(dy.v.begin(), dy.v.end(), d.v.begin());
  group_norm_backward({x.n, x.h * x.w, channels, groups}, d.data(), x.data(), p.data(gamma), saved.mean.data(),
                      saved.rstd.data(), d.data(), p.grad(gamma), p.grad(beta));
  return d;
}

LayerNorm LayerNorm::declare(ParamTable& p, const std::string& name, int64_t channels, float eps) {
  LayerNorm l;
  l.channels = channels;
  l.eps = eps;
  l.gamma = p.add(name + ".weight", {channels}, Init::kOne);
  l.beta = p.add(name + ".bias", {channels}, Init::kZero);
  return l;
}

void LayerNorm::forward(const ParamTable& p, const float* x, int64_t rows, float* y, float* mean,
                        float* rstd) const {
  layer_norm_forward(x, rows, channels, p.data(gamma), p.data(beta), eps, y, mean, rstd);
}

void LayerNorm::backward(ParamTable& p, const float* x, int64_t rows, const float* mean, const float* rstd,
                         const float* dy, float* dx) const {
  layer_norm_backward(dy, x, rows, channels, p.data(gamma), mean, rstd, dx, p.grad(gamma), p.grad(beta));
}

Attention Attention::declare(ParamTable& p, const std::string& name, int64_t dim, int64_t context_dim,
                             int64_t heads, bool qkv_bias, bool clip_names) {
  HYP_CHECK(heads > 0 && dim % heads == 0, "{}: {} channels do not split into {} heads", name, dim, heads);
  Attention a;
  a.heads = heads;
  a.head_dim = dim / heads;
  if (clip_names) {
    a.k = Linear::declare(p, name + ".k_proj", context_dim, dim, true);
    a.v = Linear::declare(p, name + ".v_proj", context_dim, dim, true);
    a.q = Linear::declare(p, name + ".q_proj", dim, dim, true);
    a.out = Linear::declare(p, name + ".out_proj", dim, dim, true);
  } else {
    a.q = Linear::declare(p, name + ".to_q", dim, dim, qkv_bias);
    a.k = Linear::declare(p, name + ".to_k", context_dim, dim, qkv_bias);
    a.v = Linear::declare(p, name + ".to_v", context_dim, dim, qkv_bias);
    a.out = Linear::declare(p, name + ".to_out.0", dim, dim, true);
  }
  return a;
}

void Attention::forward(const ParamTable& p, const float* x, int64_t n, int64_t tq, const float* context,
                        int64_t tk, float* result) const {
  forward(p, x, n, tq, context, tk, result, nullptr);
}

void Attention::forward(const ParamTable& p, const float* x, int64_t n, int64_t tq, const float* context,
                        int64_t tk, float* result, Saved* saved) const {
  const int64_t dim = heads * head_dim;
  Saved local;
  Saved& sv = saved ? *saved : local;
  sv.q = FloatBuffer(size_t(n * tq * dim));
  sv.k = FloatBuffer(size_t(n * tk * dim));
  sv.v = FloatBuffer(size_t(n * tk * dim));
  sv.o = FloatBuffer(size_t(n * tq * dim));
  sv.lse = FloatBuffer(size_t(n * heads * tq));
  FloatBuffer &qs = sv.q, &ks = sv.k, &vs = sv.v, &o = sv.o, &lse = sv.lse;
  q.forward(p, x, n * tq, qs.data());
  k.forward(p, context, n * tk, ks.data());
  v.forward(p, context, n * tk, vs.data());
  AttentionParams params;
  params.causal = causal;
  attention_forward(TensorView(qs.data(), DType::kF32, {n, tq, heads, head_dim}),
                    TensorView(ks.data(), DType::kF32, {n, tk, heads, head_dim}),
                    TensorView(vs.data(), DType::kF32, {n, tk, heads, head_dim}),
                    TensorView(o.data(), DType::kF32, {n, tq, heads, head_dim}),
                    TensorView(lse.data(), DType::kF32, {n, heads, tq}), params);
  g_macs += 2 * n * heads * attention_visible_pairs(tq, tk, causal) * head_dim;
  out.forward(p, o.data(), n * tq, result, /*accumulate=*/true);
}

void Attention::backward(ParamTable& p, const float* x, int64_t n, int64_t tq, const float* context, int64_t tk,
                         const Saved& sv, const float* dresult, float* dx, float* dcontext) const {
  const int64_t dim = heads * head_dim;
  FloatBuffer d_o(size_t(n * tq * dim)), dq(size_t(n * tq * dim)), dk(size_t(n * tk * dim)), dv(size_t(n * tk * dim));
  out.backward(p, sv.o.data(), dresult, n * tq, d_o.data());
  AttentionParams params;
  params.causal = causal;
  const TensorView qv(const_cast<float*>(sv.q.data()), DType::kF32, {n, tq, heads, head_dim});
  const TensorView kv(const_cast<float*>(sv.k.data()), DType::kF32, {n, tk, heads, head_dim});
  const TensorView vv(const_cast<float*>(sv.v.data()), DType::kF32, {n, tk, heads, head_dim});
  attention_backward(qv, kv, vv, TensorView(const_cast<float*>(sv.o.data()), DType::kF32, {n, tq, heads, head_dim}),
                     TensorView(d_o.data(), DType::kF32, {n, tq, heads, head_dim}),
                     TensorView(const_cast<float*>(sv.lse.data()), DType::kF32, {n, heads, tq}),
                     TensorView(dq.data(), DType::kF32, {n, tq, heads, head_dim}),
                     TensorView(dk.data(), DType::kF32, {n, tk, heads, head_dim}),
                     TensorView(dv.data(), DType::kF32, {n, tk, heads, head_dim}), params);
  g_macs += 5 * n * heads * attention_visible_pairs(tq, tk, causal) * head_dim;
  const bool self = context == x;
  float* dctx = self ? dx : dcontext;
  q.backward(p, x, dq.data(), n * tq, dx, /*accumulate_dx=*/true);
  k.backward(p, context, dk.data(), n * tk, dctx, /*accumulate_dx=*/true);
  v.backward(p, context, dv.data(), n * tk, dctx, /*accumulate_dx=*/true);
}

Act upsample2x(const Act& x) {
  Act up(x.n, x.h * 2, x.w * 2, x.c);
  upsample_nearest_forward(x.data(), x.n, x.h, x.w, x.c, 2, up.data());
  return up;
}

Act upsample2x_backward(const Act& dup) {
  Act d(dup.n, dup.h / 2, dup.w / 2, dup.c);
  upsample_nearest_backward(dup.data(), d.n, d.h, d.w, d.c, 2, d.data());
  return d;
}

Act upsample_to(const Act& x, int64_t h, int64_t w) {
  Act up(x.n, h, w, x.c);
  upsample_nearest_to_forward(x.data(), x.n, x.h, x.w, x.c, h, w, up.data());
  return up;
}

Act upsample_to_backward(const Act& dup, int64_t h, int64_t w) {
  Act d(dup.n, h, w, dup.c);
  upsample_nearest_to_backward(dup.data(), d.n, h, w, d.c, dup.h, dup.w, d.data());
  return d;
}

Act concat_channels(const Act& a, const Act& b) {
  HYP_CHECK(a.n == b.n && a.h == b.h && a.w == b.w, "concat: {}x{}x{} and {}x{}x{} differ in size", a.n, a.h,
            a.w, b.n, b.h, b.w);
  Act y(a.n, a.h, a.w, a.c + b.c);
  for (int64_t r = 0; r < a.rows(); ++r) {
    std::copy(a.data() + r * a.c, a.data() + (r + 1) * a.c, y.data() + r * y.c);
    std::copy(b.data() + r * b.c, b.data() + (r + 1) * b.c, y.data() + r * y.c + a.c);
  }
  return y;
}

void add_inplace(Act& a, const Act& b) {
  HYP_CHECK(a.numel() == b.numel(), "add: {} and {} elements", a.numel(), b.numel());
  add_to(a.data(), b.data(), a.numel());
}

}  // namespace hyperion::diffusion
