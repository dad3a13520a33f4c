// The diffusion models' layers on the GPU (kernels/conv2d.h, group_norm.h, layer_norm.h,
// upsample.h, timestep_embedding.h and activation.h semantics), channels-last f32:
//
// - 2-D convolution as im2col + GEMM: the backend (cuda_diffusion_ops.cc) gathers chunks
//   of output rows' receptive fields into a column matrix (conv_im2col), multiplies it
//   with the weights laid out as rows (conv_weight_to_rows) on cuBLASLt, and for the input
//   gradient scatters the column gradient back by gathering (conv_col2im_add: each input
//   element sums the entries that read it, in a fixed order, so no atomics).
// - GroupNorm: one block per (image, group), two passes (mean, then variance), as the host.
// - LayerNorm: one block per row.
// - The weight gradients of the norms and the convolution's bias: per-chunk column
//   partial sums over fixed groups of rows, then one ordered sum per column.
//
// Every reduction runs in a fixed order: results repeat run to run.
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kThreads = 256;
// Rows per partial sum of a column reduction: 64, or more where that would make over
// kMaxChunks chunks (the grid's y dimension).
constexpr int64_t kMaxChunks = 16384;
int64_t rows_per_chunk(int64_t rows) {
  const int64_t per = (rows + kMaxChunks - 1) / kMaxChunks;
  return per > 64 ? per : 64;
}
int64_t chunks_of(int64_t rows) {
  const int64_t per = rows_per_chunk(rows);
  return (rows + per - 1) / per;
}

__global__ void im2col_kernel(ConvGeometry g, const void* x, Elem xt, int64_t r0, int64_t rows,
                              void* col, Elem ct) {
  const int64_t kki = g.columns(), total = rows * kki;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t src = im2col_source(g, r0 + e / kki, e % kki);
    store(col, ct, e, src < 0 ? 0.0f : load(x, xt, src));
  }
}

__global__ void weight_to_rows_kernel(ConvGeometry g, const float* w, void* wr, Elem wt) {
  const int64_t total = g.co * g.columns();
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x)
    store(wr, wt, e, w[weight_row_source(g, e)]);
}

// A bijection between the two layouts: no two threads write one element.
__global__ void weight_rows_add_kernel(ConvGeometry g, const float* dwr, float* dw) {
  const int64_t total = g.co * g.columns();
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x)
    dw[weight_row_source(g, e)] += dwr[e];
}

__global__ void col2im_add_kernel(ConvGeometry g, const float* dcol, int64_t r0, int64_t rows,
                                  ChunkInputs in, float* dx) {
  const int64_t total = in.images * in.iys * g.w * g.ci;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % g.ci, ix = (e / g.ci) % g.w, iy = in.iy0 + (e / (g.ci * g.w)) % in.iys,
                  n = in.n0 + e / (g.ci * g.w * in.iys);
    dx[((n * g.h + iy) * g.w + ix) * g.ci + i] += col2im_sum(g, dcol, r0, rows, n, iy, ix, i);
  }
}

// partial[chunk, j] = sum over the chunk's rows of a[r, j] (times b[r, j] when b given).
__global__ void column_partial_kernel(const void* a, Elem at, int64_t rows, int64_t cols,
                                      int64_t per, float* partial) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, chunk = blockIdx.y;
  if (j >= cols) return;
  const int64_t r1 = imin(rows, (chunk + 1) * per);
  float acc = 0;
  for (int64_t r = chunk * per; r < r1; ++r) acc += load(a, at, r * cols + j);
  partial[chunk * cols + j] = acc;
}

__global__ void column_sum_add_kernel(const float* partial, int64_t chunks, int64_t cols,
                                      float* out) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  float acc = 0;
  for (int64_t c = 0; c < chunks; ++c) acc += partial[c * cols + j];
  out[j] += acc;
}

// ---- GroupNorm: block (n, g) over its P * Cg values x[n, p, g*Cg + j].
__device__ __forceinline__ int64_t gn_index(int64_t n, int64_t e, int64_t g, int64_t cg,
                                            int64_t pixels, int64_t channels) {
  return (n * pixels + e / cg) * channels + g * cg + e % cg;
}

__global__ void group_norm_forward_kernel(const float* x, const float* gamma, const float* beta,
                                          float eps, int64_t pixels, int64_t channels,
                                          int64_t groups, float* y, float* mean, float* rstd) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x / groups, g = blockIdx.x % groups, cg = channels / groups;
  const int64_t m = pixels * cg;
  float s = 0;
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) s += x[gn_index(n, e, g, cg, pixels, channels)];
  const float mu = block_sum(s, shared) / static_cast<float>(m);
  float v = 0;
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const float d = x[gn_index(n, e, g, cg, pixels, channels)] - mu;
    v += d * d;
  }
  const float r = rsqrtf(block_sum(v, shared) / static_cast<float>(m) + eps);
  __syncthreads();  // y may alias x: every thread has read before any writes
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const int64_t idx = gn_index(n, e, g, cg, pixels, channels), c = g * cg + e % cg;
    y[idx] = (x[idx] - mu) * r * gamma[c] + beta[c];
  }
  if (threadIdx.x == 0) mean[blockIdx.x] = mu, rstd[blockIdx.x] = r;
}

__global__ void group_norm_dx_kernel(const float* dy, const float* x, const float* gamma,
                                     const float* mean, const float* rstd, int64_t pixels,
                                     int64_t channels, int64_t groups, float* dx) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x / groups, g = blockIdx.x % groups, cg = channels / groups;
  const int64_t m = pixels * cg;
  const float mu = mean[blockIdx.x], r = rstd[blockIdx.x];
  float a = 0, b = 0;
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const int64_t idx = gn_index(n, e, g, cg, pixels, channels);
    const float gdy = gamma[g * cg + e % cg] * dy[idx];
    a += gdy;
    b += gdy * (x[idx] - mu) * r;
  }
  a = block_sum(a, shared) / static_cast<float>(m);
  b = block_sum(b, shared) / static_cast<float>(m);
  __syncthreads();  // dx may alias dy
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const int64_t idx = gn_index(n, e, g, cg, pixels, channels);
    const float gdy = gamma[g * cg + e % cg] * dy[idx];
    dx[idx] = r * (gdy - a - (x[idx] - mu) * r * b);
  }
}

// partial[chunk, c] (dgamma's) and partial[chunks + chunk, c] (dbeta's) over rows (n, p).
__global__ void group_norm_dw_partial_kernel(const float* dy, const float* x, const float* mean,
                                             const float* rstd, int64_t batch, int64_t pixels,
                                             int64_t channels, int64_t groups, int64_t per,
                                             float* partial) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, chunk = blockIdx.y;
  if (c >= channels) return;
  const int64_t rows = batch * pixels, chunks = gridDim.y, g = c / (channels / groups);
  const int64_t r1 = imin(rows, (chunk + 1) * per);
  float dg = 0, db = 0;
  for (int64_t r = chunk * per; r < r1; ++r) {
    const int64_t stat = (r / pixels) * groups + g, idx = r * channels + c;
    dg += dy[idx] * (x[idx] - mean[stat]) * rstd[stat];
    db += dy[idx];
  }
  partial[chunk * channels + c] = dg;
  partial[(chunks + chunk) * channels + c] = db;
}

// ---- LayerNorm: one block per row.
__global__ void layer_norm_forward_kernel(const float* x, const float* gamma, const float* beta,
                                          float eps, int64_t cols, float* y, float* mean,
                                          float* rstd) {
  __shared__ float shared[32];
  const int64_t base = blockIdx.x * cols;
  float s = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += x[base + j];
  const float mu = block_sum(s, shared) / static_cast<float>(cols);
  float v = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float d = x[base + j] - mu;
    v += d * d;
  }
  const float r = rsqrtf(block_sum(v, shared) / static_cast<float>(cols) + eps);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    y[base + j] = (x[base + j] - mu) * r * gamma[j] + beta[j];
  if (threadIdx.x == 0 && mean != nullptr) mean[blockIdx.x] = mu, rstd[blockIdx.x] = r;
}

// ---- Row softmax in place with each row's log-sum-exp (the wide-head attention's
// probabilities): one block per row, max then sum, as the host's attention kernel.
__global__ void softmax_rows_kernel(float* x, int64_t cols, float* lse) {
  __shared__ float shared[32];
  float* row = x + blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_max(m, shared);
  __syncthreads();
  float s = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(row[j] - m);
  s = block_sum(s, shared);
  const float inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) row[j] = expf(row[j] - m) * inv;
  if (threadIdx.x == 0) lse[blockIdx.x] = m + logf(s);
}

__global__ void layer_norm_dx_kernel(const float* dy, const float* x, const float* gamma,
                                     const float* mean, const float* rstd, int64_t cols,
                                     float* dx) {
  __shared__ float shared[32];
  const int64_t base = blockIdx.x * cols;
  const float mu = mean[blockIdx.x], r = rstd[blockIdx.x];
  float a = 0, b = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float gdy = gamma[j] * dy[base + j];
    a += gdy;
    b += gdy * (x[base + j] - mu) * r;
  }
  a = block_sum(a, shared) / static_cast<float>(cols);
  b = block_sum(b, shared) / static_cast<float>(cols);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float gdy = gamma[j] * dy[base + j];
    dx[base + j] = r * (gdy - a - (x[base + j] - mu) * r * b);
  }
}

__global__ void layer_norm_dw_partial_kernel(const float* dy, const float* x, const float* mean,
                                             const float* rstd, int64_t rows, int64_t cols,
                                             int64_t per, float* partial) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, chunk = blockIdx.y;
  if (j >= cols) return;
  const int64_t chunks = gridDim.y, r1 = imin(rows, (chunk + 1) * per);
  float dg = 0, db = 0;
  for (int64_t r = chunk * per; r < r1; ++r) {
    dg += dy[r * cols + j] * (x[r * cols + j] - mean[r]) * rstd[r];
    db += dy[r * cols + j];
  }
  partial[chunk * cols + j] = dg;
  partial[(chunks + chunk) * cols + j] = db;
}

// ---- nearest upsampling [N, H, W, C] -> [N, OH, OW, C].
__global__ void upsample_forward_kernel(const float* x, int64_t n, int64_t h, int64_t w,
                                        int64_t c, int64_t oh, int64_t ow, float* y) {
  const int64_t total = n * oh * ow * c;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = e % c, j = (e / c) % ow, i = (e / (c * ow)) % oh, b = e / (c * ow * oh);
    y[e] = x[((b * h + i * h / oh) * w + j * w / ow) * c + ch];
  }
}

// Each input sums the outputs that copied it: rows i with floor(i h / oh) == y, i.e.
// [ceil(y oh / h), ceil((y + 1) oh / h)), likewise columns; in output order.
__global__ void upsample_backward_kernel(const float* dy, int64_t n, int64_t h, int64_t w,
                                         int64_t c, int64_t oh, int64_t ow, float* dx) {
  const int64_t total = n * h * w * c;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = e % c, xx = (e / c) % w, yy = (e / (c * w)) % h, b = e / (c * w * h);
    const int64_t i0 = (yy * oh + h - 1) / h, i1 = ((yy + 1) * oh + h - 1) / h;
    const int64_t j0 = (xx * ow + w - 1) / w, j1 = ((xx + 1) * ow + w - 1) / w;
    float acc = 0;
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = j0; j < j1; ++j) acc += dy[((b * oh + i) * ow + j) * c + ch];
    dx[e] = acc;
  }
}

// ---- timestep embedding (the host's order: frequency, product, then sin / cos).
__global__ void timestep_embedding_kernel(const float* t, int64_t n, int64_t dim, bool flip,
                                          float freq_shift, float scale, float log_period,
                                          float* out) {
  const int64_t half = dim / 2, total = n * dim;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / dim, k = e % dim;
    if (k >= 2 * half) {  // the zero column of an odd dim
      out[e] = 0.0f;
      continue;
    }
    const bool second = k >= half;
    const int64_t i = second ? k - half : k;
    const float freq = expf(-log_period * static_cast<float>(i) /
                            (static_cast<float>(half) - freq_shift));
    const float arg = scale * (t[r] * freq);
    // flip: [cos | sin]; else [sin | cos].
    out[e] = (second != flip) ? cosf(arg) : sinf(arg);
  }
}

// ---- activations (kernels/activation.h): 0 silu, 1 gelu (exact), 2 quick_gelu.
__device__ __forceinline__ float sigmoid(float x) {
  const float e = expf(-fabsf(x)), r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : e * r;
}
__device__ __forceinline__ float normal_cdf(float x) {
  return 0.5f * (1.0f + erff(x * 0.70710678118654752f));
}
__device__ __forceinline__ float act_value(int a, float x) {
  if (a == 0) return x * sigmoid(x);
  if (a == 1) return x * normal_cdf(x);
  return x * sigmoid(1.702f * x);
}
__device__ __forceinline__ float act_derivative(int a, float x) {
  if (a == 0) {
    const float s = sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
  }
  if (a == 1) return normal_cdf(x) + x * 0.39894228040143268f * expf(-0.5f * x * x);
  const float s = sigmoid(1.702f * x);
  return s + 1.702f * x * s * (1.0f - s);
}

__global__ void activation_forward_kernel(int a, const float* x, float* y, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x)
    y[e] = act_value(a, x[e]);
}
__global__ void activation_backward_kernel(int a, const float* dy, const float* x, float* dx,
                                           int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x)
    dx[e] = dy[e] * act_derivative(a, x[e]);
}
__global__ void geglu_forward_kernel(const float* x, int64_t rows, int64_t f, float* h) {
  const int64_t total = rows * f;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / f, i = e % f;
    h[e] = x[r * 2 * f + i] * act_value(1, x[r * 2 * f + f + i]);
  }
}
__global__ void geglu_backward_kernel(const float* dh, const float* x, int64_t rows, int64_t f,
                                      float* dx) {
  const int64_t total = rows * f;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / f, i = e % f;
    const float g = dh[e], v = x[r * 2 * f + i], gate = x[r * 2 * f + f + i];
    dx[r * 2 * f + i] = g * act_value(1, gate);
    dx[r * 2 * f + f + i] = g * v * act_derivative(1, gate);
  }
}

}  // namespace

void conv_im2col(cudaStream_t s, const ConvGeometry& g, const void* x, Elem xt, int64_t r0,
                 int64_t rows, void* col, Elem ct) {
  const int64_t total = rows * g.columns();
  if (total <= 0) return;
  im2col_kernel<<<blocks_for(total, kThreads), kThreads, 0, s>>>(g, x, xt, r0, rows, col, ct);
}

void conv_weight_to_rows(cudaStream_t s, const ConvGeometry& g, const float* w, void* wr,
                         Elem wt) {
  const int64_t total = g.co * g.columns();
  weight_to_rows_kernel<<<blocks_for(total, kThreads), kThreads, 0, s>>>(g, w, wr, wt);
}

void conv_weight_rows_add(cudaStream_t s, const ConvGeometry& g, const float* dwr, float* dw) {
  const int64_t total = g.co * g.columns();
  weight_rows_add_kernel<<<blocks_for(total, kThreads), kThreads, 0, s>>>(g, dwr, dw);
}

void conv_col2im_add(cudaStream_t s, const ConvGeometry& g, const float* dcol, int64_t r0,
                     int64_t rows, float* dx) {
  if (rows <= 0) return;
  const ChunkInputs in = chunk_inputs(g, r0, rows);
  if (in.iys <= 0) return;
  const int64_t total = in.images * in.iys * g.w * g.ci;
  col2im_add_kernel<<<blocks_for(total, kThreads), kThreads, 0, s>>>(g, dcol, r0, rows, in, dx);
}

int64_t column_sums_scratch_floats(int64_t rows, int64_t cols) {
  return 2 * chunks_of(rows) * cols;
}

void column_sums_add(cudaStream_t s, const void* a, Elem at, int64_t rows, int64_t cols,
                     float* scratch, float* out) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t chunks = chunks_of(rows);
  const unsigned col_blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
  column_partial_kernel<<<dim3(col_blocks, static_cast<unsigned>(chunks)), kThreads, 0, s>>>(
      a, at, rows, cols, rows_per_chunk(rows), scratch);
  column_sum_add_kernel<<<col_blocks, kThreads, 0, s>>>(scratch, chunks, cols, out);
}

void group_norm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta,
                        float eps, int64_t batch, int64_t pixels, int64_t channels,
                        int64_t groups, float* y, float* mean, float* rstd) {
  if (batch * groups <= 0) return;
  group_norm_forward_kernel<<<static_cast<unsigned>(batch * groups), kThreads, 0, s>>>(
      x, gamma, beta, eps, pixels, channels, groups, y, mean, rstd);
}

void group_norm_backward(cudaStream_t s, const float* dy, const float* x, const float* gamma,
                         const float* mean, const float* rstd, int64_t batch, int64_t pixels,
                         int64_t channels, int64_t groups, float* dx, float* dgamma,
                         float* dbeta, float* scratch) {
  if (batch * groups <= 0) return;
  // The weight gradients first: dx may overwrite dy.
  const int64_t chunks = chunks_of(batch * pixels);
  const unsigned col_blocks = static_cast<unsigned>((channels + kThreads - 1) / kThreads);
  group_norm_dw_partial_kernel<<<dim3(col_blocks, static_cast<unsigned>(chunks)), kThreads, 0,
                                 s>>>(dy, x, mean, rstd, batch, pixels, channels, groups,
                                      rows_per_chunk(batch * pixels), scratch);
  column_sum_add_kernel<<<col_blocks, kThreads, 0, s>>>(scratch, chunks, channels, dgamma);
  column_sum_add_kernel<<<col_blocks, kThreads, 0, s>>>(scratch + chunks * channels, chunks,
                                                        channels, dbeta);
  group_norm_dx_kernel<<<static_cast<unsigned>(batch * groups), kThreads, 0, s>>>(
      dy, x, gamma, mean, rstd, pixels, channels, groups, dx);
}

void softmax_rows(cudaStream_t s, float* x, int64_t rows, int64_t cols, float* lse) {
  if (rows <= 0) return;
  softmax_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, cols, lse);
}

void layer_norm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta,
                        float eps, int64_t rows, int64_t cols, float* y, float* mean,
                        float* rstd) {
  if (rows <= 0) return;
  layer_norm_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, gamma, beta, eps,
                                                                            cols, y, mean, rstd);
}

void layer_norm_backward(cudaStream_t s, const float* dy, const float* x, const float* gamma,
                         const float* mean, const float* rstd, int64_t rows, int64_t cols,
                         float* dx, float* dgamma, float* dbeta, float* scratch) {
  if (rows <= 0) return;
  if (dgamma != nullptr || dbeta != nullptr) {
    const int64_t chunks = chunks_of(rows);
    const unsigned col_blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
    layer_norm_dw_partial_kernel<<<dim3(col_blocks, static_cast<unsigned>(chunks)), kThreads, 0,
                                   s>>>(dy, x, mean, rstd, rows, cols, rows_per_chunk(rows), scratch);
    if (dgamma != nullptr)
      column_sum_add_kernel<<<col_blocks, kThreads, 0, s>>>(scratch, chunks, cols, dgamma);
    if (dbeta != nullptr)
      column_sum_add_kernel<<<col_blocks, kThreads, 0, s>>>(scratch + chunks * cols, chunks, cols,
                                                            dbeta);
  }
  layer_norm_dx_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(dy, x, gamma, mean, rstd,
                                                                       cols, dx);
}

void upsample_nearest_forward(cudaStream_t s, const float* x, int64_t n, int64_t h, int64_t w,
                              int64_t c, int64_t oh, int64_t ow, float* y) {
  const int64_t total = n * oh * ow * c;
  if (total <= 0) return;
  upsample_forward_kernel<<<blocks_for(total, kThreads), kThreads, 0, s>>>(x, n, h, w, c, oh, ow,
                                                                          y);
}

void upsample_nearest_backward(cudaStream_t s, const float* dy, int64_t n, int64_t h, int64_t w,
                               int64_t c, int64_t oh, int64_t ow, float* dx) {
  const int64_t total = n * h * w * c;
  if (total <= 0) return;
  upsample_backward_kernel<<<blocks_for(total, kThreads), kThreads, 0, s>>>(dy, n, h, w, c, oh, ow,
                                                                           dx);
}

void timestep_embedding(cudaStream_t s, const float* t, int64_t n, int64_t dim, bool flip,
                        float freq_shift, float scale, float max_period, float* out) {
  const int64_t total = n * dim;
  if (total <= 0) return;
  timestep_embedding_kernel<<<blocks_for(total, kThreads), kThreads, 0, s>>>(
      t, n, dim, flip, freq_shift, scale, logf(max_period), out);
}

void activation_forward(cudaStream_t s, int act, const float* x, float* y, int64_t n) {
  if (n <= 0) return;
  activation_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(act, x, y, n);
}

void activation_backward(cudaStream_t s, int act, const float* dy, const float* x, float* dx,
                         int64_t n) {
  if (n <= 0) return;
  activation_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(act, dy, x, dx, n);
}

void geglu_forward(cudaStream_t s, const float* x, int64_t rows, int64_t f, float* h) {
  if (rows * f <= 0) return;
  geglu_forward_kernel<<<blocks_for(rows * f, kThreads), kThreads, 0, s>>>(x, rows, f, h);
}

void geglu_backward(cudaStream_t s, const float* dh, const float* x, int64_t rows, int64_t f,
                    float* dx) {
  if (rows * f <= 0) return;
  geglu_backward_kernel<<<blocks_for(rows * f, kThreads), kThreads, 0, s>>>(dh, x, rows, f, dx);
}

}  // namespace hyperion::cuda
