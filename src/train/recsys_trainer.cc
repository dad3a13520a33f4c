#include "train/recsys_trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/error.h"
#include "base/log.h"
#include "base/thread_governor.h"
#include "base/system_memory.h"
#include "base/threads.h"
#include "base/timer.h"
#include "io/atomic_file.h"
#include "io/directory_lock.h"
#include "io/safetensors.h"
#include "kernels/dense_ops.h"
#include "kernels/peak.h"
#include "recsys/auc.h"
#include "recsys/batch_builder.h"
#include "recsys/criteo_reader.h"
#include "recsys/dlrm_model.h"
#include "recsys/synthetic_data.h"
#include "train/checkpoint.h"
#include "train/checkpoint_files.h"
#include "train/metrics_writer.h"
#include "train/run_directory.h"
#include "train/stop_signal.h"
#include "train/training_monitor.h"

namespace hyperion {

namespace fs = std::filesystem;
using recsys::DlrmModel;

namespace {

// Held-out examples of the synthetic stream start here (training never reaches them).
constexpr int64_t kSyntheticEvalFirst = int64_t{1} << 40;

// Where the training data continues: the next example of the synthetic stream, or the
// Criteo reader's position (the same on every rank after every step).
struct DataPosition {
  int64_t next_example = 0;
  recsys::CriteoReader::State criteo;
};

class RecsysRun {
 public:
  RecsysRun(const Config& config, const TrainConfig& t, const TrainOptions& options,
            dist::Communicator& comm, double process_start)
      : config_(config), t_(t), options_(options), comm_(comm), process_start_(process_start) {}

  TrainResult run() {
    StopSignalScope stop_signals;
    setup();
    monitor_->init_done();
    const int64_t last = options_.stop_at > 0 ? std::min(options_.stop_at, t_.steps) : t_.steps;
    while (step_ < last) {
      step();
      if (stop_requested_) {
        log_warn("stopping after step {} on {}: {}", step_,
                 stop_requested_ == SIGINT ? "SIGINT" : "SIGTERM",
                 t_.enable_checkpointing ? "saving a checkpoint; the same command resumes from it"
                                         : "enable_checkpointing=false, so nothing is saved");
        stop_signal_saving();  // the save may take longer than the grace period
        save();
        result_.stopped_by_signal = stop_requested_;
        return finish(false);
      }
      if (t_.checkpoint_period > 0 && step_ % t_.checkpoint_period == 0 && step_ < last) save();
    }
    if (step_ > result_.start_step) save();
    if (step_ >= t_.steps) {
      monitor_->eval_started();
      const Eval e = evaluate();
      monitor_->eval_done();
      if (e.examples > 0) {
        result_.auc = e.auc;
        result_.eval_loss = e.loss;
        result_.eval_tokens = e.examples;
        log_info("eval: held-out AUC {:.4f}, loss {:.4f} over {} examples", e.auc, e.loss,
                 e.examples);
      }
    }
    return finish(step_ >= t_.steps);
  }

 private:
  struct Eval {
    double auc = -1, loss = -1;
    int64_t examples = 0;
  };
  void setup();
  void fill_train_batch();
  void step();
  Eval evaluate();
  void save();
  void restore(const std::string& dir);
  TrainResult finish(bool job_end);

  const Config& config_;
  TrainConfig t_;
  const TrainOptions& options_;
  dist::Communicator& comm_;
  double process_start_;
  int rank_ = 0, world_ = 1;
  int64_t batch_ = 0;  // examples per rank per step
  std::string run_dir_;
  std::optional<io::DirectoryLock> lock_;
  std::unique_ptr<TrainingMonitor> monitor_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<DlrmModel> model_;
  recsys::SyntheticSpec spec_;
  std::unique_ptr<recsys::CriteoReader> reader_;
  recsys::BatchBuilder builder_;
  Batch batch_data_;
  DataPosition data_;
  int64_t step_ = 0;
  double peak_gflops_ = 0;
  double sps_sum_ = 0;
  int64_t timed_ = 0;
  int stop_requested_ = 0;
  int64_t saved_step_ = -1;
  TrainResult result_;
  Timer total_;
};

void RecsysRun::setup() {
  rank_ = comm_.rank();
  world_ = comm_.world_size();
  HYP_CHECK(t_.hardware == Device::kHost,
            "config key hardware: model_type=dlrm trains on the CPU only (the tables' kernels "
            "have no GPU form yet)");
  batch_ = t_.per_device_batch_size * t_.gradient_accumulation_steps;
  const recsys::DlrmConfig& d = t_.dlrm;
  // Every byte the busiest rank will hold, times the ranks sharing this host, checked
  // before any of it is allocated.
  {
    const int64_t table_bytes = recsys::EmbeddingCollection::max_rank_bytes(d, world_);
    const int64_t act = batch_ * (4 * d.interaction_dim() * (d.cross_layers + 4) + 4 * 4096);
    const int64_t ranks_here = std::max(dist::detect_launch().local_size, 1);
    check_fits_in_memory(
        sat_mul(table_bytes + 3 * 4 * d.dense_params() + act, ranks_here),
        fmt::format("training {} ({} embedding and {} dense parameters{})", t_.name,
                    d.embedding_params(), d.dense_params(),
                    ranks_here > 1 ? fmt::format(", {} ranks on this host", ranks_here) : ""),
        fmt::format("tables and their optimizer state {} on the busiest of {} ranks (placed by "
                    "dlrm.sharding={}), dense part and Adagrad {}",
                    format_bytes(table_bytes), world_, recsys::sharding_name(d.sharding),
                    format_bytes(3 * 4 * d.dense_params())));
  }
  run_dir_ = open_run_directory(t_, options_.resume, comm_, lock_);
  result_.run_dir = run_dir_;
  // A save killed half-way leaves its hidden directory (named by the dead process's pid).
  if (rank_ == 0 && fs::is_directory(run_dir_ + "/checkpoints"))
    for (const auto& entry : fs::directory_iterator(run_dir_ + "/checkpoints"))
      if (entry.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(entry.path());
  monitor_ = std::make_unique<TrainingMonitor>(t_, comm_, run_dir_, process_start_);

  // Data.
  spec_.dense_features = d.dense_features;
  spec_.table_rows = d.table_rows;
  spec_.bag_sizes = d.bag_sizes;
  spec_.zipf_exponent = d.zipf_exponent;
  spec_.seed = t_.data_shuffle_seed;
  spec_.signal = d.synthetic_signal;
  if (!t_.dataset_path.empty()) {
    HYP_CHECK(d.tables() == 26 && d.dense_features == 13,
              "dataset_path {}: Criteo data has 13 dense and 26 sparse features, but the model "
              "has {} and {} (dlrm.dense_features, dlrm.table_rows)",
              t_.dataset_path, d.dense_features, d.tables());
    reader_ = std::make_unique<recsys::CriteoReader>(t_.dataset_path, d.table_rows);
  }
  model_ = std::make_unique<DlrmModel>(d, batch_, comm_);

  // Resume: --resume, or the run directory's latest checkpoint.
  std::optional<std::string> from;
  if (!options_.resume.empty())
    from = resolve_checkpoint_dir(options_.resume);
  else if (t_.enable_checkpointing)
    from = latest_checkpoint(run_dir_);
  if (from) {
    check_resume_shape(config_, *from);  // names the key, the values, the source
    monitor_->restore_started();
    Timer timer;
    restore(*from);
    monitor_->restore_done(step_, timer.seconds());
    log_info("resume: from {} at step {}", *from, step_);
  } else {
    model_->init(t_.init_weights_seed);
  }
  result_.start_step = step_;
  metrics_ = std::make_unique<MetricsWriter>(run_dir_, rank_ == 0, from ? step_ : 0);

  // The MFU denominator: the f32 peak (the dense part runs in f32), times the ranks.
  double g = 0;
  if (t_.peak_tflops > 0) {
    g = t_.peak_tflops * 1e3;
  } else {
    if (rank_ == 0) g = measure_peak(0.2).f32_gflops;
    if (world_ > 1) comm_.broadcast(&g, sizeof g, 0);
    g *= world_;
  }
  peak_gflops_ = g;
  result_.peak_gflops = result_.peak_bf16_gflops = g;
  log_info(
      "model: dlrm, {} tables ({} embedding params, dim {}, {} pooling, {} rows, {}), dense "
      "{} params (bottom {}, {} cross layers of rank {}, top {}), {:.3g} training FLOPs/example",
      d.tables(), d.embedding_params(), d.embedding_dim, pooling_name(d.pooling),
      dtype_name(d.embedding_dtype), sparse_optimizer_name(d.sparse_optimizer), d.dense_params(),
      fmt::join(d.bottom_mlp, "-"), d.cross_layers, d.cross_rank, fmt::join(d.top_mlp, "-"),
      3 * d.forward_flops_per_example());
  log_info(
      "train: {} steps x {} examples ({} per rank x {} ranks), tables placed by {} ({} here), "
      "data {}, peak {:.0f} GFLOP/s, {} threads per rank, run dir {}",
      t_.steps, batch_ * world_, batch_, world_, recsys::sharding_name(d.sharding),
      format_bytes(model_->embeddings().local_bytes()),
      reader_ ? t_.dataset_path : std::string("synthetic"), peak_gflops_, num_threads(), run_dir_);
}

// This rank's slice of the next global batch.
void RecsysRun::fill_train_batch() {
  const int64_t global = batch_ * world_;
  if (!reader_) {
    recsys::synthetic_batch(spec_, data_.next_example + rank_ * batch_, batch_, batch_data_);
    data_.next_example += global;
    return;
  }
  builder_.begin(26, 13, batch_);
  reader_->skip(rank_ * batch_);
  reader_->read(batch_, builder_);
  reader_->skip((world_ - 1 - rank_) * batch_);
  builder_.finish(batch_data_);
  data_.criteo = reader_->state();
}

void RecsysRun::step() {
  adapt_threads_to_contention();  // a busy neighbour: the team it actually gets
  monitor_->step_started(step_ + 1);
  Timer timer;
  Timer data_timer;
  fill_train_batch();
  const double data_wait = data_timer.seconds();
  const double comm_before = comm_.seconds(), wait_before = comm_.wait_seconds();
  const uint64_t bytes_before = comm_.bytes_sent();
  const double lr = t_.schedule.lr(step_);
  recsys::DlrmStepResult r = model_->train_step(batch_data_, static_cast<float>(lr));
  const int local_stop = stop_signal_received();
  stop_requested_ = local_stop;
  if (world_ > 1) {
    float v[2] = {static_cast<float>(r.loss), static_cast<float>(local_stop)};
    comm_.all_reduce(v, 2, dist::ReduceOp::kAvg);
    r.loss = v[0];
    if (v[1] > 0 && stop_requested_ == 0) stop_requested_ = SIGTERM;
  }
  step_ += 1;
  StepMetrics m;
  m.step = step_;
  m.loss = m.lm_loss = r.loss;
  m.grad_norm = r.grad_norm;
  m.lr = lr;
  m.step_s = timer.seconds();
  m.samples_per_s = double(batch_ * world_) / m.step_s;
  m.tokens_per_s = m.samples_per_s;
  m.tflops = 3 * t_.dlrm.forward_flops_per_example() * m.samples_per_s / 1e12;
  m.mfu = m.emfu = m.tflops * 1e3 / peak_gflops_;
  m.data_wait_s = data_wait;
  m.comm_s = comm_.seconds() - comm_before;
  m.comm_wait_s = comm_.wait_seconds() - wait_before;
  m.comm_bytes = comm_.bytes_sent() - bytes_before;
  HYP_CHECK(std::isfinite(m.loss), "step {}: loss is {} (diverged); lower learning_rate", m.step,
            m.loss);
  const bool eval_now = t_.eval_interval > 0 && step_ % t_.eval_interval == 0 && step_ < t_.steps;
  if (eval_now) {
    monitor_->eval_started();
    const Eval e = evaluate();
    monitor_->eval_done();
    m.auc = e.auc;
    m.eval_loss = e.loss;
    if (e.examples > 0)
      log_info("eval  step {:>5}  held-out AUC {:.4f}  loss {:.4f}  ({} examples)", step_, e.auc,
               e.loss, e.examples);
  }
  metrics_->write(m, step_ * batch_ * world_, world_ > 1, false);
  monitor_->step_done(m);
  result_.history.push_back(m);
  if (step_ > result_.start_step + 1) {
    sps_sum_ += m.samples_per_s;
    ++timed_;
  }
  if (!options_.quiet && (step_ % t_.log_period == 0 || step_ == 1 || step_ == t_.steps))
    log_info(
        "step {:>5}  loss {:.4f}  grad_norm {:.3f}  lr {:.2e}  {:.3f} s  {:.0f} samples/s  "
        "{:.3f} TFLOP/s  MFU {:.1f}%  data {:.1f} ms",
        m.step, m.loss, m.grad_norm, m.lr, m.step_s, m.samples_per_s, m.tflops, 100 * m.mfu,
        1e3 * m.data_wait_s);
}

// Held-out AUC and loss over every rank's share of the evaluation examples.
RecsysRun::Eval RecsysRun::evaluate() {
  Eval e;
  const int64_t global = batch_ * world_;
  int64_t batches = t_.dlrm.eval_examples / global;
  if (t_.dlrm.eval_examples > 0 && batches == 0) batches = 1;
  std::unique_ptr<recsys::CriteoReader> eval_reader;
  if (reader_) {
    if (t_.dlrm.eval_dataset_path.empty()) return e;
    eval_reader =
        std::make_unique<recsys::CriteoReader>(t_.dlrm.eval_dataset_path, t_.dlrm.table_rows);
  }
  if (batches == 0) return e;
  std::vector<float> scores(size_t(batches * batch_)), labels(size_t(batches * batch_));
  Batch b;
  for (int64_t i = 0; i < batches; ++i) {
    if (eval_reader) {
      builder_.begin(26, 13, batch_);
      eval_reader->skip(rank_ * batch_);
      eval_reader->read(batch_, builder_);
      eval_reader->skip((world_ - 1 - rank_) * batch_);
      builder_.finish(b);
    } else {
      recsys::synthetic_batch(spec_, kSyntheticEvalFirst + i * global + rank_ * batch_, batch_, b);
    }
    model_->predict(b, scores.data() + i * batch_);
    std::copy(b.labels.begin(), b.labels.end(), labels.begin() + i * batch_);
  }
  std::vector<float> all_scores = scores, all_labels = labels;
  if (world_ > 1) {
    all_scores.resize(scores.size() * size_t(world_));
    all_labels.resize(labels.size() * size_t(world_));
    comm_.all_gather(scores.data(), all_scores.data(), scores.size() * sizeof(float));
    comm_.all_gather(labels.data(), all_labels.data(), labels.size() * sizeof(float));
  }
  e.examples = int64_t(all_scores.size());
  e.auc = recsys::roc_auc(all_scores, all_labels);
  e.loss = bce_with_logits(all_scores.data(), all_labels.data(), e.examples, nullptr, 1.0f) /
           double(e.examples);
  return e;
}

std::string shard_file(const char* stem, int rank, int world) {
  return world == 1 ? fmt::format("{}.safetensors", stem)
                    : fmt::format("{}-{}-of-{}.safetensors", stem, rank + 1, world);
}

void RecsysRun::save() {
  if (!t_.enable_checkpointing || saved_step_ == step_) return;
  saved_step_ = step_;
  monitor_->save_started(step_);
  Timer timer;
  const std::string dir = run_dir_ + "/checkpoints";
  const std::string final_dir = fmt::format("{}/{}", dir, step_);
  // Everything goes into a hidden directory, renamed into place once complete.
  const std::string tmp = agree_on_rank0(
      comm_, fmt::format("{}/.tmp-{}-{}", dir, step_, static_cast<int64_t>(::getpid())));
  if (rank_ == 0) {
    fs::remove_all(tmp);
    io::make_directories(tmp);
  }
  const SavingDirectory saving(tmp);  // a second stop signal removes it
  if (world_ > 1) comm_.barrier();
  io::SafetensorsWriter model, optimizer;
  if (rank_ == 0)
    for (const recsys::DenseTensor& d : model_->dense_tensors()) {
      model.add(d.name, DType::kF32, d.shape, model_->dense_params() + d.offset);
      optimizer.add(d.name + ".sum", DType::kF32, d.shape, model_->dense_state() + d.offset);
    }
  model_->embeddings().add_tensors(model, optimizer);
  model.set_metadata("format", "pt");
  model.write(tmp + "/" + shard_file("model", rank_, world_));
  optimizer.write(tmp + "/" + shard_file("optimizer", rank_, world_));
  if (world_ > 1) comm_.barrier();
  if (rank_ == 0) {
    if (world_ > 1) {
      nlohmann::ordered_json index;
      index["metadata"] = {{"format", "pt"}};
      nlohmann::ordered_json map = nlohmann::ordered_json::object();
      for (int r = 0; r < world_; ++r) {
        const std::string file = shard_file("model", r, world_);
        const io::SafetensorsFile written = io::SafetensorsFile::open(tmp + "/" + file);
        for (const io::SafetensorsTensor& x : written.tensors()) map[x.name] = file;
      }
      index["weight_map"] = map;
      io::write_file_atomic(tmp + "/model.safetensors.index.json", index.dump(2));
    }
    nlohmann::ordered_json state;
    state["model_type"] = "dlrm";
    state["step"] = step_;
    state["examples_seen"] = step_ * batch_ * world_;
    state["world_size"] = world_;
    state["data"] = {{"next_example", data_.next_example},
                     {"criteo_offset", data_.criteo.offset},
                     {"criteo_line", data_.criteo.line},
                     {"criteo_epoch", data_.criteo.epoch}};
    nlohmann::ordered_json cfg = nlohmann::ordered_json::object();
    for (const auto& [k, v] : config_.values()) cfg[k] = v;
    state["config"] = cfg;
    io::write_file_atomic(tmp + "/trainer_state.json", state.dump(2));
    publish_checkpoint(dir, tmp, step_, t_.checkpoints_to_keep);
  }
  if (world_ > 1) comm_.barrier();
  result_.checkpoint = final_dir;
  monitor_->save_done(step_, timer.seconds());
}

void RecsysRun::restore(const std::string& dir) {
  const std::string state_path = dir + "/trainer_state.json";
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(io::read_file(state_path));
    HYP_CHECK(state.value("model_type", std::string()) == "dlrm",
              "{}: not a recommender checkpoint (model_type {})", state_path,
              state.value("model_type", std::string("decoder")));
    step_ = state.at("step").get<int64_t>();
    const nlohmann::json& d = state.at("data");
    data_.next_example = d.at("next_example").get<int64_t>();
    data_.criteo = {d.at("criteo_offset").get<uint64_t>(), d.at("criteo_line").get<uint64_t>(),
                    d.at("criteo_epoch").get<uint64_t>()};
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", state_path, e.what());
  }
  std::vector<io::SafetensorsFile> model_files, optimizer_files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 12 || name.substr(name.size() - 12) != ".safetensors") continue;
    if (name.rfind("model", 0) == 0)
      model_files.push_back(io::SafetensorsFile::open(entry.path().string()));
    else if (name.rfind("optimizer", 0) == 0)
      optimizer_files.push_back(io::SafetensorsFile::open(entry.path().string()));
  }
  HYP_CHECK(!model_files.empty(), "checkpoint {}: no model*.safetensors", dir);
  auto find = [&](std::vector<io::SafetensorsFile>& files,
                  const std::string& name) -> const io::SafetensorsFile* {
    for (const io::SafetensorsFile& f : files)
      if (f.find(name)) return &f;
    return nullptr;
  };
  for (const recsys::DenseTensor& d : model_->dense_tensors()) {
    const io::SafetensorsFile* f = find(model_files, d.name);
    HYP_CHECK(f, "checkpoint {}: no tensor {} in its model files", dir, d.name);
    f->read_into(d.name, TensorView(model_->dense_params() + d.offset, DType::kF32, d.shape));
    const io::SafetensorsFile* o = find(optimizer_files, d.name + ".sum");
    HYP_CHECK(o, "checkpoint {}: no optimizer state {}.sum", dir, d.name);
    o->read_into(d.name + ".sum",
                 TensorView(model_->dense_state() + d.offset, DType::kF32, d.shape));
  }
  std::vector<const io::SafetensorsFile*> mp, op;
  for (const io::SafetensorsFile& f : model_files) mp.push_back(&f);
  for (const io::SafetensorsFile& f : optimizer_files) op.push_back(&f);
  model_->embeddings().load(mp, op);
  if (reader_) reader_->restore(data_.criteo);
}

TrainResult RecsysRun::finish(bool job_end) {
  result_.steps = step_;
  if (timed_ > 0) {
    result_.mean_samples_per_s = sps_sum_ / double(timed_);
    result_.mean_tokens_per_s = result_.mean_samples_per_s;
    result_.mean_mfu = result_.mean_emfu =
        3 * t_.dlrm.forward_flops_per_example() * result_.mean_samples_per_s / 1e9 / peak_gflops_;
  }
  if (result_.checkpoint.empty() && step_ == result_.start_step && step_ > 0)
    result_.checkpoint = latest_checkpoint(run_dir_).value_or("");
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  float rss_mib = static_cast<float>(usage.ru_maxrss) / 1024.0f;
  if (world_ > 1) comm_.all_reduce(&rss_mib, 1, dist::ReduceOp::kMax);
  result_.peak_rss_mib = rss_mib;
  result_.world_size = world_;
  result_.parallel_mode =
      fmt::format("data + {}-wise tables", recsys::sharding_name(t_.dlrm.sharding));
  result_.seconds = total_.seconds();
  if (world_ > 1) comm_.barrier();  // no rank exits while another still writes
  monitor_->finished(step_, job_end);
  return std::move(result_);
}

}  // namespace

TrainResult run_recsys_training(const Config& config, const TrainConfig& t,
                                const TrainOptions& options, dist::Communicator& comm,
                                double process_start) {
  RecsysRun run(config, t, options, comm, process_start);
  return run.run();
}

}  // namespace hyperion
