#include "train/checkpoint.h"

#include <unistd.h>

#include <signal.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/log.h"
#include "base/timer.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace hyperion {

namespace fs = std::filesystem;

struct CheckpointManager::Snapshot {
  std::vector<ParamInfo> infos;
  std::vector<float> params, m, v;
  LlamaConfig config;
  TrainerState state;
  int64_t optimizer_steps = 0;
  std::string tokenizer;
  std::map<std::string, std::string> config_values;
};

CheckpointManager::CheckpointManager(std::string run_dir, int64_t keep, bool async)
    : dir_(std::move(run_dir) + "/checkpoints"), keep_(std::max<int64_t>(keep, 1)), async_(async) {
  fs::create_directories(dir_);
  // Leftovers of a save that was killed: never complete, safe to remove.
  for (const auto& e : fs::directory_iterator(dir_))
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(e.path());
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

void CheckpointManager::save(const ParamStore& params, const AdamW& optimizer,
                             const TrainerState& state, const std::string& tokenizer_bytes,
                             const std::map<std::string, std::string>& config_values) {
  Timer timer;
  wait();
  auto snap = std::make_shared<Snapshot>();
  snap->infos = params.infos();
  const size_t n = static_cast<size_t>(params.size());
  snap->params.assign(params.params(), params.params() + n);
  snap->m.assign(optimizer.m(), optimizer.m() + n);
  snap->v.assign(optimizer.v(), optimizer.v() + n);
  snap->config = params.config();
  snap->state = state;
  snap->optimizer_steps = optimizer.steps_taken();
  snap->tokenizer = tokenizer_bytes;
  snap->config_values = config_values;
  if (async_) {
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

namespace {

bool is_step_dir(const fs::path& p, int64_t* step) {
  const std::string name = p.filename().string();
  if (name.empty() || name.size() > 18) return false;
  for (char ch : name)
    if (ch < '0' || ch > '9') return false;
  *step = std::stoll(name);
  return fs::is_directory(p);
}

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    int64_t step = 0;
    if (is_step_dir(e.path(), &step)) out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

void CheckpointManager::write(const Snapshot& s) {
  Timer timer;
  const std::string final_dir = dir_ + "/" + std::to_string(s.state.step);
  const std::string tmp =
      dir_ + "/.tmp-" + std::to_string(s.state.step) + "-" + std::to_string(::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);

  io::SafetensorsWriter model, opt;
  std::vector<std::string> moment_names;
  moment_names.reserve(s.infos.size() * 2);
  for (const ParamInfo& p : s.infos) {
    model.add(p.name, DType::kF32, p.shape, s.params.data() + p.offset);
    moment_names.push_back(p.name + ".exp_avg");
    opt.add(moment_names.back(), DType::kF32, p.shape, s.m.data() + p.offset);
    moment_names.push_back(p.name + ".exp_avg_sq");
    opt.add(moment_names.back(), DType::kF32, p.shape, s.v.data() + p.offset);
  }
  model.set_metadata("format", "pt");
  model.write(tmp + "/model.safetensors");
  // Test hook: die mid-save (after the first file) to prove earlier checkpoints survive.
  if (const char* kill_at = std::getenv("HYPERION_TEST_KILL_DURING_SAVE"))
    if (std::atoll(kill_at) == s.state.step) ::kill(::getpid(), SIGKILL);
  opt.set_metadata("optimizer", "adamw");
  opt.set_metadata("step", std::to_string(s.optimizer_steps));
  opt.write(tmp + "/optimizer.safetensors");
  io::write_file_atomic(tmp + "/config.json", s.config.to_hf_json());
  io::write_file_atomic(tmp + "/tokenizer.model", s.tokenizer);
  nlohmann::ordered_json st;
  st["format_version"] = 1;
  st["step"] = s.state.step;
  st["optimizer_step"] = s.optimizer_steps;
  st["data"] = {{"epoch", s.state.data.epoch}, {"index", s.state.data.index}};
  st["tokens_seen"] = s.state.tokens_seen;
  st["config"] = s.config_values;
  io::write_file_atomic(tmp + "/trainer_state.json", st.dump(2) + "\n");
  io::fsync_directory(tmp);

  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // re-save of the same step
  fs::rename(tmp, final_dir);
  io::fsync_directory(dir_);
  auto all = list_checkpoints(dir_);
  for (size_t i = 0; i + static_cast<size_t>(keep_) < all.size(); ++i)
    fs::remove_all(all[i].second);
  last_write_seconds_ = timer.seconds();
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  auto all = list_checkpoints(run_dir + "/checkpoints");
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (fs::exists(it->second / "trainer_state.json") &&
        fs::exists(it->second / "model.safetensors"))
      return it->second.string();
  return std::nullopt;
}

std::string resolve_checkpoint_dir(const std::string& path) {
  HYP_CHECK(fs::is_directory(path), "checkpoint '{}': no such directory", path);
  if (fs::exists(fs::path(path) / "model.safetensors")) return path;
  auto latest = latest_checkpoint(path);
  HYP_CHECK(latest.has_value(),
            "checkpoint '{}': neither a checkpoint (no model.safetensors) nor a run directory "
            "with checkpoints/<step>/",
            path);
  return *latest;
}

LlamaConfig read_checkpoint_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  return LlamaConfig::from_hf_json(io::read_file(path), path);
}

void load_model_weights(const std::string& dir, ParamStore& params) {
  io::SafetensorsFile f = io::SafetensorsFile::open(dir + "/model.safetensors");
  for (size_t i = 0; i < params.infos().size(); ++i)
    f.read_into(params.infos()[i].name, params.param(static_cast<int>(i)));
  params.sync_bf16();
}

TrainerState load_training_state(const std::string& dir, ParamStore& params, AdamW& optimizer) {
  load_model_weights(dir, params);
  io::SafetensorsFile f = io::SafetensorsFile::open(dir + "/optimizer.safetensors");
  for (const ParamInfo& p : params.infos()) {
    f.read_into(p.name + ".exp_avg", TensorView(optimizer.m() + p.offset, DType::kF32, p.shape));
    f.read_into(p.name + ".exp_avg_sq", TensorView(optimizer.v() + p.offset, DType::kF32, p.shape));
  }
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
    return s;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid trainer state: {}", path, e.what());
  }
}

}  // namespace hyperion
