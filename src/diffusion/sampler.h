// Inference samplers over a NoiseSchedule, with diffusers' formulas and timestep choices:
//
//   ddim      DDIMScheduler, eta = 0 (deterministic)
//   euler     EulerDiscreteScheduler (s_churn = 0)
//   euler_a   EulerAncestralDiscreteScheduler (fresh noise each step)
//   dpm++2m   DPMSolverMultistepScheduler, dpmsolver++ of order 2, final sigma 0
//
// with `karras` (use_karras_sigmas) for euler, euler_a and dpm++2m. A Sampler is the plan
// of one run of `steps` steps, shared by all images of a batch; each image keeps its own
// SamplerState (DPM-Solver's previous prediction), so an image can join a batch at any
// step. Per step i: the UNet sees input_scale(i) * x at timestep(i); its output (after
// classifier-free guidance) goes to step(), which updates x in place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diffusion/noise_schedule.h"

namespace hyperion::diffusion {

enum class SamplerKind : uint8_t { kDdim, kEuler, kEulerAncestral, kDpmSolver2M };
const char* sampler_name(SamplerKind k);
// "ddim", "euler", "euler_a" (or "euler_ancestral"), "dpm++2m" (or "dpmpp_2m").
bool parse_sampler(const std::string& name, SamplerKind* out);
// The sampler a diffusers scheduler class names (EulerDiscreteScheduler -> euler, ...);
// classes without one here (PNDMScheduler, LMSDiscreteScheduler ...) give `fallback`.
SamplerKind sampler_for_class(const std::string& class_name, SamplerKind fallback);

struct SamplerState {
  std::vector<float> prev_x0;  // DPM-Solver++: the previous step's x0 prediction
  bool has_prev = false;
};

class Sampler {
 public:
  Sampler(const NoiseSchedule& schedule, SamplerKind kind, int64_t steps, bool karras);

  SamplerKind kind() const { return kind_; }
  int64_t steps() const { return int64_t(timesteps_.size()); }
  // The UNet's timestep at step i (fractional for Euler with Karras sigmas).
  double timestep(int64_t i) const { return timesteps_[size_t(i)]; }
  // The UNet's input is x * input_scale(i) (1 / sqrt(sigma^2 + 1) for Euler, else 1).
  double input_scale(int64_t i) const;
  // The starting latent is standard normal noise times this.
  double init_noise_sigma() const { return init_noise_sigma_; }
  // sigma_i (Euler, DPM: sigmas().size() == steps + 1, the last 0); empty for DDIM.
  const std::vector<double>& sigmas() const { return sigmas_; }

  // One step on n values of one image: x <- x_{i+1} from the model's output at step i.
  // noise: n standard normal values (euler_a; ignored by the others, may be null).
  void step(int64_t i, const float* model_out, float* x, int64_t n, const float* noise,
            SamplerState* state) const;

 private:
  const NoiseSchedule* schedule_;
  SamplerKind kind_;
  std::vector<double> timesteps_, sigmas_;
  double init_noise_sigma_ = 1.0;
};

// Classifier-free guidance over n values: out = uncond + scale * (cond - uncond).
void classifier_free_guidance(const float* uncond, const float* cond, double scale, int64_t n,
                              float* out);

// Karras et al.'s sigmas: rho = 7 between sigma_max and sigma_min, `steps` values.
std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int64_t steps);

}  // namespace hyperion::diffusion
