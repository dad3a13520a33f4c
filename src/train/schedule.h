// Learning-rate schedules as in MaxText (base.yml: learning_rate, warmup_steps_fraction,
// cosine_learning_rate_final_fraction, and the WSD "warmup-stable-decay" schedule).
//
// `step` is the 0-based index of the optimizer step being taken; T = total_steps,
// W = warmup_steps, peak = peak_lr, final = peak * final_lr_fraction.
//
//   warmup (all kinds), step < W:  lr = peak * (step + 1) / W
//       (the first step already moves, the last warmup step W - 1 reaches peak)
//   constant, step >= W:           lr = peak
//   cosine,   step >= W:           lr = final + (peak - final) * 0.5 * (1 + cos(pi * p)),
//       p = (step - W) / (T - 1 - W), so p = 0 (lr = peak) at step W and p = 1
//       (lr = final) at the last step T - 1; p = 1 if W = T - 1.
//   wsd,      step >= W:           D = round(wsd_decay_fraction * T) decay steps, the
//       decay phase is steps S = T - D .. T - 1. For W <= step < S: lr = peak (stable).
//       For step >= S: p = (step - S) / (D - 1) (p = 1 if D = 1), and
//         linear: lr = peak - (peak - final) * p
//         cosine: lr = final + (peak - final) * 0.5 * (1 + cos(pi * p))
//       so the decay starts from peak at step S and reaches final at step T - 1.
//       D = 0 (wsd_decay_fraction * T < 0.5) keeps lr = peak after warmup.
//
// Steps past the end (step >= T) keep the last step's value (p is clamped to 1), so a
// run resumed with extra steps does not jump. With W = T (warmup only) no decay step
// remains and the last step is at peak.
#pragma once

#include <cstdint>
#include <string>

namespace hyperion {

enum class ScheduleKind { kConstant, kCosine, kWsd };

// "constant" | "cosine" | "wsd". `key` names the config key in the error message, which
// lists the valid names.
ScheduleKind parse_schedule(const std::string& name, const std::string& key);
// The inverse of parse_schedule (for logs and checkpoints).
const char* schedule_name(ScheduleKind kind);

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::kCosine;
  double peak_lr = 3e-4;
  int64_t warmup_steps = 0;  // linear warmup from 0 to peak over these steps
  int64_t total_steps = 1;
  double final_lr_fraction = 0.1;          // lr at the last step = peak * this (cosine and WSD)
  double wsd_decay_fraction = 0.1;         // WSD: the last round(this * total_steps) steps decay
  std::string wsd_decay_shape = "linear";  // "linear" | "cosine"

  // The learning rate for 0-based `step` (see the formulas above). Validates the
  // schedule and the step (step < 0 is an error) on every call: it is a handful of
  // comparisons, once per optimizer step.
  double lr(int64_t step) const;
  // Throws hyperion::Error naming the field at fault: total_steps < 1, warmup_steps < 0,
  // warmup_steps > total_steps, fractions outside [0, 1], peak_lr <= 0 or not finite,
  // an unknown wsd_decay_shape, or WSD decay steps overlapping the warmup.
  void validate() const;
  // Number of WSD decay steps D (see above); 0 for the other kinds.
  int64_t wsd_decay_steps() const;
};

}  // namespace hyperion
