// The training job behind `hyperion train`, in four parts (trainer.cc's TrainingRun):
//   setup      run directory and lock, dataset (preparing the bundled corpus or a text
//              file on first use), the model, optimizer and gradient sync, resume
//   step       one optimizer step: micro-batches with gradient accumulation through the
//              TrainableModel interface, clipping, the LR schedule, metrics.jsonl
//              (train/metrics_writer.h), periodic evaluation and checkpoints (saved off
//              the training thread)
//   evaluate   held-out loss on a forward-only model (model/forward_model.h)
//   finish     last checkpoint, final evaluation, samples, peak memory
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/config.h"
#include "model/causal_lm.h"
#include "train/metrics_writer.h"
#include "train/train_config.h"

namespace hyperion {

struct TrainResult {
  std::string run_dir;
  std::string checkpoint;  // last checkpoint written ("" if none)
  int64_t start_step = 0;  // > 0 when resumed
  int64_t steps = 0;
  std::vector<StepMetrics> history;  // steps run by this process
  double eval_loss = 0, eval_perplexity = 0;
  int64_t eval_tokens = 0;
  // Recommenders: held-out AUC (-1: none) over eval_tokens examples, and examples/s.
  double auc = -1;
  double mean_samples_per_s = 0;
  // MFU denominator: the peak of the precision the matmuls run in (int8 for quantization:
  // int8, bf16 or f32 otherwise; fp8 runs emulated on bf16 units here).
  double peak_gflops = 0;
  double peak_bf16_gflops = 0;  // EMFU denominator (the bf16 peak; = peak_gflops unquantised)
  double mean_tokens_per_s = 0, mean_mfu = 0;  // over steps after the first (warm-up)
  double mean_emfu = 0;                        // effective MFU: the same FLOPs over the bf16 peak
  double seconds = 0;
  double peak_rss_mib = 0;  // largest over ranks
  double device_peak_mib = -1;  // hardware=gpu: most device memory allocated; -1 on the host
  int world_size = 1;
  std::string parallel_mode = "data";
  std::vector<std::string> samples;
  // SIGTERM or SIGINT stopped the run early (after saving a checkpoint), else 0.
  int stopped_by_signal = 0;
};

struct TrainOptions {
  std::string resume;  // run dir or checkpoint dir to resume from ("" = per run_name)
  bool quiet = false;  // no per-step lines (tests)
  // Stop after this many completed steps (0: run to `steps`), saving a checkpoint there:
  // splits a run in two without changing its schedule (resume tests, preemption drills).
  int64_t stop_at = 0;
};

// Runs the job described by `config` (already loaded with overrides).
TrainResult run_training(const Config& config, const std::string& config_name,
                         const TrainOptions& options);

// Where a dataset lives after preparation: train.bin, val.bin, tokenizer.model.
struct PreparedDataset {
  std::string dir, train, val, tokenizer;
  std::string input;  // the text file prepared here ("" for a given directory)
  std::string key;    // what a prepared-here dataset is made from ("" for a given directory)
};
// dataset_path: a prepared directory, a .txt/.jsonl file, or empty for the bundled corpus
// (prepared once into <base_output_directory>/datasets/<name>-v<vocab>-<key hash>/ and
// reused while its inputs are unchanged: the key holds the input's and the tokenizer's
// path, size and modification time, the vocabulary and eval_fraction).
// prepare = false only resolves the paths and the key; ensure_prepared then prepares the
// data unless it is there, unchanged (rank 0 only: the other ranks take rank 0's paths
// and key and wait for its files).
PreparedDataset resolve_dataset(const TrainConfig& t, bool prepare = true);
void ensure_prepared(const TrainConfig& t, const PreparedDataset& d);

}  // namespace hyperion
