#include "convert/peft_adapter.h"

#include <filesystem>
#include <set>
#include <vector>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "kernels/backend.h"

namespace hyperion::convert {

namespace fs = std::filesystem;

namespace {

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kTensorFile = "adapter_model.safetensors";

// A key PEFT has that must hold its "off" value here: null, false, an empty list or map.
bool is_off(const nlohmann::json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_array() && v.empty()) ||
         (v.is_object() && v.empty());
}

}  // namespace

bool is_peft_adapter_dir(const std::string& dir) { return fs::exists(fs::path(dir) / kConfigFile); }

LoraConfig read_peft_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kConfigFile).string();
  HYP_USAGE_CHECK(fs::exists(path), "adapter {}: no {} (not a PEFT adapter directory)", dir, kConfigFile);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_file(path, 1 << 20));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
  HYP_USAGE_CHECK(j.is_object(), "{}: not a JSON object", path);
  const std::string type = j.value("peft_type", std::string("LORA"));
  HYP_USAGE_CHECK(type == "LORA", "{}: peft_type {} is not implemented (LORA is)", path, type);
  for (const char* key : {"use_dora", "modules_to_save", "layers_to_transform", "layers_pattern", "rank_pattern",
                          "alpha_pattern", "fan_in_fan_out", "lora_bias", "loftq_config", "megatron_config",
                          "layer_replication", "trainable_token_indices", "exclude_modules"})
    if (j.contains(key))
      HYP_USAGE_CHECK(is_off(j[key]), "{}: key {} = {} is not implemented (hyperion adapts whole layers with plain LoRA)",
                      path, key, j[key].dump());
  const std::string bias = j.value("bias", std::string("none"));
  HYP_USAGE_CHECK(bias == "none", "{}: key bias = {} is not implemented (only \"none\")", path, bias);
  LoraConfig c;
  HYP_USAGE_CHECK(j.contains("r") && j["r"].is_number_integer(), "{}: key r (the rank) is missing or not an integer",
                  path);
  c.rank = j["r"].get<int64_t>();
  HYP_USAGE_CHECK(c.rank >= 1, "{}: key r = {}: the rank must be >= 1", path, c.rank);
  HYP_USAGE_CHECK(!j.contains("lora_alpha") || j["lora_alpha"].is_number(), "{}: key lora_alpha is not a number", path);
  c.alpha = j.value("lora_alpha", 8.0);
  HYP_USAGE_CHECK(c.alpha > 0, "{}: key lora_alpha = {} must be > 0", path, c.alpha);
  if (j.contains("lora_dropout") && j["lora_dropout"].is_number()) c.dropout = j["lora_dropout"].get<double>();
  if (j.contains("use_rslora") && j["use_rslora"].is_boolean()) c.rslora = j["use_rslora"].get<bool>();
  const nlohmann::json& t = j.contains("target_modules") ? j["target_modules"] : nlohmann::json();
  std::vector<std::string> names;
  if (t.is_array()) {
    for (const auto& n : t) {
      HYP_USAGE_CHECK(n.is_string(), "{}: key target_modules holds a non-string {}", path, n.dump());
      names.push_back(n.get<std::string>());
    }
  } else if (t.is_string()) {
    // A string is PEFT's regex over module paths, or the "all-linear" shorthand.
    HYP_USAGE_CHECK(t.get<std::string>() == "all-linear",
                    "{}: key target_modules = {}: a regular expression is not implemented (give a list "
                    "of module names, or all-linear)",
                    path, t.dump());
    names.push_back("all-linear");
  } else {
    throw UsageError(fmt::format("{}: key target_modules is missing or neither a list nor a string", path));
  }
  c.targets = parse_lora_targets(names, path + ": key target_modules");
  return c;
}

std::string peft_base_model(const std::string& dir) {
  const std::string path = (fs::path(dir) / kConfigFile).string();
  try {
    const nlohmann::json j = nlohmann::json::parse(io::read_file(path, 1 << 20));
    const auto it = j.find("base_model_name_or_path");
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
}

std::string peft_config_json(const LoraConfig& c, const std::string& base_model) {
  nlohmann::ordered_json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = base_model;
  j["r"] = c.rank;
  j["lora_alpha"] = c.alpha;
  j["lora_dropout"] = c.dropout;
  nlohmann::ordered_json targets = nlohmann::ordered_json::array();
  for (LoraModule m : c.targets) targets.push_back(lora_module_name(m));
  j["target_modules"] = targets;
  j["bias"] = "none";
  j["use_rslora"] = c.rslora;
  j["use_dora"] = false;
  j["fan_in_fan_out"] = false;
  j["init_lora_weights"] = true;
  j["inference_mode"] = true;
  j["modules_to_save"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["rank_pattern"] = nlohmann::ordered_json::object();
  j["alpha_pattern"] = nlohmann::ordered_json::object();
  j["revision"] = nullptr;
  j["library_name"] = "hyperion";
  return j.dump(2) + "\n";
}

void read_peft_tensors(const std::string& dir, LoraAdapter& adapter) {
  const std::string path = (fs::path(dir) / kTensorFile).string();
  HYP_USAGE_CHECK(fs::exists(path), "adapter {}: no {} (PEFT's .bin files are not read; save with safe_serialization)",
                  dir, kTensorFile);
  const io::SafetensorsFile f = io::SafetensorsFile::open(path);
  ParamStore& s = adapter.store();
  std::set<std::string> expected;
  for (const ParamInfo& p : s.infos()) expected.insert(p.name);
  for (const io::SafetensorsTensor& t : f.tensors()) {
    // PEFT also writes names with the adapter's name ("...lora_A.default.weight") in some
    // versions; those map to the same tensor.
    std::string name = t.name;
    const size_t dflt = name.find(".default.weight");
    if (dflt != std::string::npos) name = name.substr(0, dflt) + ".weight";
    HYP_USAGE_CHECK(expected.count(name) > 0,
                    "adapter {}: tensor {} does not belong to a {} adapter of this model (another base model, "
                    "or target modules other than adapter_config.json says)",
                    dir, t.name, adapter.rank());
  }
  std::vector<float> staging;
  const bool host = s.device() == Device::kHost;
  if (!host) staging.assign(static_cast<size_t>(s.size()), 0.0f);
  float* base = host ? s.params() : staging.data();
  for (const ParamInfo& p : s.infos()) {
    const io::SafetensorsTensor* t = f.find(p.name);
    if (t == nullptr) {
      const std::string alt = p.name.substr(0, p.name.size() - 7) + ".default.weight";
      t = f.find(alt);
    }
    HYP_USAGE_CHECK(t != nullptr, "adapter {}: tensor {} is missing (the base model has a layer the adapter lacks)", dir,
                    p.name);
    HYP_USAGE_CHECK(t->shape == p.shape,
                    "adapter {}: tensor {} has shape [{}], this model needs [{}] (adapter_config.json's r disagrees, or the adapter is of another base model)",
                    dir, t->name, fmt::join(t->shape, ", "), fmt::join(p.shape, ", "));
    f.read_into(t->name, TensorView(base + p.offset, DType::kF32, p.shape));
  }
  if (!host) backend_for(s.device()).upload(staging.data(), s.params(), staging.size() * sizeof(float));
  s.sync_bf16();
}

std::unique_ptr<LoraAdapter> load_peft_adapter(const std::string& dir, const ParamStore& base, bool gradients) {
  const LoraConfig c = read_peft_config(dir);
  auto adapter = std::make_unique<LoraAdapter>(base, c, gradients, base.has_bf16());
  read_peft_tensors(dir, *adapter);
  return adapter;
}

void save_peft_adapter(const std::string& dir, const LoraAdapter& adapter, const std::string& base_model) {
  io::make_directories(dir);
  const ParamStore& s = adapter.store();
  s.params_to_host();
  const float* host = s.host_params();
  io::SafetensorsWriter w;
  for (const ParamInfo& p : s.infos()) w.add(p.name, DType::kF32, p.shape, host + p.offset);
  w.set_metadata("format", "pt");
  w.write((fs::path(dir) / kTensorFile).string());
  io::write_file_atomic((fs::path(dir) / kConfigFile).string(), peft_config_json(adapter.config(), base_model));
}

}  // namespace hyperion::convert
