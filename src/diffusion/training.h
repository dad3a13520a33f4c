// The training objectives and optimizer state of a latent diffusion model, for the
// trainer (train/diffusion_trainer.h):
//
//   VAE:  mean((decode(z) - x)^2) + kl_weight * KL(N(mean, var) || N(0, 1)) per latent
//         value, z = mean + exp(logvar / 2) eps (the reparameterised sample)
//   UNet: the denoising loss on latents x0 at timesteps t with noise eps:
//         mean_i w_i mean_j (unet(x_t, t, context)_ij - target_ij)^2, target eps or v
//         (the schedule's prediction_type), w_i the min-SNR-gamma weight (1 when off)
//
// Each *_backward ACCUMULATES the gradient of its loss into the model's gradients.
#pragma once

#include <cstdint>
#include <vector>

#include "diffusion/noise_schedule.h"
#include "diffusion/param_table.h"
#include "diffusion/unet.h"
#include "diffusion/vae.h"

namespace hyperion::diffusion {

struct VaeLoss {
  double reconstruction = 0, kl = 0, total = 0;
};
// images [n, H, W, C] in [-1, 1]; noise [n * h * w * latent_channels] standard normals.
VaeLoss vae_loss_backward(Vae& vae, const Act& images, const float* noise, double kl_weight);

// latents x0 [n, h, w, c] (scaled), timesteps [n], noise like latents, context
// [n, tokens, d]; an SDXL UNet also takes text_embeds [n, pooled] and time_ids [n, 6].
// With backward false only the loss (held-out evaluation).
double denoising_loss(UNet& unet, const NoiseSchedule& schedule, const Act& latents,
                      const std::vector<int64_t>& timesteps, const float* noise, const float* context,
                      int64_t tokens, double snr_gamma, bool backward, const float* text_embeds = nullptr,
                      const float* time_ids = nullptr);

// AdamW (torch.optim.AdamW) over a whole ParamTable, with global-norm gradient clipping.
class AdamWState {
 public:
  explicit AdamWState(const ParamTable& params);
  // One step from the gradients (zeroed afterwards); returns the gradient norm before
  // clipping.
  double step(ParamTable& params, double lr, double beta1, double beta2, double eps, double weight_decay,
              double clip);
  int64_t steps() const { return t_; }
  // The moments and the step count, for checkpoints (restore: write into m() and v(),
  // then set_steps).
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  void set_steps(int64_t t) { t_ = t; }

 private:
  std::vector<float> m_, v_;
  int64_t t_ = 0;
};

// An exponential moving average of parameters (diffusers' EMAModel: the decay warms up
// as min(decay, (1 + n) / (10 + n)) over the updates n).
class ParamEma {
 public:
  explicit ParamEma(const ParamTable& params);
  void update(const ParamTable& params, double decay);
  // Copies the average into params (what a checkpoint saves).
  void copy_to(ParamTable& params) const;
  // For checkpoints.
  std::vector<float>& shadow() { return shadow_; }
  int64_t updates() const { return updates_; }
  void set_updates(int64_t n) { updates_ = n; }

 private:
  std::vector<float> shadow_;
  int64_t updates_ = 0;
};

}  // namespace hyperion::diffusion
