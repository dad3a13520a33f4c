// Random block-quantised data for the block format tests (kernels/block_quant.h).
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "kernels/block_quant.h"
#include "tensor/convert.h"

namespace hyperion::block_test {

inline void put_half(unsigned char* p, float v) {
  const uint16_t h = f32_to_f16(v).bits;
  std::memcpy(p, &h, 2);
}

// Random blocks: every quant byte random (all are valid), scales small finite halves.
inline std::vector<unsigned char> random_blocks(BlockType t, int64_t n, std::mt19937& rng) {
  const BlockFormat& f = block_format(t);
  std::vector<unsigned char> out(block_bytes(t, n));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (auto& b : out) b = static_cast<unsigned char>(byte(rng));
  for (int64_t b = 0; b < n / f.values; ++b) {
    unsigned char* blk = out.data() + b * int64_t(f.bytes);
    switch (t) {
      case BlockType::kQ4_0:
      case BlockType::kQ8_0:
      case BlockType::kQ5_0: put_half(blk, scale(rng)); break;
      case BlockType::kQ4_1:
      case BlockType::kQ5_1:
        put_half(blk, scale(rng));
        put_half(blk + 2, -8.0f * scale(rng));
        break;
      case BlockType::kQ4_K:
      case BlockType::kQ5_K:
        put_half(blk, scale(rng));
        put_half(blk + 2, scale(rng));
        break;
      case BlockType::kQ6_K: put_half(blk + 208, scale(rng) * 0.1f); break;
    }
  }
  return out;
}

inline std::vector<float> randn(size_t n, std::mt19937& rng, float sd) {
  std::normal_distribution<float> g(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}


}  // namespace hyperion::block_test
