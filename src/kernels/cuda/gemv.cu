// C[m, n] = alpha * A[m, k] B[n, k]^T + beta * C for a handful of rows (m <= 8), bf16 A and
// B, f32 or bf16 C: a decode step's matmuls, where the weights B are read once and the
// time is their bytes over the memory bandwidth. One warp per output column (a weight
// row): each lane streams 16-byte pieces of the row, four in flight, against the same
// pieces of every A row (L1-resident: A is m * k * 2 bytes), and the lanes' partial dots
// are summed in a fixed order. cuBLASLt's kernels for these shapes are tuned for matrix
// tiles, not for a single pass over B.
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;

__device__ __forceinline__ void bf16x8(const uint4& raw, float (&v)[8]) {
  const auto* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h2[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

template <int M>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b,
                void* c, Elem ct, int64_t n, int64_t k, float alpha, float beta) {
  const int lane = threadIdx.x & 31;
  const int64_t col = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (col >= n) return;
  const auto* brow = reinterpret_cast<const uint4*>(b + col * k);
  const auto* arow = reinterpret_cast<const uint4*>(a);
  const int64_t pieces = k / 8, a_stride = k / 8;
  float acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0.0f;
  int64_t p = lane;
  for (; p + 32 * (kUnroll - 1) < pieces; p += 32 * kUnroll) {
    uint4 w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) w[u] = __ldcs(brow + p + 32 * u);  // streamed once
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float wf[8];
      bf16x8(w[u], wf);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        float xf[8];
        bf16x8(__ldg(arow + i * a_stride + p + 32 * u), xf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i] += wf[j] * xf[j];
      }
    }
  }
  for (; p < pieces; p += 32) {
    float wf[8];
    bf16x8(__ldcs(brow + p), wf);
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float xf[8];
      bf16x8(__ldg(arow + i * a_stride + p), xf);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i] += wf[j] * xf[j];
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const float dot = warp_sum(acc[i]);
    if (lane == 0) {
      const int64_t at = i * n + col;
      const float old = beta != 0.0f ? load(c, ct, at) : 0.0f;
      store(c, ct, at, alpha * dot + beta * old);
    }
  }
}

template <int M>
void launch(cudaStream_t s, const void* a, const void* b, void* c, Elem ct, int64_t n, int64_t k,
            float alpha, float beta) {
  const auto blocks = static_cast<unsigned>((n + kWarps - 1) / kWarps);
  gemv_kernel<M><<<blocks, kWarps * 32, 0, s>>>(static_cast<const __nv_bfloat16*>(a),
                                                 static_cast<const __nv_bfloat16*>(b), c, ct, n, k,
                                                 alpha, beta);
}

}  // namespace

void gemv_bf16(cudaStream_t s, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
               void* c, Elem ct, float alpha, float beta) {
  if (m <= 0 || n <= 0) return;
  switch (m) {
    case 1: launch<1>(s, a, b, c, ct, n, k, alpha, beta); break;
    case 2: launch<2>(s, a, b, c, ct, n, k, alpha, beta); break;
    case 3: launch<3>(s, a, b, c, ct, n, k, alpha, beta); break;
    case 4: launch<4>(s, a, b, c, ct, n, k, alpha, beta); break;
    case 5: launch<5>(s, a, b, c, ct, n, k, alpha, beta); break;
    case 6: launch<6>(s, a, b, c, ct, n, k, alpha, beta); break;
    case 7: launch<7>(s, a, b, c, ct, n, k, alpha, beta); break;
    default: launch<8>(s, a, b, c, ct, n, k, alpha, beta); break;
  }
}

}  // namespace hyperion::cuda
