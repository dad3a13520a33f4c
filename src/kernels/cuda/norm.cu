// RMSNorm forward and backward (kernels/rmsnorm.h semantics). One block per row; the
// weight gradient is summed deterministically: per-chunk partial sums over a fixed
// grouping of rows, then one ordered sum per column.
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowsPerChunk = 64;

__global__ void rmsnorm_forward_kernel(const void* x, Elem xt, const float* w, float eps, void* y,
                                       Elem yt, float* rstd, int64_t h, float offset) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x, base = row * h;
  float ss = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const float v = load(x, xt, base + j);
    ss += v * v;
  }
  ss = block_sum(ss, shared);
  const float r = rsqrtf(ss / static_cast<float>(h) + eps);
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x)
    store(y, yt, base + j, load(x, xt, base + j) * r * (w[j] + offset));
  if (threadIdx.x == 0) rstd[row] = r;
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * (w + offset), xhat = x * rstd.
__global__ void rmsnorm_dx_kernel(const void* dy, const void* x, Elem t, const float* w,
                                  const float* rstd, void* dx, bool accumulate, int64_t h,
                                  float offset) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x, base = row * h;
  const float r = rstd[row];
  float dot = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x)
    dot += load(dy, t, base + j) * (w[j] + offset) * load(x, t, base + j) * r;
  dot = block_sum(dot, shared) / static_cast<float>(h);
  __syncthreads();  // dx may alias dy: every thread has read its dy before any write
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const float g = load(dy, t, base + j) * (w[j] + offset);
    const float xhat = load(x, t, base + j) * r;
    const float v = r * (g - xhat * dot);
    store(dx, t, base + j, accumulate ? load(dx, t, base + j) + v : v);
  }
}

// The two kernels above with eight elements per thread and 16-byte accesses (h a
// multiple of 8, vec8_ok): the model's hidden sizes.
__global__ void rmsnorm_forward_vec_kernel(const void* x, Elem xt, const float* w, float eps,
                                           void* y, Elem yt, float* rstd, int64_t h, float offset) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x, base = row * h;
  float ss = 0;
  for (int64_t j = 8 * threadIdx.x; j < h; j += 8 * blockDim.x) {
    float v[8];
    load8(x, xt, base + j, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
  }
  ss = block_sum(ss, shared);
  const float r = rsqrtf(ss / static_cast<float>(h) + eps);
  for (int64_t j = 8 * threadIdx.x; j < h; j += 8 * blockDim.x) {
    float v[8], wv[8];
    load8(x, xt, base + j, v);
    load8(w, j, wv);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = v[e] * r * (wv[e] + offset);
    store8(y, yt, base + j, v);
  }
  if (threadIdx.x == 0) rstd[row] = r;
}

__global__ void rmsnorm_dx_vec_kernel(const void* dy, const void* x, Elem t, const float* w,
                                      const float* rstd, void* dx, bool accumulate, int64_t h,
                                      float offset) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x, base = row * h;
  const float r = rstd[row];
  float dot = 0;
  for (int64_t j = 8 * threadIdx.x; j < h; j += 8 * blockDim.x) {
    float dv[8], xv[8], wv[8];
    load8(dy, t, base + j, dv);
    load8(x, t, base + j, xv);
    load8(w, j, wv);
#pragma unroll
    for (int e = 0; e < 8; ++e) dot += dv[e] * (wv[e] + offset) * xv[e] * r;
  }
  dot = block_sum(dot, shared) / static_cast<float>(h);
  __syncthreads();  // dx may alias dy: every thread has read its dy before any write
  for (int64_t j = 8 * threadIdx.x; j < h; j += 8 * blockDim.x) {
    float dv[8], xv[8], wv[8], out[8];
    load8(dy, t, base + j, dv);
    load8(x, t, base + j, xv);
    load8(w, j, wv);
    if (accumulate) load8(dx, t, base + j, out);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float v = r * (dv[e] * (wv[e] + offset) - xv[e] * r * dot);
      out[e] = accumulate ? out[e] + v : v;
    }
    store8(dx, t, base + j, out);
  }
}

// partial[chunk, j] = sum over the chunk's rows of dy * x * rstd.
__global__ void rmsnorm_dw_partial_kernel(const void* dy, const void* x, Elem t, const float* rstd,
                                          int64_t n, int64_t h, float* partial) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, chunk = blockIdx.y;
  if (j >= h) return;
  const int64_t r0 = chunk * kRowsPerChunk, r1 = imin(n, r0 + kRowsPerChunk);
  float acc = 0;
  for (int64_t r = r0; r < r1; ++r) acc += load(dy, t, r * h + j) * load(x, t, r * h + j) * rstd[r];
  partial[chunk * h + j] = acc;
}

__global__ void rmsnorm_dw_sum_kernel(const float* partial, int64_t chunks, int64_t h,
                                      float* dweight) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= h) return;
  float acc = 0;
  for (int64_t c = 0; c < chunks; ++c) acc += partial[c * h + j];
  dweight[j] += acc;
}

}  // namespace

void rmsnorm_forward(cudaStream_t s, const void* x, Elem xt, const float* w, float eps, void* y,
                     Elem yt, float* rstd, int64_t n, int64_t h, float offset) {
  if (n <= 0) return;
  if (vec8_ok(h, {x, w, y}))
    rmsnorm_forward_vec_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(x, xt, w, eps, y, yt,
                                                                             rstd, h, offset);
  else
    rmsnorm_forward_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(x, xt, w, eps, y, yt, rstd,
                                                                         h, offset);
}

int64_t rmsnorm_scratch_floats(int64_t n, int64_t h) {
  return ((n + kRowsPerChunk - 1) / kRowsPerChunk) * h;
}

void rmsnorm_backward(cudaStream_t s, const void* dy, const void* x, Elem t, const float* w,
                      const float* rstd, void* dx, float* dweight, bool accumulate_dx, int64_t n,
                      int64_t h, float offset, float* scratch) {
  if (n <= 0) return;
  // The weight gradient first: dx may overwrite dy.
  const int64_t chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  const unsigned cols = static_cast<unsigned>((h + kThreads - 1) / kThreads);
  rmsnorm_dw_partial_kernel<<<dim3(cols, static_cast<unsigned>(chunks)), kThreads, 0, s>>>(
      dy, x, t, rstd, n, h, scratch);
  rmsnorm_dw_sum_kernel<<<cols, kThreads, 0, s>>>(scratch, chunks, h, dweight);
  if (vec8_ok(h, {dy, x, w, dx}))
    rmsnorm_dx_vec_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(dy, x, t, w, rstd, dx,
                                                                        accumulate_dx, h, offset);
  else
    rmsnorm_dx_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(dy, x, t, w, rstd, dx,
                                                                    accumulate_dx, h, offset);
}

}  // namespace hyperion::cuda
