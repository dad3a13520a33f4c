// Mixture-of-experts routing and row movement (kernels/moe_routing.h semantics): the
// router's softmax and top-k (one thread per token), its backward, the auxiliary losses
// (summed in a fixed order by one block), and the gather / scatter-add / combine around
// the grouped GEMM. Row indices (pair_row, row_token) are device arrays here.
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kThreads = 256;

// (p, index) order of the top-k: higher probability first, ties to the lower index.
__device__ __forceinline__ bool before(float pa, int64_t ia, float pb, int64_t ib) {
  return pa > pb || (pa == pb && ia < ib);
}

__global__ void router_forward_kernel(const float* logits, int64_t n, int64_t e, int64_t k,
                                      bool normalize, float* probs, int32_t* experts,
                                      float* weights) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  const float* x = logits + r * e;
  float* p = probs + r * e;
  float m = -INFINITY;
  for (int64_t x_i = 0; x_i < e; ++x_i) m = fmaxf(m, x[x_i]);
  float sum = 0;
  for (int64_t x_i = 0; x_i < e; ++x_i) {
    p[x_i] = expf(x[x_i] - m);
    sum += p[x_i];
  }
  for (int64_t x_i = 0; x_i < e; ++x_i) p[x_i] /= sum;
  // The j-th choice is the best expert strictly after the (j-1)-th in (p, index) order.
  float prev_p = INFINITY, chosen_sum = 0;
  int64_t prev_i = -1;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t x_i = 0; x_i < e; ++x_i) {
      if (!before(prev_p, prev_i, p[x_i], x_i)) continue;  // not after the previous choice
      if (best < 0 || before(p[x_i], x_i, p[best], best)) best = x_i;
    }
    if (best < 0) best = 0;  // NaN probabilities: any valid id (the host keeps ids valid too)
    experts[r * k + j] = static_cast<int32_t>(best);
    weights[r * k + j] = p[best];
    chosen_sum += p[best];
    prev_p = p[best];
    prev_i = best;
  }
  if (normalize)
    for (int64_t j = 0; j < k; ++j) weights[r * k + j] /= chosen_sum;
}

__global__ void router_backward_kernel(const float* probs, const int32_t* experts,
                                       const float* weights, const float* dweights,
                                       const float* dprobs, int64_t n, int64_t e, int64_t k,
                                       bool normalize, float* dlogits) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  const float* p = probs + r * e;
  float chosen = 0, dw_w = 0;
  for (int64_t j = 0; j < k; ++j) {
    chosen += p[experts[r * k + j]];
    dw_w += dweights[r * k + j] * weights[r * k + j];
  }
  // dp_x for expert x: dprobs plus the combine weights' share.
  auto dp = [&](int64_t x) {
    float v = dprobs != nullptr ? dprobs[r * e + x] : 0.0f;
    for (int64_t j = 0; j < k; ++j)
      if (experts[r * k + j] == x)
        v += normalize ? (dweights[r * k + j] - dw_w) / chosen : dweights[r * k + j];
    return v;
  };
  float dot = 0;
  for (int64_t x = 0; x < e; ++x) dot += p[x] * dp(x);
  for (int64_t x = 0; x < e; ++x) dlogits[r * e + x] = p[x] * (dp(x) - dot);
}

// scratch[s * e + x] = f[s][x], scratch[b * e + s * e + x] = f[s][x] * P[s][x].
__global__ void load_balance_stats_kernel(const float* probs, const int32_t* experts, int64_t b,
                                          int64_t t, int64_t e, int64_t k, float* scratch,
                                          DeviceError* err) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= b * e) return;
  const int64_t s = idx / e, x = idx % e;
  float count = 0, psum = 0;
  for (int64_t tok = s * t; tok < (s + 1) * t; ++tok) {
    psum += probs[tok * e + x];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t c = experts[tok * k + j];
      if (c < 0 || c >= e) record_error(err, kExpertOutOfRange, tok * k + j, c, e);
      if (c == x) count += 1;
    }
  }
  const float f = count / static_cast<float>(t), pm = psum / static_cast<float>(t);
  scratch[idx] = f;
  scratch[b * e + idx] = f * pm;
}

// One block sums `count` values in a fixed order into *out, times `factor`.
__global__ void ordered_sum_kernel(const float* values, int64_t count, float factor, float* out) {
  __shared__ double shared[kThreads];
  const int64_t per = (count + blockDim.x - 1) / blockDim.x;
  const int64_t i0 = threadIdx.x * per, i1 = imin(count, i0 + per);
  double acc = 0;
  for (int64_t i = i0; i < i1; ++i) acc += values[i];
  shared[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int i = 0; i < blockDim.x; ++i) total += shared[i];
    *out = static_cast<float>(total * factor);
  }
}

__global__ void load_balance_grad_kernel(const float* f, int64_t b, int64_t t, int64_t e,
                                         float coeff, float* dprobs) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= b * t * e) return;
  const int64_t tok = idx / e, x = idx % e, s = tok / t;
  dprobs[idx] += coeff * f[s * e + x];
}

__global__ void z_loss_rows_kernel(const float* logits, int64_t n, int64_t e, float coeff,
                                   float* dlogits, float* lse2) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  const float* x = logits + r * e;
  float m = -INFINITY;
  for (int64_t i = 0; i < e; ++i) m = fmaxf(m, x[i]);
  float sum = 0;
  for (int64_t i = 0; i < e; ++i) sum += expf(x[i] - m);
  const float lse = m + logf(sum);
  lse2[r] = lse * lse;
  if (dlogits != nullptr)
    for (int64_t i = 0; i < e; ++i) dlogits[r * e + i] += coeff * lse * expf(x[i] - lse);
}

__global__ void gather_rows_kernel(const void* src, Elem t, const int32_t* row_token, int64_t rows,
                                   int64_t d, void* dst) {
  const int64_t total = rows * d;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / d, c = idx % d;
    const int32_t tok = row_token[r];
    store(dst, t, idx, tok >= 0 ? load(src, t, int64_t(tok) * d + c) : 0.0f);
  }
}

__global__ void scatter_add_kernel(const void* drows, Elem t, const int32_t* pair_row, int64_t n,
                                   int64_t k, int64_t d, float* dsrc) {
  const int64_t total = n * d;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tok = idx / d, c = idx % d;
    float acc = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = pair_row[tok * k + j];
      if (r >= 0) acc += load(drows, t, int64_t(r) * d + c);
    }
    dsrc[idx] += acc;
  }
}

__global__ void combine_kernel(const void* y, Elem t, const int32_t* pair_row, const float* weights,
                               int64_t n, int64_t k, int64_t d, float* out) {
  const int64_t total = n * d;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tok = idx / d, c = idx % d;
    float acc = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = pair_row[tok * k + j];
      if (r >= 0) acc += weights[tok * k + j] * load(y, t, int64_t(r) * d + c);
    }
    out[idx] += acc;
  }
}

__global__ void combine_backward_dy_kernel(const float* dout, Elem t, const int32_t* pair_row,
                                           const int32_t* row_token, const float* weights,
                                           int64_t k, int64_t d, int64_t rows, void* dy) {
  const int64_t total = rows * d;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / d, c = idx % d;
    const int32_t tok = row_token[r];
    float v = 0;
    if (tok >= 0)
      for (int64_t j = 0; j < k; ++j)
        if (pair_row[int64_t(tok) * k + j] == r)
          v = weights[int64_t(tok) * k + j] * dout[int64_t(tok) * d + c];
    store(dy, t, idx, v);
  }
}

// One warp per pair: dweights[p] = <dout[token], y[pair_row[p]]>.
__global__ void combine_backward_dw_kernel(const float* dout, const void* y, Elem t,
                                           const int32_t* pair_row, int64_t n, int64_t k, int64_t d,
                                           float* dweights) {
  const int lane = threadIdx.x & 31;
  const int64_t p = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (p >= n * k) return;
  const int32_t r = pair_row[p];
  float dot = 0;
  if (r >= 0)
    for (int64_t c = lane; c < d; c += 32)
      dot += dout[(p / k) * d + c] * load(y, t, int64_t(r) * d + c);
  dot = warp_sum(dot);
  if (lane == 0) dweights[p] = dot;
}

}  // namespace

void router_topk_forward(cudaStream_t s, const float* logits, int64_t n, int64_t e, int64_t k,
                         bool normalize, float* probs, int32_t* experts, float* weights) {
  if (n <= 0) return;
  router_forward_kernel<<<blocks_for(n, 128), 128, 0, s>>>(logits, n, e, k, normalize, probs,
                                                           experts, weights);
}

void router_topk_backward(cudaStream_t s, const float* probs, const int32_t* experts,
                          const float* weights, const float* dweights, const float* dprobs,
                          int64_t n, int64_t e, int64_t k, bool normalize, float* dlogits) {
  if (n <= 0) return;
  router_backward_kernel<<<blocks_for(n, 128), 128, 0, s>>>(probs, experts, weights, dweights,
                                                            dprobs, n, e, k, normalize, dlogits);
}

void load_balance_loss(cudaStream_t s, const float* probs, const int32_t* experts, int64_t b,
                       int64_t t, int64_t e, int64_t k, float weight, float* dprobs, float dscale,
                       float* scratch, float* result, DeviceError* err) {
  if (b * t <= 0) {
    cudaMemsetAsync(result, 0, sizeof(float), s);
    return;
  }
  load_balance_stats_kernel<<<blocks_for(b * e, 128), 128, 0, s>>>(probs, experts, b, t, e, k,
                                                                   scratch, err);
  const double ee = static_cast<double>(e);
  ordered_sum_kernel<<<1, kThreads, 0, s>>>(
      scratch + b * e, b * e, static_cast<float>(weight * ee * ee / (b * ee)), result);
  if (dprobs != nullptr)
    load_balance_grad_kernel<<<blocks_for(b * t * e, kThreads), kThreads, 0, s>>>(
        scratch, b, t, e, static_cast<float>(dscale * weight * ee / (b * t)), dprobs);
}

void router_z_loss(cudaStream_t s, const float* logits, int64_t n, int64_t e, float weight,
                   float* dlogits, float dscale, float* scratch, float* result) {
  if (n <= 0) {
    cudaMemsetAsync(result, 0, sizeof(float), s);
    return;
  }
  z_loss_rows_kernel<<<blocks_for(n, 128), 128, 0, s>>>(
      logits, n, e, dscale * 2.0f * weight / static_cast<float>(n), dlogits, scratch);
  ordered_sum_kernel<<<1, kThreads, 0, s>>>(scratch, n, weight / static_cast<float>(n), result);
}

void moe_gather_rows(cudaStream_t s, const void* src, Elem t, const int32_t* row_token,
                     int64_t rows, int64_t d, void* dst) {
  if (rows * d <= 0) return;
  gather_rows_kernel<<<blocks_for(rows * d, kThreads), kThreads, 0, s>>>(src, t, row_token, rows, d,
                                                                         dst);
}

void moe_scatter_add_rows(cudaStream_t s, const void* drows, Elem t, const int32_t* pair_row,
                          int64_t n, int64_t k, int64_t d, float* dsrc) {
  if (n * d <= 0) return;
  scatter_add_kernel<<<blocks_for(n * d, kThreads), kThreads, 0, s>>>(drows, t, pair_row, n, k, d,
                                                                      dsrc);
}

void moe_combine(cudaStream_t s, const void* y, Elem t, const int32_t* pair_row,
                 const float* weights, int64_t n, int64_t k, int64_t d, float* out) {
  if (n * d <= 0) return;
  combine_kernel<<<blocks_for(n * d, kThreads), kThreads, 0, s>>>(y, t, pair_row, weights, n, k, d,
                                                                  out);
}

void moe_combine_backward(cudaStream_t s, const float* dout, const void* y, Elem t,
                          const int32_t* pair_row, const int32_t* row_token, const float* weights,
                          int64_t n, int64_t k, int64_t d, int64_t rows, void* dy,
                          float* dweights) {
  if (rows * d > 0)
    combine_backward_dy_kernel<<<blocks_for(rows * d, kThreads), kThreads, 0, s>>>(
        dout, t, pair_row, row_token, weights, k, d, rows, dy);
  if (n * k > 0)
    combine_backward_dw_kernel<<<static_cast<unsigned>((n * k + 7) / 8), 256, 0, s>>>(
        dout, y, t, pair_row, n, k, d, dweights);
}

}  // namespace hyperion::cuda
