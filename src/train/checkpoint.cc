#include "convert/hf_config.h"
#include "train/checkpoint.h"
#include "train/checkpoint_files.h"

#include <unistd.h>

#include <signal.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <tuple>

#include "base/error.h"
#include "base/log.h"
#include "base/timer.h"
#include "dist/communicator.h"
#include "io/atomic_file.h"
#include "io/model_dir_file.h"
#include "io/safetensors.h"
#include "train/stop_signal.h"

namespace hyperion {

namespace fs = std::filesystem;

struct CheckpointManager::Snapshot {
  // Tensors this rank writes: name, shape and where their data sits in `data`.
  struct Entry {
    std::string name;
    Shape shape;
    size_t at = 0;
  };
  std::vector<Entry> model, optimizer;
  std::vector<float> model_data, optimizer_data;
  std::map<std::string, int> weight_map;  // every model tensor -> writing rank (index)
  int64_t model_bytes = 0;
  // One process: the model file of each tensor of `model`, and how many there are (1: one
  // model.safetensors; more: Hugging Face's sharded layout, past max_shard_bytes).
  std::vector<int> model_file;
  int model_files = 1;
  int rank = 0, world = 1;
  DecoderConfig config;
  TrainerState state;
  int64_t optimizer_steps = 0;
  std::vector<std::pair<std::string, std::string>> tokenizer;
  std::map<std::string, std::string> config_values;
};

namespace {

// One process's model tensors split into files of at most `max_bytes` (a tensor larger than
// that gets a file of its own), in order, as transformers' save_pretrained(max_shard_size)
// does: the file index of each tensor, and the file count (1: one model.safetensors).
std::pair<std::vector<int>, int> size_shards(const std::vector<int64_t>& bytes, int64_t max_bytes) {
  std::vector<int> file(bytes.size(), 0);
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  if (max_bytes <= 0 || total <= max_bytes) return {file, 1};
  int current = 0;
  int64_t filled = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (filled > 0 && filled + bytes[i] > max_bytes) ++current, filled = 0;
    file[i] = current;
    filled += bytes[i];
  }
  return {file, current + 1};
}

}  // namespace

CheckpointManager::CheckpointManager(std::string run_dir, int64_t keep, bool async,
                                     dist::Communicator* comm, std::vector<int> writers)
    : dir_(std::move(run_dir) + "/checkpoints"), keep_(std::max<int64_t>(keep, 1)), async_(async) {
  comm_ = comm != nullptr && comm->world_size() > 1 ? comm : nullptr;
  writers_ = std::move(writers);
  io::make_directories(dir_);
  // Leftovers of a save that was killed: never complete, safe to remove (by one rank).
  if (comm_ == nullptr || comm_->rank() == 0)
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(e.path());
  if (comm_ != nullptr) comm_->barrier();
}

CheckpointManager::~CheckpointManager() {
  try {
    wait();
  } catch (const std::exception& e) {
    log_error("checkpoint: background save failed: {}", e.what());
  }
}

void CheckpointManager::wait() {
  if (worker_.joinable()) worker_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

namespace {

std::string shard_name(const char* kind, int rank, int world) {
  return fmt::format("{}-{:05d}-of-{:05d}.safetensors", kind, rank + 1, world);
}

}  // namespace

void CheckpointManager::save(const ParamStore& params, const AdamW& optimizer,
                             const TrainerState& state,
                             const std::vector<std::pair<std::string, std::string>>& tokenizer_files,
                             const std::map<std::string, std::string>& config_values) {
  Timer timer;
  wait();
  auto snap = std::make_shared<Snapshot>();
  snap->rank = comm_ != nullptr ? comm_->rank() : 0;
  snap->world = comm_ != nullptr ? comm_->world_size() : 1;
  const auto& infos = params.infos();
  auto writer = [&](size_t i) { return writers_.empty() ? 0 : writers_[i]; };
  // Weights and moments as host memory (downloaded when they live on a device).
  params.params_to_host();
  optimizer.moments_to_host();
  const float* host = params.host_params();
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& p = infos[i];
    snap->weight_map[p.name] = writer(i);
    snap->model_bytes += p.numel * 4;
    if (writer(i) != snap->rank) continue;
    snap->model.push_back({p.name, p.shape, snap->model_data.size()});
    snap->model_data.insert(snap->model_data.end(), host + p.offset, host + p.offset + p.numel);
  }
  // Moments: the parts of each tensor this rank owns (a replicated tensor by its writer).
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& p = infos[i];
    for (const OwnedRange& r : optimizer.owned()) {
      const int64_t lo = std::max(p.offset, r.begin), hi = std::min(p.offset + p.numel, r.end);
      if (lo >= hi || (r.replicated && writer(i) != snap->rank)) continue;
      const bool whole = lo == p.offset && hi == p.offset + p.numel;
      const std::string suffix = whole ? "" : fmt::format("@{}", lo - p.offset);
      const Shape shape = whole ? p.shape : Shape{hi - lo};
      for (int which = 0; which < 2; ++which) {
        const float* src = which == 0 ? optimizer.m_at(lo) : optimizer.v_at(lo);
        snap->optimizer.push_back(
            {fmt::format("{}.{}{}", p.name, which == 0 ? "exp_avg" : "exp_avg_sq", suffix), shape,
             snap->optimizer_data.size()});
        snap->optimizer_data.insert(snap->optimizer_data.end(), src, src + (hi - lo));
      }
    }
  }
  snap->config = params.config();
  snap->state = state;
  snap->optimizer_steps = optimizer.steps_taken();
  snap->tokenizer = tokenizer_files;
  snap->config_values = config_values;
  if (snap->world == 1) {
    std::vector<int64_t> bytes;
    for (const Snapshot::Entry& e : snap->model) bytes.push_back(e.shape.numel() * 4);
    std::tie(snap->model_file, snap->model_files) = size_shards(bytes, max_shard_bytes_);
  }
  if (comm_ != nullptr) {
    // Collective: every rank writes its shard files into one shared temp directory.
    const std::string tmp = dir_ + "/.tmp-" + std::to_string(state.step);
    if (snap->rank == 0) {
      fs::remove_all(tmp);
      io::make_directories(tmp);
    }
    const SavingDirectory saving(tmp);  // a second stop signal removes it
    comm_->barrier();
    write_files(*snap, tmp);
    comm_->barrier();
    if (snap->rank == 0) {
      write_common(*snap, tmp);
      publish(tmp, state.step);
    }
    comm_->barrier();
  } else if (async_) {
    worker_ = std::thread([this, snap] {
      try {
        write(*snap);
      } catch (...) {
        error_ = std::current_exception();
      }
    });
  } else {
    write(*snap);
  }
  blocking_seconds_ += timer.seconds();
}


void CheckpointManager::write_files(const Snapshot& s, const std::string& dir) const {
  io::SafetensorsWriter opt;
  for (const Snapshot::Entry& e : s.optimizer)
    opt.add(e.name, DType::kF32, e.shape, s.optimizer_data.data() + e.at);
  const bool sharded = s.world > 1 && adapter_config_.empty();
  if (!adapter_config_.empty()) {
    // Rank 0 holds every adapter tensor (writers all 0); the others write none.
    if (s.rank == 0) {
      io::SafetensorsWriter model;
      for (const Snapshot::Entry& e : s.model)
        model.add(e.name, DType::kF32, e.shape, s.model_data.data() + e.at);
      model.set_metadata("format", "pt");
      model.write(dir + "/adapter_model.safetensors");
    }
  } else if (sharded) {
    io::SafetensorsWriter model;
    for (const Snapshot::Entry& e : s.model)
      model.add(e.name, DType::kF32, e.shape, s.model_data.data() + e.at);
    model.set_metadata("format", "pt");
    model.write(dir + "/" + shard_name("model", s.rank, s.world));
  } else {
    // One process: model.safetensors, or Hugging Face's sharded layout past the size limit.
    const std::vector<int>& file = s.model_file;
    const int files = s.model_files;
    for (int f = 0; f < files; ++f) {
      io::SafetensorsWriter model;
      for (size_t i = 0; i < s.model.size(); ++i)
        if (file[i] == f)
          model.add(s.model[i].name, DType::kF32, s.model[i].shape,
                    s.model_data.data() + s.model[i].at);
      model.set_metadata("format", "pt");
      model.write(dir + "/" + (files == 1 ? "model.safetensors" : shard_name("model", f, files)));
    }
  }
  // Test hook: die mid-save (after the first file) to prove earlier checkpoints survive.
  if (const char* kill_at = std::getenv("HYPERION_TEST_KILL_DURING_SAVE"))
    if (std::atoll(kill_at) == s.state.step) ::kill(::getpid(), SIGKILL);
  opt.set_metadata("optimizer", "adamw");
  opt.set_metadata("step", std::to_string(s.optimizer_steps));
  opt.write(dir + "/" +
            (s.world > 1 ? shard_name("optimizer", s.rank, s.world) : "optimizer.safetensors"));
}

void CheckpointManager::write_common(const Snapshot& s, const std::string& tmp) const {
  if (!adapter_config_.empty()) io::write_file_atomic(tmp + "/adapter_config.json", adapter_config_);
  if (adapter_config_.empty() && (s.world > 1 || s.model_files > 1)) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", s.model_bytes}};
    nlohmann::ordered_json map;
    if (s.world > 1) {
      for (const auto& [name, rank] : s.weight_map) map[name] = shard_name("model", rank, s.world);
    } else {
      std::map<std::string, std::string> sorted;
      for (size_t i = 0; i < s.model.size(); ++i)
        sorted[s.model[i].name] = shard_name("model", s.model_file[i], s.model_files);
      for (const auto& [name, f] : sorted) map[name] = f;
    }
    index["weight_map"] = map;
    io::write_file_atomic(tmp + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  io::write_file_atomic(tmp + "/config.json", convert::to_hf_config_json(s.config));
  for (const auto& [name, bytes] : s.tokenizer) io::write_file_atomic(tmp + "/" + name, bytes);
  nlohmann::ordered_json st;
  st["format_version"] = 1;
  st["step"] = s.state.step;
  st["optimizer_step"] = s.optimizer_steps;
  st["data"] = {{"epoch", s.state.data.epoch}, {"index", s.state.data.index}};
  st["tokens_seen"] = s.state.tokens_seen;
  st["world_size"] = s.world;
  if (!s.state.quantization.empty()) {
    st["quantization"] = {{"mode", s.state.quantization}, {"passes", s.state.quant_passes}};
    if (!s.state.quant_histories.empty()) {
      io::SafetensorsWriter q;
      // The delayed scales (for reading; a resume recomputes them from the histories).
      std::vector<float> scales;
      scales.reserve(s.state.quant_histories.size());
      for (const auto& [name, h] : s.state.quant_histories) {
        float m = 0.0f;
        for (float v : h) m = std::max(m, v);
        scales.push_back(m);
      }
      for (size_t i = 0; i < s.state.quant_histories.size(); ++i) {
        const auto& [name, h] = s.state.quant_histories[i];
        q.add(name, DType::kF32, Shape{static_cast<int64_t>(h.size())}, h.data());
        q.add(name + ".max", DType::kF32, Shape{1}, &scales[i]);
      }
      q.set_metadata("quantization", s.state.quantization);
      q.write(tmp + "/quantization.safetensors");
    }
  }
  st["config"] = s.config_values;
  io::write_file_atomic(tmp + "/trainer_state.json", st.dump(2) + "\n");
}

void CheckpointManager::publish(const std::string& tmp, int64_t step) {
  publish_checkpoint(dir_, tmp, step, keep_);
}

void CheckpointManager::write(const Snapshot& s) {
  Timer timer;
  const std::string tmp =
      dir_ + "/.tmp-" + std::to_string(s.state.step) + "-" + std::to_string(::getpid());
  fs::remove_all(tmp);
  io::make_directories(tmp);
  const SavingDirectory saving(tmp);  // a second stop signal removes it
  write_files(s, tmp);
  write_common(s, tmp);
  publish(tmp, s.state.step);
  last_write_seconds_ = timer.seconds();
}

bool has_full_model_weights(const std::string& dir) {
  return fs::exists(fs::path(dir) / "model.safetensors") || fs::exists(fs::path(dir) / "model.safetensors.index.json");
}

bool has_model_weights(const std::string& dir) {
  // A diffusion run's checkpoint is a diffusers directory (model_index.json).
  return fs::exists(fs::path(dir) / "model.safetensors") ||
         fs::exists(fs::path(dir) / "adapter_model.safetensors") ||
         fs::exists(fs::path(dir) / "model.safetensors.index.json") ||
         fs::exists(fs::path(dir) / "model_index.json");
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  auto all = list_step_dirs(run_dir + "/checkpoints");
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (fs::exists(it->second / "trainer_state.json") && has_model_weights(it->second.string()))
      return it->second.string();
  return std::nullopt;
}

std::string resolve_checkpoint_dir(const std::string& path) {
  HYP_CHECK(fs::is_directory(path), "checkpoint '{}': no such directory", path);
  if (has_model_weights(path)) return path;
  auto latest = latest_checkpoint(path);
  HYP_CHECK(latest.has_value(),
            "checkpoint '{}': neither a checkpoint (no model.safetensors) nor a run directory "
            "with checkpoints/<step>/",
            path);
  return *latest;
}

DecoderConfig read_checkpoint_config(const std::string& dir) {
  const std::string path = io::model_dir_file(dir, "config.json");
  if (!fs::exists(path)) {
    // Say what the directory is, not only what it lacks.
    std::string model_type;
    try {
      model_type = nlohmann::json::parse(io::read_file(dir + "/trainer_state.json"))
                       .value("model_type", std::string());
    } catch (const std::exception&) {
    }
    HYP_CHECK(model_type != "dlrm",
              "{} is a recommender (DLRM) checkpoint: eval, generate, serve and convert work on "
              "language-model checkpoints (with a config.json); a DLRM run resumes with "
              "`hyperion train --resume {}`",
              dir, dir);
    HYP_CHECK(model_type != "diffusion",
              "{} is a diffusion checkpoint (a diffusers directory): generate and serve take it as "
              "--checkpoint {} / serve {}; a diffusion run resumes with `hyperion train --resume {}`",
              dir, dir, dir, dir);
    fail("{}: no config.json: not a language-model checkpoint (hyperion train writes "
         "config.json, model.safetensors and the tokenizer into each checkpoint)",
         dir);
  }
  const std::string text = io::read_file(path);
  // What config.json says is bad input (exit status 2), like a bad flag.
  try {
    return convert::decoder_config_from_hf_json(text, path);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw_usage_error(e.what());
  }
}

void load_model_weights(const std::string& dir, ParamStore& params) {
  HYP_USAGE_CHECK(!fs::exists(fs::path(dir) / "adapter_config.json") || has_full_model_weights(dir),
                  "{} is a LoRA adapter, not a model: give its base model and the adapter with --adapter {} "
                  "(or merge them: hyperion convert BASE OUT --merge-lora {})",
                  dir, dir, dir);
  check_weights_match_config(dir, params.config());
  // Read into host memory (the store itself, or its host copy when it lives on a device),
  // then written back to the device with the bf16 copy refreshed. A tensor that cannot be
  // read as f32 or holds a non-finite value is bad input (exit status 2).
  float* host = params.host_params();
  try {
    const WeightFiles files(dir);
    for (size_t i = 0; i < params.infos().size(); ++i) {
      const ParamInfo& p = params.infos()[i];
      const TensorView dst(host + p.offset, DType::kF32, p.shape);
      files.file_of(p.name)->read_into(p.name, dst);
      check_finite(dst, p.name, files.file_of(p.name)->path());
      params.master_written(static_cast<int>(i));  // (a frozen bf16 base: to bf16, f32 released)
    }
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw_usage_error(e.what());
  }
  params.params_to_device();
}

namespace {

// Copies every moment piece of the checkpoint's optimizer file(s) that overlaps what
// `optimizer` owns; the owned elements must be covered exactly once.
void load_moments(const std::string& dir, const ParamStore& params, AdamW& optimizer) {
  std::vector<std::string> paths;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name == "optimizer.safetensors" ||
        (name.rfind("optimizer-", 0) == 0 && name.size() > 12 &&
         name.compare(name.size() - 12, 12, ".safetensors") == 0))
      paths.push_back(e.path().string());
  }
  HYP_CHECK(!paths.empty(), "{}: no optimizer.safetensors or optimizer-*.safetensors", dir);
  std::sort(paths.begin(), paths.end());
  int64_t owned = 0, filled = 0;
  for (const OwnedRange& r : optimizer.owned()) owned += r.size();
  for (const std::string& path : paths) {
    io::SafetensorsFile f = io::SafetensorsFile::open(path);
    for (const io::SafetensorsTensor& t : f.tensors()) {
      // "<tensor>.exp_avg[_sq][@start]"
      std::string name = t.name;
      int64_t start = 0;
      if (const size_t at = name.rfind('@'); at != std::string::npos) {
        start = std::atoll(name.c_str() + at + 1);
        name.resize(at);
      }
      const bool is_v = name.size() > 11 && name.compare(name.size() - 11, 11, ".exp_avg_sq") == 0;
      const bool is_m =
          !is_v && name.size() > 8 && name.compare(name.size() - 8, 8, ".exp_avg") == 0;
      HYP_CHECK(is_m || is_v, "{}: unexpected tensor {}", path, t.name);
      const std::string param = name.substr(0, name.size() - (is_v ? 11 : 8));
      const ParamInfo* p = params.find(param);
      HYP_CHECK(p != nullptr, "{}: {} is not a tensor of this model", path, t.name);
      HYP_CHECK(t.dtype == DType::kF32, "{}: {} must be F32", path, t.name);
      const int64_t n = static_cast<int64_t>(t.nbytes / 4);
      HYP_CHECK(start >= 0 && start + n <= p->numel, "{}: {} lies outside tensor {} ({} elements)",
                path, t.name, param, p->numel);
      const int64_t b = p->offset + start, e = b + n;
      for (const OwnedRange& r : optimizer.owned()) {
        const int64_t lo = std::max(b, r.begin), hi = std::min(e, r.end);
        if (lo >= hi) continue;
        float* dst = is_v ? optimizer.v_at(lo) : optimizer.m_at(lo);
        std::memcpy(dst, static_cast<const char*>(t.data) + (lo - b) * 4,
                    static_cast<size_t>(hi - lo) * 4);
        if (!is_v) filled += hi - lo;
      }
    }
  }
  HYP_CHECK(filled == owned,
            "{}: the optimizer files cover {} of the {} moment elements this rank needs (a "
            "missing or duplicated shard file?)",
            dir, filled, owned);
  optimizer.moments_to_device();
}

}  // namespace

TrainerState load_training_state(const std::string& dir, ParamStore& params, AdamW& optimizer,
                                 bool weights) {
  if (weights) load_model_weights(dir, params);
  load_moments(dir, params, optimizer);
  const std::string path = dir + "/trainer_state.json";
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(io::read_file(path));
    TrainerState s;
    s.step = st.at("step").get<int64_t>();
    s.data.epoch = st.at("data").at("epoch").get<uint64_t>();
    s.data.index = st.at("data").at("index").get<uint64_t>();
    s.tokens_seen = st.at("tokens_seen").get<int64_t>();
    optimizer.set_steps_taken(st.at("optimizer_step").get<int64_t>());
    if (st.contains("quantization")) {
      s.quantization = st.at("quantization").at("mode").get<std::string>();
      s.quant_passes = st.at("quantization").at("passes").get<uint64_t>();
      const std::string qpath = dir + "/quantization.safetensors";
      if (std::filesystem::exists(qpath)) {
        const io::SafetensorsFile f = io::SafetensorsFile::open(qpath);
        for (const io::SafetensorsTensor& t : f.tensors()) {
          if (t.name.size() > 4 && t.name.compare(t.name.size() - 4, 4, ".max") == 0) continue;
          std::vector<float> v(static_cast<size_t>(t.shape.numel()));
          f.read_into(t.name, TensorView(v.data(), DType::kF32, t.shape));
          s.quant_histories.emplace_back(t.name, std::move(v));
        }
      }
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid trainer state: {}", path, e.what());
  }
}

}  // namespace hyperion
