#include "diffusion/train_config.h"

#include <cmath>

#include "base/error.h"

namespace hyperion::diffusion {

std::vector<ConfigKey> diffusion_config_schema() {
  using T = ConfigType;
  return {
      {"diffusion.pretrained", T::kString, "",
       "a diffusers directory (model_index.json) to fine-tune; empty: sd-tiny from scratch"},
      {"diffusion.dataset", T::kString, "fashion-mnist",
       "fashion-mnist (Debian's dataset-fashion-mnist, captioned 'a photo of a NAME') or an "
       "image folder with metadata.jsonl (file_name, text)"},
      {"diffusion.resolution", T::kInt, "32", "image side in pixels (resized, center-cropped)"},
      {"diffusion.max_images", T::kInt, "0", "use at most this many training images (0: all)"},
      {"diffusion.vae_steps", T::kInt, "600",
       "steps training the VAE first (reconstruction + KL; 0: keep the pretrained VAE)"},
      {"diffusion.vae_learning_rate", T::kFloat, "1e-3", "the VAE's AdamW learning rate"},
      {"diffusion.kl_weight", T::kFloat, "1e-6", "weight of the VAE's KL term"},
      {"diffusion.caption_dropout", T::kFloat, "0.1",
       "fraction of captions replaced by the empty one (what classifier-free guidance needs)"},
      {"diffusion.snr_gamma", T::kFloat, "5", "min-SNR-gamma loss weighting (0: off)"},
      {"diffusion.ema_decay", T::kFloat, "0.999", "EMA of the UNet's weights (0: off); the EMA is saved"},
      {"diffusion.sample_steps", T::kInt, "30", "denoising steps of the sample grid"},
      {"diffusion.sample_guidance", T::kFloat, "3", "guidance scale of the sample grid"},
      {"diffusion.samples_per_class", T::kInt, "8", "sample grid: images per class (Fashion-MNIST)"},
      {"diffusion.dataset_save_location", T::kString, "",
       "where the VAE latents and text embeddings of the dataset are cached (empty: the run "
       "directory)"},
  };
}

DiffusionTrainConfig parse_diffusion_config(const Config& c) {
  DiffusionTrainConfig d;
  auto where = [&](const char* key) { return std::string(key) + " (" + c.source_of(key) + ")"; };
  d.pretrained = c.get_string("diffusion.pretrained");
  d.dataset = c.get_string("diffusion.dataset");
  HYP_CHECK(!d.dataset.empty(), "config key {} must name fashion-mnist or an image folder", where("diffusion.dataset"));
  d.resolution = c.get_int("diffusion.resolution");
  HYP_CHECK(d.resolution >= 8 && d.resolution <= 2048 && d.resolution % 8 == 0,
            "config key {} = {} must be a multiple of 8 in [8, 2048]", where("diffusion.resolution"), d.resolution);
  d.max_images = c.get_int("diffusion.max_images");
  HYP_CHECK(d.max_images >= 0, "config key {} must be >= 0", where("diffusion.max_images"));
  d.vae_steps = c.get_int("diffusion.vae_steps");
  HYP_CHECK(d.vae_steps >= 0 && d.vae_steps <= 10000000, "config key {} must be in [0, 1e7]",
            where("diffusion.vae_steps"));
  d.vae_learning_rate = c.get_float("diffusion.vae_learning_rate");
  HYP_CHECK(d.vae_learning_rate > 0 && d.vae_learning_rate < 1, "config key {} must be in (0, 1)",
            where("diffusion.vae_learning_rate"));
  d.kl_weight = c.get_float("diffusion.kl_weight");
  HYP_CHECK(d.kl_weight >= 0 && d.kl_weight < 1, "config key {} must be in [0, 1)", where("diffusion.kl_weight"));
  d.caption_dropout = c.get_float("diffusion.caption_dropout");
  HYP_CHECK(d.caption_dropout >= 0 && d.caption_dropout < 1, "config key {} must be in [0, 1)",
            where("diffusion.caption_dropout"));
  d.snr_gamma = c.get_float("diffusion.snr_gamma");
  HYP_CHECK(d.snr_gamma >= 0 && std::isfinite(d.snr_gamma), "config key {} must be >= 0", where("diffusion.snr_gamma"));
  d.ema_decay = c.get_float("diffusion.ema_decay");
  HYP_CHECK(d.ema_decay >= 0 && d.ema_decay < 1, "config key {} must be in [0, 1)", where("diffusion.ema_decay"));
  d.sample_steps = c.get_int("diffusion.sample_steps");
  HYP_CHECK(d.sample_steps >= 1 && d.sample_steps <= 1000, "config key {} must be in [1, 1000]",
            where("diffusion.sample_steps"));
  d.sample_guidance = c.get_float("diffusion.sample_guidance");
  HYP_CHECK(d.sample_guidance >= 0 && d.sample_guidance <= 100, "config key {} must be in [0, 100]",
            where("diffusion.sample_guidance"));
  d.samples_per_class = c.get_int("diffusion.samples_per_class");
  HYP_CHECK(d.samples_per_class >= 0 && d.samples_per_class <= 64, "config key {} must be in [0, 64]",
            where("diffusion.samples_per_class"));
  d.dataset_save_location = c.get_string("diffusion.dataset_save_location");
  return d;
}

}  // namespace hyperion::diffusion
