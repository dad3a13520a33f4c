#include "train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "base/system_memory.h"
#include "base/threads.h"
#include "base/timer.h"
#include "dist/communicator.h"
#include "io/atomic_file.h"
#include "io/directory_lock.h"
#include "io/text_input.h"
#include "io/tokenizer.h"
#include "kernels/peak.h"
#include "model/llama_generator.h"
#include "model/llama_model.h"
#include "train/checkpoint.h"
#include "train/data_loader.h"
#include "train/data_prepare.h"
#include "train/optimizer.h"
#include "train/parallel.h"

namespace hyperion {

namespace fs = std::filesystem;

namespace {

bool is_prepared(const std::string& dir) {
  return fs::exists(dir + "/train.bin") && fs::exists(dir + "/val.bin") &&
         fs::exists(dir + "/tokenizer.model");
}

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

// Exactly equal: eval, generate, serve and convert refuse a checkpoint whose tokenizer
// differs from its vocab_size, so a run that trained with fewer pieces would write
// checkpoints nothing can load. (Tokenizers trained here always have vocab_size pieces.)
void check_tokenizer_size(const io::Tokenizer& tokenizer, const std::string& path,
                          const Config& config, const TrainConfig& t) {
  HYP_CHECK(tokenizer.vocab_size() == t.model.vocab_size,
            "tokenizer {} has {} tokens but config key vocab_size ({}) is {}; they must be equal "
            "(set vocab_size={})",
            path, tokenizer.vocab_size(), config.source_of("vocab_size"), t.model.vocab_size,
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
  const std::string per_rank =
      mode != ParallelMode::kData && world > 1
          ? fmt::format(", each rank holding its {} share of {} ranks", parallel_mode_name(mode),
                        world)
          : "";
  check_fits_in_memory(sat_mul(mem.total(), ranks),
                       fmt::format("training {} ({} parameters{}{})", t.name,
                                   t.model.total_params(), per_rank,
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
      log_info("resume: {} differs from the checkpoint's config: {} -> {} ({})", key, before,
               value, config.source_of(key));
  }
}

// Keeps the metrics of steps <= `step` (a resumed run rewrites what came after).
void truncate_metrics(const std::string& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).at("step").get<int64_t>() <= step) kept += line + "\n";
    } catch (const std::exception&) {
      // A torn last line from a killed run: dropped.
    }
  }
  io::write_file_atomic(path, kept);
}

struct EvalResult {
  double loss = 0;
  int64_t tokens = 0;
};

EvalResult evaluate(LlamaModel& model, train::DataLoader& loader, int64_t max_batches) {
  const int64_t n = model.tokens_per_batch();
  std::vector<int32_t> in(static_cast<size_t>(n)), tg(static_cast<size_t>(n));
  const int64_t per_epoch = loader.sequences_per_epoch() / model.options().batch;
  const int64_t batches = max_batches > 0 ? std::min(max_batches, per_epoch) : per_epoch;
  loader.restore({0, 0});
  double sum = 0;
  int64_t count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    loader.next(in.data(), tg.data());
    CrossEntropyResult r = model.forward_loss(in.data(), tg.data());
    sum += r.loss * double(r.count);
    count += r.count;
  }
  return {count > 0 ? sum / double(count) : 0.0, count};
}

}  // namespace

PreparedDataset resolve_dataset(const TrainConfig& t, bool prepare) {
  PreparedDataset d;
  std::string input = t.dataset_path;
  if (!input.empty() && fs::is_directory(input)) {
    HYP_CHECK(is_prepared(input),
              "dataset_path '{}': a directory must hold train.bin, val.bin and tokenizer.model "
              "(made by `hyperion data prepare`)",
              input);
    d.dir = input;
  } else {
    if (input.empty()) input = io::require_bundled_corpus("dataset_path is empty");
    HYP_CHECK(fs::is_regular_file(input), "dataset_path '{}': no such file or directory", input);
    const std::string stem = fs::path(input).stem().string();
    // fmt::format rather than `"-" + string` chains: GCC 12 -Wrestrict misfires on those.
    d.dir = fmt::format("{}/datasets/{}-v{}", t.base_output_directory, stem, t.model.vocab_size);
    if (!t.tokenizer_path.empty())
      d.dir += fmt::format("-{}", fs::path(t.tokenizer_path).stem().string());
    if (prepare && !is_prepared(d.dir)) {
      train::PrepareOptions po;
      po.inputs = {input};
      po.output_dir = d.dir;
      po.tokenizer_model = t.tokenizer_path;
      po.vocab_size = static_cast<int>(t.model.vocab_size);
      po.val_fraction = t.eval_fraction;
      log_info("data: preparing {} into {} (vocab {})", input, d.dir, t.model.vocab_size);
      train::PrepareResult r = train::prepare_dataset(po);
      log_info("data: {} documents, {} train / {} held-out tokens, {:.1f} s", r.documents,
               r.train_tokens, r.val_tokens, r.seconds);
    }
  }
  d.train = d.dir + "/train.bin";
  d.val = d.dir + "/val.bin";
  d.tokenizer = t.tokenizer_path.empty() ? d.dir + "/tokenizer.model" : t.tokenizer_path;
  return d;
}

namespace {

// The same string on every rank: rank 0's.
std::string agree(dist::Communicator& comm, const std::string& value) {
  if (comm.world_size() == 1) return value;
  uint64_t n = value.size();
  comm.broadcast(&n, sizeof n, 0);
  std::string out = comm.rank() == 0 ? value : std::string(n, '\0');
  comm.broadcast(out.data(), n, 0);
  return out;
}

TrainResult train_ranks(const Config& config, TrainConfig t, const TrainOptions& options,
                        dist::Communicator& comm_ref);

}  // namespace

TrainResult run_training(const Config& config, const std::string& config_name,
                         const TrainOptions& options) {
  TrainConfig t = parse_train_config(config, config_name);
  std::unique_ptr<dist::Communicator> comm =
      dist::make_communicator(t.communicator, t.collective_timeout_s);
  if (comm->world_size() == 1) return train_ranks(config, t, options, *comm);
  try {
    return train_ranks(config, t, options, *comm);
  } catch (const std::exception& e) {
    // The other ranks would wait for this one in their next collective: end them all.
    log_error("rank {}: {}", comm->rank(), e.what());
    comm->abort(1);  // does not return
  }
  return {};  // unreachable: the compiler cannot see through the virtual [[noreturn]]
}

namespace {

TrainResult train_ranks(const Config& config, TrainConfig t, const TrainOptions& options,
                        dist::Communicator& comm_ref) {
  Timer total;
  TrainResult result;
  dist::Communicator* comm = &comm_ref;
  const int rank = comm->rank(), world = comm->world_size();
  const MeshConfig mesh = resolve_mesh(t.mesh, world);
  const ParallelMode mode = mesh.fsdp > 1                                  ? ParallelMode::kFsdp
                            : mesh.expert > 1                              ? ParallelMode::kExpert
                            : t.shard_optimizer_over_data && mesh.data > 1 ? ParallelMode::kZero1
                                                                           : ParallelMode::kData;
  // Every rank sees different data: the mesh's axes all split the batch.
  t.data_ranks = world;
  // Everything this process will hold, checked before any of it is allocated or any
  // data is prepared (data parallelism holds the whole plan on every rank; the sharded
  // modes their share of it).
  const MemoryPlan mem =
      rank_memory_plan(memory_plan(t.model, t.per_device_batch_size, t.max_target_length, t.bf16,
                                   t.remat, t.moe.capacity_factor),
                       t.model, mode, world);
  check_training_memory(config, t, mem, mode, world, dist::detect_launch().local_size);
  // A given tokenizer is checked before the run directory or the dataset exists (a
  // mismatch found after preparing the data leaves an empty run behind).
  if (!t.tokenizer_path.empty())
    check_tokenizer_size(io::Tokenizer::load(t.tokenizer_path), t.tokenizer_path, config, t);

  // Run directory: base_output_directory/run_name, or the directory being resumed.
  std::string run_dir;
  if (!options.resume.empty()) {
    HYP_CHECK(fs::is_directory(options.resume), "--resume '{}': no such directory", options.resume);
    run_dir = has_model_weights(options.resume)
                  ? fs::path(options.resume).parent_path().parent_path().string()
                  : options.resume;
  } else {
    const std::string name = t.run_name.empty() ? t.name + "-" + timestamp() : t.run_name;
    run_dir = t.base_output_directory + "/" + name;
  }
  run_dir = agree(*comm, run_dir);
  io::make_directories(run_dir);
  result.run_dir = run_dir;
  // One training per run directory: a second one would interleave checkpoints and
  // metrics with this one's.
  std::optional<io::DirectoryLock> lock;
  if (rank == 0) {
    lock.emplace(run_dir, "run directory");
    if (!lock->previous_holder().empty())
      log_info("run directory {}: took over the lock of {} (no longer running)", run_dir,
               lock->previous_holder());
  }
  if (world > 1) {
    io::make_directories(run_dir + "/logs");
    set_log_rank(rank, fmt::format("{}/logs/rank-{}.log", run_dir, rank),
                 rank == 0 ? LogLevel::kDebug : LogLevel::kWarn);
    log_info("rank {} of {}: pid {}, {} threads, mesh data {} fsdp {} expert {}, mode {}", rank,
             world, static_cast<int64_t>(::getpid()), num_threads(), mesh.data, mesh.fsdp,
             mesh.expert, parallel_mode_name(mode));
  }

  // Rank 0 prepares the dataset (tokenizer training, sharding); the others wait for its
  // files outside any collective (preparing a large corpus can outlast
  // collective_timeout_s; a failure on rank 0 aborts them all).
  PreparedDataset data = resolve_dataset(t, rank == 0);
  while (rank != 0 && !is_prepared(data.dir))
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  comm->barrier();
  io::Tokenizer tokenizer = io::Tokenizer::load(data.tokenizer);
  check_tokenizer_size(tokenizer, data.tokenizer, config, t);
  t.model.bos_id = tokenizer.bos_id();
  t.model.eos_id = tokenizer.eos_id();

  ParamStore params(t.model, t.bf16);
  MoeOptions moe_options = t.moe;
  if (mode == ParallelMode::kExpert)
    moe_options.ep = make_expert_parallel(comm, static_cast<int>(t.model.n_experts));
  LlamaModel model(params,
                   {t.per_device_batch_size, t.max_target_length, t.bf16, t.remat, moe_options});
  GradientSync sync(params, *comm, mode, t.overlap_communication);
  if (world > 1) model.set_hooks(&sync);
  const bool moe = t.model.is_moe();
  OptimizerOptions oo;
  oo.beta1 = t.adam_b1;
  oo.beta2 = t.adam_b2;
  oo.eps = t.adam_eps;
  oo.weight_decay = t.weight_decay;
  oo.exclude_norms_and_embeddings = t.weight_decay_exclude_norms_and_embeddings;
  oo.clip_norm = t.gradient_clipping_threshold;
  AdamW optimizer(params, oo, sync.owned_ranges(), comm);
  train::DataLoader loader({data.train}, t.per_device_batch_size, t.max_target_length,
                           t.data_shuffle_seed, true, comm->rank(), comm->world_size());

  TrainerState state;
  const std::optional<std::string> resume_from =
      options.resume.empty() ? latest_checkpoint(run_dir)
                             : std::optional<std::string>(resolve_checkpoint_dir(options.resume));
  if (resume_from) {
    if (options.resume.empty()) log_config_changes(config, *resume_from);
    const LlamaConfig saved = read_checkpoint_config(*resume_from);
    HYP_CHECK(saved.dim == t.model.dim && saved.n_layers == t.model.n_layers &&
                  saved.vocab_size == t.model.vocab_size && saved.ffn_dim == t.model.ffn_dim &&
                  saved.n_heads == t.model.n_heads && saved.n_kv_heads == t.model.n_kv_heads &&
                  saved.tie_embeddings == t.model.tie_embeddings &&
                  saved.n_experts == t.model.n_experts &&
                  saved.n_experts_per_tok == t.model.n_experts_per_tok &&
                  saved.expert_ffn_dim() == t.model.expert_ffn_dim() &&
                  saved.first_dense_layers == t.model.first_dense_layers &&
                  saved.moe_layer_step == t.model.moe_layer_step,
              "resume: checkpoint {} holds a different model shape than the config", *resume_from);
    state = load_training_state(*resume_from, params, optimizer);
    sync.release_unowned();
    loader.restore(state.data);
    truncate_metrics(run_dir + "/metrics.jsonl", state.step);
    log_info("resume: from {} at step {}", *resume_from, state.step);
  } else {
    params.init(t.init_weights_seed);
    sync.release_unowned();
  }
  result.start_step = state.step;

  // Start-up report: sizes, memory by category, FLOPs and the MFU denominator.
  const double flops_per_token = t.model.train_flops_per_token(t.max_target_length);
  if (t.peak_tflops > 0) {
    result.peak_gflops = t.peak_tflops * 1e3;
  } else {
    // Rank 0 measures (one rank's threads) while the others wait; the job's peak is
    // that times the ranks.
    double g = 0;
    if (rank == 0) {
      const PeakResult peak = measure_peak(0.2);
      g = t.bf16 ? peak.bf16_gflops : peak.f32_gflops;
    }
    if (world > 1) comm->broadcast(&g, sizeof g, 0);
    result.peak_gflops = g * world;
  }
  log_info("model: {} params ({} non-embedding), {} layers, dim {}, heads {}/{}, ffn {}, vocab {}",
           t.model.total_params(), t.model.non_embedding_params(), t.model.n_layers, t.model.dim,
           t.model.n_heads, t.model.n_kv_heads, t.model.ffn_dim, t.model.vocab_size);
  if (moe) {
    const MoeShape& ms = model.moe_shape();
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
      format_bytes(mem.scratch_bytes), format_bytes(model.activation_bytes()),
      format_bytes(model.scratch_bytes()));
  log_info(
      "train: {} steps x {} tokens (global batch: {} per rank x {} x {} accum x {} ranks), "
      "dtype {}, {:.3g} FLOPs/token, peak {:.0f} GFLOP/s, {} threads per rank, run dir {}",
      t.steps, t.tokens_per_step(), t.per_device_batch_size, t.max_target_length,
      t.gradient_accumulation_steps, world, t.bf16 ? "bf16" : "f32", flops_per_token,
      result.peak_gflops, num_threads(), run_dir);
  if (world > 1)
    log_info("parallel: {} over {} ranks ({}), communicator {}, overlap {}, timeout {} s",
             parallel_mode_name(mode), world,
             fmt::format("data {} fsdp {} expert {}", mesh.data, mesh.fsdp, mesh.expert),
             comm->name(), t.overlap_communication, t.collective_timeout_s);

  // Held-out evaluation uses its own loader over val.bin (in order, no shuffle).
  std::unique_ptr<train::DataLoader> val_loader;
  try {
    val_loader = std::make_unique<train::DataLoader>(
        std::vector<std::string>{data.val}, t.per_device_batch_size, t.max_target_length, 0, false);
  } catch (const Error& e) {
    log_warn("eval: held-out split unusable, skipping evaluation: {}", e.what());
  }

  CheckpointManager ckpt(run_dir, t.checkpoints_to_keep, t.async_checkpointing, comm,
                         sync.tensor_writers());
  const std::map<std::string, std::string> config_values = config.values();
  auto save = [&] {
    if (!t.enable_checkpointing) return;
    sync.gather_all();
    state.data = loader.state();
    ckpt.save(params, optimizer, state, tokenizer.serialized(), config_values);
    result.checkpoint = ckpt.checkpoints_dir() + "/" + std::to_string(state.step);
  };

  // Rank 0 writes the metrics (the loss is averaged over ranks first).
  std::ofstream metrics;
  if (rank == 0) {
    metrics.open(run_dir + "/metrics.jsonl", std::ios::app);
    HYP_CHECK(metrics.good(), "cannot open {}/metrics.jsonl for writing: {}", run_dir,
              os_error_text(errno));
  }
  const int64_t n = model.tokens_per_batch();
  std::vector<int32_t> in(static_cast<size_t>(n)), tg(static_cast<size_t>(n));
  // Each rank's backward is scaled by 1 / (accumulation x ranks), so the summed
  // gradients are the mean over the global batch (no separate division pass; for expert
  // parallelism the sums over every rank's tokens come out right as well).
  const float dloss = 1.0f / static_cast<float>(t.gradient_accumulation_steps * world);
  const float dmean = 1.0f / static_cast<float>(t.gradient_accumulation_steps);
  double tps_sum = 0, mfu_sum = 0;
  int64_t timed_steps = 0;

  const int64_t last_step = options.stop_at > 0 ? std::min(options.stop_at, t.steps) : t.steps;
  while (state.step < last_step) {
    Timer step_timer;
    double data_wait = 0, loss = 0;
    MoeStats ms;
    sync.zero_grads();
    const double comm_before = comm->seconds(), wait_before = comm->wait_seconds();
    const uint64_t bytes_before = comm->bytes_sent();
    for (int64_t micro = 0; micro < t.gradient_accumulation_steps; ++micro) {
      Timer dt;
      loader.next(in.data(), tg.data());
      data_wait += dt.seconds();
      sync.begin_micro_batch(micro + 1 == t.gradient_accumulation_steps);
      loss += model.forward_backward(in.data(), tg.data(), dloss).loss * dmean;
      sync.end_micro_batch();
      if (moe) {
        const MoeStats& s = model.moe_stats();
        ms.lb_loss += s.lb_loss * dmean;
        ms.z_loss += s.z_loss * dmean;
        ms.dropped_fraction += s.dropped_fraction * dmean;
        ms.load_cv += s.load_cv * dmean;
        ms.load_min = micro == 0 ? s.load_min : std::min(ms.load_min, s.load_min);
        ms.load_max = std::max(ms.load_max, s.load_max);
      }
    }
    const double lr = t.schedule.lr(state.step);
    const OptimizerStepResult opt = optimizer.step(lr);
    sync.after_optimizer_step();
    if (world > 1) {
      // The job's objective: the mean over ranks (each rank's loss is its tokens' mean).
      float l[3] = {static_cast<float>(loss), ms.lb_loss, ms.z_loss};
      comm->all_reduce(l, 3, dist::ReduceOp::kAvg);
      loss = l[0];
      ms.lb_loss = l[1];
      ms.z_loss = l[2];
    }
    state.step += 1;
    state.tokens_seen += t.tokens_per_step();

    StepMetrics m;
    m.step = state.step;
    m.lm_loss = loss;
    m.loss = loss + ms.lb_loss + ms.z_loss;
    m.moe = ms;
    m.grad_norm = opt.grad_norm;
    m.lr = lr;
    m.step_s = step_timer.seconds();
    m.tokens_per_s = double(t.tokens_per_step()) / m.step_s;
    m.tflops = flops_per_token * m.tokens_per_s / 1e12;
    m.mfu = m.tflops * 1e3 / result.peak_gflops;
    m.data_wait_s = data_wait;
    m.comm_s = comm->seconds() - comm_before;
    m.comm_wait_s = comm->wait_seconds() - wait_before;
    m.comm_bytes = comm->bytes_sent() - bytes_before;
    m.skipped = opt.skipped;
    if (opt.skipped) log_warn("step {}: non-finite gradient norm, update skipped", m.step);
    HYP_CHECK(std::isfinite(m.loss), "step {}: loss is {} (diverged); lower learning_rate", m.step,
              m.loss);
    nlohmann::ordered_json j;
    j["step"] = m.step;
    j["loss"] = m.loss;
    j["grad_norm"] = m.grad_norm;
    j["lr"] = m.lr;
    j["step_s"] = m.step_s;
    j["tokens_per_s"] = m.tokens_per_s;
    j["tflops"] = m.tflops;
    j["mfu"] = m.mfu;
    j["data_wait_s"] = m.data_wait_s;
    j["tokens_seen"] = state.tokens_seen;
    if (world > 1) {
      j["comm_s"] = m.comm_s;
      j["comm_exposed_s"] = m.comm_wait_s;
      j["comm_bytes_sent"] = m.comm_bytes;
    }
    if (moe) {
      j["lm_loss"] = m.lm_loss;
      j["moe_lb_loss"] = ms.lb_loss;
      j["moe_z_loss"] = ms.z_loss;
      j["moe_dropped_fraction"] = ms.dropped_fraction;
      j["expert_load_min"] = ms.load_min;
      j["expert_load_max"] = ms.load_max;
      j["expert_load_cv"] = ms.load_cv;
    }
    if (m.skipped) j["skipped"] = true;
    if (rank == 0) {
      metrics << j.dump() << "\n";
      metrics.flush();
      HYP_CHECK(metrics.good(), "cannot append to {}/metrics.jsonl: {}", run_dir,
                os_error_text(errno));
    }
    result.history.push_back(m);
    if (state.step > result.start_step + 1) {  // the first step warms caches up
      tps_sum += m.tokens_per_s;
      mfu_sum += m.mfu;
      ++timed_steps;
    }
    if (!options.quiet &&
        (state.step % t.log_period == 0 || state.step == 1 || state.step == t.steps))
      log_info(
          "step {:>5}  loss {:.4f}  grad_norm {:.3f}  lr {:.2e}  {:.3f} s  {:.0f} tok/s  "
          "{:.3f} TFLOP/s  MFU {:.1f}%  data {:.1f} ms",
          m.step, m.loss, m.grad_norm, m.lr, m.step_s, m.tokens_per_s, m.tflops, 100 * m.mfu,
          1e3 * m.data_wait_s);
    if (!options.quiet && moe &&
        (state.step % t.log_period == 0 || state.step == 1 || state.step == t.steps))
      log_info(
          "           moe: lb_loss {:.4f}  z_loss {:.4f}  dropped {:.2f}%  expert load "
          "min {:.2f} max {:.2f} cv {:.3f}",
          ms.lb_loss, ms.z_loss, 100 * ms.dropped_fraction, ms.load_min, ms.load_max, ms.load_cv);
    if (val_loader && t.eval_interval > 0 && state.step % t.eval_interval == 0 &&
        state.step < t.steps) {
      EvalResult e = evaluate(model, *val_loader, t.eval_batches);
      log_info("eval  step {:>5}  held-out loss {:.4f}  perplexity {:.2f}", state.step, e.loss,
               std::exp(e.loss));
    }
    if (t.checkpoint_period > 0 && state.step % t.checkpoint_period == 0 && state.step < last_step)
      save();
  }
  if (state.step > result.start_step)
    save();
  else if (resume_from)
    result.checkpoint = *resume_from;
  ckpt.wait();
  result.steps = state.step;
  if (timed_steps > 0) {
    result.mean_tokens_per_s = tps_sum / double(timed_steps);
    result.mean_mfu = mfu_sum / double(timed_steps);
  }
  if (t.enable_checkpointing)
    log_info("checkpoint: {} (training thread blocked {:.2f} s in total for saves)",
             result.checkpoint, ckpt.blocking_seconds());

  if (val_loader) {  // (FSDP gathers bucket by bucket through the model's hooks)
    EvalResult e = evaluate(model, *val_loader, 0);
    result.eval_loss = e.loss;
    result.eval_perplexity = std::exp(e.loss);
    result.eval_tokens = e.tokens;
    log_info("eval: held-out loss {:.4f}, perplexity {:.2f} over {} tokens", e.loss,
             result.eval_perplexity, e.tokens);
  }
  // Sampling runs on rank 0 alone, outside the parallel model: it needs every expert.
  if (t.sample_count > 0 && t.sample_max_tokens > 0) sync.gather_all(true);
  if (t.sample_count > 0 && t.sample_max_tokens > 0 && rank == 0) {
    LlamaGenerator gen(params, std::min<int64_t>(t.model.max_seq_len, 1 + t.sample_max_tokens));
    for (int64_t s = 0; s < t.sample_count; ++s) {
      GenerateOptions go;
      go.sampling.temperature = static_cast<float>(t.sample_temperature);
      go.sampling.top_p = 0.95f;
      go.sampling.seed = static_cast<uint64_t>(s + 1);
      go.max_tokens = t.sample_max_tokens;
      go.eos_id = tokenizer.eos_id();
      gen.reset();
      std::vector<int32_t> toks = generate_tokens(gen, {tokenizer.bos_id()}, go);
      if (!toks.empty() && toks.back() == tokenizer.eos_id()) toks.pop_back();
      result.samples.push_back(tokenizer.decode(toks));
    }
  }
  // Peak resident memory, the largest over ranks (what FSDP and ZeRO-1 reduce).
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  float rss_mib = static_cast<float>(usage.ru_maxrss) / 1024.0f;  // ru_maxrss is in KiB
  if (world > 1) comm->all_reduce(&rss_mib, 1, dist::ReduceOp::kMax);
  result.peak_rss_mib = rss_mib;
  log_info("memory: peak resident {:.0f} MiB{}", rss_mib, world > 1 ? " (largest rank)" : "");
  result.world_size = world;
  result.parallel_mode = parallel_mode_name(mode);
  result.seconds = total.seconds();
  return result;
}

}  // namespace

}  // namespace hyperion
