// Dropout's mask hash, shared by the host kernels (kernels/dropout.h) and the CUDA kernel
// (kernels/cuda/elementwise.cu), so both compute the same mask bit for bit. No includes
// beyond <cstdint>: nvcc compiles it into device code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HYPERION_HOST_DEVICE __host__ __device__
#else
#define HYPERION_HOST_DEVICE
#endif

namespace hyperion {

// Two rounds of a 32-bit integer finaliser (xor-shift-multiply), keyed by k0 then k1; the
// top 24 bits.
HYPERION_HOST_DEVICE inline uint32_t dropout_hash(uint32_t k0, uint32_t k1, uint32_t i) {
  uint32_t h = i ^ k0;
  for (int round = 0; round < 2; ++round) {
    if (round == 1) h ^= k1;
    h ^= h >> 16;
    h *= 0x7feb352dU;
    h ^= h >> 15;
    h *= 0x846ca68bU;
    h ^= h >> 16;
  }
  return h >> 8;
}

}  // namespace hyperion
