// Device-side helpers shared by the .cu files: loads and stores of f32 / bf16 storage
// (math is always f32), warp and block reductions in a fixed order, the error word, and
// launch-size arithmetic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"

namespace hyperion::cuda {

__device__ __forceinline__ float load(const void* p, Elem t, int64_t i) {
  return t == Elem::kF32 ? static_cast<const float*>(p)[i]
                         : __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
__device__ __forceinline__ void store(void* p, Elem t, int64_t i, float v) {
  if (t == Elem::kF32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
}

__host__ __device__ __forceinline__ int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Butterfly sum over the 32 lanes: every lane ends with the same value, summed in the
// same order on every run.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over the block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `shared` holds 32 floats. Fixed order: warp results, then warp 0
// combines those.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  const float t = lane < warps ? shared[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(t) : warp_sum(t);
}
__device__ __forceinline__ float block_sum(float v, float* shared) {
  return block_reduce<false>(v, shared);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  return block_reduce<true>(v, shared);
}

// Records the first error (later ones are dropped).
__device__ __forceinline__ void record_error(DeviceError* err, int32_t code, int64_t a, int64_t b,
                                             int64_t c) {
  if (err == nullptr) return;
  if (atomicCAS(&err->code, 0, code) == 0) {
    err->a = a;
    err->b = b;
    err->c = c;
  }
}

inline unsigned int blocks_for(int64_t n, int threads, int64_t cap = 65535LL * 16) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return static_cast<unsigned int>(b);
}

}  // namespace hyperion::cuda
