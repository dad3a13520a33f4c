#include "diffusion/architectures.h"

#include "base/error.h"
#include "diffusion/sd_tiny.h"

namespace hyperion::diffusion {

const std::vector<std::string>& unet_preset_names() {
  static const std::vector<std::string> names = {"sd15", "sd21", "sdxl", "sd-tiny"};
  return names;
}

UNetConfig unet_preset(const std::string& name) {
  UNetConfig c;
  c.block_out_channels = {320, 640, 1280, 1280};
  c.down_block_types = {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"};
  c.up_block_types = {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"};
  c.transformer_layers_per_block = {1, 1, 1, 1};
  if (name == "sd15") {
    c.sample_size = 64;
    c.heads = {8, 8, 8, 8};
    c.cross_attention_dim = 768;
  } else if (name == "sd21") {
    c.sample_size = 96;
    c.heads = {5, 10, 20, 20};
    c.cross_attention_dim = 1024;
    c.use_linear_projection = true;
  } else if (name == "sdxl") {
    c.sample_size = 128;
    c.block_out_channels = {320, 640, 1280};
    c.down_block_types = {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"};
    c.up_block_types = {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"};
    c.heads = {5, 10, 20};
    c.transformer_layers_per_block = {1, 2, 10};
    c.cross_attention_dim = 2048;
    c.use_linear_projection = true;
    c.text_time = true;
    c.addition_time_embed_dim = 256;
    c.projection_class_embeddings_input_dim = 2816;
  } else if (name == "sd-tiny") {
    c = sd_tiny_unet_config();
  } else {
    std::string all;
    for (const std::string& n : unet_preset_names()) all += (all.empty() ? "" : ", ") + n;
    usage_fail("unknown UNet architecture '{}' ({})", name, all);
  }
  return c;
}

}  // namespace hyperion::diffusion
