// diffusers' AutoencoderKL from its config.json (the VAE of SD 1.x/2.x and SDXL, or a
// small one of the same architecture): the encoder (images [n, H, W, 3] in [-1, 1] to
// the latent distribution's mean and log-variance at H/f x W/f, f = 2^(blocks - 1)) and
// the decoder (latents back to images), with `scaling_factor` (and `shift_factor`)
// applied by encode_latents / decode_latents as the pipelines apply them. Names and
// shapes are diffusers' (vae/diffusion_pytorch_model.safetensors).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "diffusion/nn.h"
#include "diffusion/param_table.h"
#include "diffusion/resnet_block.h"

namespace hyperion::diffusion {

struct VaeConfig {
  int64_t in_channels = 3, out_channels = 3, latent_channels = 4;
  std::vector<int64_t> block_out_channels = {128, 256, 512, 512};
  int64_t layers_per_block = 2;
  int64_t norm_num_groups = 32;
  int64_t sample_size = 512;
  double scaling_factor = 0.18215, shift_factor = 0.0;
  bool use_quant_conv = true, use_post_quant_conv = true, mid_block_add_attention = true;

  int64_t downscale() const { return int64_t(1) << (block_out_channels.size() - 1); }
  static VaeConfig from_json(const std::string& text, const std::string& origin);
  std::string to_json() const;
};

class Vae {
 public:
  explicit Vae(const VaeConfig& config);
  const VaeConfig& config() const { return config_; }
  ParamTable& params() { return params_; }
  const ParamTable& params() const { return params_; }

  // images [n, H, W, in_channels] -> [n, H/f, W/f, 2 * latent_channels]: mean | logvar.
  Act encode(const Act& images) const;
  // latents [n, h, w, latent_channels] -> images [n, h f, w f, out_channels].
  Act decode(const Act& latents) const;
  // Training: the passes keeping what their backward passes read (the inputs must outlive
  // the tapes), and the backward passes, which ACCUMULATE into params()'s gradients.
  struct Tape;
  Act encode(const Act& images, std::shared_ptr<Tape>* tape) const;
  Act decode(const Act& latents, std::shared_ptr<Tape>* tape) const;
  // The encoder's backward from the gradient of its moments (the images get none).
  void encode_backward(const Tape& tape, const Act& dmoments);
  // The decoder's backward; returns the gradient of the latents.
  Act decode_backward(const Tape& tape, const Act& dimages);

  // What a pipeline trains on: (mean + exp(logvar / 2) noise - shift) * scaling_factor,
  // noise [n * h * w * latent_channels] standard normals (null: the mean alone). Host
  // images in, host latents out, as decode_latents.
  Act encode_latents(const Act& images, const float* noise) const;
  // latents / scaling_factor + shift, decoded. Host latents in, host images out, wherever
  // the model runs (the other calls take and return activations on the model's device).
  Act decode_latents(const Act& latents) const;

 private:
  struct MidAttention {
    GroupNorm norm;
    Attention attn;
  };
  struct Block {
    std::vector<ResnetBlock> resnets;
    bool has_sampler = false;
    Conv sampler;
  };
  struct Mid {
    ResnetBlock first, second;
    bool has_attention = true;
    MidAttention attention;
  };
  struct MidTape;
  ResnetBlock resnet(const std::string& name, int64_t in, int64_t out);
  Mid mid(const std::string& name, int64_t channels);
  Act run_mid(const Mid& m, const Act& x, MidTape* tape) const;
  Act mid_backward(const Mid& m, const MidTape& t, const Act& dout);

  VaeConfig config_;
  ParamTable params_;
  Conv enc_conv_in, enc_conv_out, dec_conv_in, dec_conv_out, quant_conv, post_quant_conv;
  GroupNorm enc_norm_out, dec_norm_out;
  std::vector<Block> enc_blocks_, dec_blocks_;
  Mid enc_mid_, dec_mid_;
};

}  // namespace hyperion::diffusion
