// metrics.jsonl: one JSON line per optimizer step, written by rank 0 and flushed each
// step (a killed run keeps every completed step; a torn last line is dropped on resume).
// Stable keys: step, loss, grad_norm, lr, step_s, tokens_per_s, tflops, mfu, emfu (the same FLOPs
// over the bf16 peak: MFU's counterpart for quantised training), data_wait_s,
// tokens_seen; with several ranks comm_s, comm_exposed_s, comm_bytes_sent; for MoE models
// lm_loss, moe_lb_loss, moe_z_loss, moe_dropped_fraction, expert_load_min/max/cv; and
// skipped: true for a step whose update was skipped; on a device (hardware=gpu)
// device_peak_mib, the most device memory the process had allocated so far. Recommender
// runs (model_type: dlrm) add samples_per_s, and at evaluation steps auc and eval_loss
// (held-out). DPO runs add rewards/chosen, rewards/rejected, rewards/accuracies and
// rewards/margins (TRL's names).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "model/trainable_model.h"

namespace hyperion {

// Per-step metrics (one line of metrics.jsonl).
struct StepMetrics {
  int64_t step = 0;    // 1-based: optimizer steps completed
  double loss = 0;     // the objective: cross-entropy + MoE auxiliary losses
  double lm_loss = 0;  // cross-entropy alone
  double grad_norm = 0;
  double lr = 0;
  double step_s = 0;
  double tokens_per_s = 0;
  double tflops = 0;
  double mfu = 0;
  double emfu = 0;
  double data_wait_s = 0;
  // Multi-process: seconds the collectives ran (communication thread), seconds the
  // training thread waited for them (exposed), and payload bytes this rank sent.
  double comm_s = 0, comm_wait_s = 0;
  uint64_t comm_bytes = 0;
  bool skipped = false;
  // On a device: the most memory allocated there so far, in MiB (as PyTorch's
  // max_memory_allocated: what hyperion allocated, not the driver's own); -1 on the host.
  double device_peak_mib = -1;
  // Recommenders: examples per second (tokens_per_s holds the same), and the held-out
  // AUC and loss at evaluation steps (-1: not evaluated at this step).
  double samples_per_s = 0;
  double auc = -1, eval_loss = -1;
  // MoE models: averages over the step's micro-batches (see MoeStats).
  MoeStats moe;
  // DPO runs (use_dpo): TRL's rewards/chosen, rewards/rejected, rewards/accuracies and
  // rewards/margins, means over the step's pairs.
  bool dpo = false;
  double rewards_chosen = 0, rewards_rejected = 0, rewards_accuracies = 0, rewards_margins = 0;
};

class MetricsWriter {
 public:
  // Appends to run_dir/metrics.jsonl when `enabled` (rank 0), after dropping the lines
  // of steps > resume_step (a resumed run rewrites what came after its checkpoint).
  MetricsWriter(const std::string& run_dir, bool enabled, int64_t resume_step);
  // One line; multi_rank and moe add their keys.
  void write(const StepMetrics& m, int64_t tokens_seen, bool multi_rank, bool moe);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace hyperion
