#include "diffusion/noise_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"

namespace hyperion::diffusion {
namespace {

std::string error_of(const std::string& json) {
  try {
    NoiseSchedule::from_json(json, "scheduler/scheduler_config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Stable Diffusion 1.5's scheduler_config.json (PNDMScheduler, as the hub ships it).
const char* kSd15 = R"({
  "_class_name": "PNDMScheduler", "_diffusers_version": "0.6.0",
  "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085,
  "num_train_timesteps": 1000, "set_alpha_to_one": false, "skip_prk_steps": true,
  "steps_offset": 1, "trained_betas": null, "clip_sample": false})";

TEST(NoiseSchedule, StableDiffusionSigmasAreTheKnownOnes) {
  const NoiseSchedule s = NoiseSchedule::from_json(kSd15, "sd15");
  EXPECT_EQ(s.class_name, "PNDMScheduler");
  EXPECT_EQ(s.steps_offset, 1);
  EXPECT_FALSE(s.set_alpha_to_one);
  ASSERT_EQ(s.alphas_cumprod.size(), 1000u);
  EXPECT_NEAR(s.alpha_bar(0), 1.0 - 0.00085, 1e-9);
  // k-diffusion's well-known sigma range of SD: 0.0292 .. 14.6146.
  EXPECT_NEAR(s.sigma(0), 0.0291675, 1e-6);
  EXPECT_NEAR(s.sigma(999), 14.6146, 1e-4);
}

TEST(NoiseSchedule, BetasFollowTheirFormulas) {
  for (const char* name : {"linear", "scaled_linear", "squaredcos_cap_v2"}) {
    SCOPED_TRACE(name);
    const NoiseSchedule s = NoiseSchedule::from_json(
        std::string(R"({"beta_schedule": ")") + name + R"(", "num_train_timesteps": 10, "beta_start": 0.001, "beta_end": 0.02})",
        "x");
    double prod = 1.0;
    for (int t = 0; t < 10; ++t) {
      double beta;
      if (std::string(name) == "linear") {
        beta = 0.001 + (0.02 - 0.001) * t / 9.0;
      } else if (std::string(name) == "scaled_linear") {
        const double r = std::sqrt(0.001) + (std::sqrt(0.02) - std::sqrt(0.001)) * t / 9.0;
        beta = r * r;
      } else {
        auto f = [](double u) { return std::pow(std::cos((u + 0.008) / 1.008 * M_PI / 2), 2); };
        beta = std::min(1 - f((t + 1) / 10.0) / f(t / 10.0), 0.999);
      }
      prod *= 1 - beta;
      // The betas are held in f32 as diffusers holds them: 1 - beta loses up to ~6e-8 / (1 -
      // beta) relatively, large only for the cosine schedule's last betas (near its 0.999 cap).
      EXPECT_NEAR(s.alpha_bar(t), prod, 2e-5 * prod) << t;
    }
  }
}

TEST(NoiseSchedule, NoisingTargetsAndMinSnrWeights) {
  NoiseSchedule s = NoiseSchedule::stable_diffusion();
  const std::vector<float> x0 = {0.5f, -1.0f, 2.0f}, eps = {0.1f, 0.3f, -0.7f};
  std::vector<float> xt(3), v(3);
  const int64_t t = 500;
  const double a = s.alpha_bar(t);
  s.add_noise(x0.data(), eps.data(), t, 3, xt.data());
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(xt[i], std::sqrt(a) * x0[i] + std::sqrt(1 - a) * eps[i], 1e-6);
  s.target(x0.data(), eps.data(), t, 3, v.data());
  EXPECT_EQ(v, eps);
  s.prediction = Prediction::kVPrediction;
  s.target(x0.data(), eps.data(), t, 3, v.data());
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(v[i], std::sqrt(a) * eps[i] - std::sqrt(1 - a) * x0[i], 1e-6);
  // Min-SNR-5: high-SNR (small t) steps are down-weighted, low-SNR ones keep weight 1 (eps).
  s.prediction = Prediction::kEpsilon;
  EXPECT_NEAR(s.min_snr_weight(10, 5.0), 5.0 / s.snr(10), 1e-12);
  EXPECT_DOUBLE_EQ(s.min_snr_weight(900, 5.0), 1.0);
  EXPECT_DOUBLE_EQ(s.min_snr_weight(10, 0.0), 1.0);
  s.prediction = Prediction::kVPrediction;
  EXPECT_NEAR(s.min_snr_weight(900, 5.0), s.snr(900) / (s.snr(900) + 1), 1e-12);
}

TEST(NoiseSchedule, JsonRoundTrips) {
  NoiseSchedule s = NoiseSchedule::from_json(kSd15, "sd15");
  s.prediction = Prediction::kVPrediction;
  s.spacing = TimestepSpacing::kTrailing;
  const NoiseSchedule back = NoiseSchedule::from_json(s.to_json(), "round trip");
  EXPECT_EQ(back.class_name, s.class_name);
  EXPECT_EQ(back.prediction, Prediction::kVPrediction);
  EXPECT_EQ(back.spacing, TimestepSpacing::kTrailing);
  EXPECT_EQ(back.steps_offset, 1);
  EXPECT_EQ(back.alphas_cumprod, s.alphas_cumprod);
}

TEST(NoiseSchedule, RefusesWhatItCannotHonourNamingFileAndKey) {
  EXPECT_EQ(error_of(R"({"prediction_type": "sample"})"),
            "scheduler/scheduler_config.json: prediction_type \"sample\" is not supported (epsilon, "
            "v_prediction)");
  EXPECT_NE(error_of(R"({"beta_schedule": "sigmoid"})").find("beta_schedule \"sigmoid\""), std::string::npos);
  EXPECT_NE(error_of(R"({"timestep_spacing": "karras"})").find("timestep_spacing"), std::string::npos);
  EXPECT_NE(error_of(R"({"rescale_betas_zero_snr": true})").find("rescale_betas_zero_snr"), std::string::npos);
  EXPECT_NE(error_of(R"({"num_train_timesteps": "many"})").find("num_train_timesteps must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"trained_betas": [0.1, 0.2]})").find("trained_betas"), std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("must hold a JSON object"), std::string::npos);
  EXPECT_NE(error_of("{").find("not valid JSON"), std::string::npos);
}

}  // namespace
}  // namespace hyperion::diffusion
