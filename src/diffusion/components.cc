#include "diffusion/components.h"

#include <filesystem>

#include "base/error.h"
#include "base/log.h"
#include "io/atomic_file.h"
#include "io/weight_files.h"

namespace hyperion::diffusion {

namespace fs = std::filesystem;

std::string component_weights_name(const std::string& dir, const std::string& file_name) {
  HYP_CHECK(fs::is_directory(dir), "{}: not a directory (a diffusers component folder)", dir);
  const std::string stem = file_name.substr(0, file_name.size() - std::string(".safetensors").size());
  for (const std::string& name : {file_name, stem + ".fp16.safetensors"})
    if (fs::exists(fs::path(dir) / name) || fs::exists(fs::path(dir) / (name + ".index.json"))) return name;
  fail("{}: no {} (nor its .index.json or .fp16 variant); .bin weights are not read, convert them to "
       "safetensors",
       dir, file_name);
}

namespace {

std::string read_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  HYP_CHECK(fs::exists(path), "{}: config.json is missing", dir);
  return io::read_file(path, 16 << 20);
}

template <class Model>
void load_weights(Model& m, const std::string& dir, const std::string& file_name,
                  const std::vector<std::string>& ignored = {}, bool with_grads = false) {
  const std::string name = component_weights_name(dir, file_name);
  const io::WeightFiles files(dir, name);
  m.params().allocate(with_grads);
  const std::vector<std::string> unused = m.params().load(files, (fs::path(dir) / name).string(), "", ignored);
  if (!unused.empty())
    log_warn("{}: {} tensors the config does not use (first: {})", dir, unused.size(), unused.front());
}

}  // namespace

std::unique_ptr<UNet> load_unet(const std::string& dir, bool with_grads) {
  auto m = std::make_unique<UNet>(UNetConfig::from_json(read_config(dir), (fs::path(dir) / "config.json").string()));
  load_weights(*m, dir, "diffusion_pytorch_model.safetensors", {}, with_grads);
  return m;
}

std::unique_ptr<Vae> load_vae(const std::string& dir, bool with_grads) {
  auto m = std::make_unique<Vae>(VaeConfig::from_json(read_config(dir), (fs::path(dir) / "config.json").string()));
  load_weights(*m, dir, "diffusion_pytorch_model.safetensors", {}, with_grads);
  return m;
}

std::unique_ptr<ClipTextModel> load_clip_text(const std::string& dir) {
  auto m = std::make_unique<ClipTextModel>(
      ClipTextConfig::from_json(read_config(dir), (fs::path(dir) / "config.json").string()));
  load_weights(*m, dir, "model.safetensors", {"text_model.embeddings.position_ids"});
  return m;
}

}  // namespace hyperion::diffusion
