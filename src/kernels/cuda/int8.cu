// int8 weights on the GPU (`quantize_weights=int8`), with the host's numerics: rows
// quantised by absmax (kernels/quantize.h: scale = max|x| / 127, q = round-to-even(x /
// scale) clamped to +-127, a NaN row gets a NaN scale and zeros, a zero row zeros), and
// the scaled int8 GEMM C = alpha * a_scale[m] * b_scale[n] * (A B^T) + beta * C with
// exact int32 sums (kernels/gemm.h), so a product equals the host's up to the final f32
// multiplications.
//
// The GEMM is a decode kernel: one warp per weight row streams 16 int8 weights per lane
// and load (half a bf16 row's bytes: the point of int8 weights) against the same pieces
// of up to 8 activation rows, four-way dot products (dp4a) into int32. More rows run in
// groups of 8 (each group one more pass over the weights): correct for a prefill chunk,
// not fast.
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kQuantThreads = 256;

__global__ void quantize_rows_kernel(const void* x, Elem xt, int64_t cols, int8_t* q,
                                     float* scales) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const int64_t base = row * cols;
  float amax = 0.0f;
  int nan = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float a = fabsf(load(x, xt, base + c));
    nan |= a != a;
    amax = fmaxf(amax, a);
  }
  nan = __syncthreads_or(nan);
  amax = block_max(amax, red);
  const float scale = nan ? __int_as_float(0x7fc00000) : amax / 127.0f;
  const bool zero_row = !isfinite(scale) || scale == 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = 0.0f;
    if (!zero_row) v = fminf(fmaxf(rintf(load(x, xt, base + c) / scale), -127.0f), 127.0f);
    q[base + c] = static_cast<int8_t>(v);
  }
  if (threadIdx.x == 0) scales[row] = scale;
}

constexpr int kWarps = 8;
constexpr int kUnroll = 4;

__device__ __forceinline__ int dot16(const int4& a, const int4& b, int acc) {
  acc = __dp4a(a.x, b.x, acc);
  acc = __dp4a(a.y, b.y, acc);
  acc = __dp4a(a.z, b.z, acc);
  return __dp4a(a.w, b.w, acc);
}

template <int M>
__global__ void __launch_bounds__(kWarps * 32)
    int8_gemv_kernel(const int8_t* __restrict__ a, const float* __restrict__ a_scale,
                     const int8_t* __restrict__ b, const float* __restrict__ b_scale, void* c,
                     Elem ct, int64_t n, int64_t k, int64_t ldc, float alpha, float beta) {
  const int lane = threadIdx.x & 31;
  const int64_t col = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (col >= n) return;
  const auto* brow = reinterpret_cast<const int4*>(b + col * k);
  const auto* arow = reinterpret_cast<const int4*>(a);
  const int64_t pieces = k / 16, a_stride = k / 16;
  int acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0;
  int64_t p = lane;
  for (; p + 32 * (kUnroll - 1) < pieces; p += 32 * kUnroll) {
    int4 w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) w[u] = __ldcs(brow + p + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int i = 0; i < M; ++i) acc[i] = dot16(w[u], __ldg(arow + i * a_stride + p + 32 * u), acc[i]);
  }
  for (; p < pieces; p += 32) {
    const int4 w = __ldcs(brow + p);
#pragma unroll
    for (int i = 0; i < M; ++i) acc[i] = dot16(w, __ldg(arow + i * a_stride + p), acc[i]);
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
    int sum = acc[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      const int64_t at = i * ldc + col;
      const float v = alpha * a_scale[i] * b_scale[col] * static_cast<float>(sum);
      store(c, ct, at, beta != 0.0f ? v + beta * load(c, ct, at) : v);
    }
  }
}

template <int M>
void launch(cudaStream_t s, const int8_t* a, const float* as, const int8_t* b, const float* bs,
            void* c, Elem ct, int64_t n, int64_t k, int64_t ldc, float alpha, float beta) {
  int8_gemv_kernel<M><<<static_cast<unsigned>((n + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(
      a, as, b, bs, c, ct, n, k, ldc, alpha, beta);
}

// A decode step's rows quantised inside the matmul: each block quantises x [M, k] (bf16)
// into shared memory with the host's rule (absmax per row, round-to-even, NaN row: NaN
// scale and zeros), then its warps take weight rows of up to kInt8MaxTargets matrices as
// above. Quantising x again in every block costs a read of x from L2 and k divisions
// per row; a separate quantising launch costs more at these sizes.
struct Int8Targets {
  const int8_t* w[kInt8MaxTargets];
  const float* scale[kInt8MaxTargets];
  void* y[kInt8MaxTargets];
  float beta[kInt8MaxTargets];
  int64_t out[kInt8MaxTargets];
  int64_t end[kInt8MaxTargets];
  int count = 0;
};

template <int M>
__global__ void __launch_bounds__(kWarps * 32)
    int8_gemv_quantising_kernel(const __nv_bfloat16* __restrict__ x, Int8Targets t, Elem ct,
                                int64_t k) {
  extern __shared__ int4 s_q4[];  // [M][k] int8
  auto* s_q = reinterpret_cast<int8_t*>(s_q4);
  __shared__ float s_scale[M];
  __shared__ float red[32];
  for (int i = 0; i < M; ++i) {
    const __nv_bfloat16* row = x + i * k;
    float amax = 0.0f;
    int nan = 0;
    for (int64_t c = threadIdx.x * 8; c < k; c += blockDim.x * 8) {
      float v[8];
      load8(row, Elem::kBF16, c, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float a = fabsf(v[j]);
        nan |= a != a;
        amax = fmaxf(amax, a);
      }
    }
    nan = __syncthreads_or(nan);
    amax = block_max(amax, red);
    const float scale = nan ? __int_as_float(0x7fc00000) : amax / 127.0f;
    const bool zero_row = !isfinite(scale) || scale == 0.0f;
    if (threadIdx.x == 0) s_scale[i] = scale;
    for (int64_t c = threadIdx.x * 8; c < k; c += blockDim.x * 8) {
      float v[8];
      load8(row, Elem::kBF16, c, v);
      alignas(8) int8_t qv[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        qv[j] = zero_row ? 0
                         : static_cast<int8_t>(fminf(fmaxf(rintf(v[j] / scale), -127.0f), 127.0f));
      *reinterpret_cast<uint2*>(s_q + i * k + c) = *reinterpret_cast<const uint2*>(qv);
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  int64_t col = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (col >= t.end[t.count - 1]) return;
  int ti = 0;
  while (col >= t.end[ti]) ++ti;
  if (ti > 0) col -= t.end[ti - 1];
  const auto* brow = reinterpret_cast<const int4*>(t.w[ti] + col * k);
  const int64_t pieces = k / 16;
  int acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0;
  int64_t p = lane;
  for (; p + 32 * (kUnroll - 1) < pieces; p += 32 * kUnroll) {
    int4 w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) w[u] = __ldcs(brow + p + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int i = 0; i < M; ++i)
        acc[i] = dot16(w[u], s_q4[i * pieces + p + 32 * u], acc[i]);
  }
  for (; p < pieces; p += 32) {
    const int4 w = __ldcs(brow + p);
#pragma unroll
    for (int i = 0; i < M; ++i) acc[i] = dot16(w, s_q4[i * pieces + p], acc[i]);
  }
  const float ws = t.scale[ti][col];
  const int64_t n = t.out[ti];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    int sum = acc[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      const float v = s_scale[i] * ws * static_cast<float>(sum);
      const float b = t.beta[ti];
      store(t.y[ti], ct, i * n + col, b != 0.0f ? v + b * load(t.y[ti], ct, i * n + col) : v);
    }
  }
}

template <int M>
void launch_quantising(cudaStream_t s, const void* x, const Int8Targets& t, Elem ct, int64_t k) {
  const auto blocks = static_cast<unsigned>((t.end[t.count - 1] + kWarps - 1) / kWarps);
  int8_gemv_quantising_kernel<M><<<blocks, kWarps * 32, static_cast<size_t>(M * k), s>>>(
      static_cast<const __nv_bfloat16*>(x), t, ct, k);
}

}  // namespace

void quantize_rows_i8(cudaStream_t s, const void* x, Elem xt, int64_t rows, int64_t cols,
                      int8_t* q, float* scales) {
  if (rows <= 0) return;
  quantize_rows_kernel<<<static_cast<unsigned>(rows), kQuantThreads, 0, s>>>(x, xt, cols, q,
                                                                            scales);
}

void int8_gemm_scaled(cudaStream_t s, int64_t m, int64_t n, int64_t k, const int8_t* a,
                      const float* a_scale, const int8_t* b, const float* b_scale, void* c,
                      Elem ct, float alpha, float beta) {
  const size_t c_bytes = ct == Elem::kF32 ? 4 : 2;
  for (int64_t r0 = 0; r0 < m; r0 += 8) {
    const int64_t rows = m - r0 < 8 ? m - r0 : 8;
    const int8_t* ar = a + r0 * k;
    const float* sr = a_scale + r0;
    void* cr = static_cast<unsigned char*>(c) + static_cast<size_t>(r0 * n) * c_bytes;
    switch (rows) {
      case 1: launch<1>(s, ar, sr, b, b_scale, cr, ct, n, k, n, alpha, beta); break;
      case 2: launch<2>(s, ar, sr, b, b_scale, cr, ct, n, k, n, alpha, beta); break;
      case 3: launch<3>(s, ar, sr, b, b_scale, cr, ct, n, k, n, alpha, beta); break;
      case 4: launch<4>(s, ar, sr, b, b_scale, cr, ct, n, k, n, alpha, beta); break;
      case 5: launch<5>(s, ar, sr, b, b_scale, cr, ct, n, k, n, alpha, beta); break;
      case 6: launch<6>(s, ar, sr, b, b_scale, cr, ct, n, k, n, alpha, beta); break;
      case 7: launch<7>(s, ar, sr, b, b_scale, cr, ct, n, k, n, alpha, beta); break;
      default: launch<8>(s, ar, sr, b, b_scale, cr, ct, n, k, n, alpha, beta); break;
    }
  }
}

}  // namespace hyperion::cuda

namespace hyperion::cuda {

bool int8_linear_quantising_applies(int64_t m, int64_t k) {
  // k <= 131072 keeps k * 127^2 within int32: the sums stay exact.
  return m >= 1 && m <= kInt8QuantisingMaxRows && k % 16 == 0 && k <= 131072 &&
         m * k <= 40 * 1024;
}

void int8_linear_quantising(cudaStream_t s, int64_t m, int64_t k, const void* x,
                            const int8_t* const* w, const float* const* scales,
                            const int64_t* out, void* const* y, const float* beta, int count,
                            Elem ct) {
  if (m <= 0 || count <= 0) return;
  Int8Targets t;
  t.count = count;
  int64_t end = 0;
  for (int i = 0; i < count; ++i) {
    t.w[i] = w[i];
    t.scale[i] = scales[i];
    t.y[i] = y[i];
    t.beta[i] = beta[i];
    t.out[i] = out[i];
    end += out[i];
    t.end[i] = end;
  }
  if (end == 0) return;
  switch (m) {
    case 1: launch_quantising<1>(s, x, t, ct, k); break;
    case 2: launch_quantising<2>(s, x, t, ct, k); break;
    case 3: launch_quantising<3>(s, x, t, ct, k); break;
    default: launch_quantising<4>(s, x, t, ct, k); break;
  }
}

}  // namespace hyperion::cuda
