#include "diffusion/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/error.h"

namespace hyperion::diffusion {
namespace {

NoiseSchedule sd_schedule(TimestepSpacing spacing, Prediction prediction = Prediction::kEpsilon) {
  NoiseSchedule s = NoiseSchedule::stable_diffusion();
  s.spacing = spacing;
  s.prediction = prediction;
  s.steps_offset = spacing == TimestepSpacing::kLeading ? 1 : 0;
  s.finish();
  return s;
}

std::vector<double> timesteps_of(const Sampler& s) {
  std::vector<double> out;
  for (int64_t i = 0; i < s.steps(); ++i) out.push_back(s.timestep(i));
  return out;
}

// diffusers' timesteps for SD's schedule (num_train_timesteps 1000).
TEST(DiffusionSampler, TimestepsAreSpacedAsDiffusersSpacesThem) {
  const NoiseSchedule leading = sd_schedule(TimestepSpacing::kLeading);
  // DDIM, leading, steps_offset 1, 10 steps: 901, 801, ..., 1.
  EXPECT_EQ(timesteps_of(Sampler(leading, SamplerKind::kDdim, 10, false)),
            (std::vector<double>{901, 801, 701, 601, 501, 401, 301, 201, 101, 1}));
  // DPM-Solver, leading: 11 points of ratio 1000 // 11 = 90, the last dropped.
  EXPECT_EQ(timesteps_of(Sampler(leading, SamplerKind::kDpmSolver2M, 10, false)),
            (std::vector<double>{901, 811, 721, 631, 541, 451, 361, 271, 181, 91}));
  const NoiseSchedule trailing = sd_schedule(TimestepSpacing::kTrailing);
  EXPECT_EQ(timesteps_of(Sampler(trailing, SamplerKind::kEuler, 4, false)),
            (std::vector<double>{999, 749, 499, 249}));
  const NoiseSchedule linspace = sd_schedule(TimestepSpacing::kLinspace);
  // Euler keeps linspace's fractions; DDIM rounds them.
  EXPECT_EQ(timesteps_of(Sampler(linspace, SamplerKind::kEuler, 4, false)),
            (std::vector<double>{999, 666, 333, 0}));
  EXPECT_EQ(timesteps_of(Sampler(linspace, SamplerKind::kEuler, 3, false)),
            (std::vector<double>{999, 499.5, 0}));
  EXPECT_EQ(timesteps_of(Sampler(linspace, SamplerKind::kDdim, 3, false)),
            (std::vector<double>{999, 500, 0}));
}

TEST(DiffusionSampler, EulerSigmasAndInitialNoise) {
  const NoiseSchedule linspace = sd_schedule(TimestepSpacing::kLinspace);
  const Sampler e(linspace, SamplerKind::kEuler, 3, false);
  ASSERT_EQ(e.sigmas().size(), 4u);
  EXPECT_NEAR(e.sigmas()[0], linspace.sigma(999), 1e-12);
  // A fractional timestep interpolates the sigma table linearly.
  EXPECT_NEAR(e.sigmas()[1], 0.5 * (linspace.sigma(499) + linspace.sigma(500)), 1e-12);
  EXPECT_EQ(e.sigmas()[3], 0.0);
  EXPECT_NEAR(e.init_noise_sigma(), linspace.sigma(999), 1e-12);  // linspace: sigma_max
  EXPECT_NEAR(e.input_scale(0), 1 / std::sqrt(std::pow(linspace.sigma(999), 2) + 1), 1e-12);
  const NoiseSchedule leading = sd_schedule(TimestepSpacing::kLeading);
  const Sampler l(leading, SamplerKind::kEuler, 10, false);
  EXPECT_NEAR(l.init_noise_sigma(), std::sqrt(std::pow(leading.sigma(901), 2) + 1), 1e-12);
}

TEST(DiffusionSampler, KarrasSigmasFollowTheirFormula) {
  const std::vector<double> k = karras_sigmas(0.0292, 14.6146, 5);
  ASSERT_EQ(k.size(), 5u);
  EXPECT_NEAR(k.front(), 14.6146, 1e-9);
  EXPECT_NEAR(k.back(), 0.0292, 1e-9);
  const double mid = std::pow((std::pow(14.6146, 1 / 7.0) + std::pow(0.0292, 1 / 7.0)) / 2, 7);
  EXPECT_NEAR(k[2], mid, 1e-9);
  // Euler with Karras sigmas: each timestep is where the schedule's sigma equals it.
  const NoiseSchedule s = sd_schedule(TimestepSpacing::kLeading);
  const Sampler e(s, SamplerKind::kEuler, 8, true);
  for (int64_t i = 0; i < e.steps(); ++i) {
    const double t = e.timestep(i);
    const int64_t lo = std::min<int64_t>(int64_t(t), 998);
    const double w = t - double(lo);
    // log sigma interpolated at t gives back the step's sigma.
    const double ls = (1 - w) * std::log(s.sigma(lo)) + w * std::log(s.sigma(lo + 1));
    EXPECT_NEAR(ls, std::log(e.sigmas()[size_t(i)]), 1e-9) << i;
  }
  // DPM-Solver's Karras range is the whole table, timesteps rounded.
  const Sampler d(s, SamplerKind::kDpmSolver2M, 8, true);
  EXPECT_NEAR(d.sigmas().front(), s.sigma(999), 1e-9);
  EXPECT_NEAR(d.sigmas()[7], s.sigma(0), 1e-9);
  EXPECT_EQ(d.timestep(0), 999);
  EXPECT_EQ(d.timestep(7), 0);
}

// With a perfect denoiser (it knows x0, so its prediction of eps or v is exact) every
// sampler must land on x0, whatever the schedule, prediction type and steps.
TEST(DiffusionSampler, PerfectDenoiserLandsOnTheData) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const int64_t n = 16;
  std::vector<float> x0(n);
  for (float& v : x0) v = normal(rng);
  for (SamplerKind kind : {SamplerKind::kDdim, SamplerKind::kEuler, SamplerKind::kEulerAncestral,
                           SamplerKind::kDpmSolver2M}) {
    for (TimestepSpacing spacing : {TimestepSpacing::kLeading, TimestepSpacing::kTrailing, TimestepSpacing::kLinspace}) {
      for (Prediction pred : {Prediction::kEpsilon, Prediction::kVPrediction}) {
        for (bool karras : {false, true}) {
          if (karras && kind == SamplerKind::kDdim) continue;
          SCOPED_TRACE(testing::Message() << sampler_name(kind) << " " << timestep_spacing_name(spacing)
                                          << " " << prediction_name(pred) << " karras " << karras);
          NoiseSchedule s = sd_schedule(spacing, pred);
          // DDIM with trailing spacing and set_alpha_to_one lands exactly at alpha 1.
          s.set_alpha_to_one = true;
          const Sampler sampler(s, kind, 12, karras);
          std::vector<float> x(n), out(n), noise(n);
          for (float& v : x) v = normal(rng) * float(sampler.init_noise_sigma());
          SamplerState state;
          for (int64_t i = 0; i < sampler.steps(); ++i) {
            // The model sees x * input_scale: alpha x0 + sigma_vp eps in the VP form.
            const double scale = sampler.input_scale(i);
            const double t = sampler.timestep(i);
            // alpha_bar at a fractional t, from the sigma the sampler is at (Euler), or the table.
            double a;
            if (kind == SamplerKind::kDdim) {
              a = s.alpha_bar(int64_t(t));
            } else {
              const double sg = sampler.sigmas()[size_t(i)];
              a = 1.0 / (sg * sg + 1.0);
            }
            for (int64_t j = 0; j < n; ++j) {
              const double xin = x[size_t(j)] * scale;  // = sqrt(a) x0 + sqrt(1 - a) eps
              const double eps = (xin - std::sqrt(a) * x0[size_t(j)]) / std::sqrt(1 - a);
              out[size_t(j)] = float(pred == Prediction::kEpsilon
                                         ? eps
                                         : std::sqrt(a) * eps - std::sqrt(1 - a) * x0[size_t(j)]);
            }
            for (float& v : noise) v = normal(rng);
            sampler.step(i, out.data(), x.data(), n, noise.data(), &state);
          }
          // DDIM's last step lands at alpha_bar(prev) = 1 only when prev < 0 (set_alpha_to_one).
          for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(x[size_t(j)], x0[size_t(j)], 2e-3) << j;
        }
      }
    }
  }
}

TEST(DiffusionSampler, DdimStepIsItsFormula) {
  const NoiseSchedule s = sd_schedule(TimestepSpacing::kLeading);
  const Sampler d(s, SamplerKind::kDdim, 10, false);
  std::vector<float> x = {0.3f, -1.2f}, eps = {0.5f, 0.1f};
  const double a = s.alpha_bar(501), ap = s.alpha_bar(401);
  std::vector<double> want(2);
  for (int j = 0; j < 2; ++j) {
    const double x0 = (x[size_t(j)] - std::sqrt(1 - a) * eps[size_t(j)]) / std::sqrt(a);
    want[size_t(j)] = std::sqrt(ap) * x0 + std::sqrt(1 - ap) * eps[size_t(j)];
  }
  d.step(4, eps.data(), x.data(), 2, nullptr, nullptr);  // step 4 is t = 501
  EXPECT_NEAR(x[0], want[0], 1e-6);
  EXPECT_NEAR(x[1], want[1], 1e-6);
}

TEST(DiffusionSampler, DpmSolverSecondOrderStepIsItsFormula) {
  const NoiseSchedule s = sd_schedule(TimestepSpacing::kLinspace);
  const Sampler d(s, SamplerKind::kDpmSolver2M, 5, false);
  SamplerState state;
  std::vector<float> x = {0.8f}, m0 = {0.2f}, m1 = {-0.4f};
  d.step(0, m0.data(), x.data(), 1, nullptr, &state);  // first order
  const double x1 = x[0];
  auto alpha_sigma = [](double sg) { return std::pair{1 / std::sqrt(sg * sg + 1), sg / std::sqrt(sg * sg + 1)}; };
  const auto [a0, s0] = alpha_sigma(d.sigmas()[0]);
  const auto [a1, s1] = alpha_sigma(d.sigmas()[1]);
  const auto [a2, s2] = alpha_sigma(d.sigmas()[2]);
  const double x0_first = (0.8 - s0 * 0.2) / a0;
  const double l0 = std::log(a0 / s0), l1 = std::log(a1 / s1), l2 = std::log(a2 / s2);
  EXPECT_NEAR(x1, s1 / s0 * 0.8 - a1 * (std::exp(-(l1 - l0)) - 1) * x0_first, 1e-5);
  d.step(1, m1.data(), x.data(), 1, nullptr, &state);  // second order
  const double x0_second = (x1 - s1 * -0.4) / a1;
  const double h = l2 - l1, r0 = (l1 - l0) / h;
  const double d1 = (x0_second - x0_first) / r0;
  const double want = s2 / s1 * x1 - a2 * (std::exp(-h) - 1) * x0_second - 0.5 * a2 * (std::exp(-h) - 1) * d1;
  EXPECT_NEAR(x[0], want, 1e-5);
}

TEST(DiffusionSampler, GuidanceAndNames) {
  const std::vector<float> u = {1, 2}, c = {3, 1};
  std::vector<float> out(2);
  classifier_free_guidance(u.data(), c.data(), 7.5, 2, out.data());
  EXPECT_FLOAT_EQ(out[0], 1 + 7.5f * 2);
  EXPECT_FLOAT_EQ(out[1], 2 - 7.5f);
  SamplerKind k;
  ASSERT_TRUE(parse_sampler("dpmpp_2m", &k));
  EXPECT_EQ(k, SamplerKind::kDpmSolver2M);
  EXPECT_FALSE(parse_sampler("lms", &k));
  EXPECT_EQ(sampler_for_class("EulerDiscreteScheduler", SamplerKind::kDdim), SamplerKind::kEuler);
  EXPECT_EQ(sampler_for_class("PNDMScheduler", SamplerKind::kDpmSolver2M), SamplerKind::kDpmSolver2M);
  const NoiseSchedule s = NoiseSchedule::stable_diffusion();
  try {
    const Sampler bad(s, SamplerKind::kEuler, 0, false);
    FAIL() << bad.steps();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("steps 0 must be in [1, 1000]"), std::string::npos);
  }
}

}  // namespace
}  // namespace hyperion::diffusion
