// llama.cpp's block quantisation formats, as data: the layouts GGUF files hold (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), their sizes, and the reference dequantisation every
// faster path is tested against. Below both the readers of files (io/gguf.h) and the kernels
// that compute on the blocks (kernels/block_quant.h, kernels/block_pack.h).
//
// The block layouts, as ggml lays them out (little-endian, packed, f16 = IEEE half):
//   Q4_0  32 values, 18 bytes  { f16 d; u8 qs[16]; }
//         x[j] = d * ((qs[j] & 15) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8)
//   Q4_1  32 values, 20 bytes  { f16 d; f16 m; u8 qs[16]; }     x = d * q + m, q as Q4_0's
//   Q5_0  32 values, 22 bytes  { f16 d; u8 qh[4]; u8 qs[16]; }  x = d * (q - 16): q as Q4_0's
//         plus 16 times bit j of the little-endian u32 qh for value j (0..31)
//   Q5_1  32 values, 24 bytes  { f16 d; f16 m; u8 qh[4]; u8 qs[16]; }   x = d * q + m
//   Q8_0  32 values, 34 bytes  { f16 d; i8 qs[32]; }             x[j] = d * qs[j]
//   Q4_K  256 values, 144 bytes { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; }
//         8 sub-blocks of 32, each with a 6-bit scale sc and a 6-bit min m packed in
//         `scales` (k_scale_min below); x = d * sc * q - dmin * m, q in [0, 15].
//         In each 64 values c: qs[32c + l] holds value 64c + l (low nibble, sub-block 2c)
//         and value 64c + 32 + l (high nibble, sub-block 2c + 1).
//   Q5_K  256 values, 176 bytes { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }
//         as Q4_K with a fifth bit: value 64c + l gets bit 2c of qh[l] as 16, value
//         64c + 32 + l bit 2c + 1; q in [0, 31].
//   Q6_K  256 values, 210 bytes { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; }
//         16 groups of 16 with an int8 scale; x = d * scales[g] * (q - 32), q in [0, 63].
//         In each half h (128 values, ql + 64h, qh + 32h), for l < 32:
//           value 128h + l      = (ql[l] & 15)      | ((qh[l] >> 0) & 3) << 4
//           value 128h + 32 + l = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4
//           value 128h + 64 + l = (ql[l] >> 4)      | ((qh[l] >> 4) & 3) << 4
//           value 128h + 96 + l = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace hyperion {

// The order is the index of per-type tables (kernels' dispatch): append only.
enum class BlockType : uint8_t { kQ4_0, kQ8_0, kQ4_K, kQ5_K, kQ6_K, kQ4_1, kQ5_0, kQ5_1 };
inline constexpr int kBlockTypes = 8;

struct BlockFormat {
  BlockType type;
  const char* name;    // ggml's spelling: "q4_0", "q8_0", "q4_K", ...
  uint32_t ggml_type;  // ggml's type id: 2, 8, 12, 13, 14, 3, 6, 7
  int64_t values;      // per block: 32 or 256
  size_t bytes;        // per block
};
const BlockFormat& block_format(BlockType t);
// The format with ggml type id `ggml_type`, or null.
const BlockFormat* block_format_of_ggml(uint32_t ggml_type);
// The format named `name` (case-insensitive: "q4_k" = "q4_K"), or null.
const BlockFormat* block_format_named(std::string_view name);
// The formats' names, for messages: "q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K".
const char* block_format_names();

// Bytes of `n` values (n a multiple of the block's values; checked).
size_t block_bytes(BlockType t, int64_t n);

// n values (a multiple of the block's values) from blocks to f32: the definition.
void dequantize_blocks_reference(BlockType t, const void* src, float* dst, int64_t n);

// ---- The integer fields of the layouts (inline: the kernels' packing reads them too).
namespace block_layout {

inline uint16_t load_u16(const unsigned char* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
}

// IEEE half to float (exact), without a library call.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((man & 0x400) == 0) {
        man <<= 1;
        --exp;
      }
      man &= 0x3FF;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block's `scales`.
inline void k_scale_min(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = uint8_t((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *m = uint8_t((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// Q4_K (qh null) and Q5_K: the 4-bit value of element e, plus 16 times its fifth bit.
inline int k_quant_value(const unsigned char* qs, const unsigned char* qh, int e) {
  const int c = e / 64, l = e % 32;
  const bool high = (e % 64) >= 32;
  int q = high ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 15);
  if (qh != nullptr) q += ((qh[l] >> (2 * c + (high ? 1 : 0))) & 1) << 4;
  return q;
}

// Q6_K: the 6-bit value (0..63) of element e of block b.
inline int q6_k_value(const unsigned char* b, int e) {
  const int h = e / 128, r = e % 128, part = r / 32, l = r % 32;
  const unsigned char* ql = b + 64 * h;
  const unsigned char* qh = b + 128 + 32 * h;
  const int low = part == 0   ? (ql[l] & 15)
                  : part == 1 ? (ql[l + 32] & 15)
                  : part == 2 ? (ql[l] >> 4)
                              : (ql[l + 32] >> 4);
  return low | (((qh[l] >> (2 * part)) & 3) << 4);
}

// The 32-value formats: the unsigned value q of element j (Q4_0/Q4_1: 0..15, Q5_0/Q5_1:
// 0..31), the scale d, the min m (Q4_1/Q5_1; 0 otherwise) and the offset (Q4_0: 8, Q5_0:
// 16, else 0), so that x = d * (q - offset) + m.
struct Block32 {
  float d = 0, m = 0;
  int offset = 0;
  const unsigned char* qs = nullptr;
  uint32_t qh = 0;
  bool five = false;
  int q(int j) const {
    const int nib = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
    return five ? nib | int((qh >> j) & 1) << 4 : nib;
  }
};
inline Block32 block32(BlockType t, const unsigned char* b) {
  Block32 k;
  k.d = half_to_float(load_u16(b));
  switch (t) {
    case BlockType::kQ4_0: k.offset = 8; k.qs = b + 2; break;
    case BlockType::kQ4_1: k.m = half_to_float(load_u16(b + 2)); k.qs = b + 4; break;
    case BlockType::kQ5_0:
      k.offset = 16;
      __builtin_memcpy(&k.qh, b + 2, 4);
      k.qs = b + 6;
      k.five = true;
      break;
    case BlockType::kQ5_1:
      k.m = half_to_float(load_u16(b + 2));
      __builtin_memcpy(&k.qh, b + 4, 4);
      k.qs = b + 8;
      k.five = true;
      break;
    default: break;
  }
  return k;
}

}  // namespace block_layout
}  // namespace hyperion
