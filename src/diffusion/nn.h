// The layers diffusion models are built from, over channels-last activations (NHWC: a
// UNet's transformer blocks then see their H*W tokens as rows without a transpose, and
// a 1x1 convolution is a linear layer over the rows), each a declaration of its
// parameters in a ParamTable plus a forward call on the kernels:
//
//   Linear     y = x W^T + b                    (kernels/gemm.h)
//   Conv       2-D convolution                  (kernels/conv2d.h, oneDNN)
//   GroupNorm  optionally followed by SiLU      (kernels/group_norm.h, activation.h)
//   LayerNorm                                   (kernels/layer_norm.h)
//   Attention  multi-head, self or cross, q/k/v/out projections as diffusers' Attention
//              and CLIP's attention name them  (kernels/attention.h)
//
// On a device (the table moved there, ParamTable::to_device) every forward runs on that
// device's backend, its activations in that device's memory (DeviceScope); the backward
// passes are the host's (training stays on the host).
//
// Mixed precision (the table's set_bf16_compute, torch.autocast's rule): the linear layers
// and convolutions read bf16 activations and weights and accumulate in f32; everything
// else (norms, activations, attention's softmax products, residuals, what backward keeps)
// stays f32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diffusion/buffer_pool.h"
#include "diffusion/param_table.h"

namespace hyperion::diffusion {

// An activation [n, h, w, c] (text tokens: h = sequence length, w = 1), its values
// uninitialised until written (the layers write every element of their outputs).
struct Act {
  int64_t n = 0, h = 0, w = 0, c = 0;
  FloatBuffer v;
  Act() = default;
  Act(int64_t n_, int64_t h_, int64_t w_, int64_t c_) : n(n_), h(h_), w(w_), c(c_), v(size_t(n_ * h_ * w_ * c_)) {}
  int64_t rows() const { return n * h * w; }
  int64_t numel() const { return rows() * c; }
  float* data() { return v.data(); }
  const float* data() const { return v.data(); }
};

// Backward passes ACCUMULATE parameter gradients into the table's gradient buffer (dW +=)
// and write (or, where a flag says so, add to) the input gradient.
struct Linear {
  int w = -1, b = -1;
  int64_t in = 0, out = 0;
  static Linear declare(ParamTable& p, const std::string& name, int64_t in, int64_t out, bool bias = true);
  // y [rows, out] = x [rows, in] W^T + b; with accumulate, y += instead.
  void forward(const ParamTable& p, const float* x, int64_t rows, float* y, bool accumulate = false) const;
  // dx [rows, in] = dy W (null: skipped; accumulate_dx: +=), dW += dy^T x, db += sum_rows dy.
  void backward(ParamTable& p, const float* x, const float* dy, int64_t rows, float* dx,
                bool accumulate_dx = false) const;
};

struct Conv {
  int w = -1, b = -1;
  int64_t in = 0, out = 0, kernel = 3, stride = 1, padding = 1;
  static Conv declare(ParamTable& p, const std::string& name, int64_t in, int64_t out, int64_t kernel,
                      int64_t stride = 1, int64_t padding = -1);
  Act forward(const ParamTable& p, const Act& x) const;
  // A 1x1 convolution, stride 1, no padding: a linear layer over the pixels.
  bool is_pointwise() const { return kernel == 1 && stride == 1 && padding == 0; }
  Linear as_linear() const;
  // dx (null: skipped) from dy; dW, db accumulated.
  void backward(ParamTable& p, const Act& x, const Act& dy, Act* dx) const;
};

struct GroupNorm {
  int gamma = -1, beta = -1;
  int64_t channels = 0, groups = 32;
  float eps = 1e-5f;
  static GroupNorm declare(ParamTable& p, const std::string& name, int64_t channels, int64_t groups,
                           float eps);
  Act forward(const ParamTable& p, const Act& x, bool silu) const;
  // Training: also keeps the normalised values before the SiLU (pre) and the statistics.
  struct Saved {
    Act pre;
    FloatBuffer mean, rstd;
  };
  Act forward(const ParamTable& p, const Act& x, bool silu, Saved* saved) const;
  // dy: the gradient of the forward's output (after the SiLU when silu); returns dx.
  Act backward(ParamTable& p, const Act& x, const Saved& saved, bool silu, const Act& dy) const;
};

struct LayerNorm {
  int gamma = -1, beta = -1;
  int64_t channels = 0;
  float eps = 1e-5f;
  static LayerNorm declare(ParamTable& p, const std::string& name, int64_t channels, float eps);
  // y [rows, channels]; mean and rstd [rows] kept when given (training).
  void forward(const ParamTable& p, const float* x, int64_t rows, float* y, float* mean = nullptr,
               float* rstd = nullptr) const;
  // dx [rows, channels] (overwritten; may alias dy); gains and shifts accumulated.
  void backward(ParamTable& p, const float* x, int64_t rows, const float* mean, const float* rstd, const float* dy,
                float* dx) const;
};

struct Attention {
  Linear q, k, v, out;
  int64_t heads = 1, head_dim = 0;
  bool causal = false;
  // diffusers' Attention (to_q, to_k, to_v, to_out.0; q/k/v biases only with qkv_bias) or
  // CLIP's (q_proj, k_proj, v_proj, out_proj, all with biases): `clip_names`.
  static Attention declare(ParamTable& p, const std::string& name, int64_t dim, int64_t context_dim,
                           int64_t heads, bool qkv_bias, bool clip_names = false);
  // x [n, tq, dim] attends to context [n, tk, context_dim] (context = x for self-attention);
  // the result is ADDED to out [n, tq, dim] (the residual connection).
  void forward(const ParamTable& p, const float* x, int64_t n, int64_t tq, const float* context,
               int64_t tk, float* result) const;
  // Training: the projections, the attention output and its log-sum-exps are kept.
  struct Saved {
    FloatBuffer q, k, v, o, lse;
  };
  void forward(const ParamTable& p, const float* x, int64_t n, int64_t tq, const float* context, int64_t tk,
               float* result, Saved* saved) const;
  // dresult: the gradient of what forward added to `result`. Adds the gradient of x to dx;
  // with a separate context (cross-attention) its gradient goes to dcontext (null: not
  // computed, the context being a frozen encoder's output); for self-attention (context
  // == x) both paths add to dx.
  void backward(ParamTable& p, const float* x, int64_t n, int64_t tq, const float* context, int64_t tk,
                const Saved& saved, const float* dresult, float* dx, float* dcontext) const;
};

// Multiply-adds done by these layers since the last reset (GEMMs, convolutions and the
// attention products), summed over threads: what a benchmark divides by its time.
int64_t layer_macs();
void reset_layer_macs();

// Nearest-neighbour upsampling by 2 (the first half of diffusers' Upsample2D, whose
// convolution follows), and its backward: the gradient of the upsampled map summed back
// onto each source pixel.
Act upsample2x(const Act& x);
Act upsample2x_backward(const Act& dup);
// To a size (diffusers' upsample_size: a UNet on latents whose sides are not a multiple of
// its downsampling upsamples each map to its skip's size), and its backward onto the
// original h x w.
Act upsample_to(const Act& x, int64_t h, int64_t w);
Act upsample_to_backward(const Act& dup, int64_t h, int64_t w);

// Channel concatenation [a | b] of two activations of one spatial size.
Act concat_channels(const Act& a, const Act& b);
// a += b elementwise.
void add_inplace(Act& a, const Act& b);

// Copies between the host and a device (an activation already there is copied as is):
// what a pipeline running its models on a device uploads and downloads.
Act to_device(const Act& x, Device device);
FloatBuffer to_device(const float* host, int64_t n, Device device);

}  // namespace hyperion::diffusion
