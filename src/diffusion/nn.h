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

struct Linear {
  int w = -1, b = -1;
  int64_t in = 0, out = 0;
  static Linear declare(ParamTable& p, const std::string& name, int64_t in, int64_t out, bool bias = true);
  // y [rows, out] = x [rows, in] W^T + b; with accumulate, y += instead.
  void forward(const ParamTable& p, const float* x, int64_t rows, float* y, bool accumulate = false) const;
};

struct Conv {
  int w = -1, b = -1;
  int64_t in = 0, out = 0, kernel = 3, stride = 1, padding = 1;
  static Conv declare(ParamTable& p, const std::string& name, int64_t in, int64_t out, int64_t kernel,
                      int64_t stride = 1, int64_t padding = -1);
  Act forward(const ParamTable& p, const Act& x) const;
};

struct GroupNorm {
  int gamma = -1, beta = -1;
  int64_t channels = 0, groups = 32;
  float eps = 1e-5f;
  static GroupNorm declare(ParamTable& p, const std::string& name, int64_t channels, int64_t groups,
                           float eps);
  Act forward(const ParamTable& p, const Act& x, bool silu) const;
};

struct LayerNorm {
  int gamma = -1, beta = -1;
  int64_t channels = 0;
  float eps = 1e-5f;
  static LayerNorm declare(ParamTable& p, const std::string& name, int64_t channels, float eps);
  // y [rows, channels]
  void forward(const ParamTable& p, const float* x, int64_t rows, float* y) const;
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
};

// Multiply-adds done by these layers since the last reset (GEMMs, convolutions and the
// attention products), summed over threads: what a benchmark divides by its time.
int64_t layer_macs();
void reset_layer_macs();

// Channel concatenation [a | b] of two activations of one spatial size.
Act concat_channels(const Act& a, const Act& b);
// a += b elementwise.
void add_inplace(Act& a, const Act& b);

}  // namespace hyperion::diffusion
