// diffusers' UNet2DConditionModel, built from its config.json: SD 1.x (cross-attention
// blocks with 1x1-convolution projections, attention_head_dim = heads), SD 2.x
// (use_linear_projection, heads per block) and SDXL (transformer_layers_per_block per
// block, addition_embed_type "text_time": pooled text embeddings and size/crop time ids).
// Parameter names and shapes are diffusers' (unet/diffusion_pytorch_model.safetensors);
// activations are channels-last. What the config asks for that is not built here (an
// attention processor, class embeddings, another block type, time_cond_proj_dim ...) is
// refused naming the file and key.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "diffusion/nn.h"
#include "diffusion/param_table.h"
#include "diffusion/resnet_block.h"

namespace hyperion::diffusion {

struct UNetConfig {
  int64_t sample_size = 64, in_channels = 4, out_channels = 4;
  bool flip_sin_to_cos = true;
  double freq_shift = 0;
  std::vector<std::string> down_block_types, up_block_types;  // Down/CrossAttnDown..., Up/CrossAttnUp...
  std::string mid_block_type = "UNetMidBlock2DCrossAttn";       // or "" (none)
  std::vector<int64_t> block_out_channels;
  int64_t layers_per_block = 2;
  int64_t downsample_padding = 1;
  int64_t norm_num_groups = 32;
  double norm_eps = 1e-5;
  int64_t cross_attention_dim = 768;
  std::vector<int64_t> transformer_layers_per_block;  // per down block (mid uses the last)
  std::vector<int64_t> heads;                          // attention heads per down block
  bool use_linear_projection = false;
  // SDXL: "text_time" (pooled text + 6 time ids per sample), else none.
  bool text_time = false;
  int64_t addition_time_embed_dim = 256;
  int64_t projection_class_embeddings_input_dim = 0;

  int64_t time_embed_dim() const { return block_out_channels.front() * 4; }
  // Downsampling factor of the latent (2^(blocks - 1)): sizes must be multiples of it.
  static UNetConfig from_json(const std::string& text, const std::string& origin);
  std::string to_json() const;
};

class UNet {
 public:
  explicit UNet(const UNetConfig& config);
  const UNetConfig& config() const { return config_; }
  ParamTable& params() { return params_; }
  const ParamTable& params() const { return params_; }

  // sample [n, h, w, in_channels] at timesteps t [n]; context [n, tokens, cross_attention_dim];
  // SDXL: text_embeds [n, pooled] and time_ids [n, 6]. Returns [n, h, w, out_channels].
  // Every input lives where the parameters do (params().device()), as does the result.
  Act forward(const Act& sample, const float* timesteps, const float* context, int64_t tokens,
              const float* text_embeds = nullptr, const float* time_ids = nullptr) const;

  // Training: the forward pass keeping what the backward pass reads (every block's
  // inputs, normalisation statistics and attention projections) in *tape; the inputs
  // must outlive the tape.
  struct Tape;
  Act forward(const Act& sample, const float* timesteps, const float* context, int64_t tokens,
              const float* text_embeds, const float* time_ids, std::shared_ptr<Tape>* tape) const;
  // ACCUMULATES the gradient of sum(dout * output) into params()'s gradients (allocated
  // with gradients). The inputs (latents, text, time) get no gradient: they come from
  // frozen encoders.
  void backward(const Tape& tape, const Act& dout);
  // Remat (remat_policy: full): the training forward keeps only each resnet's and
  // transformer's input, and the backward pass runs that block's forward again before its
  // backward: the same gradients, bit for bit, for one more forward's compute and a
  // fraction of the activation memory.
  void set_remat(bool remat) { remat_ = remat; }
  bool remat() const { return remat_; }

 private:
  struct TransformerBlock {
    LayerNorm norm1, norm2, norm3;
    Attention self_attn, cross_attn;
    Linear ff_in, ff_out;
  };
  struct Transformer {
    GroupNorm norm;
    Linear proj_in, proj_out;  // 1x1 convolutions or linear layers: the same over NHWC rows
    std::vector<TransformerBlock> blocks;
  };
  struct Block {
    std::vector<ResnetBlock> resnets;
    std::vector<Transformer> attentions;  // empty for plain blocks
    bool has_sampler = false;
    Conv sampler;  // downsampler (stride 2) or the upsampler's convolution
  };

  struct BlockTape;
  struct TransformerTape;
  ResnetBlock resnet(const std::string& name, int64_t in, int64_t out);
  Transformer transformer(const std::string& name, int64_t channels, int64_t heads, int64_t layers);
  void run_transformer(const Transformer& t, Act& x, const float* context, int64_t tokens,
                       TransformerTape* tape) const;
  void transformer_backward(const Transformer& t, const TransformerTape& tape, Act& dx, const float* context,
                            int64_t tokens);

  UNetConfig config_;
  bool remat_ = false;
  ParamTable params_;
  Linear time_linear1, time_linear2, add_linear1, add_linear2;
  Conv conv_in, conv_out;
  GroupNorm norm_out;
  std::vector<Block> down_, up_;
  Block mid_;
  bool has_mid_ = false;
};

}  // namespace hyperion::diffusion
