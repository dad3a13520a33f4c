// The forward (noising) process of a latent diffusion model, as a diffusers
// `scheduler/scheduler_config.json` describes it: the betas over `num_train_timesteps`
// steps, their cumulative products alpha_bar[t], what the UNet predicts
// (`prediction_type`), and how inference spaces its timesteps (`timestep_spacing`,
// `steps_offset`). Every diffusers scheduler class shares these keys, so the schedule of
// any of them (PNDM for SD 1.5, DDIM for SD 2.x, Euler for SDXL) drives any sampler here
// (diffusion/sampler.h).
//
// Training (DDPM): x_t = sqrt(alpha_bar[t]) x0 + sqrt(1 - alpha_bar[t]) eps; the target is
// eps (`epsilon`) or v = sqrt(alpha_bar[t]) eps - sqrt(1 - alpha_bar[t]) x0
// (`v_prediction`); min-SNR-gamma weights the loss per sample by
// min(snr, gamma) / snr (epsilon) or min(snr, gamma) / (snr + 1) (v), snr = a / (1 - a).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace hyperion::diffusion {

enum class BetaSchedule : uint8_t { kLinear, kScaledLinear, kSquaredCosCapV2 };
enum class Prediction : uint8_t { kEpsilon, kVPrediction };
enum class TimestepSpacing : uint8_t { kLeading, kTrailing, kLinspace };

const char* beta_schedule_name(BetaSchedule b);
const char* prediction_name(Prediction p);
const char* timestep_spacing_name(TimestepSpacing s);

struct NoiseSchedule {
  std::string class_name = "DDIMScheduler";  // `_class_name`, kept when written back
  int64_t train_timesteps = 1000;
  double beta_start = 0.00085, beta_end = 0.012;
  BetaSchedule beta_schedule = BetaSchedule::kScaledLinear;
  Prediction prediction = Prediction::kEpsilon;
  TimestepSpacing spacing = TimestepSpacing::kLeading;
  int64_t steps_offset = 1;
  bool set_alpha_to_one = false;  // DDIM: alpha_bar before the first step (1 or alpha_bar[0])
  bool karras_sigmas = false;     // `use_karras_sigmas` (Euler, DPM-Solver)
  // alpha_bar[t], t in [0, train_timesteps): filled by finish().
  std::vector<double> alphas_cumprod;

  // Stable Diffusion 1.x / 2.x's schedule (scaled_linear 0.00085 .. 0.012 over 1000).
  static NoiseSchedule stable_diffusion();
  // Parses scheduler_config.json text; origin names the file in errors. Unknown keys are
  // ignored (each scheduler class has its own extras); a known key with a value outside
  // what is supported (a beta_schedule, prediction_type "sample", timestep_spacing,
  // rescale_betas_zero_snr true, a non-positive count) is refused naming the key.
  static NoiseSchedule from_json(const std::string& text, const std::string& origin);
  std::string to_json() const;

  // Computes alphas_cumprod from the betas (after changing the fields by hand).
  void finish();

  double alpha_bar(int64_t t) const { return alphas_cumprod[size_t(t)]; }
  double snr(int64_t t) const { return alpha_bar(t) / (1.0 - alpha_bar(t)); }
  // sigma of the variance-exploding form: sqrt((1 - alpha_bar) / alpha_bar).
  double sigma(int64_t t) const { return std::sqrt((1.0 - alpha_bar(t)) / alpha_bar(t)); }

  // x_t = sqrt(a) x0 + sqrt(1 - a) eps over n values.
  void add_noise(const float* x0, const float* eps, int64_t t, int64_t n, float* xt) const;
  // The training target for x0, eps at t (eps itself or v).
  void target(const float* x0, const float* eps, int64_t t, int64_t n, float* out) const;
  // The min-SNR-gamma loss weight at t (1 when gamma <= 0: off).
  double min_snr_weight(int64_t t, double gamma) const;
};

}  // namespace hyperion::diffusion
