// C[m, n] = alpha * A[m, k] B[n, k]^T + beta * C for a handful of rows (m <= 8), bf16 A and
// B, f32 or bf16 C: a decode step's matmuls, where the weights B are read once and the
// time is their bytes over the memory bandwidth. One warp per output column (a weight
// row): each lane streams 16-byte pieces of the row, eight in flight, against the same
// pieces of every A row (L1-resident: A is m * k * 2 bytes), and the lanes' partial dots
// are summed in a fixed order. cuBLASLt's kernels for these shapes are tuned for matrix
// tiles, not for a single pass over B. Several matrices of one input (a layer's q, k and
// v; gate and up) go in one launch, so the small ones do not each pay a launch's latency.
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 8;

// The weights one launch reads: up to kGemvMaxTargets matrices [out_t, k] of one input,
// their outputs [m, out_t]; warp w takes the row of the target whose range holds w.
struct GemvTargets {
  const __nv_bfloat16* w[kGemvMaxTargets];
  void* y[kGemvMaxTargets];
  int64_t out[kGemvMaxTargets];
  int64_t end[kGemvMaxTargets];  // cumulative rows
  int count = 0;
};

template <int M>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const __nv_bfloat16* __restrict__ a, GemvTargets t, Elem ct, int64_t k,
                float alpha, float beta) {
  const int lane = threadIdx.x & 31;
  int64_t col = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (col >= t.end[t.count - 1]) return;
  int ti = 0;
  while (col >= t.end[ti]) ++ti;
  if (ti > 0) col -= t.end[ti - 1];
  const int64_t n = t.out[ti];
  const auto* brow = reinterpret_cast<const uint4*>(t.w[ti] + col * k);
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
  void* c = t.y[ti];
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
void launch(cudaStream_t s, const void* a, const GemvTargets& t, Elem ct, int64_t k, float alpha,
            float beta) {
  const auto blocks = static_cast<unsigned>((t.end[t.count - 1] + kWarps - 1) / kWarps);
  gemv_kernel<M><<<blocks, kWarps * 32, 0, s>>>(static_cast<const __nv_bfloat16*>(a), t, ct, k,
                                                 alpha, beta);
}

void launch_rows(cudaStream_t s, int64_t m, const void* a, const GemvTargets& t, Elem ct,
                 int64_t k, float alpha, float beta) {
  switch (m) {
    case 1: launch<1>(s, a, t, ct, k, alpha, beta); break;
    case 2: launch<2>(s, a, t, ct, k, alpha, beta); break;
    case 3: launch<3>(s, a, t, ct, k, alpha, beta); break;
    case 4: launch<4>(s, a, t, ct, k, alpha, beta); break;
    case 5: launch<5>(s, a, t, ct, k, alpha, beta); break;
    case 6: launch<6>(s, a, t, ct, k, alpha, beta); break;
    case 7: launch<7>(s, a, t, ct, k, alpha, beta); break;
    default: launch<8>(s, a, t, ct, k, alpha, beta); break;
  }
}

}  // namespace

void gemv_bf16(cudaStream_t s, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
               void* c, Elem ct, float alpha, float beta) {
  if (m <= 0 || n <= 0) return;
  GemvTargets t;
  t.count = 1;
  t.w[0] = static_cast<const __nv_bfloat16*>(b);
  t.y[0] = c;
  t.out[0] = n;
  t.end[0] = n;
  launch_rows(s, m, a, t, ct, k, alpha, beta);
}

void gemv_bf16_many(cudaStream_t s, int64_t m, int64_t k, const void* a, const void* const* w,
                    const int64_t* out, void* const* y, int count, Elem ct) {
  if (m <= 0 || count <= 0) return;
  GemvTargets t;
  t.count = count;
  int64_t end = 0;
  for (int i = 0; i < count; ++i) {
    t.w[i] = static_cast<const __nv_bfloat16*>(w[i]);
    t.y[i] = y[i];
    t.out[i] = out[i];
    end += out[i];
    t.end[i] = end;
  }
  if (end > 0) launch_rows(s, m, a, t, ct, k, 1.0f, 0.0f);
}

}  // namespace hyperion::cuda
