#include "diffusion/noise_schedule.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "diffusion/json_fields.h"

namespace hyperion::diffusion {

const char* beta_schedule_name(BetaSchedule b) {
  switch (b) {
    case BetaSchedule::kLinear:
      return "linear";
    case BetaSchedule::kScaledLinear:
      return "scaled_linear";
    case BetaSchedule::kSquaredCosCapV2:
      return "squaredcos_cap_v2";
  }
  return "?";
}

const char* prediction_name(Prediction p) {
  return p == Prediction::kEpsilon ? "epsilon" : "v_prediction";
}

const char* timestep_spacing_name(TimestepSpacing s) {
  switch (s) {
    case TimestepSpacing::kLeading:
      return "leading";
    case TimestepSpacing::kTrailing:
      return "trailing";
    case TimestepSpacing::kLinspace:
      return "linspace";
  }
  return "?";
}

NoiseSchedule NoiseSchedule::stable_diffusion() {
  NoiseSchedule s;
  s.finish();
  return s;
}

NoiseSchedule NoiseSchedule::from_json(const std::string& text, const std::string& origin) {
  const JsonFields f(text, origin);
  NoiseSchedule s;
  s.class_name = f.string("_class_name", s.class_name);
  s.train_timesteps = f.integer("num_train_timesteps", 1000);
  if (s.train_timesteps < 2 || s.train_timesteps > 100000)
    f.refuse("num_train_timesteps", "must be in [2, 100000], got " + std::to_string(s.train_timesteps));
  s.beta_start = f.number("beta_start", 0.0001);
  s.beta_end = f.number("beta_end", 0.02);
  if (!(s.beta_start > 0 && s.beta_start < 1 && s.beta_end > 0 && s.beta_end < 1))
    f.refuse("beta_start", "and beta_end must lie in (0, 1)");
  if (f.has("trained_betas")) f.refuse("trained_betas", "(an explicit beta list) is not supported");
  const std::string schedule = f.string("beta_schedule", "linear");
  if (schedule == "linear") s.beta_schedule = BetaSchedule::kLinear;
  else if (schedule == "scaled_linear") s.beta_schedule = BetaSchedule::kScaledLinear;
  else if (schedule == "squaredcos_cap_v2") s.beta_schedule = BetaSchedule::kSquaredCosCapV2;
  else f.refuse("beta_schedule", "\"" + schedule + "\" is not supported (linear, scaled_linear, squaredcos_cap_v2)");
  const std::string pred = f.string("prediction_type", "epsilon");
  if (pred == "epsilon") s.prediction = Prediction::kEpsilon;
  else if (pred == "v_prediction") s.prediction = Prediction::kVPrediction;
  else f.refuse("prediction_type", "\"" + pred + "\" is not supported (epsilon, v_prediction)");
  const std::string spacing = f.string("timestep_spacing", "leading");
  if (spacing == "leading") s.spacing = TimestepSpacing::kLeading;
  else if (spacing == "trailing") s.spacing = TimestepSpacing::kTrailing;
  else if (spacing == "linspace") s.spacing = TimestepSpacing::kLinspace;
  else f.refuse("timestep_spacing", "\"" + spacing + "\" is not supported (leading, trailing, linspace)");
  s.steps_offset = f.integer("steps_offset", 0);
  if (s.steps_offset < 0 || s.steps_offset >= s.train_timesteps)
    f.refuse("steps_offset", "must be in [0, num_train_timesteps)");
  s.set_alpha_to_one = f.boolean("set_alpha_to_one", true);
  s.karras_sigmas = f.boolean("use_karras_sigmas", false);
  if (f.boolean("rescale_betas_zero_snr", false))
    f.refuse("rescale_betas_zero_snr", "true is not supported");
  if (f.boolean("thresholding", false)) f.refuse("thresholding", "true is not supported");
  s.finish();
  return s;
}

std::string NoiseSchedule::to_json() const {
  nlohmann::ordered_json j;
  j["_class_name"] = class_name;
  j["_diffusers_version"] = "0.31.0";
  j["beta_end"] = beta_end;
  j["beta_schedule"] = beta_schedule_name(beta_schedule);
  j["beta_start"] = beta_start;
  j["clip_sample"] = false;
  j["num_train_timesteps"] = train_timesteps;
  j["prediction_type"] = prediction_name(prediction);
  j["set_alpha_to_one"] = set_alpha_to_one;
  j["steps_offset"] = steps_offset;
  j["timestep_spacing"] = timestep_spacing_name(spacing);
  j["use_karras_sigmas"] = karras_sigmas;
  return j.dump(2) + "\n";
}

void NoiseSchedule::finish() {
  const int64_t T = train_timesteps;
  std::vector<double> betas(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) {
    const double f = T > 1 ? double(i) / double(T - 1) : 0.0;
    double b = 0.0;
    switch (beta_schedule) {
      case BetaSchedule::kLinear:
        b = beta_start + f * (beta_end - beta_start);
        break;
      case BetaSchedule::kScaledLinear: {
        const double r = std::sqrt(beta_start) + f * (std::sqrt(beta_end) - std::sqrt(beta_start));
        b = r * r;
        break;
      }
      case BetaSchedule::kSquaredCosCapV2: {
        auto alpha_bar_fn = [](double t) {
          const double c = std::cos((t + 0.008) / 1.008 * M_PI / 2);
          return c * c;
        };
        b = std::min(1.0 - alpha_bar_fn(double(i + 1) / double(T)) / alpha_bar_fn(double(i) / double(T)),
                     0.999);
        break;
      }
    }
    // diffusers holds the betas in f32.
    betas[size_t(i)] = double(float(b));
  }
  alphas_cumprod.resize(size_t(T));
  double prod = 1.0;
  for (int64_t i = 0; i < T; ++i) {
    prod *= 1.0 - betas[size_t(i)];
    alphas_cumprod[size_t(i)] = prod;
  }
}

void NoiseSchedule::add_noise(const float* x0, const float* eps, int64_t t, int64_t n,
                              float* xt) const {
  const float a = float(std::sqrt(alpha_bar(t))), b = float(std::sqrt(1.0 - alpha_bar(t)));
  for (int64_t i = 0; i < n; ++i) xt[i] = a * x0[i] + b * eps[i];
}

void NoiseSchedule::target(const float* x0, const float* eps, int64_t t, int64_t n,
                           float* out) const {
  if (prediction == Prediction::kEpsilon) {
    std::copy(eps, eps + n, out);
    return;
  }
  const float a = float(std::sqrt(alpha_bar(t))), b = float(std::sqrt(1.0 - alpha_bar(t)));
  for (int64_t i = 0; i < n; ++i) out[i] = a * eps[i] - b * x0[i];
}

double NoiseSchedule::min_snr_weight(int64_t t, double gamma) const {
  if (gamma <= 0) return 1.0;
  const double s = snr(t);
  return std::min(s, gamma) / (prediction == Prediction::kEpsilon ? s : s + 1.0);
}

}  // namespace hyperion::diffusion
