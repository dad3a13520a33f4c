#include "train/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "base/error.h"

namespace hyperion {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected hyperion::Error";
  return "";
}

const double kPi = std::acos(-1.0);

LrSchedule make(ScheduleKind kind, double peak, int64_t warmup, int64_t total, double final_frac) {
  LrSchedule s;
  s.kind = kind;
  s.peak_lr = peak;
  s.warmup_steps = warmup;
  s.total_steps = total;
  s.final_lr_fraction = final_frac;
  return s;
}

// Independent restatement of the cosine formula: after warmup W of T steps.
double expected_cosine(double peak, double final_frac, int64_t w, int64_t t, int64_t step) {
  if (step < w) return peak * double(step + 1) / double(w);
  const double fin = peak * final_frac;
  double p = t - 1 == w ? 1.0 : double(step - w) / double(t - 1 - w);
  if (p > 1.0) p = 1.0;
  return fin + (peak - fin) * 0.5 * (1.0 + std::cos(kPi * p));
}

TEST(Schedule, ParseNamesAndErrorListsValidOnes) {
  EXPECT_EQ(parse_schedule("constant", "lr_schedule"), ScheduleKind::kConstant);
  EXPECT_EQ(parse_schedule("cosine", "lr_schedule"), ScheduleKind::kCosine);
  EXPECT_EQ(parse_schedule("wsd", "lr_schedule"), ScheduleKind::kWsd);
  for (ScheduleKind k : {ScheduleKind::kConstant, ScheduleKind::kCosine, ScheduleKind::kWsd})
    EXPECT_EQ(parse_schedule(schedule_name(k), "x"), k);
  const std::string msg = error_of([] { parse_schedule("linear", "lr_schedule"); });
  EXPECT_NE(msg.find("lr_schedule"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'linear'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("constant, cosine, wsd"), std::string::npos) << msg;
  EXPECT_THROW(parse_schedule("Cosine", "k"), Error);  // case-sensitive, like the config
}

TEST(Schedule, WarmupStartsAboveZeroAndEndsAtPeak) {
  for (ScheduleKind kind : {ScheduleKind::kConstant, ScheduleKind::kCosine, ScheduleKind::kWsd}) {
    LrSchedule s = make(kind, 1e-3, 10, 100, 0.1);
    EXPECT_DOUBLE_EQ(s.lr(0), 1e-3 / 10);
    EXPECT_DOUBLE_EQ(s.lr(4), 1e-3 * 5 / 10);
    EXPECT_DOUBLE_EQ(s.lr(9), 1e-3);
    for (int64_t i = 1; i < 10; ++i) EXPECT_GT(s.lr(i), s.lr(i - 1));
  }
}

TEST(Schedule, ConstantStaysAtPeak) {
  LrSchedule s = make(ScheduleKind::kConstant, 2e-4, 3, 50, 0.1);
  for (int64_t i = 3; i < 60; ++i) EXPECT_DOUBLE_EQ(s.lr(i), 2e-4) << i;
  s.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(s.lr(0), 2e-4);
}

TEST(Schedule, CosineMatchesFormulaAndDecaysMonotonically) {
  for (int64_t w : {0, 1, 7, 20}) {  // 20 of 21: one post-warmup step
    for (int64_t t : {21, 100, 1001}) {
      LrSchedule s = make(ScheduleKind::kCosine, 3e-4, w, t, 0.1);
      for (int64_t i = 0; i < t + 5; ++i)
        EXPECT_NEAR(s.lr(i), expected_cosine(3e-4, 0.1, w, t, i), 1e-15)
            << w << " " << t << " " << i;
      if (w < t - 1) {
        EXPECT_DOUBLE_EQ(s.lr(w), 3e-4);  // decay starts at peak
      }
      EXPECT_NEAR(s.lr(t - 1), 3e-5, 1e-18);    // reaches final at the last step
      EXPECT_NEAR(s.lr(t + 100), 3e-5, 1e-18);  // and stays there
      for (int64_t i = w + 1; i < t; ++i) EXPECT_LT(s.lr(i), s.lr(i - 1)) << i;
    }
  }
  // Midpoint of the decay: exactly halfway between peak and final.
  LrSchedule s = make(ScheduleKind::kCosine, 1.0, 10, 111, 0.2);
  EXPECT_NEAR(s.lr(60), 0.6, 1e-12);
  // Quarter point: final + (peak - final) * 0.5 * (1 + cos(pi/4)).
  EXPECT_NEAR(s.lr(35), 0.2 + 0.8 * 0.5 * (1 + std::sqrt(0.5)), 1e-12);
}

TEST(Schedule, CosineEdgeCases) {
  // A single step: it is the last step, so lr = final.
  EXPECT_DOUBLE_EQ(make(ScheduleKind::kCosine, 1.0, 0, 1, 0.1).lr(0), 0.1);
  // One step after warmup: the last step, at final.
  LrSchedule s = make(ScheduleKind::kCosine, 1.0, 4, 5, 0.25);
  EXPECT_DOUBLE_EQ(s.lr(3), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(4), 0.25);
  // Warmup only: peak at the end and beyond.
  s = make(ScheduleKind::kCosine, 1.0, 5, 5, 0.25);
  EXPECT_DOUBLE_EQ(s.lr(4), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0);
  // final_lr_fraction 0 decays to exactly 0.
  EXPECT_DOUBLE_EQ(make(ScheduleKind::kCosine, 1.0, 0, 10, 0.0).lr(9), 0.0);
}

TEST(Schedule, WsdPlateauThenDecay) {
  for (const char* shape : {"linear", "cosine"}) {
    LrSchedule s = make(ScheduleKind::kWsd, 1e-3, 10, 200, 0.1);
    s.wsd_decay_fraction = 0.2;  // 40 decay steps: 160 .. 199
    s.wsd_decay_shape = shape;
    EXPECT_EQ(s.wsd_decay_steps(), 40);
    for (int64_t i = 9; i <= 160; ++i) EXPECT_DOUBLE_EQ(s.lr(i), 1e-3) << shape << " " << i;
    EXPECT_LT(s.lr(161), 1e-3);
    for (int64_t i = 161; i < 200; ++i) {
      EXPECT_LT(s.lr(i), s.lr(i - 1)) << shape << " " << i;
      const double p = double(i - 160) / 39.0;
      const double expect = std::string(shape) == "linear"
                                ? 1e-3 - (1e-3 - 1e-4) * p
                                : 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + std::cos(kPi * p));
      EXPECT_NEAR(s.lr(i), expect, 1e-15) << shape << " " << i;
    }
    EXPECT_NEAR(s.lr(199), 1e-4, 1e-18);
    EXPECT_NEAR(s.lr(250), 1e-4, 1e-18);
  }
  // Rounding of the decay length and the degenerate lengths.
  LrSchedule s = make(ScheduleKind::kWsd, 1.0, 0, 10, 0.5);
  s.wsd_decay_fraction = 0.14;  // 1.4 -> 1 step: only the last step is at final
  EXPECT_EQ(s.wsd_decay_steps(), 1);
  EXPECT_DOUBLE_EQ(s.lr(8), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(9), 0.5);
  s.wsd_decay_fraction = 0.04;  // 0.4 -> 0 steps: stays at peak
  EXPECT_EQ(s.wsd_decay_steps(), 0);
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0);
  s.wsd_decay_fraction = 1.0;  // decays over the whole run
  EXPECT_DOUBLE_EQ(s.lr(0), 1.0);
  EXPECT_NEAR(s.lr(3), 1.0 - 0.5 * 3.0 / 9.0, 1e-15);
}

TEST(Schedule, ValidationNamesTheField) {
  struct Case {
    std::function<void(LrSchedule&)> edit;
    const char* field;
  };
  const Case cases[] = {
      {[](LrSchedule& s) { s.total_steps = 0; }, "total_steps"},
      {[](LrSchedule& s) { s.total_steps = -5; }, "total_steps"},
      {[](LrSchedule& s) { s.warmup_steps = -1; }, "warmup_steps"},
      {[](LrSchedule& s) { s.warmup_steps = 101; }, "warmup_steps"},
      {[](LrSchedule& s) { s.peak_lr = 0; }, "peak_lr"},
      {[](LrSchedule& s) { s.peak_lr = -1e-3; }, "peak_lr"},
      {[](LrSchedule& s) { s.peak_lr = NAN; }, "peak_lr"},
      {[](LrSchedule& s) { s.peak_lr = INFINITY; }, "peak_lr"},
      {[](LrSchedule& s) { s.final_lr_fraction = 1.5; }, "final_lr_fraction"},
      {[](LrSchedule& s) { s.final_lr_fraction = -0.1; }, "final_lr_fraction"},
      {[](LrSchedule& s) { s.final_lr_fraction = NAN; }, "final_lr_fraction"},
      {[](LrSchedule& s) { s.wsd_decay_fraction = 1.01; }, "wsd_decay_fraction"},
      {[](LrSchedule& s) { s.wsd_decay_shape = "exp"; }, "wsd_decay_shape"},
      {[](LrSchedule& s) {
         s.kind = ScheduleKind::kWsd;
         s.warmup_steps = 60;
         s.wsd_decay_fraction = 0.5;
       },
       "wsd_decay_fraction"},
  };
  for (const Case& c : cases) {
    LrSchedule s = make(ScheduleKind::kCosine, 1e-3, 10, 100, 0.1);
    EXPECT_NO_THROW(s.validate());
    c.edit(s);
    const std::string msg = error_of([&] { s.validate(); });
    EXPECT_NE(msg.find(c.field), std::string::npos) << c.field << ": " << msg;
    EXPECT_NE(msg.find("lr schedule"), std::string::npos) << msg;
    EXPECT_THROW(s.lr(50), Error) << c.field;  // lr() validates too
  }
  LrSchedule ok = make(ScheduleKind::kCosine, 1e-3, 10, 100, 0.1);
  const std::string msg = error_of([&] { ok.lr(-1); });
  EXPECT_NE(msg.find("step"), std::string::npos) << msg;
  // Boundaries that are valid.
  ok.warmup_steps = 100;
  ok.final_lr_fraction = 1.0;
  ok.wsd_decay_fraction = 0.0;
  EXPECT_NO_THROW(ok.validate());
}

}  // namespace
}  // namespace hyperion
