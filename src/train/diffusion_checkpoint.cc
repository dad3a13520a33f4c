#include "train/diffusion_checkpoint.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train/checkpoint_files.h"
#include "train/stop_signal.h"

namespace hyperion {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFile = "training_state.safetensors";

}  // namespace

void save_diffusion_checkpoint(const std::string& run_dir, const Config& config, diffusion::DiffusionPipeline& pipe,
                               const DiffusionTrainingState& state, int64_t keep) {
  auto& unet = const_cast<diffusion::UNet&>(pipe.unet());
  diffusion::ParamTable& p = unet.params();
  const std::string dir = run_dir + "/checkpoints";
  const std::string tmp = fmt::format("{}/.tmp-{}-{}", dir, state.step, static_cast<int64_t>(::getpid()));
  fs::remove_all(tmp);
  io::make_directories(tmp);
  const SavingDirectory saving(tmp);  // a second stop signal removes it
  // The training weights, kept aside while the EMA goes into the diffusers directory.
  const std::vector<float> weights(p.all(), p.all() + p.size());
  io::SafetensorsWriter w;
  std::vector<float>& m = state.optimizer->m();
  std::vector<float>& v = state.optimizer->v();
  for (size_t i = 0; i < p.entries().size(); ++i) {
    const diffusion::ParamEntry& e = p.entries()[i];
    w.add("unet." + e.name, DType::kF32, e.shape, weights.data() + e.offset);
    w.add("adam_m." + e.name, DType::kF32, e.shape, m.data() + e.offset);
    w.add("adam_v." + e.name, DType::kF32, e.shape, v.data() + e.offset);
    if (state.ema) w.add("ema." + e.name, DType::kF32, e.shape, state.ema->shadow().data() + e.offset);
  }
  w.write(tmp + "/" + kStateFile);
  if (state.ema) state.ema->copy_to(p);
  try {
    pipe.save(tmp);
  } catch (...) {
    std::copy(weights.begin(), weights.end(), p.all());
    throw;
  }
  std::copy(weights.begin(), weights.end(), p.all());
  std::ostringstream rng;
  rng << *state.rng;
  nlohmann::ordered_json j;
  j["model_type"] = "diffusion";
  j["step"] = state.step;
  j["optimizer_steps"] = state.optimizer->steps();
  j["ema_updates"] = state.ema ? state.ema->updates() : 0;
  j["rng"] = rng.str();
  j["compute_dtype"] = state.bf16 ? "bfloat16" : "float32";
  nlohmann::ordered_json cfg = nlohmann::ordered_json::object();
  for (const auto& [k, val] : config.values()) cfg[k] = val;
  j["config"] = cfg;
  io::write_file_atomic(tmp + "/trainer_state.json", j.dump(2));
  publish_checkpoint(dir, tmp, state.step, keep);
}

void restore_diffusion_checkpoint(const std::string& dir, diffusion::DiffusionPipeline& pipe,
                                  DiffusionTrainingState& state) {
  const std::string json_path = dir + "/trainer_state.json", tensors_path = dir + "/" + kStateFile;
  try {
    const nlohmann::json j = nlohmann::json::parse(io::read_file(json_path));
    HYP_CHECK(j.value("model_type", std::string()) == "diffusion", "{}: not a diffusion checkpoint (model_type {})",
              json_path, j.value("model_type", std::string("decoder")));
    state.step = j.at("step").get<int64_t>();
    state.optimizer->set_steps(j.at("optimizer_steps").get<int64_t>());
    if (state.ema) state.ema->set_updates(j.at("ema_updates").get<int64_t>());
    std::istringstream rng(j.at("rng").get<std::string>());
    rng >> *state.rng;
    HYP_CHECK(!rng.fail(), "{}: 'rng' is not a saved generator state", json_path);
    const std::string dtype = j.value("compute_dtype", std::string("float32"));
    HYP_CHECK(dtype == "float32" || dtype == "bfloat16", "{}: compute_dtype '{}' (float32 or bfloat16)", json_path,
              dtype);
    state.bf16 = dtype == "bfloat16";
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", json_path, e.what());
  }
  HYP_CHECK(fs::exists(tensors_path), "{}: no {} (a diffusers directory alone cannot resume a run)", dir, kStateFile);
  const io::SafetensorsFile f = io::SafetensorsFile::open(tensors_path);
  diffusion::ParamTable& p = const_cast<diffusion::UNet&>(pipe.unet()).params();
  auto read = [&](const std::string& name, const diffusion::ParamEntry& e, float* out) {
    const io::SafetensorsTensor& t = f.get(name);
    HYP_CHECK(t.shape == e.shape, "{}: tensor {} has shape {}, the model's is {}", tensors_path, name,
              t.shape.str(), e.shape.str());
    f.read_into(name, TensorView(out, DType::kF32, e.shape));
  };
  for (size_t i = 0; i < p.entries().size(); ++i) {
    const diffusion::ParamEntry& e = p.entries()[i];
    read("unet." + e.name, e, p.all() + e.offset);
    read("adam_m." + e.name, e, state.optimizer->m().data() + e.offset);
    read("adam_v." + e.name, e, state.optimizer->v().data() + e.offset);
    if (state.ema) read("ema." + e.name, e, state.ema->shadow().data() + e.offset);
  }
}

}  // namespace hyperion
