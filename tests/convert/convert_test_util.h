// Helpers shared by the conversion tests: a model directory's weights, written as a
// Hugging Face checkpoint holds them.
#pragma once

#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../kernels/kernel_test_util.h"
#include "io/safetensors.h"
#include "tensor/convert.h"

namespace hyperion::testing_util {

struct RandomWeights {
  const std::vector<std::pair<std::string, Shape>>* spec = nullptr;  // name, shape in order
  uint32_t seed = 0;           // of the normal(0, 0.5) values, drawn in spec order
  std::string bf16_tensor;     // the one tensor stored as bf16 (exercises the read conversion)
  std::string drop;            // a tensor left out
  std::string reshape;         // a tensor written with its first dimension 2 too large
};

// Writes `path` (a model.safetensors) from `r`; returns each written tensor's f32 values
// (the bf16 one as rounded), which a converted file must reproduce.
inline std::map<std::string, std::vector<float>> write_random_weights(const RandomWeights& r,
                                                                      const std::string& path) {
  std::mt19937 rng(r.seed);
  std::map<std::string, std::vector<float>> weights;
  std::vector<bf16> bf16_values;  // alive until write(): the writer keeps a pointer
  io::SafetensorsWriter w;
  for (auto [name, shape] : *r.spec) {
    if (name == r.drop) continue;
    if (name == r.reshape) shape[0] += 2;
    std::vector<float> v = randn(size_t(shape.numel()), rng, 0.5f);
    if (name == r.bf16_tensor) {
      bf16_values.resize(v.size());
      for (size_t k = 0; k < v.size(); ++k) {
        bf16_values[k] = f32_to_bf16(v[k]);
        v[k] = bf16_to_f32(bf16_values[k]);
      }
      w.add(name, DType::kBF16, shape, bf16_values.data());
      weights[name] = std::move(v);
    } else {
      weights[name] = std::move(v);
      w.add(name, DType::kF32, shape, weights[name].data());
    }
  }
  w.set_metadata("format", "pt");
  w.write(path);
  return weights;
}

}  // namespace hyperion::testing_util
