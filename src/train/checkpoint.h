// Training checkpoints in the Hugging Face layout, one directory per step:
//
//   <run dir>/checkpoints/<step>/
//     model.safetensors       f32 weights under LlamaForCausalLM names
//     config.json             DecoderConfig keys
//     tokenizer.model         the SentencePiece model the data was tokenized with, or
//     tokenizer.json          a Hugging Face tokenizer, with tokenizer_config.json
//     optimizer.safetensors   AdamW moments: "<tensor>.exp_avg", "<tensor>.exp_avg_sq"
//     trainer_state.json      step, optimizer step, data loader position, tokens seen,
//                             and the resolved training config
//     quantization.safetensors  fp8 training only: every amax history ("<tensor>.
//                             weight_amax_history", ".grad_amax_history", "...input_amax_
//                             history") and its max ("<history>.max"; the delayed scale is
//                             max * 2^fp8_amax_margin / fp8_max)
//
// Multi-process runs (world N > 1) write the Hugging Face sharded layout instead: rank r
// writes model-<r+1>-of-<N>.safetensors (whole tensors, balanced by size; experts by
// their owner) and optimizer-<r+1>-of-<N>.safetensors (its moments: whole tensors, or
// "<tensor>.exp_avg@<start>" 1-D pieces of a sharded tensor, start = first element), in
// parallel; rank 0 writes model.safetensors.index.json and the rest. Loading accepts
// either layout at any rank count: every piece is copied into whatever this rank owns.
//
// A save writes everything into a hidden temp directory next to the others, fsyncs it and
// renames it into place, so a save killed at any point leaves earlier checkpoints
// intact and is never mistaken for a complete one. Only then are the oldest checkpoints
// beyond the keep limit deleted. With async saving the state is copied (memcpy, the only
// part on the training thread) and written by a background I/O thread.
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "io/safetensors.h"
#include "io/weight_files.h"
#include "model/decoder_config.h"
#include "model/param_store.h"
#include "text/tokenizer.h"
#include "train/data_loader.h"
#include "train/optimizer.h"

namespace hyperion {

namespace dist {
class Communicator;
}

struct TrainerState {
  int64_t step = 0;  // optimizer steps completed
  train::DataLoaderState data;
  int64_t tokens_seen = 0;
  // Quantised training (model/quantized_matmul.h): the pass counter that seeds stochastic
  // rounding, and the fp8 amax histories by name (quantization.safetensors, f32, so they
  // restore bit-exactly; the scales follow from them). Empty / 0 when quantization is off.
  std::string quantization;
  uint64_t quant_passes = 0;
  std::vector<std::pair<std::string, std::vector<float>>> quant_histories;
};

class CheckpointManager {
 public:
  // `run_dir`/checkpoints holds the step directories; `keep` >= 1 are retained.
  // Multi-process: `comm` (world > 1) and, per tensor, the rank that writes it; saves
  // are then synchronous and collective (every rank calls save).
  CheckpointManager(std::string run_dir, int64_t keep, bool async,
                    dist::Communicator* comm = nullptr, std::vector<int> writers = {});
  ~CheckpointManager();  // waits for a save in flight (errors are logged)

  // Saves the current state as checkpoint `state.step`. Waits for the previous save first.
  void save(const ParamStore& params, const AdamW& optimizer, const TrainerState& state,
            const std::vector<std::pair<std::string, std::string>>& tokenizer_files,
            const std::map<std::string, std::string>& config_values);
  // Blocks until no save is in flight; rethrows a failure of the background save.
  void wait();
  // Seconds the training thread spent in save() calls (the copy, and waits for a
  // previous save), and the seconds of the last write itself.
  double blocking_seconds() const { return blocking_seconds_; }
  double last_write_seconds() const { return last_write_seconds_; }
  const std::string& checkpoints_dir() const { return dir_; }
  // One process: past `bytes` of weights a checkpoint's model is written as Hugging Face's
  // sharded layout (model-0000k-of-0000n.safetensors + model.safetensors.index.json, each
  // file at most `bytes` unless one tensor is larger), as save_pretrained(max_shard_size)
  // does. 0: always one model.safetensors.
  void set_max_shard_bytes(int64_t bytes) { max_shard_bytes_ = bytes; }
  // LoRA runs: the saved store is the adapters, written as PEFT's adapter_model.safetensors
  // (one file, by rank 0: every tensor's writer must be 0) beside `adapter_config` (the
  // adapter_config.json text); config.json stays the base model's.
  void set_adapter(std::string adapter_config) { adapter_config_ = std::move(adapter_config); }

 private:
  struct Snapshot;
  int64_t max_shard_bytes_ = 0;
  std::string adapter_config_;
  void write(const Snapshot& s);
  void write_files(const Snapshot& s, const std::string& dir) const;
  void write_common(const Snapshot& s, const std::string& dir) const;
  void publish(const std::string& tmp, int64_t step);

  dist::Communicator* comm_ = nullptr;
  std::vector<int> writers_;
  std::string dir_;
  int64_t keep_;
  bool async_;
  std::thread worker_;
  std::exception_ptr error_;
  double blocking_seconds_ = 0, last_write_seconds_ = 0;
};

// A directory holding a complete checkpoint's weights (single file or sharded index, or a
// LoRA run's adapter_model.safetensors).
bool has_model_weights(const std::string& dir);
// A whole model's weights (model.safetensors or its sharded index), not a LoRA adapter's.
bool has_full_model_weights(const std::string& dir);
// The newest complete checkpoint under `run_dir`/checkpoints (by step), if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);
// A checkpoint directory given as itself or as a run directory (its latest checkpoint).
std::string resolve_checkpoint_dir(const std::string& path);

DecoderConfig read_checkpoint_config(const std::string& checkpoint_dir);

using io::WeightFiles;

// Before anything is allocated: the weight files hold exactly the tensors config.json
// describes, with the same shapes (a config that disagrees with its weights - fewer
// layers, a tied head next to a different lm_head, other sizes - is refused naming the
// file, the key and both shapes).
void check_weights_match_config(const std::string& checkpoint_dir, const DecoderConfig& config);
// The weights (f32, + bf16 copy) of an inference load fit this machine's memory.
void check_load_fits_in_memory(const std::string& checkpoint_dir, const DecoderConfig& config,
                               bool bf16);
// The checkpoint's tokenizer (tokenizer.json, else tokenizer.model), refused when its
// vocabulary does not fit the model's (Tokenizer::fits_model_vocab).
text::Tokenizer load_checkpoint_tokenizer(const std::string& checkpoint_dir,
                                        const DecoderConfig& config);
// Throws naming the file, the tensor and the element when `t` holds a NaN or infinity.
void check_finite(const TensorView& t, const std::string& name, const std::string& file);
// Loads model.safetensors (or a sharded index) into params (checked as
// check_weights_match_config does; f32/bf16/f16 files accepted; non-finite values
// refused), then refreshes the bf16 copy. Errors name the file and the tensor.
void load_model_weights(const std::string& checkpoint_dir, ParamStore& params);
// Loads the optimizer moments and trainer state for an exact resume.
// `weights` false: the caller reads the weights itself (a LoRA run's adapters); the
// moments and the state are read by the store's tensor names either way.
TrainerState load_training_state(const std::string& checkpoint_dir, ParamStore& params,
                                 AdamW& optimizer, bool weights = true);

}  // namespace hyperion
