// Elementwise and row-gather kernels: dtype conversion, bias, the gated activations,
// RoPE, the token embedding, AdamW and the sums of squares behind the global norm.
// Semantics are those of the host kernels named in cuda_kernels.h.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/device_util.cuh"
#include "kernels/dropout_hash.h"

namespace hyperion::cuda {
namespace {

constexpr int kThreads = 256;

// The project's DType values (tensor/dtype.h).
enum : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2, kE4M3 = 3, kE5M2 = 4 };

__device__ float load_any(const void* p, int32_t t, int64_t i) {
  switch (t) {
    case kF32:
      return static_cast<const float*>(p)[i];
    case kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case kE4M3:
      return float(static_cast<const __nv_fp8_e4m3*>(p)[i]);
    default:
      return float(static_cast<const __nv_fp8_e5m2*>(p)[i]);
  }
}
__device__ void store_any(void* p, int32_t t, int64_t i, float v) {
  switch (t) {
    case kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    case kE4M3:
      static_cast<__nv_fp8_e4m3*>(p)[i] = __nv_fp8_e4m3(v);
      break;  // saturating
    default:
      static_cast<__nv_fp8_e5m2*>(p)[i] = __nv_fp8_e5m2(v);
      break;
  }
}

__global__ void convert_kernel(const void* src, int32_t st, void* dst, int32_t dt, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    store_any(dst, dt, i, load_any(src, st, i));
}

__global__ void add_bias_kernel(void* c, Elem ct, int64_t m, int64_t n, int64_t ldc,
                                const float* bias) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, j = i % n;
    store(c, ct, r * ldc + j, load(c, ct, r * ldc + j) + bias[j]);
  }
}

// 32 x 32 tiles through shared memory (the +1 column avoids bank conflicts).
__global__ void transpose_kernel(const uint8_t* src, int64_t rows, int64_t cols, int64_t ld,
                                 uint8_t* dst) {
  __shared__ uint8_t tile[32][33];
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * ld + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][i];
  }
}

// sigmoid from exp(-|x|): no inf / inf for large |x| (kernels/gated_activation.h).
__device__ __forceinline__ float sigmoid(float x) {
  const float e = __expf(-fabsf(x));
  return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
constexpr float kSqrt2OverPi = 0.7978845608028654f;

__device__ __forceinline__ float gated_value(int act, float gv, float uv) {
  if (act == 0) return gv * sigmoid(gv) * uv;
  const float z = kSqrt2OverPi * (gv + 0.044715f * gv * gv * gv);
  return gv * sigmoid(2.0f * z) * uv;
}
// d/dg and d/du of gated_value, times d.
__device__ __forceinline__ void gated_grads(int act, float d, float gv, float uv, float& dgv,
                                            float& duv) {
  if (act == 0) {
    const float s = sigmoid(gv);
    dgv = d * uv * s * (1.0f + gv * (1.0f - s));
    duv = d * gv * s;
  } else {
    const float z = kSqrt2OverPi * (gv + 0.044715f * gv * gv * gv);
    const float s = sigmoid(2.0f * z);
    const float dz = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * gv * gv);
    dgv = d * uv * (s + 2.0f * gv * s * (1.0f - s) * dz);
    duv = d * gv * s;
  }
}

__global__ void gated_forward_kernel(int act, const void* g, const void* u, void* h, Elem t,
                                     int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    store(h, t, i, gated_value(act, load(g, t, i), load(u, t, i)));
}
// Eight elements per thread with 16-byte accesses (vec8_ok): the form the model's
// aligned activations take.
__global__ void gated_forward_vec_kernel(int act, const void* g, const void* u, void* h, Elem t,
                                         int64_t n) {
  for (int64_t i = 8 * (blockIdx.x * int64_t(blockDim.x) + threadIdx.x); i < n;
       i += 8 * int64_t(gridDim.x) * blockDim.x) {
    float gv[8], uv[8], hv[8];
    load8(g, t, i, gv);
    load8(u, t, i, uv);
#pragma unroll
    for (int e = 0; e < 8; ++e) hv[e] = gated_value(act, gv[e], uv[e]);
    store8(h, t, i, hv);
  }
}

__global__ void gated_backward_kernel(int act, const void* dh, const void* g, const void* u,
                                      void* dg, void* du, Elem t, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float dgv, duv;
    gated_grads(act, load(dh, t, i), load(g, t, i), load(u, t, i), dgv, duv);
    store(dg, t, i, dgv);  // every input element was read above: dg/du may alias them
    store(du, t, i, duv);
  }
}
__global__ void gated_backward_vec_kernel(int act, const void* dh, const void* g, const void* u,
                                          void* dg, void* du, Elem t, int64_t n) {
  for (int64_t i = 8 * (blockIdx.x * int64_t(blockDim.x) + threadIdx.x); i < n;
       i += 8 * int64_t(gridDim.x) * blockDim.x) {
    float dv[8], gv[8], uv[8], dgv[8], duv[8];
    load8(dh, t, i, dv);
    load8(g, t, i, gv);
    load8(u, t, i, uv);
#pragma unroll
    for (int e = 0; e < 8; ++e) gated_grads(act, dv[e], gv[e], uv[e], dgv[e], duv[e]);
    store8(dg, t, i, dgv);  // the inputs were read above: dg/du may alias them
    store8(du, t, i, duv);
  }
}

// The position of token row `token` (b * tt + ti), or -1 after recording it out of range.
__device__ __forceinline__ int64_t rope_position(int64_t token, int64_t tt, int64_t start,
                                                 const int32_t* positions, bool pos_per_batch,
                                                 int64_t max_positions, DeviceError* err) {
  const int64_t ti = token % tt;
  int64_t pos = start + ti;
  if (positions != nullptr) pos = positions[pos_per_batch ? token : ti];
  if (pos < 0 || pos >= max_positions) {
    record_error(err, kPositionOutOfRange, token, pos, max_positions);
    return -1;
  }
  return pos;
}

// One thread per (token, head, i < D/2) pair of rotated elements.
__global__ void rope_kernel(const void* x, void* out, Elem t, int64_t b, int64_t tt, int64_t heads,
                            int64_t d, int64_t start, const int32_t* positions, bool pos_per_batch,
                            const float* cos_table, const float* sin_table, int64_t max_positions,
                            bool inverse, DeviceError* err) {
  const int64_t half = d / 2, total = b * tt * heads * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half, row = idx / half;  // row = (bi * tt + ti) * heads + h
    const int64_t pos =
        rope_position(row / heads, tt, start, positions, pos_per_batch, max_positions, err);
    if (pos < 0) continue;
    const float c = cos_table[pos * half + i];
    const float sn = inverse ? -sin_table[pos * half + i] : sin_table[pos * half + i];
    const int64_t base = row * d;
    const float x0 = load(x, t, base + i), x1 = load(x, t, base + i + half);
    store(out, t, base + i, x0 * c - x1 * sn);
    store(out, t, base + i + half, x1 * c + x0 * sn);
  }
}
// Eight pairs per thread with 16-byte accesses (D/2 a multiple of 8, vec8_ok).
__global__ void rope_vec_kernel(const void* x, void* out, Elem t, int64_t b, int64_t tt,
                                int64_t heads, int64_t d, int64_t start, const int32_t* positions,
                                bool pos_per_batch, const float* cos_table, const float* sin_table,
                                int64_t max_positions, bool inverse, DeviceError* err) {
  const int64_t half = d / 2, groups = half / 8, total = b * tt * heads * groups;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = 8 * (idx % groups), row = idx / groups;
    const int64_t pos =
        rope_position(row / heads, tt, start, positions, pos_per_batch, max_positions, err);
    if (pos < 0) continue;
    float c[8], sn[8], x0[8], x1[8], y0[8], y1[8];
    load8(cos_table, pos * half + i, c);
    load8(sin_table, pos * half + i, sn);
    const int64_t base = row * d;
    load8(x, t, base + i, x0);
    load8(x, t, base + i + half, x1);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float s = inverse ? -sn[e] : sn[e];
      y0[e] = x0[e] * c[e] - x1[e] * s;
      y1[e] = x1[e] * c[e] + x0[e] * s;
    }
    store8(out, t, base + i, y0);
    store8(out, t, base + i + half, y1);
  }
}

__global__ void embedding_forward_kernel(const void* table, Elem tt, const int32_t* ids, int64_t n,
                                         int64_t h, int64_t vocab, void* out, Elem ot, float scale,
                                         DeviceError* err) {
  const int64_t total = n * h;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / h, j = idx % h;
    const int32_t id = ids[r];
    if (id < 0 || id >= vocab) {
      if (j == 0) record_error(err, kEmbeddingIdOutOfRange, r, id, vocab);
      store(out, ot, idx, 0.0f);
      continue;
    }
    const float v = load(table, tt, int64_t(id) * h + j);
    store(out, ot, idx, scale == 1.0f ? v : v * scale);
  }
}

// Deterministic scatter-add: thread (column j, vocabulary slice p) walks every id in
// ascending n and adds the rows whose id falls in its slice, so each dtable element is a
// sum in ascending n, as on the host; no atomics. Out-of-range ids were reported by the
// forward and are skipped. The ids pass through shared memory in chunks: read from
// global memory inside the loop, each one waited a full load latency (the compiler cannot
// hoist loads past the dtable stores), 2 ms for 8k tokens at dim 768.
constexpr int kEmbeddingSlices = 64;
constexpr int kEmbeddingChunk = 2048;
__global__ void embedding_backward_kernel(const int32_t* __restrict__ ids, int64_t n,
                                          const void* __restrict__ dout, Elem dt, int64_t h,
                                          int64_t vocab, float* __restrict__ dtable, float scale) {
  __shared__ int32_t chunk[kEmbeddingChunk];
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t per = (vocab + kEmbeddingSlices - 1) / kEmbeddingSlices;
  const int64_t lo = blockIdx.y * per, hi = imin(lo + per, vocab);
  for (int64_t r0 = 0; r0 < n; r0 += kEmbeddingChunk) {
    const int64_t count = imin(kEmbeddingChunk, n - r0);
    __syncthreads();
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) chunk[i] = ids[r0 + i];
    __syncthreads();
    if (j >= h) continue;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t id = chunk[i];
      if (id < lo || id >= hi) continue;
      dtable[id * h + j] += scale * load(dout, dt, (r0 + i) * h + j);
    }
  }
}

__global__ void adamw_kernel(float* params, const void* grads, Elem gt, float* m, float* v,
                             int64_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float bias1, float bias2, float grad_scale,
                             uint16_t* params_bf16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load(grads, gt, i) * grad_scale;
    float p = params[i];
    p -= lr * weight_decay * p;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p -= (lr / bias1) * mi / (sqrtf(vi) / sqrtf(bias2) + eps);
    params[i] = p;
    if (params_bf16 != nullptr) {
      const __nv_bfloat16 b = __float2bfloat16_rn(p);
      params_bf16[i] = *reinterpret_cast<const uint16_t*>(&b);
    }
  }
}

constexpr int kSumBlocks = 1024;
__global__ void sum_squares_kernel(const void* x, Elem t, int64_t n, double* partial) {
  __shared__ double shared[kThreads];
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const double v = load(x, t, i);
    acc += v * v;
  }
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}

__global__ void sum_partials_kernel(const double* partial, int64_t count, double* out) {
  __shared__ double shared[kThreads];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = shared[0];
}

__global__ void scale_kernel(void* x, Elem t, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    store(x, t, i, load(x, t, i) * factor);
}

__global__ void softcap_kernel(void* x, Elem t, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    store(x, t, i, cap * tanhf(load(x, t, i) / cap));
}

__global__ void residual_add_kernel(const void* x, Elem t, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += load(x, t, i);
}

// A separate multiply and add (no contraction into an FMA): the host's bits.
__global__ void dropout_kernel(const void* x, Elem xt, void* y, Elem yt, int64_t n, uint32_t k0, uint32_t k1,
                               uint32_t threshold, float scale, bool accumulate) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const bool keep = dropout_hash(k0, k1, static_cast<uint32_t>(i)) >= threshold;
    const float v = keep ? __fmul_rn(load(x, xt, i), scale) : 0.0f;
    store(y, yt, i, accumulate ? __fadd_rn(load(y, yt, i), v) : v);
  }
}

}  // namespace

void dropout(cudaStream_t s, const void* x, Elem xt, void* y, Elem yt, int64_t n, uint32_t k0, uint32_t k1,
             uint32_t threshold, float scale, bool accumulate) {
  if (n <= 0) return;
  dropout_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(x, xt, y, yt, n, k0, k1, threshold, scale,
                                                               accumulate);
}

void softcap(cudaStream_t s, void* x, Elem t, int64_t n, float cap) {
  if (n <= 0) return;
  softcap_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(x, t, n, cap);
}

void residual_add(cudaStream_t s, const void* x, Elem t, float* y, int64_t n) {
  if (n <= 0) return;
  residual_add_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(x, t, y, n);
}

void convert(cudaStream_t s, const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype,
             int64_t n) {
  if (n <= 0) return;
  convert_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(src, src_dtype, dst, dst_dtype, n);
}

void add_bias(cudaStream_t s, void* c, Elem ct, int64_t m, int64_t n, int64_t ldc,
              const float* bias) {
  if (m * n <= 0) return;
  add_bias_kernel<<<blocks_for(m * n, kThreads), kThreads, 0, s>>>(c, ct, m, n, ldc, bias);
}

void transpose_bytes(cudaStream_t s, const uint8_t* src, int64_t rows, int64_t cols, int64_t ld,
                     uint8_t* dst) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32));
  transpose_kernel<<<grid, dim3(32, 8), 0, s>>>(src, rows, cols, ld, dst);
}

void gated_forward(cudaStream_t s, int act, const void* g, const void* u, void* h, Elem t,
                   int64_t n) {
  if (n <= 0) return;
  if (vec8_ok(n, {g, u, h}))
    gated_forward_vec_kernel<<<blocks_for(n / 8, kThreads), kThreads, 0, s>>>(act, g, u, h, t, n);
  else
    gated_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(act, g, u, h, t, n);
}

void gated_backward(cudaStream_t s, int act, const void* dh, const void* g, const void* u, void* dg,
                    void* du, Elem t, int64_t n) {
  if (n <= 0) return;
  if (vec8_ok(n, {dh, g, u, dg, du}))
    gated_backward_vec_kernel<<<blocks_for(n / 8, kThreads), kThreads, 0, s>>>(act, dh, g, u, dg,
                                                                               du, t, n);
  else
    gated_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(act, dh, g, u, dg, du, t, n);
}

void rope(cudaStream_t s, const void* x, void* out, Elem t, int64_t b, int64_t tt, int64_t heads,
          int64_t d, int64_t start, const int32_t* positions, bool pos_per_batch,
          const float* cos_table, const float* sin_table, int64_t max_positions, bool inverse,
          DeviceError* err) {
  const int64_t total = b * tt * heads * (d / 2);
  if (total <= 0) return;
  if (d % 2 == 0 && vec8_ok(d / 2, {x, out, cos_table, sin_table})) {
    rope_vec_kernel<<<blocks_for(total / 8, kThreads), kThreads, 0, s>>>(
        x, out, t, b, tt, heads, d, start, positions, pos_per_batch, cos_table, sin_table,
        max_positions, inverse, err);
    return;
  }
  rope_kernel<<<blocks_for(total, kThreads), kThreads, 0, s>>>(
      x, out, t, b, tt, heads, d, start, positions, pos_per_batch, cos_table, sin_table,
      max_positions, inverse, err);
}

void embedding_forward(cudaStream_t s, const void* table, Elem tt, const int32_t* ids, int64_t n,
                       int64_t h, int64_t vocab, void* out, Elem ot, float scale,
                       DeviceError* err) {
  if (n * h <= 0) return;
  embedding_forward_kernel<<<blocks_for(n * h, kThreads), kThreads, 0, s>>>(
      table, tt, ids, n, h, vocab, out, ot, scale, err);
}

void embedding_backward(cudaStream_t s, const int32_t* ids, int64_t n, const void* dout, Elem dt,
                        int64_t h, int64_t vocab, float* dtable, float scale) {
  if (n <= 0 || h <= 0) return;
  const dim3 grid(static_cast<unsigned>((h + 127) / 128), kEmbeddingSlices);
  embedding_backward_kernel<<<grid, 128, 0, s>>>(ids, n, dout, dt, h, vocab, dtable, scale);
}

void adamw(cudaStream_t s, float* params, const void* grads, Elem gt, float* m, float* v, int64_t n,
           float lr, float beta1, float beta2, float eps, float weight_decay, float bias1,
           float bias2, float grad_scale, uint16_t* params_bf16) {
  if (n <= 0) return;
  adamw_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(params, grads, gt, m, v, n, lr, beta1,
                                                            beta2, eps, weight_decay, bias1, bias2,
                                                            grad_scale, params_bf16);
}

int64_t sum_squares_blocks(int64_t n) {
  return n <= 0 ? 1 : static_cast<int64_t>(blocks_for(n, kThreads, kSumBlocks));
}

void sum_squares(cudaStream_t s, const void* x, Elem t, int64_t n, double* partial) {
  const unsigned blocks = static_cast<unsigned>(sum_squares_blocks(n));
  sum_squares_kernel<<<blocks, kThreads, 0, s>>>(x, t, n < 0 ? 0 : n, partial);
}

void sum_partials(cudaStream_t s, const double* partial, int64_t count, double* out) {
  sum_partials_kernel<<<1, kThreads, 0, s>>>(partial, count, out);
}

void scale(cudaStream_t s, void* x, Elem t, int64_t n, float factor) {
  if (n <= 0) return;
  scale_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(x, t, n, factor);
}

namespace {
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__global__ void hold_kernel(int64_t ns) {
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < static_cast<uint64_t>(ns)) {
  }
}
}  // namespace

void hold_stream(cudaStream_t s, int64_t nanoseconds) {
  hold_kernel<<<1, 1, 0, s>>>(nanoseconds);
}

}  // namespace hyperion::cuda
