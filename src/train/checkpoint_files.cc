#include "train/checkpoint_files.h"

#include <algorithm>
#include <system_error>

#include "base/error.h"
#include "base/log.h"
#include "io/atomic_file.h"

namespace hyperion {

namespace fs = std::filesystem;

namespace {

bool all_digits(const std::string& s, size_t from, size_t to) {
  if (from >= to) return false;
  for (size_t i = from; i < to; ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

// "<stem>-<digits>-of-<digits>.safetensors": a shard of either trainer's layout.
bool is_shard_name(const std::string& name, const std::string& stem) {
  const std::string ext = ".safetensors";
  if (name.size() <= stem.size() + ext.size() + 1 || name.rfind(stem + "-", 0) != 0 ||
      name.compare(name.size() - ext.size(), ext.size(), ext) != 0)
    return false;
  const std::string middle = name.substr(stem.size() + 1, name.size() - stem.size() - 1 - ext.size());
  const size_t of = middle.find("-of-");
  return of != std::string::npos && all_digits(middle, 0, of) &&
         all_digits(middle, of + 4, middle.size());
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

bool is_trainer_checkpoint_file(const std::string& name) {
  static const char* const kNames[] = {"model.safetensors",        "model.safetensors.index.json",
                                       "optimizer.safetensors",    "config.json",
                                       "tokenizer.model",          "trainer_state.json",
                                       "quantization.safetensors", "tokenizer.json",
                                       "tokenizer_config.json",    "chat_template.jinja",
                                       "generation_config.json"};
  for (const char* n : kNames)
    if (name == n) return true;
  // A diffusion checkpoint's (train/diffusion_checkpoint.h) files beside its components.
  if (name == "model_index.json" || name == "training_state.safetensors") return true;
  return is_shard_name(name, "model") || is_shard_name(name, "optimizer");
}

namespace {

// A diffusion checkpoint's component folders and the files hyperion writes in them:
// removed with the checkpoint; anything else in them is kept, as are the folders then.
bool is_diffusers_component(const std::string& name) {
  for (const char* n : {"unet", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "scheduler"})
    if (name == n) return true;
  return false;
}

bool is_diffusers_file(const std::string& name) {
  for (const char* n : {"config.json", "diffusion_pytorch_model.safetensors", "model.safetensors", "vocab.json",
                        "merges.txt", "scheduler_config.json", "special_tokens_map.json", "tokenizer_config.json"})
    if (name == n) return true;
  return false;
}

// Removes a component folder's own files, then the folder when empty; false when it
// holds something else.
bool remove_component(const fs::path& dir) {
  bool all = true;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (is_diffusers_file(e.path().filename().string()) && e.is_regular_file() && !e.is_symlink())
      fs::remove(e.path());
    else
      all = false;
  }
  if (all) fs::remove(dir);
  return all;
}

}  // namespace

bool parse_step_name(const std::string& name, int64_t* step) {
  if (name.empty() || name.size() > 18 || !all_digits(name, 0, name.size())) return false;
  *step = std::stoll(name);
  return true;
}

std::vector<std::pair<int64_t, fs::path>> list_step_dirs(const std::string& checkpoints_dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(checkpoints_dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(checkpoints_dir)) {
    int64_t step = 0;
    if (parse_step_name(e.path().filename().string(), &step) && e.is_directory())
      out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> remove_checkpoint(const fs::path& dir) {
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    // Only regular files of ours: a directory or link under one of our names is not.
    if (is_trainer_checkpoint_file(name) && e.is_regular_file() && !e.is_symlink())
      fs::remove(e.path());
    else if (!(is_diffusers_component(name) && e.is_directory() && !e.is_symlink() && remove_component(e.path())))
      kept.push_back(name);
  }
  std::sort(kept.begin(), kept.end());
  if (kept.empty()) fs::remove(dir);
  return kept;
}

void publish_checkpoint(const std::string& checkpoints_dir, const std::string& tmp, int64_t step,
                        int64_t keep) {
  const fs::path final_dir = fs::path(checkpoints_dir) / std::to_string(step);
  if (fs::exists(final_dir)) {
    // A re-save of the same step: what is not the trainer's moves into the new checkpoint
    // before the old one goes (same file system, so each move is a rename).
    for (const auto& e : fs::directory_iterator(final_dir)) {
      const std::string name = e.path().filename().string();
      if (!is_trainer_checkpoint_file(name) && !fs::exists(fs::path(tmp) / name))
        fs::rename(e.path(), fs::path(tmp) / name);
    }
    const std::vector<std::string> left = remove_checkpoint(final_dir);
    HYP_CHECK(left.empty(), "checkpoint {}: cannot replace it: it still holds {}",
              final_dir.string(), joined(left));
  }
  io::fsync_directory(tmp);
  fs::rename(tmp, final_dir);
  io::fsync_directory(checkpoints_dir);

  std::vector<std::pair<int64_t, fs::path>> older;
  for (auto& [s, path] : list_step_dirs(checkpoints_dir))
    if (s != step && fs::exists(path / "trainer_state.json")) older.emplace_back(s, path);
  const size_t keep_others = static_cast<size_t>(std::max<int64_t>(keep, 1) - 1);
  for (size_t i = 0; i + keep_others < older.size(); ++i) {
    const std::vector<std::string> kept = remove_checkpoint(older[i].second);
    if (!kept.empty())
      log_warn(
          "checkpoint {}: removed the trainer's files beyond checkpoints_to_keep; kept the "
          "directory for files hyperion did not write: {}",
          older[i].second.string(), joined(kept));
  }
}

}  // namespace hyperion
