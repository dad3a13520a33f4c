// Checkpoints of a diffusion training run (train/diffusion_trainer.h), resumable as the
// language models' are. checkpoints/<step>/ holds:
//
//   - the pipeline as a diffusers directory (model_index.json, unet/, vae/, text_encoder/,
//     tokenizer/, scheduler/), the UNet as its EMA weights: what `generate`, `serve` and
//     diffusers read;
//   - training_state.safetensors: the UNet's own weights (unet.NAME), AdamW's moments
//     (adam_m.NAME, adam_v.NAME) and the EMA (ema.NAME);
//   - trainer_state.json: model_type "diffusion", the step, AdamW's and the EMA's update
//     counts, the data RNG's state, the compute dtype and the run's config (what --resume
//     restores).
//
// Written into checkpoints/.tmp-*, then published by rename (train/checkpoint_files.h),
// keeping checkpoints_to_keep.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "base/config.h"
#include "diffusion/pipeline.h"
#include "diffusion/training.h"

namespace hyperion {

struct DiffusionTrainingState {
  diffusion::AdamWState* optimizer = nullptr;
  diffusion::ParamEma* ema = nullptr;  // nullptr: no EMA (the UNet is saved as it is)
  std::mt19937_64* rng = nullptr;
  int64_t step = 0;
  bool bf16 = false;  // mixed precision (saved as trainer_state.json's compute_dtype)
};

// Rank 0 only. The pipeline's UNet holds its training weights before and after.
void save_diffusion_checkpoint(const std::string& run_dir, const Config& config, diffusion::DiffusionPipeline& pipe,
                               const DiffusionTrainingState& state, int64_t keep);

// Restores the UNet's training weights, the optimizer, the EMA and the RNG from `dir` (a
// checkpoint written above) into `pipe` (loaded from that directory) and `state`, and
// sets state.step. Errors name the file and the tensor or key.
void restore_diffusion_checkpoint(const std::string& dir, diffusion::DiffusionPipeline& pipe,
                                  DiffusionTrainingState& state);

}  // namespace hyperion
