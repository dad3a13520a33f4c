// Stable Diffusion 1.x, 2.x and SDXL single-file checkpoints: the original CompVis /
// Stability layout most users download (one .safetensors with model.diffusion_model.* for
// the UNet, first_stage_model.* for the VAE, and cond_stage_model.transformer.* for SD
// 1.x's CLIP text encoder, cond_stage_model.model.* for SD 2.x's OpenCLIP one, whose q/k/v
// are one fused in_proj tensor, or SDXL's conditioner.embedders.0.transformer.* (CLIP) and
// conditioner.embedders.1.model.* (OpenCLIP, its text_projection transposed), with the
// UNet's text_time embedding as label_emb.0.*), read into the diffusers-layout models by a
// name table: each
// diffusers tensor name maps to its original name through per-block rules (the resnet and
// attention suffixes below, the block index arithmetic of the original UNet's
// input_blocks / output_blocks and the VAE's down / up levels, and a third of a fused
// tensor), never by code per tensor.
//
// A single file holds no configs and no tokenizer: they come from a diffusers directory
// of the same model (`config_dir`: its model_index.json, component config.json files,
// tokenizer and scheduler; its weights are not read), as diffusers' from_single_file
// takes them from the hub.
#pragma once

#include <memory>
#include <string>

#include "diffusion/pipeline.h"

namespace hyperion::diffusion {

// True when path is a file (not a directory) holding model.diffusion_model.* tensors.
bool is_single_file_checkpoint(const std::string& path);

enum class Component : uint8_t { kUNet, kVae, kTextEncoder };
// The original layout's name of a diffusers tensor name of `component` (the UNet's name
// needs its config for the block indices). Throws naming the tensor when no rule covers it.
std::string original_name(Component component, const std::string& diffusers_name, const UNetConfig& unet,
                           const VaeConfig& vae);

// Loads the pipeline: configs and tokenizer from config_dir, weights from file. Errors
// name the file and the tensor (missing, mis-shaped, non-finite).
std::unique_ptr<DiffusionPipeline> load_single_file(const std::string& file, const std::string& config_dir);

// Writes an SD 1.x or SDXL pipeline's weights as one original-layout file (f32; an SD 2.x
// pipeline's text encoder goes in SD 1.x's CLIP layout), atomically: what
// other Stable Diffusion programs load (and how the tests and benchmarks hand a peer the
// same weights).
void save_single_file(const DiffusionPipeline& pipeline, const std::string& file);

}  // namespace hyperion::diffusion
