// The training configuration: one schema in the spirit of MaxText's base.yml (model,
// data, optimizer, schedule, precision, remat, checkpointing, logging), loaded from a
// preset or YAML file plus `key=value` overrides. Key names follow MaxText where it has
// one (steps, per_device_batch_size, max_target_length, learning_rate, dtype,
// weight_dtype, remat_policy, checkpoint_period, base_output_directory, run_name,
// dataset_path, tokenizer_path, base_emb_dim, base_num_decoder_layers, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/config.h"
#include "model/decoder_config.h"
#include "model/lora.h"
#include "model/moe_block.h"
#include "model/quantized_matmul.h"
#include "diffusion/train_config.h"
#include "recsys/dlrm_config.h"
#include "train/schedule.h"

namespace hyperion {

// The schema (every key, its type, default and help).
std::vector<ConfigKey> train_config_schema();

// The `tiny` preset, compiled in: `hyperion train` with no config runs it. Identical to
// configs/tiny.yml (a test checks).
extern const char* const kTinyPresetYaml;

// Loads `config_arg` (a YAML path, or a preset name looked up as configs/NAME.yml in the
// working directory and the source tree; empty = the embedded tiny preset), then applies
// the overrides in order. Errors name the file/key.
Config load_train_config(const std::string& config_arg, const std::vector<std::string>& overrides);
// The config a run saved with its latest checkpoint (`resume`: a run or checkpoint
// directory), then `overrides` as explicit changes: each one that changes a value is
// appended to `changes` ("steps: 40 -> 80"), and a change of the model's shape is
// refused (a usage error naming the key and both values).
Config load_resumed_train_config(const std::string& resume,
                                 const std::vector<std::string>& overrides,
                                 std::vector<std::string>* changes);
// Keys that fix the shape of the model's tensors (a resumed run cannot change them).
bool is_model_shape_key(const std::string& key);
// Before a resume from `checkpoint_dir` (explicit or the run directory's latest): a usage
// error naming the first model-shape key whose value in `config` differs from the config
// the checkpoint saved, both values and where the new one comes from (a file and line, or
// the command line). Nothing when the checkpoint saved no config.
void check_resume_shape(const Config& config, const std::string& checkpoint_dir);

// Parallelism axes as configured (-1: the ranks left over), see resolve_mesh.
struct MeshConfig {
  int data = -1, fsdp = 1, expert = 1;
};
// Fills the -1 axis and checks data * fsdp * expert == world (errors name the keys).
MeshConfig resolve_mesh(const MeshConfig& m, int world);

// Monitoring of a run (train/training_monitor.h, docs/MONITORING.md).
struct TrainMonitorConfig {
  bool enabled = true;   // enable_monitoring: event log, gathers, stack dumps
  int metrics_port = 0;  // Prometheus on metrics_port + rank (0: off)
  std::string metrics_host = "0.0.0.0";
  int top_n = 3;                 // monitor_top_n: ranks listed per metric
  int straggler_periods = 2;     // log periods above the threshold before naming a rank
  double hang_timeout_s = 1800;  // stack dump when no step finishes this long (0: off)
  bool abort_on_hang = false;
  int64_t crash_at_step = 0;  // fault injection: the run's first process aborts there
};

// Typed view of a loaded Config, validated (errors name the key).
struct TrainConfig {
  std::string name;  // preset / file stem
  // model_type: dlrm trains the recommender of `dlrm` (train/recsys_trainer.h) with the
  // same run directory, logs, metrics, monitoring and checkpoint layout; the language
  // model keys are then unused.
  bool dlrm_model = false;
  recsys::DlrmConfig dlrm;
  // model_type: diffusion trains a latent diffusion model (train/diffusion_trainer.h).
  bool diffusion_model = false;
  diffusion::DiffusionTrainConfig diffusion;
  DecoderConfig model;
  MoeOptions moe;  // capacity factor and aux-loss weights of the MoE layers
  // Data.
  std::string dataset_path;    // prepared dir (train.bin ...) or a .txt/.jsonl to prepare
  std::string tokenizer_path;  // existing SentencePiece model (optional)
  // A Hugging Face model directory (or hyperion checkpoint) whose weights start the run
  // (MaxText's load_parameters_path): the model's shape is its config.json, the optimizer
  // starts fresh. Empty: weights initialised from init_weights_seed.
  std::string load_parameters_path;
  int64_t max_target_length = 256;
  int64_t per_device_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  uint64_t data_shuffle_seed = 0;
  double eval_fraction = 0.05;
  // Supervised fine-tuning on conversations (train/sft_data.h): use_sft, and MaxText's
  // sft_train_on_completion_only and packing.
  bool use_sft = false;
  bool sft_completion_only = true;
  bool packing = false;
  // Direct preference optimisation (train/dpo.h): MaxText's use_dpo, dpo_beta and
  // dpo_label_smoothing.
  bool use_dpo = false;
  double dpo_beta = 0.1, dpo_label_smoothing = 0.0;
  // LoRA (model/lora.h): lora_rank >= 1 trains adapters on a frozen base (PEFT's r,
  // lora_alpha, lora_dropout, target_modules). rank 0: the whole model trains.
  LoraConfig lora;
  // Optimisation.
  int64_t steps = 100;
  LrSchedule schedule;
  double adam_b1 = 0.9, adam_b2 = 0.95, adam_eps = 1e-8, weight_decay = 0.1;
  bool weight_decay_exclude_norms_and_embeddings = true;
  double gradient_clipping_threshold = 1.0;
  uint64_t init_weights_seed = 0;
  // Precision and memory.
  bool bf16 = true;  // dtype
  RematPolicy remat = RematPolicy::kMinimal;
  Device hardware = Device::kHost;  // hardware: cpu | gpu (kernels/hardware.h)
  QuantOptions quant;  // quantization, quantize_logits, fp8_amax_history_len, fp8_amax_margin
  // Checkpointing and logging.
  std::string base_output_directory = "runs";
  std::string run_name;
  bool enable_checkpointing = true;
  int64_t checkpoint_period = 0;  // 0: only at the end
  int64_t checkpoints_to_keep = 2;
  int64_t checkpoint_max_shard_bytes = 5000000000;  // one process: shard the weights past it
  bool async_checkpointing = true;
  int64_t log_period = 10;
  int64_t eval_interval = 0;  // 0: only at the end
  int64_t eval_batches = 8;
  double peak_tflops = 0;  // MFU denominator; 0 = measure this machine's peak at start
  // After training: samples from the final model.
  int64_t sample_count = 2;
  int64_t sample_max_tokens = 64;
  double sample_temperature = 0.8;
  // Multi-process training.
  MeshConfig mesh;
  bool shard_optimizer_over_data = false;
  std::string communicator = "auto";
  double collective_timeout_s = 300;
  bool overlap_communication = true;
  bool check_links = true;  // several hosts: time each host's link at start (link_check.h)
  int64_t check_links_period = 0;  // and again every N steps (0: at start only)
  TrainMonitorConfig monitor;

  int data_ranks = 1;  // ranks that each see different data (set from the mesh at run time)
  // Global batch: per-rank batch x sequence length x accumulation x data ranks.
  int64_t tokens_per_step() const {
    return per_device_batch_size * max_target_length * gradient_accumulation_steps * data_ranks;
  }
};

TrainConfig parse_train_config(const Config& config, const std::string& name);

}  // namespace hyperion
