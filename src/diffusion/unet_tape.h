// What a UNet's training forward pass keeps for its backward pass (unet.cc writes it,
// unet_backward.cc reads it). Private to those two files.
#pragma once

#include <deque>
#include <utility>
#include <vector>

#include "diffusion/unet.h"

namespace hyperion::diffusion {

struct UNet::BlockTape {
  // The residual stream before each sub-layer (h0, h1, h2), each LayerNorm's output (n1..n3)
  // and statistics, the attentions' projections, and the feed-forward's GEGLU input / output.
  FloatBuffer h0, n1, m1, r1, h1, n2, m2, r2, h2, n3, m3, r3, ff, geglu;
  Attention::Saved a1, a2;
};

struct UNet::TransformerTape {
  Act x;       // the Transformer2DModel's input (its residual)
  Act normed;  // its GroupNorm's output: proj_in's input
  GroupNorm::Saved gn;
  std::vector<BlockTape> blocks;
  FloatBuffer h;  // proj_out's input
};

struct UNet::Tape {
  const Act* sample = nullptr;
  const float* context = nullptr;
  int64_t tokens = 0;
  FloatBuffer tproj, hidden, hidden_silu, temb, temb_silu, add_in, add_hidden, add_hidden_silu;
  std::deque<ResnetBlock::Tape> resnets;            // in forward order
  std::deque<TransformerTape> transformers;  // in forward order
  std::vector<Act> sampler_inputs;           // down samplers' inputs, then the upsampled maps
  std::vector<int64_t> skip_channels;        // per up resnet: the skip's channels
  std::vector<std::pair<int64_t, int64_t>> upsampled_from;  // per up sampler: the map's size before
  GroupNorm::Saved norm_out;
  Act h_out, a_out;
};

}  // namespace hyperion::diffusion
