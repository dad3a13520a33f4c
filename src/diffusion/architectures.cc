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

std::unique_ptr<DiffusionPipeline> random_pipeline(const std::string& name, uint64_t seed) {
  HYP_USAGE_CHECK(name == "sd15" || name == "sd21", "a whole random pipeline is built for sd15 and sd21, not '{}'",
                  name);
  auto tok = std::make_unique<text::ClipTokenizer>(
      text::ClipTokenizer::for_words({"a", "photo", "of", "an", "astronaut", "riding", "horse"}, 77));
  ClipTextConfig tc;
  tc.vocab_size = 49408;
  tc.max_positions = 77;
  tc.eos_token_id = tok->eos_id();
  if (name == "sd15") {
    tc.hidden_size = 768, tc.intermediate_size = 3072, tc.layers = 12, tc.heads = 12;
    tc.act = Activation::kQuickGelu;
  } else {
    tc.hidden_size = 1024, tc.intermediate_size = 4096, tc.layers = 23, tc.heads = 16;
    tc.act = Activation::kGelu;
  }
  VaeConfig vc;
  vc.block_out_channels = {128, 256, 512, 512};
  vc.layers_per_block = 2;
  vc.norm_num_groups = 32;
  vc.sample_size = name == "sd15" ? 512 : 768;
  auto text = std::make_unique<ClipTextModel>(tc);
  auto unet = std::make_unique<UNet>(unet_preset(name));
  auto vae = std::make_unique<Vae>(vc);
  for (ParamTable* p : {&text->params(), &unet->params(), &vae->params()}) {
    p->allocate(false);
    p->init(seed);
  }
  return std::make_unique<DiffusionPipeline>("StableDiffusionPipeline", std::move(text), std::move(tok),
                                             std::move(unet), std::move(vae), NoiseSchedule::stable_diffusion());
}

}  // namespace hyperion::diffusion
