#include "train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "base/powers_of_two.h"
#include "base/system_memory.h"
#include "base/thread_governor.h"
#include "base/threads.h"
#include "base/timer.h"
#include "convert/peft_adapter.h"
#include "dist/communicator.h"
#include "io/atomic_file.h"
#include "io/directory_lock.h"
#include "io/file_identity.h"
#include "kernels/backend.h"
#include "kernels/dropout.h"
#include "kernels/hardware.h"
#include "kernels/peak.h"
#include "model/causal_lm.h"
#include "model/forward_model.h"
#include "model/generator.h"
#include "monitor/event_log.h"
#include "text/text_input.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/data_loader.h"
#include "train/dpo.h"
#include "train/sft_data.h"
#include "train/data_prepare.h"
#include "train/link_check.h"
#include "train/optimizer.h"
#include "train/parallel.h"
#include "train/rank_heartbeat.h"
#include "train/diffusion_trainer.h"
#include "train/recsys_trainer.h"
#include "train/run_directory.h"
#include "train/stop_signal.h"
#include "train/training_monitor.h"

namespace hyperion {

namespace fs = std::filesystem;

namespace {

bool is_prepared(const std::string& dir) {
  return train::is_prepared_dataset(dir);
}

// Complete, and prepared from exactly the inputs `key` describes ("" = any).
bool dataset_ready(const PreparedDataset& d) {
  if (!is_prepared(d.dir)) return false;
  if (d.key.empty()) return true;
  try {
    return nlohmann::json::parse(io::read_file(d.dir + "/meta.json")).value("cache_key", "") ==
           d.key;
  } catch (const std::exception&) {
    return false;
  }
}

// Exactly equal: eval, generate, serve and convert refuse a checkpoint whose tokenizer
// differs from its vocab_size, so a run that trained with fewer pieces would write
// checkpoints nothing can load. (Tokenizers trained here always have vocab_size pieces.)
void check_tokenizer_size(const text::Tokenizer& tokenizer, const std::string& path,
                          const Config& config, const TrainConfig& t) {
  HYP_CHECK(tokenizer.fits_model_vocab(t.model.vocab_size),
            "tokenizer {} has {} tokens but config key vocab_size ({}) is {}; they must be {} "
            "(set vocab_size={})",
            path, tokenizer.vocab_size(), config.source_of("vocab_size"), t.model.vocab_size,
            std::string(tokenizer.format()) == "sentencepiece" ? "equal" : "at least as many",
            tokenizer.vocab_size());
}

// Refuses a training that cannot fit this machine's memory, naming the sizes and, when
// the model's shape keys were left at their defaults (a 7B Llama), saying so. `mem` is
// one rank's plan (rank_memory_plan); `ranks_on_host` ranks share the machine.
void check_training_memory(const Config& config, const TrainConfig& t, const MemoryPlan& mem,
                           ParallelMode mode, int world, int ranks_on_host) {
  std::vector<std::string> defaulted;
  for (const char* key : {"vocab_size", "base_emb_dim", "base_num_decoder_layers", "base_mlp_dim",
                          "max_target_length", "per_device_batch_size"})
    if (config.source_of(key) == "default") defaulted.push_back(key);
  std::string hint = fmt::format(
      "sizes: weights {}, bf16 copy {}, gradients {}, AdamW {}, activations {} "
      "(per_device_batch_size={} x max_target_length={}, remat_policy={}), scratch {}",
      format_bytes(mem.weight_bytes), format_bytes(mem.compute_weight_bytes),
      format_bytes(mem.grad_bytes), format_bytes(mem.optimizer_bytes),
      format_bytes(mem.activation_bytes), t.per_device_batch_size, t.max_target_length,
      remat_policy_name(t.remat), format_bytes(mem.scratch_bytes));
  if (!defaulted.empty())
    hint += fmt::format(
        "; {} are at their defaults (a Llama-2 7B): set them, or start from a preset "
        "(hyperion train tiny, llama-25m)",
        fmt::join(defaulted, ", "));
  const int64_t ranks = std::max(ranks_on_host, 1);
  const std::string per_rank = mode != ParallelMode::kData && world > 1
                                   ? fmt::format(", each rank holding its {} share of {} ranks",
                                                 parallel_mode_name(mode), world)
                                   : "";
  check_fits_in_memory(
      sat_mul(mem.total(), ranks),
      fmt::format("training {} ({} parameters{}{})", t.name, t.model.total_params(), per_rank,
                  ranks > 1 ? fmt::format(", {} ranks on this host", ranks) : ""),
      hint);
}

// Auto-resume (the same command run again): the checkpoint's config is what the run
// used; differences are explicit in the log. (Shape changes are refused below.)
void log_config_changes(const Config& config, const std::string& checkpoint) {
  nlohmann::json saved;
  try {
    saved = nlohmann::json::parse(io::read_file(checkpoint + "/trainer_state.json")).at("config");
  } catch (const std::exception&) {
    return;
  }
  for (const auto& [key, value] : config.values()) {
    if (!saved.contains(key) || !saved[key].is_string()) continue;
    const std::string before = saved[key].get<std::string>();
    if (before != value)
      log_info("resume: {} differs from the checkpoint's config: {} -> {} ({})", key, before, value,
               config.source_of(key));
  }
}

// Data tokenized with one tokenizer means nothing to a model trained with another: a
// prepared dataset directory used with a given tokenizer (tokenizer_path, or the model
// directory's under load_parameters_path) must hold the same vocabulary, id for id,
// checked before the run directory exists. The checkpoint then carries the tokenizer the
// data was made with.
void check_dataset_tokenizer(const TrainConfig& t) {
  if (t.tokenizer_path.empty() || t.dataset_path.empty() || !fs::is_directory(t.dataset_path) ||
      !is_prepared(t.dataset_path))
    return;
  const text::Tokenizer data = text::Tokenizer::load(t.dataset_path);
  const text::Tokenizer given = text::Tokenizer::load(t.tokenizer_path);
  const char* what = t.load_parameters_path.empty() ? "config key tokenizer_path"
                                                    : "the model (load_parameters_path)";
  auto refuse = [&](const std::string& why) {
    usage_fail(
        "dataset_path '{}' was prepared with tokenizer {}, but {} uses tokenizer {}: {}. Its "
        "token ids would mean other text to the model: prepare the data with that tokenizer "
        "(hyperion data prepare --tokenizer {})",
        t.dataset_path, data.origin(), what, given.origin(), why, t.tokenizer_path);
  };
  if (data.vocab_size() != given.vocab_size())
    refuse(fmt::format("their vocabularies have {} and {} tokens", data.vocab_size(),
                       given.vocab_size()));
  for (int32_t id = 0; id < data.vocab_size(); ++id) {
    const std::string a = data.id_to_piece(id), b = given.id_to_piece(id);
    if (a != b)
      refuse(fmt::format("token {} is {} in one and {} in the other", id,
                         nlohmann::json(a).dump(-1, ' ', false,
                                                nlohmann::json::error_handler_t::replace),
                         nlohmann::json(b).dump(-1, ' ', false,
                                                nlohmann::json::error_handler_t::replace)));
  }
}

struct EvalResult {
  double loss = 0;
  int64_t tokens = 0;
};

}  // namespace

PreparedDataset resolve_dataset(const TrainConfig& t, bool prepare) {
  PreparedDataset d;
  std::string input = t.dataset_path;
  if (!input.empty() && fs::is_directory(input)) {
    HYP_CHECK(is_prepared(input),
              "dataset_path '{}': a directory must hold train.bin, val.bin, tokenizer.model (or "
              "tokenizer.json) and meta.json (made by `hyperion data prepare`)",
              input);
    d.dir = input;
  } else {
    if (input.empty()) input = text::require_bundled_corpus("dataset_path is empty");
    HYP_CHECK(fs::is_regular_file(input), "dataset_path '{}': no such file or directory", input);
    // The prepared data is keyed by everything it is made from: the input file's and the
    // tokenizer's fingerprints (path, size, modification time), the vocabulary and the
    // held-out fraction. Another input with the same name or vocabulary, or the same file
    // changed, gets its own directory.
    std::string key = fmt::format("input {}\nvocab {}\neval_fraction {}\n", io::file_fingerprint(input),
                                  t.model.vocab_size, t.eval_fraction);
    if (!t.tokenizer_path.empty()) {
      const std::string f = fs::is_directory(t.tokenizer_path)
                                ? text::tokenizer_file_in(t.tokenizer_path)
                                : t.tokenizer_path;
      key += fmt::format("tokenizer {}\n", io::file_fingerprint(f.empty() ? t.tokenizer_path : f));
    }
    const std::string stem = fs::path(input).stem().string();
    // fmt::format rather than `"-" + string` chains: GCC 12 -Wrestrict misfires on those.
    d.dir = fmt::format("{}/datasets/{}-v{}-{}", t.base_output_directory, stem, t.model.vocab_size,
                        io::short_hash(key).substr(0, 12));
    d.key = key;
    d.input = input;
  }
  d.train = d.dir + "/train.bin";
  d.val = d.dir + "/val.bin";
  d.tokenizer = t.tokenizer_path.empty() ? d.dir : t.tokenizer_path;
  if (prepare) ensure_prepared(t, d);
  return d;
}

void ensure_prepared(const TrainConfig& t, const PreparedDataset& d) {
  if (d.input.empty()) return;  // a given directory
  if (is_prepared(d.dir)) {
    if (dataset_ready(d)) {
      log_info("data: reusing {} (prepared from {}, unchanged since)", d.dir, d.input);
      return;
    }
    log_warn("data: {} holds data prepared from other inputs (its meta.json cache_key "
             "differs); preparing it again",
             d.dir);
  }
  train::PrepareOptions po;
  po.inputs = {d.input};
  po.output_dir = d.dir;
  po.tokenizer_model = t.tokenizer_path;
  po.vocab_size = static_cast<int>(t.model.vocab_size);
  po.val_fraction = t.eval_fraction;
  po.cache_key = d.key;
  log_info("data: preparing {} into {} (vocab {})", d.input, d.dir, t.model.vocab_size);
  const train::PrepareResult r = train::prepare_dataset(po);
  log_info("data: {} documents, {} train / {} held-out tokens, {:.1f} s", r.documents,
           r.train_tokens, r.val_tokens, r.seconds);
}

namespace {

TrainResult train_ranks(const Config& config, TrainConfig t, const TrainOptions& options,
                        dist::Communicator& comm_ref, double process_start);

}  // namespace

TrainResult run_training(const Config& config, const std::string& config_name,
                         const TrainOptions& options) {
  TrainConfig t = parse_train_config(config, config_name);
  std::unique_ptr<dist::Communicator> comm =
      dist::make_communicator(t.communicator, t.collective_timeout_s);
  // Where the trainer starts: before it, the launcher and MPI (goodput's program start-up).
  const double process_start = monitor::unix_time();
  if (comm->world_size() == 1) return train_ranks(config, t, options, *comm, process_start);
  // Under `train --hosts`: this rank's status for the launcher's report (rank_heartbeat.h).
  std::optional<RankHeartbeat> heartbeat;
  if (const char* dir = std::getenv(kLaunchDirEnv); dir != nullptr && *dir != '\0')
    heartbeat.emplace(dir, comm->rank(), comm->host(comm->rank()));
  try {
    return train_ranks(config, t, options, *comm, process_start);
  } catch (const std::exception& e) {
    // The other ranks would wait for this one in their next collective: end them all.
    log_error("{}: {}", dist::rank_and_host(*comm, comm->rank()), e.what());
    comm->abort(1);  // does not return
  }
  return {};  // unreachable: the compiler cannot see through the virtual [[noreturn]]
}

namespace {

class TrainingRun {
 public:
  TrainingRun(const Config& config, TrainConfig t, const TrainOptions& options,
              dist::Communicator& comm, double process_start)
      : config_(config),
        t_(std::move(t)),
        options_(options),
        comm_(&comm),
        process_start_(process_start) {}

  TrainResult run() {
    StopSignalScope stop_signals;
    try {
      setup();
    } catch (...) {
      discard_unstarted_run();
      throw;
    }
    monitor_->init_done();
    const int64_t last_step =
        options_.stop_at > 0 ? std::min(options_.stop_at, t_.steps) : t_.steps;
    while (state_.step < last_step) {
      step();
      if (stop_requested_) return stop_early();
      // A link that degrades mid-run slows every rank alike: time the links again (every
      // rank is at this step boundary; no collective is in flight).
      if (links_.rounds > 0 && t_.check_links_period > 0 &&
          state_.step % t_.check_links_period == 0 && state_.step < last_step) {
        links_ = check_links(*comm_);
        report_links();
      }
      if (t_.checkpoint_period > 0 && state_.step % t_.checkpoint_period == 0 &&
          state_.step < last_step)
        save();
    }
    finish();
    monitor_->finished(state_.step, state_.step >= t_.steps);
    return std::move(result_);
  }

 private:
  void setup();
  // A run refused before its first step (weights that do not load, data that cannot be
  // prepared) leaves nothing behind: the run directory this process made is removed (its
  // lock, marker and event log; never a directory that existed before, such as a resume).
  void discard_unstarted_run() {
    if (rank_ != 0 || !run_dir_created_ || run_dir_.empty()) return;
    metrics_.reset();
    ckpt_.reset();
    monitor_.reset();
    lock_.reset();
    std::error_code ec;
    fs::remove_all(run_dir_, ec);
    if (!ec) log_info("run directory {}: removed (the run was refused before it started)", run_dir_);
  }
  void prepare_dataset(PreparedDataset& data);
  void setup_model(const PreparedDataset& data, const MemoryPlan& mem);
  // The id padded sequences' inputs carry (their targets are ignored): the tokenizer's
  // pad token, else its end of sequence, else 0.
  int32_t pad_id() const {
    if (tokenizer_->pad_id() >= 0) return tokenizer_->pad_id();
    return std::max<int32_t>(tokenizer_->eos_id(), 0);
  }
  void report_setup(const MemoryPlan& mem);
  void step();
  // A LoRA base in bf16 held without the f32 masters of its matrices: nothing reads them
  // (no optimizer, no fsdp gathers, no quantisation from them, no checkpoint of the base).
  bool base_bf16_only() const {
    return t_.lora.enabled() && t_.bf16 && !t_.quant.enabled() && mode_ == ParallelMode::kData &&
           t_.hardware == Device::kHost;
  }
  // The adapters' dropout key of this step's micro-batch (0: no dropout).
  uint64_t lora_dropout_key(int64_t micro) const;
  EvalResult evaluate(int64_t max_batches);
  void save();
  void finish();
  TrainResult stop_early();
  void report_links() const;
  // The most memory the run's device allocator has handed out, in MiB; -1 on the host.
  double device_peak_mib() const {
    if (t_.hardware == Device::kHost) return -1;
    return static_cast<double>(backend_for(t_.hardware).allocator().peak_bytes()) / (1 << 20);
  }

  const Config& config_;
  TrainConfig t_;
  const TrainOptions& options_;
  dist::Communicator* comm_;
  double process_start_ = 0;
  std::unique_ptr<TrainingMonitor> monitor_;
  int rank_ = 0, world_ = 1;
  MeshConfig mesh_;
  ParallelMode mode_ = ParallelMode::kData;
  Timer total_;
  TrainResult result_;
  std::string run_dir_;
  std::optional<io::DirectoryLock> lock_;
  std::optional<text::Tokenizer> tokenizer_;
  std::unique_ptr<ParamStore> params_;
  // lora_rank >= 1: the adapters, the store the run trains (its gradients, optimizer and
  // checkpoints) while params_ stays frozen.
  std::unique_ptr<LoraAdapter> lora_;
  ParamStore& trained() { return lora_ ? lora_->store() : *params_; }
  MoeOptions moe_options_;
  std::unique_ptr<CausalLM> causal_lm_;
  TrainableModel* model_ = nullptr;  // the model the step loop drives
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<GradientSync> base_sync_;  // LoRA under fsdp: the frozen base's gathers
  std::unique_ptr<SplitHooks> lora_hooks_;   // base_sync_'s gathers, sync_'s reductions
  // Drops the pages of parameters this rank does not own (after loading).
  void release_unowned() {
    sync_->release_unowned();
    if (base_sync_) base_sync_->release_unowned();
  }
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<train::SequenceBatcher> loader_, val_loader_;
  std::shared_ptr<const train::SftData> sft_;  // use_sft: the tokenized conversations
  // use_dpo: the pairs, their loaders (loader_ and val_loader_, typed), the reference
  // log-probabilities per pair (chosen, rejected), the pairs' batch and the last step's means.
  std::shared_ptr<const train::DpoData> dpo_;
  train::DpoLoader* dpo_loader_ = nullptr;
  train::DpoLoader* dpo_val_ = nullptr;
  std::vector<double> dpo_ref_;
  Batch pair_batch_;
  train::DpoStepStats dpo_stats_;
  void prepare_dpo_reference();
  EvalResult evaluate_dpo(int64_t max_batches);
  std::unique_ptr<CheckpointManager> ckpt_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::map<std::string, std::string> config_values_;
  std::optional<std::string> resume_from_;
  PowersOfTwo skipped_lines_;  // rate of the non-finite-gradient warning
  bool run_dir_created_ = false;  // by this process (rank 0), so a refused setup removes it
  TrainerState state_;
  Batch batch_;
  double flops_per_token_ = 0;
  double tps_sum_ = 0, mfu_sum_ = 0, emfu_sum_ = 0;
  int64_t timed_steps_ = 0;
  int stop_requested_ = 0;  // a rank of the job got this signal: stop after this step
  int64_t saved_step_ = -1;
  LinkCheck links_;  // several hosts: the links timed at start
};

void TrainingRun::setup() {
  const TrainConfig& t = t_;
  rank_ = comm_->rank();
  world_ = comm_->world_size();
  // The device first: a run that cannot have it fails before anything is prepared.
  require_hardware(t_.hardware, "config key hardware");
  HYP_CHECK(t_.hardware == Device::kHost || world_ == 1,
            "config key hardware=gpu: training runs one process on one GPU (multi-GPU "
            "collectives are not built); got {} ranks",
            world_);
  HYP_CHECK(t_.hardware == Device::kHost || !t_.quant.enabled(),
            "config key hardware=gpu: quantization={} runs on the CPU only so far (docs/GPU.md)",
            quant_mode_name(t_.quant.mode));
  mesh_ = resolve_mesh(t_.mesh, world_);
  mode_ = mesh_.fsdp > 1                                   ? ParallelMode::kFsdp
          : mesh_.expert > 1                               ? ParallelMode::kExpert
          : t_.shard_optimizer_over_data && mesh_.data > 1 ? ParallelMode::kZero1
                                                           : ParallelMode::kData;
  // Every rank sees different data: the mesh's axes all split the batch.
  t_.data_ranks = world_;
  // Everything this process will hold, checked before any of it is allocated or any
  // data is prepared (data parallelism holds the whole plan on every rank; the sharded
  // modes their share of it).
  if (t.lora.enabled()) {
    // LoRA: the adapters are replicated (their moments are small); the frozen base is
    // whole on every rank (data parallel) or sharded and gathered layer by layer (fsdp).
    HYP_USAGE_CHECK(mode_ != ParallelMode::kExpert,
                    "config key lora_rank: LoRA runs data parallel or fsdp; expert parallelism is not "
                    "built for adapters (the experts are not LoRA targets; set expert parallelism to 1)");
    HYP_USAGE_CHECK(mode_ != ParallelMode::kFsdp || !t.quant.enabled(),
                    "config key quantization={}: a LoRA run's quantised base is built once from the whole "
                    "weights, so under fsdp every rank would hold it whole; set quantization=none or "
                    "ici_fsdp_parallelism=1",
                    quant_mode_name(t.quant.mode));
    if (mode_ == ParallelMode::kZero1) mode_ = ParallelMode::kData;
  }
  const MemoryPlan full = memory_plan(t.model, t.per_device_batch_size, t.max_target_length, t.bf16, t.remat,
                                      t.moe.capacity_factor);
  // (LoRA: the base's share under the mode, then the adapters' weights, gradients and
  // moments, which every rank holds whole.)
  const MemoryPlan mem =
      t.lora.enabled() ? lora_memory_plan(rank_memory_plan(full, t.model, mode_, world_), t.model, t.lora, t.bf16,
                                          t.per_device_batch_size * t.max_target_length, base_bf16_only())
                       : rank_memory_plan(full, t.model, mode_, world_);
  check_training_memory(config_, t, mem, mode_, world_, dist::detect_launch().local_size);
  // A given tokenizer is checked before the run directory or the dataset exists (a
  // mismatch found after preparing the data leaves an empty run behind).
  if (!t.tokenizer_path.empty())
    check_tokenizer_size(text::Tokenizer::load(t.tokenizer_path), t.tokenizer_path, config_, t);
  if (rank_ == 0 && !t.use_sft) check_dataset_tokenizer(t);
  if (t.use_sft) {
    // The conversations, tokenized with the chat template, before anything is written (a
    // bad line is refused by path:line with no run directory left behind). Every rank
    // reads them: the same file gives the same examples.
    tokenizer_.emplace(text::Tokenizer::load(t.tokenizer_path));
    const std::optional<text::ChatTemplate> chat = text::ChatTemplate::of(*tokenizer_);
    HYP_USAGE_CHECK(chat.has_value(), "config key use_sft: the tokenizer {} has no chat_template",
                    t.tokenizer_path);
    train::SftReadOptions ro;
    // Unpacked, a row's T inputs and T targets are T + 1 tokens; packed, a conversation
    // brings its own tokens only (its last has no target).
    ro.max_tokens = t.max_target_length + (t.packing ? 0 : 1);
    ro.assistant_only = t.sft_completion_only;
    sft_ = std::make_shared<const train::SftData>(train::read_sft_jsonl(t.dataset_path, *tokenizer_, *chat, ro));
    log_info("sft: {} conversations from {} ({} trained tokens{}); {} truncated to {} tokens, {} dropped with no "
             "trained token inside them",
             sft_->examples.size(), t.dataset_path, sft_->trained_tokens,
             t.sft_completion_only ? ", the assistant's" : "", sft_->truncated, ro.max_tokens, sft_->dropped);
  }
  if (t.use_dpo) {
    HYP_USAGE_CHECK(world_ == 1, "config key use_dpo: one process for now, got {} ranks", world_);
    tokenizer_.emplace(text::Tokenizer::load(t.tokenizer_path));
    const std::optional<text::ChatTemplate> chat = text::ChatTemplate::of(*tokenizer_);
    HYP_USAGE_CHECK(chat.has_value(), "config key use_dpo: the tokenizer {} has no chat_template",
                    t.tokenizer_path);
    train::SftReadOptions ro;
    ro.max_tokens = t.max_target_length + 1;
    dpo_ = std::make_shared<const train::DpoData>(train::read_dpo_jsonl(t.dataset_path, *tokenizer_, *chat, ro));
    log_info("dpo: {} pairs from {}; {} truncated to {} tokens, {} dropped with a completion cut away", dpo_->pairs.size(),
             t.dataset_path, dpo_->truncated, ro.max_tokens, dpo_->dropped);
  }

  // Run directory: base_output_directory/run_name, or the directory being resumed.
  run_dir_ = open_run_directory(t, options_.resume, *comm_, lock_, &run_dir_created_);
  result_.run_dir = run_dir_;
  if (world_ > 1)
    log_info("rank {} of {}: pid {}, {} threads, mesh data {} fsdp {} expert {}, mode {}", rank_,
             world_, static_cast<int64_t>(::getpid()), num_threads(), mesh_.data, mesh_.fsdp,
             mesh_.expert, parallel_mode_name(mode_));
  // The event log, metrics endpoint and stack dumps from here on (a collective: every
  // rank gets here).
  monitor_ = std::make_unique<TrainingMonitor>(t_, *comm_, run_dir_, process_start_);
  if (world_ > 1 && t_.check_links) links_ = check_links(*comm_);

  PreparedDataset data;
  if (t.use_sft || t.use_dpo) {
    data.tokenizer = t.tokenizer_path;
  } else {
    prepare_dataset(data);
  }
  check_tokenizer_size(*tokenizer_, data.tokenizer, config_, t);
  // A tokenizer without a BOS (Qwen) leaves the model's bos_token_id as configured.
  if (tokenizer_->bos_id() >= 0) t_.model.bos_id = tokenizer_->bos_id();
  t_.model.eos_id = tokenizer_->eos_id();
  setup_model(data, mem);
}

// Rank 0 prepares the dataset (tokenizer training, sharding); the others wait for its
// files outside any collective (preparing a large corpus can outlast
// collective_timeout_s; a failure on rank 0 aborts them all).
// The paths and key are rank 0's (another rank's view of the input, its absolute path,
// inode or modification time, may differ: a per-node copy, another working directory).
void TrainingRun::prepare_dataset(PreparedDataset& data) {
  const TrainConfig& t = t_;
  if (rank_ == 0) data = resolve_dataset(t, false);
  data.dir = agree_on_rank0(*comm_, data.dir);
  data.key = agree_on_rank0(*comm_, data.key);
  data.input = agree_on_rank0(*comm_, data.input);
  data.train = data.dir + "/train.bin";
  data.val = data.dir + "/val.bin";
  data.tokenizer = t.tokenizer_path.empty() ? data.dir : t.tokenizer_path;
  if (rank_ == 0) ensure_prepared(t, data);
  while (rank_ != 0 && !dataset_ready(data))
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  comm_->barrier();
  tokenizer_.emplace(text::Tokenizer::load(data.tokenizer));
}

void TrainingRun::setup_model(const PreparedDataset& data, const MemoryPlan& mem) {
  const TrainConfig& t = t_;

  // Weights, gradients and optimizer state live on the run's device (hardware).
  // LoRA: the base without gradients (frozen), the adapters with them.
  params_ = std::make_unique<ParamStore>(t.model, t.bf16, !t.lora.enabled(), backend_for(t.hardware).allocator());
  ParamStore& params = *params_;
  if (t.lora.enabled()) lora_ = std::make_unique<LoraAdapter>(params, t.lora, true, t.bf16);
  // Before anything is written, so initialising or loading holds one matrix in f32 at a time.
  if (base_bf16_only())
    log_info("lora: the frozen base's matrices are held in bf16 alone ({:.2f} GiB of f32 masters not kept)",
             double(params.drop_matrix_masters(true)) * 4.0 / double(1 << 30));
  moe_options_ = t.moe;
  if (mode_ == ParallelMode::kExpert)
    moe_options_.ep = make_expert_parallel(comm_, static_cast<int>(t.model.n_experts));
  causal_lm_ = std::make_unique<CausalLM>(params, [&] {
    // DPO runs its pairs' rows one at a time (each row's backward has its own weight).
    ModelOptions mo{t.use_dpo ? 1 : t.per_device_batch_size, t.max_target_length, t.bf16, t.remat, moe_options_};
    mo.quant = t.quant;
    return mo;
  }());
  causal_lm_->set_lora(lora_.get());
  model_ = causal_lm_.get();
  // With LoRA sync_ all-reduces the adapters' gradients; under fsdp base_sync_ gathers
  // the frozen base's buckets around their use and never reduces anything.
  sync_ = std::make_unique<GradientSync>(trained(), *comm_, lora_ ? ParallelMode::kData : mode_,
                                         t.overlap_communication);
  if (lora_ && mode_ == ParallelMode::kFsdp) {
    base_sync_ = std::make_unique<GradientSync>(params, *comm_, ParallelMode::kFsdp, t.overlap_communication);
    lora_hooks_ = std::make_unique<SplitHooks>(*base_sync_, *sync_);
  }
  if (world_ > 1) model_->set_hooks(lora_hooks_ ? static_cast<BucketHooks*>(lora_hooks_.get()) : sync_.get());
  OptimizerOptions oo;
  oo.beta1 = t.adam_b1;
  oo.beta2 = t.adam_b2;
  oo.eps = t.adam_eps;
  oo.weight_decay = t.weight_decay;
  oo.exclude_norms_and_embeddings = t.weight_decay_exclude_norms_and_embeddings;
  oo.clip_norm = t.gradient_clipping_threshold;
  optimizer_ = std::make_unique<AdamW>(trained(), oo, sync_->owned_ranges(), comm_);
  // use_sft: the file's last eval_fraction of the conversations are held out (at least
  // one, and only while a training step's worth remain).
  int64_t sft_train = 0;
  if (t.use_dpo) {
    const auto n = static_cast<int64_t>(dpo_->pairs.size());
    const int64_t held = std::min<int64_t>(n - t.per_device_batch_size,
                                           std::max<int64_t>(1, static_cast<int64_t>(double(n) * t.eval_fraction)));
    sft_train = n - std::max<int64_t>(held, 0);
    auto dl = std::make_unique<train::DpoLoader>(dpo_, 0, sft_train, t.per_device_batch_size, t.max_target_length,
                                                 t.data_shuffle_seed, true, pad_id());
    dpo_loader_ = dl.get();
    loader_ = std::move(dl);
    pair_batch_ = Batch::tokens(t.per_device_batch_size, 2 * t.max_target_length);
  } else if (t.use_sft) {
    const auto n = static_cast<int64_t>(sft_->examples.size());
    const int64_t held = std::min<int64_t>(n - t.per_device_batch_size * world_,
                                           std::max<int64_t>(1, static_cast<int64_t>(double(n) * t.eval_fraction)));
    sft_train = n - std::max<int64_t>(held, 0);
    auto sft = std::make_unique<train::SftLoader>(sft_, 0, sft_train, t.per_device_batch_size,
                                                  t.max_target_length, t.data_shuffle_seed, true, pad_id(),
                                                  comm_->rank(), comm_->world_size(), t.packing);
    if (t.packing)
      log_info("sft: {} conversations packed into {} sequences of {} tokens ({:.2f} per sequence)", sft_train,
               sft->sequences_per_epoch(), t.max_target_length, sft->conversations_per_sequence());
    loader_ = std::move(sft);
  } else {
    loader_ = std::make_unique<train::DataLoader>(
        std::vector<std::string>{data.train}, t.per_device_batch_size, t.max_target_length,
        t.data_shuffle_seed, true, comm_->rank(), comm_->world_size());
  }
  batch_ = model_->make_batch();

  resume_from_ = options_.resume.empty()
                     ? latest_checkpoint(run_dir_)
                     : std::optional<std::string>(resolve_checkpoint_dir(options_.resume));
  if (resume_from_) {
    if (options_.resume.empty()) log_config_changes(config_, *resume_from_);
    check_resume_shape(config_, *resume_from_);  // names the key, the values, the source
    const DecoderConfig saved = read_checkpoint_config(*resume_from_);
    HYP_CHECK(saved.dim == t.model.dim && saved.n_layers == t.model.n_layers &&
                  saved.vocab_size == t.model.vocab_size && saved.ffn_dim == t.model.ffn_dim &&
                  saved.n_heads == t.model.n_heads && saved.n_kv_heads == t.model.n_kv_heads &&
                  saved.tie_embeddings == t.model.tie_embeddings &&
                  saved.n_experts == t.model.n_experts &&
                  saved.n_experts_per_tok == t.model.n_experts_per_tok &&
                  saved.expert_ffn_dim() == t.model.expert_ffn_dim() &&
                  saved.first_dense_layers == t.model.first_dense_layers &&
                  saved.moe_layer_step == t.model.moe_layer_step &&
                  saved.arch.family == t.model.arch.family,
              "resume: checkpoint {} holds a different model shape than the config", *resume_from_);
    monitor_->restore_started();
    Timer restore_timer;
    if (lora_) {
      // The frozen base is what the run started from; the adapters and moments resume.
      if (!t.load_parameters_path.empty())
        load_model_weights(t.load_parameters_path, params);
      else
        params.init(t.init_weights_seed);
      if (QuantizedMatmuls* q = model_->quantized()) q->weights_changed();
      convert::read_peft_tensors(*resume_from_, *lora_);
      state_ = load_training_state(*resume_from_, lora_->store(), *optimizer_, false);
    } else {
      state_ = load_training_state(*resume_from_, params, *optimizer_);
    }
    monitor_->restore_done(state_.step, restore_timer.seconds());
    release_unowned();
    loader_->restore(state_.data);
    if (QuantizedMatmuls* q = model_->quantized()) {
      q->weights_changed();  // the loaded weights
      if (state_.quantization == quant_mode_name(q->options().mode)) {
        q->restore(state_.quant_passes, state_.quant_histories);
      } else {
        log_info(
            "resume: the checkpoint was trained with quantization '{}'; {} starts fresh "
            "(pass counter 0, empty amax histories)",
            state_.quantization, quant_mode_name(q->options().mode));
      }
    }
    log_info("resume: from {} at step {}", *resume_from_, state_.step);
  } else if (!t.load_parameters_path.empty()) {
    // Fine-tuning: the weights of a Hugging Face directory, a fresh optimizer.
    monitor_->restore_started();
    Timer restore_timer;
    load_model_weights(t.load_parameters_path, params);
    monitor_->restore_done(0, restore_timer.seconds());
    if (QuantizedMatmuls* q = model_->quantized()) q->weights_changed();
    if (lora_) lora_->init(t.init_weights_seed);
    release_unowned();
    log_info("load_parameters_path: weights from {}; {}", t.load_parameters_path,
             lora_ ? "frozen, LoRA adapters fresh" : "optimizer fresh");
  } else {
    params.init(t.init_weights_seed);
    if (lora_) lora_->init(t.init_weights_seed);
    release_unowned();
  }
  if (lora_)
    log_info("lora: rank {}, alpha {} (scale {}), on {}: {} adapter parameters ({:.2f}% of the model's {}) train, "
             "the base is frozen{}",
             t.lora.rank, t.lora.alpha, lora_->scale(), lora_target_list(t.lora), lora_->elements(),
             100.0 * double(lora_->elements()) / double(t.model.total_params()), t.model.total_params(),
             t.quant.enabled() ? fmt::format(" ({} matmuls)", quant_mode_name(t.quant.mode)) : "");
  result_.start_step = state_.step;
  if (t.use_dpo) prepare_dpo_reference();
  // Rank 0 writes the metrics (the loss is averaged over ranks first).
  metrics_ = std::make_unique<MetricsWriter>(run_dir_, rank_ == 0, resume_from_ ? state_.step : 0);
  report_setup(mem);

  // Held-out evaluation uses its own loader over val.bin (in order, no shuffle).
  try {
    if (t.use_dpo) {
      auto dl = std::make_unique<train::DpoLoader>(dpo_, sft_train, static_cast<int64_t>(dpo_->pairs.size()) - sft_train,
                                                   1, t.max_target_length, 0, false, pad_id());
      dpo_val_ = dl.get();
      val_loader_ = std::move(dl);
    } else if (t.use_sft)
      val_loader_ = std::make_unique<train::SftLoader>(
          sft_, sft_train, static_cast<int64_t>(sft_->examples.size()) - sft_train, t.per_device_batch_size,
          t.max_target_length, 0, false, pad_id());
    else
      val_loader_ = std::make_unique<train::DataLoader>(
          std::vector<std::string>{data.val}, t.per_device_batch_size, t.max_target_length, 0, false);
  } catch (const Error& e) {
    log_warn("eval: held-out split unusable, skipping evaluation: {}", e.what());
  }
  ckpt_ = std::make_unique<CheckpointManager>(
      run_dir_, t.checkpoints_to_keep, t.async_checkpointing, comm_,
      lora_ ? std::vector<int>(lora_->store().infos().size(), 0) : sync_->tensor_writers());
  ckpt_->set_max_shard_bytes(t.checkpoint_max_shard_bytes);
  if (lora_)
    ckpt_->set_adapter(convert::peft_config_json(
        t.lora, t.load_parameters_path.empty() ? std::string("hyperion:") + t.name : t.load_parameters_path));
  config_values_ = config_.values();
}

// Start-up report: sizes, memory by category, FLOPs and the MFU denominator.
void TrainingRun::report_setup(const MemoryPlan& mem) {
  const TrainConfig& t = t_;
  flops_per_token_ = t.lora.enabled() ? lora_train_flops_per_token(t.model, t.lora, t.max_target_length)
                                     : t.model.train_flops_per_token(t.max_target_length);
  if (t.peak_tflops > 0) {
    // A given peak is the compute dtype's; int8 runs then report MFU = EMFU.
    result_.peak_gflops = result_.peak_bf16_gflops = t.peak_tflops * 1e3;
  } else if (t.hardware != Device::kHost) {
    // The GPU's own measured matmul rate (one process, one device).
    const double g = measure_backend_gemm_gflops(backend_for(t.hardware),
                                                 t.bf16 ? DType::kBF16 : DType::kF32, 8192);
    result_.peak_gflops = result_.peak_bf16_gflops = g;
  } else {
    // Rank 0 measures (one rank's threads) while the others wait; the job's peak is
    // that times the ranks.
    double g[2] = {0, 0};
    if (rank_ == 0) {
      const PeakResult peak = measure_peak(0.2);
      g[1] = t.bf16 ? peak.bf16_gflops : peak.f32_gflops;
      g[0] = t.quant.mode == QuantMode::kInt8 ? peak.int8_gops : g[1];
    }
    if (world_ > 1) comm_->broadcast(g, sizeof g, 0);
    result_.peak_gflops = g[0] * world_;
    result_.peak_bf16_gflops = g[1] * world_;
  }
  log_info(
      "model: {} {} params ({} non-embedding), {} layers, dim {}, heads {}/{}, ffn {}, vocab {}",
      family_info(t.model.arch.family).decoder_block, t.model.total_params(),
      t.model.non_embedding_params(), t.model.n_layers, t.model.dim, t.model.n_heads,
      t.model.n_kv_heads, t.model.ffn_dim, t.model.vocab_size);
  if (t.model.is_moe()) {
    const MoeShape& ms = causal_lm_->moe_shape();
    log_info(
        "moe: {} of {} layers, {} experts (ffn {}), top-{}, {} ({} rows per layer), "
        "{} active params per token, load-balance weight {}, z-loss weight {}",
        t.model.n_moe_layers(), t.model.n_layers, ms.e, ms.f, ms.k,
        ms.capacity >= 0 ? fmt::format("capped: capacity {} per expert per sequence (factor {})",
                                       ms.capacity, t.moe.capacity_factor)
                         : std::string("dropless"),
        ms.rows, t.model.active_non_embedding_params(), t.moe.load_balance_weight,
        t.moe.z_loss_weight);
  }
  log_info(
      "memory: weights {} + bf16 copy {} + grads {} + adam {}; activations {} (remat {}), "
      "scratch {} (allocated: activations {}, scratch {})",
      format_bytes(mem.weight_bytes), format_bytes(mem.compute_weight_bytes),
      format_bytes(mem.grad_bytes), format_bytes(mem.optimizer_bytes),
      format_bytes(mem.activation_bytes), remat_policy_name(t.remat),
      format_bytes(mem.scratch_bytes), format_bytes(causal_lm_->activation_bytes()),
      format_bytes(causal_lm_->scratch_bytes()));
  log_info(
      "train: {} steps x {} tokens (global batch: {} per rank x {} x {} accum x {} ranks), "
      "dtype {}{}, {:.3g} FLOPs/token, peak {:.0f} GFLOP/s (bf16 {:.0f}: EMFU), {} threads "
      "per rank, run dir {}",
      t.steps, t.tokens_per_step(), t.per_device_batch_size, t.max_target_length,
      t.gradient_accumulation_steps, world_, t.bf16 ? "bf16" : "f32",
      t.quant.enabled() ? fmt::format(", quantization {}", quant_mode_name(t.quant.mode)) : "",
      flops_per_token_, result_.peak_gflops, result_.peak_bf16_gflops, num_threads(), run_dir_);
  if (world_ > 1) {
    log_info("parallel: {} over {} ranks ({}), communicator {}, overlap {}, timeout {} s",
             parallel_mode_name(mode_), world_,
             fmt::format("data {} fsdp {} expert {}", mesh_.data, mesh_.fsdp, mesh_.expert),
             comm_->name(), t.overlap_communication, t.collective_timeout_s);
    log_info("hosts: {}", dist::placement_summary(*comm_));
    report_links();
  }
}

// Rank 0 logs the last link check: the rates, or the slow host by name.
void TrainingRun::report_links() const {
  if (links_.rounds == 0 || rank_ != 0) return;
  const std::string when =
      state_.step > result_.start_step ? fmt::format(" at step {}", state_.step) : "";
  const std::string slow = describe_slow_links(*comm_, links_);
  if (slow.empty())
    log_info("links{}: {:.2f} Gb/s median to and from each rank's peers, slowest {:.2f}", when,
             links_.gbit_median, *std::min_element(links_.gbit.begin(), links_.gbit.end()));
  else
    log_warn("straggler: a slow link{}: {} (check_links; every collective waits for it)", when,
             slow);
}

void TrainingRun::save() {
  if (!t_.enable_checkpointing || saved_step_ == state_.step) return;
  saved_step_ = state_.step;
  monitor_->save_started(state_.step);
  Timer blocked;
  sync_->gather_all();
  state_.data = loader_->state();
  if (QuantizedMatmuls* q = model_->quantized()) {
    state_.quantization = quant_mode_name(q->options().mode);
    state_.quant_passes = q->passes();
    state_.quant_histories = q->histories();
  }
  ckpt_->save(trained(), *optimizer_, state_, tokenizer_->files(), config_values_);
  monitor_->save_done(state_.step, blocked.seconds());
  result_.checkpoint = ckpt_->checkpoints_dir() + "/" + std::to_string(state_.step);
}

// Held-out loss on a forward-only model (no backward buffers; FSDP gathers bucket by
// bucket through the hooks). Built per evaluation so training steps never hold it.
// The reference log-probabilities: the starting weights' (the loaded model's, or the
// initialisation's), computed once and kept in the run directory, where a resumed run
// reads them back (its weights are no longer the starting ones).
void TrainingRun::prepare_dpo_reference() {
  const std::string path = run_dir_ + "/dpo_reference.json";
  const size_t n = dpo_->pairs.size();
  if (resume_from_) {
    HYP_CHECK(fs::exists(path), "resume: {} is missing; a DPO run's reference log-probabilities live there", path);
    const nlohmann::json j = nlohmann::json::parse(io::read_file(path));
    HYP_CHECK(j.value("pairs", int64_t{-1}) == static_cast<int64_t>(n) && j["logprobs"].size() == 2 * n,
              "resume: {} holds the reference of {} pairs; {} has {}", path, j.value("pairs", int64_t{-1}),
              t_.dataset_path, n);
    dpo_ref_ = j["logprobs"].get<std::vector<double>>();
    log_info("dpo: reference log-probabilities of {} pairs from {}", n, path);
    return;
  }
  Timer timer;
  // With LoRA the reference is the base: the adapter switched off (no second model).
  causal_lm_->set_lora(nullptr);
  dpo_ref_.assign(2 * n, 0.0);
  std::vector<int32_t> in(static_cast<size_t>(t_.max_target_length)), tg(in.size());
  for (size_t i = 0; i < n; ++i) {
    const train::DpoPair& p = dpo_->pairs[i];
    int side = 0;
    for (const train::SftExample* e : {&p.chosen, &p.rejected}) {
      train::sft_row(*e, t_.max_target_length, pad_id(), in.data(), tg.data());
      dpo_ref_[2 * i + static_cast<size_t>(side++)] = train::row_logprob(*causal_lm_, in.data(), tg.data());
    }
  }
  causal_lm_->set_lora(lora_.get());
  nlohmann::json j;
  j["pairs"] = n;
  j["logprobs"] = dpo_ref_;
  if (rank_ == 0) io::write_file_atomic(path, j.dump());
  log_info("dpo: reference log-probabilities of {} pairs in {:.1f} s, kept in {}", n, timer.seconds(), path);
}

// Held-out pairs: the mean loss against their reference, forward only.
EvalResult TrainingRun::evaluate_dpo(int64_t max_batches) {
  const int64_t pairs = dpo_val_->sequences_per_epoch();
  const int64_t n = max_batches > 0 ? std::min(max_batches * t_.per_device_batch_size, pairs) : pairs;
  dpo_val_->restore({0, 0});
  Batch b = Batch::tokens(1, 2 * t_.max_target_length);
  const int64_t t = t_.max_target_length;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    dpo_val_->next(b);
    const auto id = static_cast<size_t>(dpo_val_->last_pairs().front());
    const double pc = train::row_logprob(*causal_lm_, b.inputs.data(), b.targets.data());
    const double pr = train::row_logprob(*causal_lm_, b.inputs.data() + t, b.targets.data() + t);
    sum += train::dpo_terms(pc, pr, dpo_ref_[2 * id], dpo_ref_[2 * id + 1], t_.dpo_beta, t_.dpo_label_smoothing).loss;
  }
  return {n > 0 ? sum / double(n) : 0.0, n};
}

EvalResult TrainingRun::evaluate(int64_t max_batches) {
  if (t_.use_dpo) return evaluate_dpo(max_batches);
  train::SequenceBatcher& loader = *val_loader_;
  ForwardModel model(*params_, t_.per_device_batch_size, t_.max_target_length, moe_options_);
  model.set_lora(lora_.get());
  // (LoRA: the adapters are whole on every rank; an fsdp base gathers per bucket.)
  model.set_hooks(world_ <= 1 ? nullptr : !lora_ ? sync_.get() : base_sync_.get());
  const int64_t n = model.tokens_per_batch();
  std::vector<int32_t> in(static_cast<size_t>(n)), tg(static_cast<size_t>(n));
  const int64_t per_epoch = loader.sequences_per_epoch() / t_.per_device_batch_size;
  const int64_t batches = max_batches > 0 ? std::min(max_batches, per_epoch) : per_epoch;
  loader.restore({0, 0});
  double sum = 0;
  int64_t count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    loader.next(in.data(), tg.data());
    CrossEntropyResult r = model.loss(in.data(), tg.data());
    sum += r.loss * double(r.count);
    count += r.count;
  }
  return {count > 0 ? sum / double(count) : 0.0, count};
}

uint64_t TrainingRun::lora_dropout_key(int64_t micro) const {
  if (!lora_ || t_.lora.dropout <= 0) return 0;
  // A function of the seed, the step, the micro-batch and the rank: a resumed run repeats
  // its masks, and no two ranks or micro-batches share one.
  const uint64_t k = dropout_key(dropout_key(t_.init_weights_seed, static_cast<uint64_t>(state_.step)),
                                 static_cast<uint64_t>(micro * world_ + rank_));
  return k != 0 ? k : 1;
}

void TrainingRun::step() {
  adapt_threads_to_contention();  // a busy neighbour: the team it actually gets
  const TrainConfig& t = t_;
  const bool moe = t.model.is_moe();
  // Each rank's backward is scaled by 1 / (accumulation x ranks), so the summed
  // gradients are the mean over the global batch (no separate division pass; for expert
  // parallelism the sums over every rank's tokens come out right as well).
  const float dloss = 1.0f / static_cast<float>(t.gradient_accumulation_steps * world_);
  const float dmean = 1.0f / static_cast<float>(t.gradient_accumulation_steps);
  monitor_->step_started(state_.step + 1);
  Timer step_timer;
  double data_wait = 0, loss = 0;
  MoeStats ms;
  sync_->zero_grads();
  const double comm_before = comm_->seconds(), wait_before = comm_->wait_seconds();
  const uint64_t bytes_before = comm_->bytes_sent();
  dpo_stats_ = {};
  for (int64_t micro = 0; micro < t.gradient_accumulation_steps; ++micro) {
    Timer dt;
    if (t.use_dpo) {
      dpo_loader_->next(pair_batch_);
      data_wait += dt.seconds();
      std::vector<double> ref;
      for (int64_t id : dpo_loader_->last_pairs()) {
        ref.push_back(dpo_ref_[static_cast<size_t>(2 * id)]);
        ref.push_back(dpo_ref_[static_cast<size_t>(2 * id + 1)]);
      }
      sync_->begin_micro_batch(micro + 1 == t.gradient_accumulation_steps);
      // The step's loss: the mean over its pairs (each micro-batch's mean, averaged).
      const train::DpoStepStats st = train::dpo_accumulate(*causal_lm_, pair_batch_, ref, t.dpo_beta,
                                                           t.dpo_label_smoothing,
                                                           dmean / double(t.per_device_batch_size),
                                                           lora_dropout_key(micro));
      sync_->end_micro_batch();
      loss += st.loss * dmean;
      dpo_stats_.loss += st.loss * dmean;
      dpo_stats_.rewards_chosen += st.rewards_chosen * dmean;
      dpo_stats_.rewards_rejected += st.rewards_rejected * dmean;
      dpo_stats_.accuracies += st.accuracies * dmean;
      dpo_stats_.margins += st.margins * dmean;
      dpo_stats_.pairs += st.pairs;
      continue;
    }
    loader_->next(batch_);
    data_wait += dt.seconds();
    sync_->begin_micro_batch(micro + 1 == t.gradient_accumulation_steps);
    causal_lm_->set_lora_dropout_key(lora_dropout_key(micro));
    loss += model_->forward_backward(batch_, dloss).loss * dmean;
    causal_lm_->set_lora_dropout_key(0);
    sync_->end_micro_batch();
    if (moe) {
      const MoeStats& s = model_->moe_stats();
      ms.lb_loss += s.lb_loss * dmean;
      ms.z_loss += s.z_loss * dmean;
      ms.dropped_fraction += s.dropped_fraction * dmean;
      ms.load_cv += s.load_cv * dmean;
      ms.load_min = micro == 0 ? s.load_min : std::min(ms.load_min, s.load_min);
      ms.load_max = std::max(ms.load_max, s.load_max);
    }
  }
  const double lr = t.schedule.lr(state_.step);
  const OptimizerStepResult opt = optimizer_->step(lr);
  sync_->after_optimizer_step();
  if (base_sync_) base_sync_->after_optimizer_step();  // every base bucket released
  // (A LoRA run's base never changes: its quantised copy stays.)
  if (QuantizedMatmuls* q = model_->quantized(); q != nullptr && !lora_) q->weights_changed();
  const int local_stop = stop_signal_received();
  stop_requested_ = local_stop;
  if (world_ > 1) {
    // The job's objective: the mean over ranks (each rank's loss is its tokens' mean).
    // The same reduction carries the stop signal, so every rank stops after this step
    // if any rank was asked to (mpirun and Slurm signal the ranks one by one).
    float l[4] = {static_cast<float>(loss), ms.lb_loss, ms.z_loss, static_cast<float>(local_stop)};
    comm_->all_reduce(l, 4, dist::ReduceOp::kAvg);
    loss = l[0];
    ms.lb_loss = l[1];
    ms.z_loss = l[2];
    if (l[3] > 0 && stop_requested_ == 0) stop_requested_ = SIGTERM;
  }
  state_.step += 1;
  state_.tokens_seen += t.tokens_per_step();

  StepMetrics m;
  m.step = state_.step;
  m.lm_loss = loss;
  m.loss = loss + ms.lb_loss + ms.z_loss;
  m.moe = ms;
  m.grad_norm = opt.grad_norm;
  m.lr = lr;
  m.step_s = step_timer.seconds();
  m.tokens_per_s = double(t.tokens_per_step()) / m.step_s;
  m.tflops = flops_per_token_ * m.tokens_per_s / 1e12;
  m.mfu = m.tflops * 1e3 / result_.peak_gflops;
  m.emfu = m.tflops * 1e3 / result_.peak_bf16_gflops;
  m.data_wait_s = data_wait;
  m.comm_s = comm_->seconds() - comm_before;
  m.comm_wait_s = comm_->wait_seconds() - wait_before;
  m.comm_bytes = comm_->bytes_sent() - bytes_before;
  m.skipped = opt.skipped;
  m.device_peak_mib = device_peak_mib();
  if (t.use_dpo) {
    m.dpo = true;
    m.rewards_chosen = dpo_stats_.rewards_chosen;
    m.rewards_rejected = dpo_stats_.rewards_rejected;
    m.rewards_accuracies = dpo_stats_.accuracies;
    m.rewards_margins = dpo_stats_.margins;
  }
  if (opt.skipped && skipped_lines_())
    log_warn("step {}: non-finite gradient norm, update skipped ({} so far; this line is "
             "logged at the 1st, 2nd, 4th, 8th... skip; every one is counted in "
             "metrics.jsonl and hyperion_train_skipped_steps_total)",
             m.step, skipped_lines_.count());
  HYP_CHECK(std::isfinite(m.loss), "step {}: loss is {} (diverged); lower learning_rate", m.step,
            m.loss);
  metrics_->write(m, state_.tokens_seen, world_ > 1, moe);
  monitor_->step_done(m);
  result_.history.push_back(m);
  if (state_.step > result_.start_step + 1) {  // the first step warms caches up
    tps_sum_ += m.tokens_per_s;
    mfu_sum_ += m.mfu;
    emfu_sum_ += m.emfu;
    ++timed_steps_;
  }
  const bool log_now =
      state_.step % t.log_period == 0 || state_.step == 1 || state_.step == t.steps;
  if (!options_.quiet && log_now)
    log_info(
        "step {:>5}  loss {:.4f}  grad_norm {:.3f}  lr {:.2e}  {:.3f} s  {:.0f} tok/s  "
        "{:.3f} TFLOP/s  MFU {:.1f}%{}  data {:.1f} ms",
        m.step, m.loss, m.grad_norm, m.lr, m.step_s, m.tokens_per_s, m.tflops, 100 * m.mfu,
        t.quant.enabled() ? fmt::format("  EMFU {:.1f}%", 100 * m.emfu) : "", 1e3 * m.data_wait_s);
  if (!options_.quiet && moe && log_now)
    log_info(
        "           moe: lb_loss {:.4f}  z_loss {:.4f}  dropped {:.2f}%  expert load "
        "min {:.2f} max {:.2f} cv {:.3f}",
        ms.lb_loss, ms.z_loss, 100 * ms.dropped_fraction, ms.load_min, ms.load_max, ms.load_cv);
  if (val_loader_ && t.eval_interval > 0 && state_.step % t.eval_interval == 0 &&
      state_.step < t.steps) {
    monitor_->eval_started();
    EvalResult e = evaluate(t.eval_batches);
    monitor_->eval_done();
    if (t.use_dpo)
      log_info("eval  step {:>5}  held-out DPO loss {:.4f} over {} pairs", state_.step, e.loss, e.tokens);
    else
      log_info("eval  step {:>5}  held-out loss {:.4f}  perplexity {:.2f}", state_.step, e.loss,
               std::exp(e.loss));
  }
}

// Asked to stop: save where the run is (the same command resumes from here), wait for
// the write, and leave together; no evaluation or samples.
TrainResult TrainingRun::stop_early() {
  log_warn("stopping after step {} on {}: saving a checkpoint; the same command resumes from it",
           state_.step, stop_requested_ == SIGINT ? "SIGINT" : "SIGTERM");
  stop_signal_saving();  // the save may take longer than the grace period
  save();
  ckpt_->wait();
  if (world_ > 1) comm_->barrier();  // no rank exits while another still writes
  result_.steps = state_.step;
  result_.stopped_by_signal = stop_requested_;
  result_.seconds = total_.seconds();
  result_.device_peak_mib = device_peak_mib();
  result_.world_size = world_;
  result_.parallel_mode = parallel_mode_name(mode_);
  monitor_->finished(state_.step, false);
  return std::move(result_);
}

void TrainingRun::finish() {
  const TrainConfig& t = t_;
  if (state_.step > result_.start_step)
    save();
  else if (resume_from_)
    result_.checkpoint = *resume_from_;
  ckpt_->wait();
  result_.steps = state_.step;
  if (timed_steps_ > 0) {
    result_.mean_tokens_per_s = tps_sum_ / double(timed_steps_);
    result_.mean_mfu = mfu_sum_ / double(timed_steps_);
    result_.mean_emfu = emfu_sum_ / double(timed_steps_);
  }
  if (t.enable_checkpointing)
    log_info("checkpoint: {} (training thread blocked {:.2f} s in total for saves)",
             result_.checkpoint, ckpt_->blocking_seconds());

  if (val_loader_) {
    monitor_->eval_started();
    EvalResult e = evaluate(0);
    monitor_->eval_done();
    result_.eval_loss = e.loss;
    result_.eval_perplexity = std::exp(e.loss);
    result_.eval_tokens = e.tokens;
    if (t.use_dpo)
      log_info("eval: held-out DPO loss {:.4f} over {} pairs", e.loss, e.tokens);
    else
      log_info("eval: held-out loss {:.4f}, perplexity {:.2f} over {} tokens", e.loss,
               result_.eval_perplexity, e.tokens);
  }
  // Sampling runs on rank 0 alone, outside the parallel model: it needs every expert.
  if (t.sample_count > 0 && t.sample_max_tokens > 0) {
    sync_->gather_all(true);
    if (base_sync_) base_sync_->gather_all();
  }
  if (t.sample_count > 0 && t.sample_max_tokens > 0 && rank_ == 0) {
    const text::Tokenizer& tok = *tokenizer_;
    Generator gen(*params_, std::min<int64_t>(t.model.max_seq_len, 1 + t.sample_max_tokens));
    gen.set_lora(lora_.get());
    for (int64_t s = 0; s < t.sample_count; ++s) {
      GenerateOptions go;
      go.sampling.temperature = static_cast<float>(t.sample_temperature);
      go.sampling.top_p = 0.95f;
      go.sampling.seed = static_cast<uint64_t>(s + 1);
      go.max_tokens = t.sample_max_tokens;
      go.eos_id = tok.eos_id();
      go.end_ids = tok.end_ids();
      gen.reset();
      // Samples start from BOS, or for a vocabulary without one from EOS (a document
      // boundary: data prepare ends every document with it).
      std::vector<int32_t> toks =
          generate_tokens(gen, {tok.bos_id() >= 0 ? tok.bos_id() : tok.eos_id()}, go);
      if (!toks.empty() && tok.is_end(toks.back())) toks.pop_back();
      result_.samples.push_back(tok.decode(toks));
    }
  }
  // Peak resident memory, the largest over ranks (what FSDP and ZeRO-1 reduce).
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  float rss_mib = static_cast<float>(usage.ru_maxrss) / 1024.0f;  // ru_maxrss is in KiB
  if (world_ > 1) comm_->all_reduce(&rss_mib, 1, dist::ReduceOp::kMax);
  result_.peak_rss_mib = rss_mib;
  log_info("memory: peak resident {:.0f} MiB{}", rss_mib, world_ > 1 ? " (largest rank)" : "");
  result_.device_peak_mib = device_peak_mib();
  if (result_.device_peak_mib >= 0)
    log_info("memory: device peak {:.0f} MiB allocated on {}", result_.device_peak_mib,
             backend_for(t_.hardware).name());
  result_.world_size = world_;
  result_.parallel_mode = parallel_mode_name(mode_);
  result_.seconds = total_.seconds();
}

TrainResult train_ranks(const Config& config, TrainConfig t, const TrainOptions& options,
                        dist::Communicator& comm, double process_start) {
  if (t.dlrm_model) return run_recsys_training(config, t, options, comm, process_start);
  if (t.diffusion_model) return run_diffusion_training(config, t, options, comm, process_start);
  TrainingRun run(config, std::move(t), options, comm, process_start);
  return run.run();
}

}  // namespace

}  // namespace hyperion
