#include "train/schedule.h"

#include <cmath>
#include <numbers>

#include "base/error.h"

namespace hyperion {

ScheduleKind parse_schedule(const std::string& name, const std::string& key) {
  if (name == "constant") return ScheduleKind::kConstant;
  if (name == "cosine") return ScheduleKind::kCosine;
  if (name == "wsd") return ScheduleKind::kWsd;
  fail("{}: unknown learning-rate schedule '{}' (valid: constant, cosine, wsd)", key, name);
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kConstant:
      return "constant";
    case ScheduleKind::kCosine:
      return "cosine";
    case ScheduleKind::kWsd:
      return "wsd";
  }
  return "unknown";
}

namespace {

bool is_fraction(double v) {
  return v >= 0.0 && v <= 1.0;  // false for NaN
}

// 0.5 * (1 + cos(pi * p)): 1 at p = 0, 0 at p = 1.
double cosine_factor(double p) {
  return 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

// Position of `step` in a decay phase spanning steps first .. last (inclusive): 0 at
// first, 1 at last and beyond.
double progress(int64_t step, int64_t first, int64_t last) {
  if (step >= last) return 1.0;
  return static_cast<double>(step - first) / static_cast<double>(last - first);
}

}  // namespace

int64_t LrSchedule::wsd_decay_steps() const {
  if (kind != ScheduleKind::kWsd) return 0;
  return std::llround(wsd_decay_fraction * static_cast<double>(total_steps));
}

void LrSchedule::validate() const {
  const char* ctx = "lr schedule";
  HYP_CHECK(total_steps >= 1, "{}: total_steps must be >= 1, got {}", ctx, total_steps);
  HYP_CHECK(warmup_steps >= 0, "{}: warmup_steps must be >= 0, got {}", ctx, warmup_steps);
  HYP_CHECK(warmup_steps <= total_steps, "{}: warmup_steps ({}) exceeds total_steps ({})", ctx,
            warmup_steps, total_steps);
  HYP_CHECK(peak_lr > 0.0 && std::isfinite(peak_lr),
            "{}: peak_lr must be a positive finite number, got {}", ctx, peak_lr);
  HYP_CHECK(is_fraction(final_lr_fraction), "{}: final_lr_fraction must be in [0, 1], got {}", ctx,
            final_lr_fraction);
  HYP_CHECK(is_fraction(wsd_decay_fraction), "{}: wsd_decay_fraction must be in [0, 1], got {}",
            ctx, wsd_decay_fraction);
  HYP_CHECK(wsd_decay_shape == "linear" || wsd_decay_shape == "cosine",
            "{}: wsd_decay_shape must be 'linear' or 'cosine', got '{}'", ctx, wsd_decay_shape);
  if (kind == ScheduleKind::kWsd) {
    const int64_t decay = wsd_decay_steps();
    HYP_CHECK(warmup_steps + decay <= total_steps,
              "{}: wsd_decay_fraction {} gives {} decay steps, which overlap the warmup_steps "
              "({}) of total_steps ({})",
              ctx, wsd_decay_fraction, decay, warmup_steps, total_steps);
  }
}

double LrSchedule::lr(int64_t step) const {
  validate();
  HYP_CHECK(step >= 0, "lr schedule: step must be >= 0, got {}", step);
  if (step < warmup_steps) {
    return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  const double final_lr = peak_lr * final_lr_fraction;
  const int64_t last = total_steps - 1;
  switch (kind) {
    case ScheduleKind::kConstant:
      return peak_lr;
    case ScheduleKind::kCosine: {
      // warmup_steps == total_steps: only warmup steps exist; past the end, stay at peak.
      if (warmup_steps == total_steps) return peak_lr;
      return final_lr + (peak_lr - final_lr) * cosine_factor(progress(step, warmup_steps, last));
    }
    case ScheduleKind::kWsd: {
      const int64_t decay = wsd_decay_steps();
      const int64_t start = total_steps - decay;
      if (decay == 0 || step < start) return peak_lr;
      const double p = progress(step, start, last);
      if (wsd_decay_shape == "cosine") return final_lr + (peak_lr - final_lr) * cosine_factor(p);
      return peak_lr - (peak_lr - final_lr) * p;
    }
  }
  fail("lr schedule: invalid schedule kind {}", static_cast<int>(kind));
}

}  // namespace hyperion
