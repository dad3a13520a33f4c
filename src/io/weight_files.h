// A model directory's weight files, opened (headers parsed, data mapped lazily): the
// single model.safetensors, or every shard of a Hugging Face sharded layout
// (model.safetensors.index.json's weight_map: tensor name -> file in the directory).
// Diffusers components name theirs diffusion_pytorch_model.safetensors (file_name).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace hyperion::io {

class WeightFiles {
 public:
  // Throws naming the index and the tensor or file at fault: a weight_map entry outside
  // the directory, a missing shard, a shard that does not hold what the index maps to it.
  explicit WeightFiles(const std::string& dir, const std::string& file_name = "model.safetensors");
  const SafetensorsTensor* find(const std::string& name) const;
  const SafetensorsFile* file_of(const std::string& name) const;  // null: not held
  std::vector<std::string> names() const;                         // sorted

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;
};

}  // namespace hyperion::io
