#include "diffusion/nn.h"

#include <atomic>
#include <vector>

#include "base/error.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/backend.h"
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

// The same in the memory of the backend that runs the layer: the host's thread-local
// scratch there, a pooled buffer (kept alive by the returned holder) on a device.
struct Bf16Rows {
  FloatBuffer storage;
  const bf16* data = nullptr;
};
Bf16Rows to_bf16(KernelBackend& be, const float* x, int64_t n) {
  Bf16Rows r;
  if (be.device() == Device::kHost) {
    r.data = to_bf16(x, n, 0);
    return r;
  }
  r.storage = FloatBuffer(size_t(n + 1) / 2);
  be.convert(x, DType::kF32, r.storage.data(), DType::kBF16, size_t(n));
  r.data = reinterpret_cast<const bf16*>(r.storage.data());
  return r;
}

KernelBackend& backend_of(const ParamTable& p) {
  return backend_for(p.device());
}

TensorView f32_view(KernelBackend& be, const float* x, Shape shape) {
  return be.view(const_cast<float*>(x), DType::kF32, shape);
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
  KernelBackend& be = backend_of(p);
  DeviceScope scope(be.device());
  const bool mixed = p.bf16_compute();
  Bf16Rows x16;
  if (mixed) x16 = to_bf16(be, x, rows * in);
  GemmArgs g = mixed ? contiguous_gemm_args(Trans::kN, Trans::kT, rows, out, in, x16.data, DType::kBF16,
                                            p.data_bf16(w), DType::kBF16, y, DType::kF32, accumulate ? 1.0f : 0.0f)
                     : contiguous_gemm_args(Trans::kN, Trans::kT, rows, out, in, x, DType::kF32, p.data(w),
                                            DType::kF32, y, DType::kF32, accumulate ? 1.0f : 0.0f);
  if (b >= 0) g.bias = p.data(b);
  be.gemm(g);
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
  KernelBackend& be = backend_of(p);
  DeviceScope scope(be.device());
  Conv2dShape s{x.n, x.h, x.w, in, out, kernel, stride, padding};
  Act y(x.n, s.out_height(), s.out_width(), out);
  if (is_pointwise()) {
    // A 1x1 convolution is a linear layer over the pixels (weights [O, I, 1, 1] = [O, I]).
    as_linear().forward(p, x.data(), x.rows(), y.data());
    return y;
  }
  const TensorView wv = f32_view(be, p.data(w), {out, in, kernel, kernel}), bv = f32_view(be, p.data(b), {out});
  const TensorView yv = f32_view(be, y.data(), {y.n, y.h, y.w, out});
  if (p.bf16_compute()) {
    const Bf16Rows x16 = to_bf16(be, x.data(), x.numel());
    be.conv2d_forward(s, be.view(const_cast<bf16*>(x16.data), DType::kBF16, {x.n, x.h, x.w, in}), wv, bv, yv);
  } else {
    be.conv2d_forward(s, f32_view(be, x.data(), {x.n, x.h, x.w, in}), wv, bv, yv);
  }
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
  return forward(p, x, silu, nullptr);
}

Act GroupNorm::forward(const ParamTable& p, const Act& x, bool silu, Saved* saved) const {
  HYP_CHECK(x.c == channels, "group_norm: input has {} channels, the layer takes {}", x.c, channels);
  KernelBackend& be = backend_of(p);
  DeviceScope scope(be.device());
  Saved local;
  Saved& sv = saved ? *saved : local;
  sv.pre = Act(x.n, x.h, x.w, x.c);
  sv.mean = FloatBuffer(size_t(x.n * groups));
  sv.rstd = FloatBuffer(size_t(x.n * groups));
  const Shape shape{x.n, x.h * x.w, channels}, stats{x.n, groups};
  be.group_norm_forward({x.n, x.h * x.w, channels, groups}, f32_view(be, x.data(), shape),
                        f32_view(be, p.data(gamma), {channels}), f32_view(be, p.data(beta), {channels}), eps,
                        f32_view(be, sv.pre.data(), shape), f32_view(be, sv.mean.data(), stats),
                        f32_view(be, sv.rstd.data(), stats));
  if (!silu) return sv.pre;
  if (!saved) {  // inference: the SiLU in place
    be.activation_forward(Activation::kSilu, f32_view(be, sv.pre.data(), {x.numel()}),
                          f32_view(be, sv.pre.data(), {x.numel()}));
    return std::move(sv.pre);
  }
  Act y(x.n, x.h, x.w, x.c);
  be.activation_forward(Activation::kSilu, f32_view(be, sv.pre.data(), {x.numel()}),
                        f32_view(be, y.data(), {x.numel()}));
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
  KernelBackend& be = backend_of(p);
  const TensorView none;
  be.layer_norm_forward(f32_view(be, x, {rows, channels}), f32_view(be, p.data(gamma), {channels}),
                        f32_view(be, p.data(beta), {channels}), eps, f32_view(be, y, {rows, channels}),
                        mean ? f32_view(be, mean, {rows}) : none, rstd ? f32_view(be, rstd, {rows}) : none);
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
  KernelBackend& be = backend_of(p);
  DeviceScope scope(be.device());
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
  be.attention_forward(f32_view(be, qs.data(), {n, tq, heads, head_dim}), f32_view(be, ks.data(), {n, tk, heads, head_dim}),
                       f32_view(be, vs.data(), {n, tk, heads, head_dim}), f32_view(be, o.data(), {n, tq, heads, head_dim}),
                       f32_view(be, lse.data(), {n, heads, tq}), params);
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
  return upsample_to(x, x.h * 2, x.w * 2);
}

Act upsample2x_backward(const Act& dup) {
  Act d(dup.n, dup.h / 2, dup.w / 2, dup.c);
  upsample_nearest_backward(dup.data(), d.n, d.h, d.w, d.c, 2, d.data());
  return d;
}

Act upsample_to(const Act& x, int64_t h, int64_t w) {
  KernelBackend& be = x.v.backend();
  DeviceScope scope(be.device());
  Act up(x.n, h, w, x.c);
  be.upsample_nearest_forward(f32_view(be, x.data(), {x.n, x.h, x.w, x.c}), f32_view(be, up.data(), {x.n, h, w, x.c}));
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
  HYP_CHECK(a.v.device() == b.v.device(), "concat: one map on the {}, the other on the {}", device_name(a.v.device()),
            device_name(b.v.device()));
  KernelBackend& be = a.v.backend();
  DeviceScope scope(be.device());
  Act y(a.n, a.h, a.w, a.c + b.c);
  const size_t f = sizeof(float), pitch = size_t(y.c) * f;
  if (a.rows() > 0) {
    be.copy_2d(a.data(), size_t(a.c) * f, y.data(), pitch, size_t(a.c) * f, size_t(a.rows()));
    be.copy_2d(b.data(), size_t(b.c) * f, y.data() + a.c, pitch, size_t(b.c) * f, size_t(b.rows()));
  }
  return y;
}

void add_inplace(Act& a, const Act& b) {
  HYP_CHECK(a.numel() == b.numel(), "add: {} and {} elements", a.numel(), b.numel());
  KernelBackend& be = a.v.backend();
  be.residual_add(f32_view(be, b.data(), {b.numel()}), f32_view(be, a.data(), {a.numel()}));
}

Act to_device(const Act& x, Device device) {
  if (x.v.device() == device) return x;
  Act y;
  {
    DeviceScope scope(device);
    y = Act(x.n, x.h, x.w, x.c);
  }
  if (x.numel() == 0) return y;
  const size_t bytes = size_t(x.numel()) * sizeof(float);
  if (device == Device::kHost) x.v.backend().download(x.data(), y.data(), bytes);
  else if (x.v.device() == Device::kHost) backend_for(device).upload(x.data(), y.data(), bytes);
  else fail("diffusion: an activation from the {} to the {}", device_name(x.v.device()), device_name(device));
  return y;
}

FloatBuffer to_device(const float* host, int64_t n, Device device) {
  DeviceScope scope(device);
  FloatBuffer b(static_cast<size_t>(n));
  if (n > 0) backend_for(device).upload(host, b.data(), size_t(n) * sizeof(float));
  return b;
}

}  // namespace hyperion::diffusion
