#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "cases/bench_registry.h"
#include "tensor/convert.h"

namespace hyperion::bench {

std::shared_ptr<Tensor> random_tensor(DType dtype, Shape shape, unsigned seed, float lo, float hi) {
  auto t = std::make_shared<Tensor>(dtype, shape);
  const size_t n = size_t(t->numel()), es = dtype_size(dtype);
  const size_t block = std::min<size_t>(n, size_t(1) << 20);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> vals(block);
  for (auto& v : vals) v = is_floating(dtype) ? u(rng) : std::floor(u(rng));
  convert_any(vals.data(), DType::kF32, t->data(), dtype, block);
  auto* bytes = static_cast<unsigned char*>(t->data());
  for (size_t i = block; i < n; i += block)
    std::memcpy(bytes + i * es, bytes, std::min(block, n - i) * es);
  return t;
}

}  // namespace hyperion::bench
