#include "diffusion/sampler.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace hyperion::diffusion {

const char* sampler_name(SamplerKind k) {
  switch (k) {
    case SamplerKind::kDdim:
      return "ddim";
    case SamplerKind::kEuler:
      return "euler";
    case SamplerKind::kEulerAncestral:
      return "euler_a";
    case SamplerKind::kDpmSolver2M:
      return "dpm++2m";
  }
  return "?";
}

bool parse_sampler(const std::string& name, SamplerKind* out) {
  if (name == "ddim") *out = SamplerKind::kDdim;
  else if (name == "euler") *out = SamplerKind::kEuler;
  else if (name == "euler_a" || name == "euler_ancestral") *out = SamplerKind::kEulerAncestral;
  else if (name == "dpm++2m" || name == "dpmpp_2m") *out = SamplerKind::kDpmSolver2M;
  else return false;
  return true;
}

SamplerKind sampler_for_class(const std::string& class_name, SamplerKind fallback) {
  if (class_name == "DDIMScheduler") return SamplerKind::kDdim;
  if (class_name == "EulerDiscreteScheduler") return SamplerKind::kEuler;
  if (class_name == "EulerAncestralDiscreteScheduler") return SamplerKind::kEulerAncestral;
  if (class_name == "DPMSolverMultistepScheduler") return SamplerKind::kDpmSolver2M;
  return fallback;
}

std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int64_t steps) {
  const double rho = 7.0;
  const double min_inv = std::pow(sigma_min, 1.0 / rho), max_inv = std::pow(sigma_max, 1.0 / rho);
  std::vector<double> out(static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i) {
    const double ramp = steps > 1 ? double(i) / double(steps - 1) : 0.0;
    out[size_t(i)] = std::pow(max_inv + ramp * (min_inv - max_inv), rho);
  }
  return out;
}

namespace {

// np.interp(t, arange(T), table).
double interp(double t, const std::vector<double>& table) {
  if (t <= 0) return table.front();
  const double last = double(table.size() - 1);
  if (t >= last) return table.back();
  const size_t lo = size_t(std::floor(t));
  const double w = t - double(lo);
  return table[lo] * (1.0 - w) + table[lo + 1] * w;
}

// diffusers' _sigma_to_t: the fractional timestep of sigma, interpolating log sigma.
double sigma_to_t(double sigma, const std::vector<double>& log_sigmas) {
  const double ls = std::log(std::max(sigma, 1e-10));
  // The last index whose log sigma is <= ls (the table ascends with t), at most T - 2.
  int64_t low = -1;
  for (size_t i = 0; i < log_sigmas.size(); ++i)
    if (ls - log_sigmas[i] >= 0) low = int64_t(i);
  low = std::clamp<int64_t>(low, 0, int64_t(log_sigmas.size()) - 2);
  const double l = log_sigmas[size_t(low)], h = log_sigmas[size_t(low + 1)];
  const double w = std::clamp((l - ls) / (l - h), 0.0, 1.0);
  return (1.0 - w) * double(low) + w * double(low + 1);
}

}  // namespace

Sampler::Sampler(const NoiseSchedule& schedule, SamplerKind kind, int64_t steps, bool karras)
    : schedule_(&schedule), kind_(kind) {
  const int64_t T = schedule.train_timesteps;
  HYP_CHECK(steps >= 1 && steps <= T, "sampler: steps {} must be in [1, {}] (num_train_timesteps)",
            steps, T);
  HYP_CHECK(!karras || kind != SamplerKind::kDdim, "sampler: ddim has no Karras sigmas");
  const bool dpm = kind == SamplerKind::kDpmSolver2M;
  // Timesteps, descending, as each diffusers class spaces them.
  std::vector<double> ts;
  switch (schedule.spacing) {
    case TimestepSpacing::kLeading: {
      // DPM-Solver spaces N + 1 points and drops the last.
      const int64_t ratio = T / (dpm ? steps + 1 : steps);
      for (int64_t i = steps - (dpm ? 0 : 1); i >= (dpm ? 1 : 0); --i)
        ts.push_back(double(i * ratio + schedule.steps_offset));
      break;
    }
    case TimestepSpacing::kTrailing: {
      // np.arange(T, 0, -T / steps), rounded, minus one.
      const double ratio = double(T) / double(steps);
      for (int64_t i = 0; i < steps; ++i) ts.push_back(std::round(double(T) - double(i) * ratio) - 1.0);
      break;
    }
    case TimestepSpacing::kLinspace: {
      const int64_t points = dpm ? steps + 1 : steps;
      for (int64_t i = points - 1; i >= (dpm ? 1 : 0); --i) {
        const double t = points > 1 ? double(T - 1) * double(i) / double(points - 1) : 0.0;
        // Euler keeps the fractional values; DDIM and DPM-Solver round them.
        ts.push_back(kind == SamplerKind::kEuler || kind == SamplerKind::kEulerAncestral ? t
                                                                                          : std::round(t));
      }
      break;
    }
  }
  HYP_CHECK(int64_t(ts.size()) == steps, "sampler: {} timesteps spaced for {} steps", ts.size(), steps);
  for (double t : ts)
    HYP_CHECK(t >= 0 && t < double(T), "sampler: timestep {} outside [0, {}) (steps_offset {} too large for {} steps?)",
              t, T, schedule.steps_offset, steps);
  timesteps_ = ts;
  if (kind == SamplerKind::kDdim) return;

  std::vector<double> full(static_cast<size_t>(T)), log_full(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    full[size_t(t)] = schedule.sigma(t);
    log_full[size_t(t)] = std::log(full[size_t(t)]);
  }
  if (karras) {
    double lo, hi;
    if (dpm) {
      lo = full.front();
      hi = full.back();
    } else {
      lo = interp(ts.back(), full);
      hi = interp(ts.front(), full);
    }
    sigmas_ = karras_sigmas(lo, hi, steps);
    for (int64_t i = 0; i < steps; ++i) {
      const double t = sigma_to_t(sigmas_[size_t(i)], log_full);
      timesteps_[size_t(i)] = dpm ? std::round(t) : t;
    }
  } else {
    for (double t : ts) sigmas_.push_back(interp(t, full));
  }
  sigmas_.push_back(0.0);
  const double sigma_max = *std::max_element(sigmas_.begin(), sigmas_.end());
  if (dpm)
    init_noise_sigma_ = 1.0;
  else if (schedule.spacing == TimestepSpacing::kLeading)
    init_noise_sigma_ = std::sqrt(sigma_max * sigma_max + 1.0);
  else
    init_noise_sigma_ = sigma_max;
}

double Sampler::input_scale(int64_t i) const {
  if (kind_ == SamplerKind::kEuler || kind_ == SamplerKind::kEulerAncestral) {
    const double s = sigmas_[size_t(i)];
    return 1.0 / std::sqrt(s * s + 1.0);
  }
  return 1.0;
}

void Sampler::step(int64_t i, const float* model_out, float* x, int64_t n, const float* noise,
                   SamplerState* state) const {
  HYP_CHECK(i >= 0 && i < steps(), "sampler: step {} outside [0, {})", i, steps());
  const NoiseSchedule& s = *schedule_;
  const bool v_pred = s.prediction == Prediction::kVPrediction;
  switch (kind_) {
    case SamplerKind::kDdim: {
      const int64_t t = int64_t(timesteps_[size_t(i)]);
      const int64_t prev = t - s.train_timesteps / steps();
      const double a = s.alpha_bar(t);
      const double a_prev = prev >= 0 ? s.alpha_bar(prev) : (s.set_alpha_to_one ? 1.0 : s.alpha_bar(0));
      const double sa = std::sqrt(a), sb = std::sqrt(1.0 - a);
      const double spa = std::sqrt(a_prev), spb = std::sqrt(1.0 - a_prev);
      for (int64_t j = 0; j < n; ++j) {
        const double m = model_out[j], xj = x[j];
        const double x0 = v_pred ? sa * xj - sb * m : (xj - sb * m) / sa;
        const double eps = v_pred ? sa * m + sb * xj : m;
        x[j] = float(spa * x0 + spb * eps);
      }
      return;
    }
    case SamplerKind::kEuler:
    case SamplerKind::kEulerAncestral: {
      const double sigma = sigmas_[size_t(i)], next = sigmas_[size_t(i + 1)];
      double target = next, up = 0.0;
      if (kind_ == SamplerKind::kEulerAncestral) {
        up = std::sqrt(std::max(0.0, next * next * (sigma * sigma - next * next) / (sigma * sigma)));
        target = std::sqrt(std::max(0.0, next * next - up * up));
        HYP_CHECK(noise != nullptr || up == 0.0, "sampler: euler_a needs noise at step {}", i);
      }
      const double dt = target - sigma;
      const double c_out = -sigma / std::sqrt(sigma * sigma + 1.0), c_skip = 1.0 / (sigma * sigma + 1.0);
      for (int64_t j = 0; j < n; ++j) {
        const double m = model_out[j], xj = x[j];
        const double x0 = v_pred ? m * c_out + xj * c_skip : xj - sigma * m;
        double out = xj + (xj - x0) / sigma * dt;
        if (up > 0.0) out += double(noise[j]) * up;
        x[j] = float(out);
      }
      return;
    }
    case SamplerKind::kDpmSolver2M: {
      auto alpha_of = [](double sg) { return 1.0 / std::sqrt(sg * sg + 1.0); };
      const double sg = sigmas_[size_t(i)], sg_next = sigmas_[size_t(i + 1)];
      const double alpha_s = alpha_of(sg), sigma_s = sg * alpha_s;
      std::vector<float> x0(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        const double m = model_out[j], xj = x[j];
        x0[size_t(j)] = float(v_pred ? alpha_s * xj - sigma_s * m : (xj - sigma_s * m) / alpha_s);
      }
      const bool last = i == steps() - 1;
      if (sg_next == 0.0) {
        // lambda_t = +inf: the update lands on the prediction itself.
        std::copy(x0.begin(), x0.end(), x);
      } else {
        const double alpha_t = alpha_of(sg_next), sigma_t = sg_next * alpha_t;
        const double lambda_t = std::log(alpha_t) - std::log(sigma_t);
        const double lambda_s = std::log(alpha_s) - std::log(sigma_s);
        const double h = lambda_t - lambda_s;
        const double ratio = sigma_t / sigma_s, phi = alpha_t * (std::exp(-h) - 1.0);
        const bool second = state && state->has_prev && !last && i > 0;
        if (second) {
          const double sp = sigmas_[size_t(i - 1)];
          const double alpha_p = alpha_of(sp), sigma_p = sp * alpha_p;
          const double lambda_p = std::log(alpha_p) - std::log(sigma_p);
          const double r0 = (lambda_s - lambda_p) / h;
          for (int64_t j = 0; j < n; ++j) {
            const double d0 = x0[size_t(j)], d1 = (d0 - state->prev_x0[size_t(j)]) / r0;
            x[j] = float(ratio * x[j] - phi * d0 - 0.5 * phi * d1);
          }
        } else {
          for (int64_t j = 0; j < n; ++j) x[j] = float(ratio * x[j] - phi * x0[size_t(j)]);
        }
      }
      if (state) {
        state->prev_x0 = std::move(x0);
        state->has_prev = true;
      }
      return;
    }
  }
}

void classifier_free_guidance(const float* uncond, const float* cond, double scale, int64_t n,
                              float* out) {
  const float g = float(scale);
  for (int64_t i = 0; i < n; ++i) out[i] = uncond[i] + g * (cond[i] - uncond[i]);
}

}  // namespace hyperion::diffusion
