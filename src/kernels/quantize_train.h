// The quantisers of quantised training (model/quantized_matmul.h), in the manner of
// AQT (MaxText's int8) and of fp8 training with delayed scaling (Transformer Engine):
//
//   int8, symmetric absmax, scale = max|x| / 127 along the axis a GEMM does NOT sum over:
//     quantize_cols_int8     one scale per column (a weight's input channel, for dx = dy W)
//     quantize_grad_int8     a gradient dy [rows, cols] twice, with stochastic rounding:
//                            per row (token) for dx = dy W, and dy * row_factor per column
//                            (output channel) for dW = dy^T x, where row_factor is the
//                            forward's per-token scale of x (so the forward's int8 x is
//                            reused as is: dW = sum_r dy[r,o] s_x[r] q_x[r,i])
//     (per-row nearest rounding is kernels/quantize.h's quantize_rows)
//   fp8, one scale per tensor given by the caller (the delayed scale):
//     quantize_fp8           q = fp8(x / scale), saturating, round to nearest even, into
//                            e4m3 or e5m2 bytes and/or their exact values as bf16 (every
//                            e4m3 and e5m2 value is a bf16 value), and returns max|x|
//     dequantize_fp8_values  fp8 bytes -> their values as bf16 (no scale)
//
// Stochastic rounding: q = floor(x * (1 / scale) + u) (one f32 reciprocal per scale, a
// multiply per element), u uniform in [0, 1) from a counter-based hash of
// (seed, element index): E[q] = v, and the draw depends on nothing but the seed and the
// element's position, so results are identical at any thread count and after a resume
// (the caller derives the seed from its step counter). Values clamp to [-127, 127].
// All-zero lines get scale 0 and q 0; a line holding inf or NaN gets a non-finite scale.
//
// Each kernel has a plain scalar reference (ref::) that the tests compare exactly against.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace hyperion {

// 32 random bits from (seed, index): a key mixed from the 64-bit seed (splitmix64), a
// Weyl step over the 32-bit element index and murmur3's finaliser (a bijection of the
// index for a given key, so no two elements of a tensor share a draw).
struct SrKey {
  uint32_t a = 0, b = 0;
};
inline SrKey sr_key(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return {static_cast<uint32_t>(z), static_cast<uint32_t>(z >> 32)};
}
inline uint32_t sr_bits(SrKey k, uint32_t index) {
  uint32_t h = (index * 0x9E3779B1u + k.a) ^ k.b;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}
// The two uniform draws in [0, 1) of one 32-bit value, 16 bits each (exact in f32): the
// gradient quantiser's per-row rounding takes the low half, its per-column one the high.
inline float sr_low(uint32_t h) {
  return static_cast<float>(h & 0xFFFFu) * (1.0f / 65536.0f);
}
inline float sr_high(uint32_t h) {
  return static_cast<float>(h >> 16) * (1.0f / 65536.0f);
}
// Stochastic rounding of v (already divided by its scale) to an int8 level.
inline int8_t sr_round_i8(float v, float u) {
  float r = __builtin_floorf(v + u);
  r = r < -127.0f ? -127.0f : (r > 127.0f ? 127.0f : r);
  return static_cast<int8_t>(r);
}

// x [rows, cols] f32|bf16 contiguous -> q [rows, cols] int8, scales[cols] (nearest even).
void quantize_cols_int8(const TensorView& x, const TensorView& q, float* scales);

struct GradQuantized {
  int8_t* q_rows = nullptr;  // [rows, cols], per-row scales s_rows[rows]
  float* s_rows = nullptr;
  int8_t* q_cols = nullptr;  // [rows, cols] of dy * row_factor, per-column s_cols[cols]
  float* s_cols = nullptr;
  // q_cols written transposed, [cols, rows] (the A operand of an AMX weight gradient,
  // kernels/amx_int8_gemm.h); needs rows % 64 == 0.
  bool cols_transposed = false;
};
// dy [rows, cols] f32|bf16 contiguous; row_factor [rows] or null (1). Either output pair
// may be null (not computed). One draw per element (sr_bits(sr_key(seed), r * cols + c)):
// its low 16 bits round the row quantisation, its high 16 bits the column one.
void quantize_grad_int8(const TensorView& dy, const float* row_factor, uint64_t seed,
                        const GradQuantized& out);

// max|x| of n values of xd (f32|bf16); NaN if any is NaN.
float absmax(const void* x, DType xd, int64_t n);

// q = fp8(x / scale) for n values (xd f32|bf16; fd kE4M3 or kE5M2). `bytes` (n fp8) and
// `values` (n bf16: the fp8 values, unscaled) may each be null. scale must be finite and
// > 0. Returns max|x| (the amax a delayed-scaling history records).
float quantize_fp8(const void* x, DType xd, int64_t n, float scale, DType fd, void* bytes,
                   bf16* values);
// n fp8 bytes of fd -> their values as bf16.
void dequantize_fp8_values(const void* bytes, DType fd, int64_t n, bf16* values);
// Largest finite value: 448 (e4m3), 57344 (e5m2).
float fp8_max(DType fd);

namespace ref {
void quantize_cols_int8(const TensorView& x, const TensorView& q, float* scales);
void quantize_grad_int8(const TensorView& dy, const float* row_factor, uint64_t seed,
                        const GradQuantized& out);
// Through tensor/convert.h's exact minifloat encoder (saturating).
float quantize_fp8(const void* x, DType xd, int64_t n, float scale, DType fd, void* bytes,
                   bf16* values);
}  // namespace ref

}  // namespace hyperion
