// sd-tiny: Stable Diffusion's architecture (a CLIP text encoder, a UNet with
// cross-attention down/up blocks, an AutoencoderKL) at small widths, for 32 x 32 gray
// images (Fashion-MNIST resized) and captions from a fixed word list: the embedded
// default `hyperion train sd-tiny` trains from scratch in minutes on two cores. Its VAE
// has factor 4 (8 x 8 x 4 latents); its tokenizer spells each caption word as one token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "diffusion/pipeline.h"

namespace hyperion::diffusion {

constexpr int64_t kSdTinyImageSize = 32;

UNetConfig sd_tiny_unet_config();
VaeConfig sd_tiny_vae_config();
ClipTextConfig sd_tiny_text_config(int64_t vocab_size, int32_t eos_token_id);
// The words of Fashion-MNIST's captions ("a", "photo", "of", and the class names' words).
std::vector<std::string> sd_tiny_words();

// A randomly initialised sd-tiny pipeline (DDPM's scaled_linear schedule, 1000 steps).
std::unique_ptr<DiffusionPipeline> make_sd_tiny(uint64_t seed);
// sd-tiny shaped as SDXL (StableDiffusionXLPipeline): a second text encoder with a
// projection, a text_time UNet attending to both; for tests of the SDXL paths.
std::unique_ptr<DiffusionPipeline> make_sd_tiny_xl(uint64_t seed);

}  // namespace hyperion::diffusion
