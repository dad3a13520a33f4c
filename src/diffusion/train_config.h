// The `diffusion.*` keys of `hyperion train` (model_type: diffusion; configs/sd-tiny.yml):
// what to train from, on which images, and the diffusion-specific settings; steps, batch
// size, learning rate, schedule, AdamW and logging are the trainer's common keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/config.h"

namespace hyperion::diffusion {

struct DiffusionTrainConfig {
  std::string pretrained;                 // a diffusers directory to fine-tune ("": sd-tiny from scratch)
  std::string dataset = "fashion-mnist";  // "fashion-mnist" or an image folder (metadata.jsonl)
  int64_t resolution = 32;
  int64_t max_images = 0;  // 0: all
  int64_t vae_steps = 600;
  double vae_learning_rate = 1e-3;
  double kl_weight = 1e-6;
  double caption_dropout = 0.1;
  double snr_gamma = 5.0;  // min-SNR-gamma loss weights (0: off)
  double ema_decay = 0.999;
  int64_t sample_steps = 30;
  double sample_guidance = 3.0;
  int64_t samples_per_class = 8;
  std::string dataset_save_location;  // cache of latents and text embeddings ("": the run dir)
};

std::vector<ConfigKey> diffusion_config_schema();
DiffusionTrainConfig parse_diffusion_config(const Config& c);

}  // namespace hyperion::diffusion
