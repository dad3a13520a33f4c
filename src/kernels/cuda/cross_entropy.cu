// Fused softmax cross-entropy (kernels/cross_entropy.h semantics): one block per row,
// an online max / sum-exp pass, then the gradient pass; the mean over the counted rows
// is summed in row order by one block, in double. A soft cap (Gemma 2's
// final_logit_softcapping) is applied to each logit as it is read; the gradient carries
// its derivative, 1 - (c / cap)^2, back to the logit before the cap.
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kThreads = 256;

// counts[0] = rows whose target is not ignore_index; out-of-range targets are recorded.
__global__ void count_targets_kernel(const int32_t* targets, int64_t n, int64_t vocab,
                                     int32_t ignore_index, double* result, DeviceError* err) {
  __shared__ float shared[32];
  float c = 0;
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
    const int32_t t = targets[r];
    if (t == ignore_index) continue;
    if (t < 0 || t >= vocab)
      record_error(err, kTargetOutOfRange, r, t, vocab);
    else
      c += 1;
  }
  c = block_sum(c, shared);
  if (threadIdx.x == 0) result[1] = c;
}

__device__ float capped(float z, float cap) {
  return cap > 0.0f ? cap * tanhf(z / cap) : z;
}

__global__ void cross_entropy_row_kernel(const void* logits, Elem t, const int32_t* targets,
                                         int64_t vocab, int32_t ignore_index, float dloss,
                                         float cap, void* dlogits, float* row_loss,
                                         const double* result) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x, base = row * vocab;
  const int32_t target = targets[row];
  const bool counted = target != ignore_index && target >= 0 && target < vocab;
  // Online max and sum of exp per thread, then merged across the block.
  float m = -INFINITY, s = 0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float v = capped(load(logits, t, base + j), cap);
    if (v > m) {
      s = s * __expf(m - v) + 1.0f;
      m = v;
    } else {
      s += __expf(v - m);
    }
  }
  const float row_max = block_max(m, shared);
  __syncthreads();
  const float sum = block_sum(m == -INFINITY ? 0.0f : s * __expf(m - row_max), shared);
  const float lse = row_max + logf(sum);
  const float target_logit = counted ? capped(load(logits, t, base + target), cap) : 0.0f;
  __syncthreads();  // the target logit is read before dlogits (maybe the logits) is written
  if (threadIdx.x == 0) row_loss[row] = counted ? lse - target_logit : 0.0f;
  if (dlogits == nullptr) return;
  const float count = static_cast<float>(result[1]);
  const float g = counted && count > 0 ? dloss / count : 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float c = capped(load(logits, t, base + j), cap);
    const float dc = cap > 0.0f ? 1.0f - (c / cap) * (c / cap) : 1.0f;
    const float p = __expf(c - lse);
    store(dlogits, t, base + j, counted ? (p - (j == target ? 1.0f : 0.0f)) * g * dc : 0.0f);
  }
}

__global__ void mean_loss_kernel(const float* row_loss, int64_t n, double* result) {
  __shared__ double shared[kThreads];
  double acc = 0;
  // Each thread sums a contiguous run of rows, then the block sums the runs in order.
  const int64_t per = (n + blockDim.x - 1) / blockDim.x;
  const int64_t r0 = threadIdx.x * per, r1 = imin(n, r0 + per);
  for (int64_t r = r0; r < r1; ++r) acc += row_loss[r];
  shared[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int i = 0; i < blockDim.x; ++i) total += shared[i];
    result[0] = result[1] > 0 ? total / result[1] : 0.0;
  }
}

}  // namespace

void cross_entropy(cudaStream_t s, const void* logits, Elem t, const int32_t* targets, int64_t n,
                   int64_t vocab, int32_t ignore_index, float dloss, float softcap, void* dlogits,
                   float* row_loss, double* result, DeviceError* err) {
  count_targets_kernel<<<1, 1024, 0, s>>>(targets, n, vocab, ignore_index, result, err);
  if (n > 0)
    cross_entropy_row_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(
        logits, t, targets, vocab, ignore_index, dloss, softcap, dlogits, row_loss, result);
  mean_loss_kernel<<<1, kThreads, 0, s>>>(row_loss, n, result);
}

}  // namespace hyperion::cuda
