// Loading a diffusion model's components from a diffusers directory: each component's
// folder holds config.json and its weights (diffusion_pytorch_model.safetensors for a
// UNet or VAE, model.safetensors for a text encoder; sharded with an .index.json, or
// the ".fp16" variant when only that is present). Errors name the folder, file and key.
#pragma once

#include <memory>
#include <string>

#include "diffusion/clip_text.h"
#include "diffusion/unet.h"
#include "diffusion/vae.h"

namespace hyperion::diffusion {

// with_grads: the parameter table also holds gradients (training, gradient checks).
std::unique_ptr<UNet> load_unet(const std::string& dir, bool with_grads = false);
std::unique_ptr<Vae> load_vae(const std::string& dir, bool with_grads = false);
std::unique_ptr<ClipTextModel> load_clip_text(const std::string& dir);

// The weights file of a component folder, given its default name
// ("diffusion_pytorch_model.safetensors"): the name itself (or its .index.json), else the
// .fp16 variant. Errors name the folder when neither is there.
std::string component_weights_name(const std::string& dir, const std::string& file_name);

}  // namespace hyperion::diffusion
