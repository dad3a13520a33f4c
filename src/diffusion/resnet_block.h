// The ResNet block of a UNet and a VAE (diffusers' ResnetBlock2D), one definition for
// both: GroupNorm + SiLU, 3x3 convolution, (the UNet's) time projection added per image,
// GroupNorm + SiLU, 3x3 convolution, and the residual (through a 1x1 convolution when the
// channels change). The VAE's blocks have no time projection (time_dim 0).
#pragma once

#include <cstdint>
#include <string>

#include "diffusion/nn.h"

namespace hyperion::diffusion {

struct ResnetBlock {
  GroupNorm norm1, norm2;
  Conv conv1, conv2, shortcut;
  Linear time_proj;
  bool has_shortcut = false;
  bool has_time = false;

  // Declares `name`.norm1, .conv1, (.time_emb_proj), .norm2, .conv2 and, when in != out,
  // .conv_shortcut. time_dim 0: no time projection.
  static ResnetBlock declare(ParamTable& p, const std::string& name, int64_t in, int64_t out,
                             int64_t groups, float eps, int64_t time_dim);

  // What the training forward keeps. Under remat a caller keeps x alone (drop()) and the
  // backward pass runs the forward again.
  struct Tape {
    Act x;   // the block's input
    Act a1;  // silu(norm1(x)): conv1's input
    Act h1;  // conv1's output (plus the time projection): norm2's input
    Act a2;  // silu(norm2(h1)): conv2's input
    GroupNorm::Saved n1, n2;
    // Keeps x only.
    void drop() {
      a1 = Act();
      h1 = Act();
      a2 = Act();
    }
    bool dropped() const { return a1.v.empty(); }
  };

  // temb_silu [n, time_dim]: silu of the UNet's time embedding (null without a time
  // projection).
  Act forward(const ParamTable& p, const Act& x, const float* temb_silu, Tape* tape) const;
  // dout: the gradient of the output; returns the input's. Parameter gradients accumulate;
  // dtemb_silu [n, time_dim] accumulates the time embedding's (with a time projection).
  // A dropped tape is recomputed first.
  Act backward(ParamTable& p, const Tape& tape, const Act& dout, const float* temb_silu,
               float* dtemb_silu) const;
};

}  // namespace hyperion::diffusion
