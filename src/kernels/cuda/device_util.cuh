// Device-side helpers shared by the .cu files: loads and stores of f32 / bf16 storage
// (math is always f32), warp and block reductions in a fixed order, the error word, and
// launch-size arithmetic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

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

// Eight bf16 packed in 16 bytes, as f32.
__device__ __forceinline__ void bf16x8(const uint4& raw, float (&v)[8]) {
  const auto* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(h2[k]);
    v[2 * k] = f.x;
    v[2 * k + 1] = f.y;
  }
}

// Eight consecutive elements from index i as f32: one 16-byte load for bf16, two for f32.
// i must be a multiple of 8 and the tensor 16-byte aligned (vec8_ok says so).
__device__ __forceinline__ void load8(const void* p, Elem t, int64_t i, float (&v)[8]) {
  if (t == Elem::kBF16) {
    bf16x8(*reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p) + i), v);
  } else {
    const auto* f4 = reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    const float4 a = f4[0], b = f4[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}
__device__ __forceinline__ void load8(const float* p, int64_t i, float (&v)[8]) {
  load8(p, Elem::kF32, i, v);
}
__device__ __forceinline__ void store8(void* p, Elem t, int64_t i, const float (&v)[8]) {
  if (t == Elem::kBF16) {
    uint4 raw;
    auto* h2 = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int k = 0; k < 4; ++k) h2[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
    *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p) + i) = raw;
  } else {
    auto* f4 = reinterpret_cast<float4*>(static_cast<float*>(p) + i);
    f4[0] = make_float4(v[0], v[1], v[2], v[3]);
    f4[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

// Whether the 8-wide loads and stores above may run over `n` elements (per row or in all)
// of these tensors: n a multiple of 8 and every pointer 16-byte aligned.
inline bool vec8_ok(int64_t n, std::initializer_list<const void*> tensors) {
  if (n % 8 != 0) return false;
  for (const void* p : tensors)
    if ((reinterpret_cast<uintptr_t>(p) & 15) != 0) return false;
  return true;
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
