// Filling buffers: constants and counter-based normal random numbers. Element i of a
// normal fill depends only on (seed, i), so fills are reproducible for any thread count
// and any chunking (parameter initialisation, test fixtures).
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace hyperion {

// x[i] = value (f32 or bf16, contiguous).
void fill_constant(const TensorView& x, float value);
// x[i] = mean + stddev * N(0,1), N from Box-Muller on two 32-bit halves of
// splitmix64(seed ^ splitmix64(i)) (f32 or bf16, contiguous).
void fill_normal(const TensorView& x, uint64_t seed, float mean, float stddev);
// x[i] = lo + (hi - lo) * U[0, 1), U from the top 24 bits of splitmix64(seed ^
// splitmix64(i)) (f32 or bf16, contiguous): PyTorch's uniform_ / kaiming_uniform_ shape.
void fill_uniform(const TensorView& x, uint64_t seed, float lo, float hi);

// splitmix64 finaliser: a 64-bit mixing function (the RNG under fill_normal).
uint64_t splitmix64(uint64_t x);
// 64-bit FNV-1a of a string, to derive per-tensor seeds from names.
uint64_t hash_string(const char* s);

namespace ref {
void fill_normal(const TensorView& x, uint64_t seed, float mean, float stddev);
}  // namespace ref

}  // namespace hyperion
