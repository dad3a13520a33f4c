#include "io/weight_files.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/model_dir_file.h"

namespace hyperion::io {

namespace fs = std::filesystem;

WeightFiles::WeightFiles(const std::string& dir, const std::string& file_name) {
  // Symbolic links only within the directory (or a hub snapshot's blobs): io/model_dir_file.h.
  const std::string single = model_dir_file(dir, file_name);
  const std::string index_path = model_dir_file(dir, file_name + ".index.json");
  if (fs::exists(single) || !fs::exists(index_path)) {
    files_.push_back(SafetensorsFile::open(single));
  } else {
    // Hugging Face sharded layout: the index maps each tensor to its file.
    std::map<std::string, std::string> weight_map;
    try {
      const nlohmann::json index = nlohmann::json::parse(read_file(index_path));
      weight_map = index.at("weight_map").get<std::map<std::string, std::string>>();
    } catch (const nlohmann::json::exception& e) {
      fail("{}: invalid index: {}", index_path, e.what());
    }
    std::map<std::string, size_t> opened;
    for (const auto& [name, file] : weight_map) {
      HYP_CHECK(file.find('/') == std::string::npos,
                "{}: tensor {} maps to '{}', not a file in the checkpoint directory", index_path,
                name, file);
      if (!opened.count(file)) {
        const std::string shard = model_dir_file(dir, file);
        HYP_CHECK(fs::is_regular_file(shard),
                  "{}: tensor {} maps to shard '{}', which is not in the directory", index_path,
                  name, file);
        opened[file] = files_.size();
        files_.push_back(SafetensorsFile::open(shard));
      }
    }
    for (const auto& [name, file] : weight_map) {
      HYP_CHECK(files_[opened[file]].find(name) != nullptr,
                "{}: tensor {} is mapped to {}, which does not hold it", index_path, name, file);
      where_[name] = opened[file];
    }
    return;
  }
  for (const SafetensorsTensor& t : files_[0].tensors()) where_[t.name] = 0;
}

const SafetensorsFile* WeightFiles::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : &files_[it->second];
}

const SafetensorsTensor* WeightFiles::find(const std::string& name) const {
  const SafetensorsFile* f = file_of(name);
  return f == nullptr ? nullptr : f->find(name);
}

std::vector<std::string> WeightFiles::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

}  // namespace hyperion::io
