// Sinusoidal embedding of diffusion timesteps (diffusers' get_timestep_embedding, the
// Timesteps module of a UNet; SDXL embeds its size and crop conditions the same way):
//
//   half = dim / 2,  freq[i] = exp(-ln(max_period) * i / (half - freq_shift))
//   e[n] = scale * t[n] * freq,  out[n] = [sin(e), cos(e)]  ([cos, sin] with flip_sin_to_cos),
//   a zero column appended when dim is odd.
//
// Computed in f32 in the same order as diffusers (the frequencies, the product, then
// sin/cos), so the embedding of a given timestep matches it to rounding. The timesteps
// are inputs, not parameters, so there is no backward pass: the gradient flows from the
// embedding's first Linear layer only into its weights.
#pragma once

#include <cstdint>

namespace hyperion {

struct TimestepEmbeddingParams {
  int64_t dim = 320;
  bool flip_sin_to_cos = true;
  float freq_shift = 0.0f;  // diffusers' downscale_freq_shift (a UNet's freq_shift)
  float scale = 1.0f;
  float max_period = 10000.0f;
};

// Throws naming the field when dim < 2 or freq_shift is half the dim (a division by zero).
void check_timestep_embedding_params(const TimestepEmbeddingParams& p);
// t [n] (fractional timesteps allowed: the Euler schedulers use them), out [n, dim].
void timestep_embedding(const float* t, int64_t n, const TimestepEmbeddingParams& p, float* out);

namespace ref {
void timestep_embedding(const float* t, int64_t n, const TimestepEmbeddingParams& p, float* out);
}

}  // namespace hyperion
