// `hyperion train` for a latent diffusion model (model_type: diffusion; configs/sd-tiny.yml):
// with the language-model trainer's run directory and lock, learning-rate schedule,
// AdamW settings, metrics.jsonl (loss, grad_norm, lr, step_s, samples_per_s, and the
// held-out denoising loss as eval_loss) and graceful stop on SIGTERM / SIGINT:
//
//   1. the VAE first (diffusion.vae_steps: reconstruction + KL), unless fine-tuning
//      keeps a pretrained one; its scaling_factor set to 1 / std of the latents;
//   2. the dataset's latents and its captions' text embeddings computed once with the
//      frozen VAE and text encoder, cached in diffusion.dataset_save_location;
//   3. the UNet on the denoising loss (epsilon or v, min-SNR-gamma weights), captions
//      dropped to the empty one at diffusion.caption_dropout, an EMA of its weights;
//   4. a diffusers directory at <run dir>/checkpoints/<step>/ (the EMA UNet), loadable by
//      `hyperion generate` and by diffusers, and for Fashion-MNIST a grid of samples per
//      class at <run dir>/samples.png.
#pragma once

#include "base/config.h"
#include "dist/communicator.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace hyperion {

TrainResult run_diffusion_training(const Config& config, const TrainConfig& t, const TrainOptions& options,
                                   dist::Communicator& comm, double process_start);

}  // namespace hyperion
