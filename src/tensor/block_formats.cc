#include "tensor/block_formats.h"

#include <algorithm>
#include <cctype>

#include "base/error.h"

namespace hyperion {

using block_layout::half_to_float;
using block_layout::k_quant_value;
using block_layout::load_u16;
using block_layout::q6_k_value;

namespace {

// Indexed by BlockType.
const BlockFormat kFormats[kBlockTypes] = {
    {BlockType::kQ4_0, "q4_0", 2, 32, 18},    {BlockType::kQ8_0, "q8_0", 8, 32, 34},
    {BlockType::kQ4_K, "q4_K", 12, 256, 144}, {BlockType::kQ5_K, "q5_K", 13, 256, 176},
    {BlockType::kQ6_K, "q6_K", 14, 256, 210}, {BlockType::kQ4_1, "q4_1", 3, 32, 20},
    {BlockType::kQ5_0, "q5_0", 6, 32, 22},    {BlockType::kQ5_1, "q5_1", 7, 32, 24},
};

void dequant_q8_0(const unsigned char* b, float* y) {
  const float d = half_to_float(load_u16(b));
  const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * float(qs[j]);
}

void dequant_32(BlockType t, const unsigned char* b, float* y) {
  const block_layout::Block32 k = block_layout::block32(t, b);
  const bool min = t == BlockType::kQ4_1 || t == BlockType::kQ5_1;
  for (int j = 0; j < 32; ++j) y[j] = min ? k.d * float(k.q(j)) + k.m : k.d * float(k.q(j) - k.offset);
}

void dequant_q45_k(const unsigned char* b, float* y, bool five) {
  const float d = half_to_float(load_u16(b)), dmin = half_to_float(load_u16(b + 2));
  const unsigned char* scales = b + 4;
  const unsigned char* qh = five ? b + 16 : nullptr;
  const unsigned char* qs = five ? b + 48 : b + 16;
  for (int e = 0; e < 256; ++e) {
    uint8_t sc, m;
    block_layout::k_scale_min(scales, e / 32, &sc, &m);
    y[e] = d * float(sc) * float(k_quant_value(qs, qh, e)) - dmin * float(m);
  }
}

void dequant_q6_k(const unsigned char* b, float* y) {
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_to_float(load_u16(b + 208));
  for (int e = 0; e < 256; ++e) y[e] = d * float(scales[e / 16]) * float(q6_k_value(b, e) - 32);
}

void check_values(BlockType t, int64_t n, const char* what) {
  const BlockFormat& f = block_format(t);
  HYP_CHECK(n >= 0 && n % f.values == 0, "{}: {} values are not a whole number of {} blocks ({})",
            what, n, f.name, f.values);
}

}  // namespace

const BlockFormat& block_format(BlockType t) {
  return kFormats[static_cast<int>(t)];
}

const BlockFormat* block_format_of_ggml(uint32_t ggml_type) {
  for (const BlockFormat& f : kFormats)
    if (f.ggml_type == ggml_type) return &f;
  return nullptr;
}

const BlockFormat* block_format_named(std::string_view name) {
  for (const BlockFormat& f : kFormats) {
    const std::string_view n = f.name;
    if (n.size() == name.size() &&
        std::equal(n.begin(), n.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        }))
      return &f;
  }
  return nullptr;
}

const char* block_format_names() {
  return "q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K";
}

size_t block_bytes(BlockType t, int64_t n) {
  check_values(t, n, "block_bytes");
  const BlockFormat& f = block_format(t);
  return static_cast<size_t>(n / f.values) * f.bytes;
}

void dequantize_blocks_reference(BlockType t, const void* src, float* dst, int64_t n) {
  check_values(t, n, "dequantize_blocks");
  const BlockFormat& f = block_format(t);
  const auto* p = static_cast<const unsigned char*>(src);
  for (int64_t i = 0; i < n / f.values; ++i) {
    const unsigned char* b = p + i * int64_t(f.bytes);
    float* y = dst + i * f.values;
    switch (t) {
      case BlockType::kQ8_0: dequant_q8_0(b, y); break;
      case BlockType::kQ4_0:
      case BlockType::kQ4_1:
      case BlockType::kQ5_0:
      case BlockType::kQ5_1: dequant_32(t, b, y); break;
      case BlockType::kQ4_K: dequant_q45_k(b, y, false); break;
      case BlockType::kQ5_K: dequant_q45_k(b, y, true); break;
      case BlockType::kQ6_K: dequant_q6_k(b, y); break;
    }
  }
}

}  // namespace hyperion
