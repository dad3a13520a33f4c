// UNet architectures by name, as their diffusers configs give them: for benchmarks and
// for training from scratch. "sd15" (Stable Diffusion 1.x), "sd21" (2.x: linear
// projections, 5-20 heads, 1024-wide context), "sdxl" (three levels, 1/2/10 transformer
// layers, text_time), "sd-tiny" (diffusion/sd_tiny.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "diffusion/pipeline.h"
#include "diffusion/unet.h"

namespace hyperion::diffusion {

// Throws a usage error listing the names for an unknown one.
UNetConfig unet_preset(const std::string& name);
const std::vector<std::string>& unet_preset_names();

// A whole pipeline of that shape with random weights (for benchmarks): "sd15" (CLIP
// ViT-L/14's text encoder, SD's VAE) or "sd21" (OpenCLIP ViT-H's 23 layers); the
// tokenizer knows only a few words (the text encoder's vocabulary is full size).
std::unique_ptr<DiffusionPipeline> random_pipeline(const std::string& name, uint64_t seed);

}  // namespace hyperion::diffusion
