#include "diffusion/sd_tiny.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "diffusion/image_dataset.h"

namespace hyperion::diffusion {

UNetConfig sd_tiny_unet_config() {
  UNetConfig c;
  c.sample_size = 8;
  c.in_channels = 4;
  c.out_channels = 4;
  c.down_block_types = {"CrossAttnDownBlock2D", "DownBlock2D"};
  c.up_block_types = {"UpBlock2D", "CrossAttnUpBlock2D"};
  c.block_out_channels = {64, 128};
  c.layers_per_block = 1;
  c.norm_num_groups = 16;
  c.cross_attention_dim = 64;
  c.heads = {4, 8};
  c.transformer_layers_per_block = {1, 1};
  return c;
}

VaeConfig sd_tiny_vae_config() {
  VaeConfig c;
  c.in_channels = 1;
  c.out_channels = 1;
  c.latent_channels = 4;
  c.block_out_channels = {32, 64, 64};
  c.layers_per_block = 1;
  c.norm_num_groups = 16;
  c.sample_size = kSdTinyImageSize;
  c.scaling_factor = 1.0;
  return c;
}

ClipTextConfig sd_tiny_text_config(int64_t vocab_size, int32_t eos_token_id) {
  ClipTextConfig c;
  c.vocab_size = vocab_size;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.layers = 2;
  c.heads = 4;
  c.max_positions = 16;
  c.act = Activation::kQuickGelu;
  c.eos_token_id = eos_token_id;
  return c;
}

std::vector<std::string> sd_tiny_words() {
  std::set<std::string> words = {"a", "photo", "of"};
  for (const std::string& name : fashion_mnist_classes()) {
    std::istringstream in(name);
    for (std::string w; in >> w;) {
      // CLIP splits "t-shirt" into "t", "-", "shirt".
      size_t start = 0;
      for (size_t dash; (dash = w.find('-', start)) != std::string::npos; start = dash + 1)
        if (dash > start) words.insert(w.substr(start, dash - start));
      if (start < w.size()) words.insert(w.substr(start));
    }
  }
  return {words.begin(), words.end()};
}

std::unique_ptr<DiffusionPipeline> make_sd_tiny(uint64_t seed) {
  auto tok = std::make_unique<text::ClipTokenizer>(text::ClipTokenizer::for_words(sd_tiny_words(), 16));
  auto text = std::make_unique<ClipTextModel>(sd_tiny_text_config(tok->vocab_size(), tok->eos_id()));
  auto unet = std::make_unique<UNet>(sd_tiny_unet_config());
  auto vae = std::make_unique<Vae>(sd_tiny_vae_config());
  for (ParamTable* p : {&text->params(), &unet->params(), &vae->params()}) {
    p->allocate(false);
    p->init(seed);
  }
  NoiseSchedule schedule = NoiseSchedule::stable_diffusion();
  schedule.class_name = "DDIMScheduler";
  schedule.steps_offset = 1;
  schedule.finish();
  return std::make_unique<DiffusionPipeline>("StableDiffusionPipeline", std::move(text), std::move(tok), std::move(unet),
                                             std::move(vae), std::move(schedule));
}

std::unique_ptr<DiffusionPipeline> make_sd_tiny_xl(uint64_t seed) {
  auto pipe = make_sd_tiny(seed);
  // The UNet again, SDXL-shaped: text_time embedding of the second encoder's pooled
  // projection and 6 size / crop ids, attending to both encoders' widths.
  UNetConfig uc = sd_tiny_unet_config();
  ClipTextConfig tc2 = sd_tiny_text_config(pipe->tokenizer().vocab_size(), pipe->tokenizer().eos_id());
  tc2.act = Activation::kGelu;  // OpenCLIP's
  tc2.with_projection = true;
  tc2.projection_dim = 32;
  uc.cross_attention_dim = pipe->text_encoder().config().hidden_size + tc2.hidden_size;
  uc.text_time = true;
  uc.addition_time_embed_dim = 8;
  uc.projection_class_embeddings_input_dim = tc2.projection_dim + 6 * uc.addition_time_embed_dim;
  auto unet = std::make_unique<UNet>(uc);
  auto text2 = std::make_unique<ClipTextModel>(tc2);
  for (ParamTable* p : {&text2->params(), &unet->params()}) {
    p->allocate(false);
    p->init(seed + 1);
  }
  auto vae = std::make_unique<Vae>(sd_tiny_vae_config());
  vae->params().allocate(false);
  std::copy(pipe->vae().params().all(), pipe->vae().params().all() + pipe->vae().params().size(), vae->params().all());
  auto text = std::make_unique<ClipTextModel>(pipe->text_encoder().config());
  text->params().allocate(false);
  std::copy(pipe->text_encoder().params().all(),
            pipe->text_encoder().params().all() + pipe->text_encoder().params().size(), text->params().all());
  auto xl = std::make_unique<DiffusionPipeline>(
      "StableDiffusionPipeline", std::move(text), std::make_unique<text::ClipTokenizer>(pipe->tokenizer()),
      std::move(unet), std::move(vae), pipe->schedule());
  xl->add_second_text_encoder(std::move(text2), std::make_unique<text::ClipTokenizer>(pipe->tokenizer()), true);
  return xl;
}

}  // namespace hyperion::diffusion
