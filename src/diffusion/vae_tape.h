// What the VAE's training passes keep for their backward passes (vae.cc writes it,
// vae_backward.cc reads it). Private to those two files.
#pragma once

#include <deque>
#include <vector>

#include "diffusion/vae.h"

namespace hyperion::diffusion {

struct Vae::MidTape {
  ResnetBlock::Tape first, second;
  Act h, normed;  // the attention's residual input and its GroupNorm output
  GroupNorm::Saved gn;
  Attention::Saved attn;
};

struct Vae::Tape {
  const Act* input = nullptr;      // images (encoder) or latents (decoder)
  std::deque<ResnetBlock::Tape> resnets;  // the blocks' resnets in forward order
  std::vector<Act> sampler_inputs; // padded maps (encoder) or upsampled maps (decoder)
  MidTape mid;
  GroupNorm::Saved norm_out;
  Act h_out, a_out;
  Act quant_in;       // encoder: quant_conv's input
  Act conv_in_input;  // decoder: conv_in's input (post_quant_conv's output)
};

}  // namespace hyperion::diffusion
