// GQA flash attention (causal or not) on the tensor cores (mma.sync m16n8k16, bf16 in, f32
// accumulate; sm_80 and later), forward and backward, for bf16 q/k/v with head_dim 64 or
// 128: the shapes of every Llama preset. attention.cu keeps the portable kernels for the
// rest (f32, other head dims) and calls these first.
//
// Blocking (FlashAttention-2): a block of 4 warps owns 64 rows (16 per warp) and streams
// the other operand through shared memory in tiles of 64 rows, double-buffered with
// cp.async so the next tile loads while this one is multiplied. Scores and probabilities
// stay in registers: an m16n8 accumulator has the layout of an m16n8k16 A fragment, so
// P (and dS) feed the next product without a trip through shared memory. Shared rows are
// padded by 16 bytes so ldmatrix reads hit distinct banks.
//
// The backward recomputes P from the forward's lse. It is two kernels, as the portable
// one is: dQ (a block per query tile, over key tiles) and dK/dV (a block per key tile,
// over the group's query heads and tiles). Each output element is summed by one thread in
// a fixed order: deterministic, no atomics, at the price of recomputing S and dP twice.
//
// Rounding: P and dS are rounded to bf16 before their products (as FlashAttention does);
// everything else accumulates in f32. docs/GPU.md states the tolerance.
#include <cuda_bf16.h>

#include <initializer_list>

#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16 * kWarps;  // rows a block owns
constexpr int kTile = 64;           // rows of each streamed tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
__host__ __device__ constexpr int stride() {  // bf16 elements per shared row: 16 bytes of padding
  return D + 8;
}
template <int D>
__host__ __device__ constexpr int tile_elems() {
  return kTile * stride<D>();
}

struct Geometry {
  int64_t b, tq, tk, hq, hkv, group;
  float scale;
  bool causal;
  __host__ __device__ int64_t off() const { return causal ? tk - tq : 0; }
  // Last key query i sees, inclusive (clamped to the keys there are).
  __device__ int64_t last_key(int64_t i) const {
    const int64_t l = causal ? i + (tk - tq) : tk - 1;
    return l < tk - 1 ? l : tk - 1;
  }
  __device__ int64_t first_query(int64_t j) const {
    const int64_t f = causal ? j - (tk - tq) : 0;
    return f < 0 ? 0 : f;
  }
  __device__ bool visible(int64_t i, int64_t j) const {
    return j < tk && i < tq && (!causal || j <= i + (tk - tq));
  }
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, zero-filled when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c += a (16x16, row) * b (16x8, col).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The A fragment (16 rows x 16 columns k0..k0+15) made of two m16n8 accumulators.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                         const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// Rows row0.. (rows_valid of them real, the rest zero) of one head of a [B, T, H, D]
// tensor into a padded shared tile. `head` points at the head's first element at T = 0;
// row_stride is H * D elements.
template <int D>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* head, int64_t row0,
                                          int64_t rows_valid, int64_t row_stride) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < kTile * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool ok = r < rows_valid;
    const bf16* src = ok ? head + (row0 + r) * row_stride + c * 8 : head;
    cp_async16(tile + r * stride<D>() + c * 8, src, ok);
  }
}

// A fragments of the warp's 16 rows (all D columns) of a shared tile.
template <int D>
__device__ __forceinline__ void load_a(uint32_t (&a)[D / 16][4], const bf16* tile, int warp,
                                       int lane) {
  const bf16* base =
      tile + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * stride<D>() + (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(a[kk], base + kk * 16);
}

// s (16 x 64) += a (16 x D) * tile^T, tile rows being the 64 columns of s.
template <int D>
__device__ __forceinline__ void mul_abt(float (&s)[8][4], const uint32_t (&a)[D / 16][4],
                                        const bf16* tile, int lane) {
  const bf16* base = tile + ((lane & 7) + (lane >> 4) * 8) * stride<D>() + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, base + np * 16 * stride<D>() + kk * 16);
      mma(s[2 * np], a[kk], b[0], b[1]);
      mma(s[2 * np + 1], a[kk], b[2], b[3]);
    }
  }
}

// As mul_abt, with the warp's A rows read from a shared tile at each step (the dK/dV
// kernel keeps K and V there rather than in registers).
template <int D>
__device__ __forceinline__ void mul_abt_shared(float (&s)[8][4], const bf16* a_tile,
                                               const bf16* tile, int warp, int lane) {
  const bf16* abase =
      a_tile + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * stride<D>() + (lane >> 4) * 8;
  const bf16* base = tile + ((lane & 7) + (lane >> 4) * 8) * stride<D>() + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, abase + kk * 16);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, base + np * 16 * stride<D>() + kk * 16);
      mma(s[2 * np], a, b[0], b[1]);
      mma(s[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 x D) += p (16 x 64, accumulator layout) * tile (64 x D).
template <int D>
__device__ __forceinline__ void mul_pb(float (&acc)[D / 8][4], const float (&p)[8][4],
                                       const bf16* tile, int lane) {
  const bf16* base = tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * stride<D>() + (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[4];
    acc_to_a(a, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, base + kk * 16 * stride<D>() + dp * 16);
      mma(acc[2 * dp], a, b[0], b[1]);
      mma(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

template <int D>
__device__ __forceinline__ void zero(float (&acc)[D][4]) {
#pragma unroll
  for (int i = 0; i < D; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
}

// Stores the warp's 16 rows x D (accumulator layout) times mul; rows >= rows_valid skipped.
template <int D>
__device__ __forceinline__ void store_rows(void* out, Elem ot, int64_t first_elem,
                                           int64_t row_stride, int64_t row0, int64_t rows_valid,
                                           const float (&acc)[D / 8][4], const float (&mul)[2],
                                           int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t r = row0 + (lane >> 2) + half * 8;
    if (r >= rows_valid) continue;
    const int64_t e0 = first_elem + r * row_stride + 2 * (lane & 3);
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      const float x = acc[dn][2 * half] * mul[half], y = acc[dn][2 * half + 1] * mul[half];
      if (ot == Elem::kBF16)
        *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(out) + e0 + dn * 8) =
            __floats2bfloat162_rn(x, y);
      else
        *reinterpret_cast<float2*>(static_cast<float*>(out) + e0 + dn * 8) = make_float2(x, y);
    }
  }
}

// ---------------------------------------------------------------- forward

template <int D>
__global__ void __launch_bounds__(kThreads)
    mma_forward_kernel(Geometry G, const bf16* q, const bf16* k, const bf16* v, void* out, Elem ot,
                       float* lse) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + tile_elems<D>();  // two buffers
  bf16* vs = ks + 2 * tile_elems<D>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bi = blockIdx.z, h = blockIdx.y, g = h / G.group;
  // The last query tiles see the most keys: start them first.
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kRows;
  const int64_t qstride = G.hq * D, kstride = G.hkv * D;
  const bf16* qh = q + (bi * G.tq * G.hq + h) * D;
  const bf16* kh = k + (bi * G.tk * G.hkv + g) * D;
  const bf16* vh = v + (bi * G.tk * G.hkv + g) * D;
  const int64_t block_last = G.last_key(imin(q0 + kRows, G.tq) - 1);
  const int tiles = static_cast<int>(block_last / kTile) + 1;

  load_tile<D>(qs, qh, q0, G.tq - q0, qstride);
  load_tile<D>(ks, kh, 0, G.tk, kstride);
  load_tile<D>(vs, vh, 0, G.tk, kstride);
  cp_async_commit();

  uint32_t qf[D / 16][4];
  float o[D / 8][4];
  zero<D / 8>(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sl2 = G.scale * kLog2e;
  const int64_t row_lo = q0 + warp * 16 + (lane >> 2);

  for (int t = 0; t < tiles; ++t) {
    const int buf = t & 1;
    if (t + 1 < tiles) {
      const int64_t j1 = int64_t(t + 1) * kTile;
      load_tile<D>(ks + (buf ^ 1) * tile_elems<D>(), kh, j1, G.tk - j1, kstride);
      load_tile<D>(vs + (buf ^ 1) * tile_elems<D>(), vh, j1, G.tk - j1, kstride);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (t == 0) load_a<D>(qf, qs, warp, lane);
    const bf16* kt = ks + buf * tile_elems<D>();
    const bf16* vt = vs + buf * tile_elems<D>();

    float s[8][4];
    zero<8>(s);
    mul_abt<D>(s, qf, kt, lane);

    const int64_t j0 = int64_t(t) * kTile;
    if ((G.causal && j0 + kTile - 1 > q0 + G.off()) || j0 + kTile > G.tk) {  // crosses a boundary
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t i = row_lo + (e >> 1) * 8, j = j0 + nt * 8 + 2 * (lane & 3) + (e & 1);
          if (!(j < G.tk && (!G.causal || j <= i + G.off()))) s[nt][e] = -INFINITY;
        }
    }
    // Online softmax; the four threads of a quad share each row.
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]) * sl2);
      mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]) * sl2);
    }
    float corr[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      base[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
      corr[r] = exp2f(m[r] - base[r]);
      m[r] = mx[r];
      l[r] *= corr[r];
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[nt][e] * sl2 - base[e >> 1]);
        s[nt][e] = p;
        l[e >> 1] += p;
      }
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      o[dn][0] *= corr[0];
      o[dn][1] *= corr[0];
      o[dn][2] *= corr[1];
      o[dn][3] *= corr[1];
    }
    mul_pb<D>(o, s, vt, lane);
    __syncthreads();  // this buffer is the next load's target
  }

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
  }
  store_rows<D>(out, ot, (bi * G.tq * G.hq + h) * D, qstride, q0 + warp * 16, G.tq, o, inv, lane);
  if ((lane & 3) == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t i = row_lo + r * 8;
      if (i < G.tq) lse[(bi * G.hq + h) * G.tq + i] = (m[r] + log2f(l[r])) * kLn2;
    }
  }
}

// ---------------------------------------------------------------- backward: dQ

// dq_i = scale * sum_j p_ij (dO_i . v_j - delta_i) k_j over the row's visible keys.
template <int D>
__global__ void __launch_bounds__(kThreads)
    mma_dq_kernel(Geometry G, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                  const float* lse, const float* delta, void* dq, Elem gt) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* dos = qs + tile_elems<D>();
  bf16* ks = dos + tile_elems<D>();  // two buffers
  bf16* vs = ks + 2 * tile_elems<D>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bi = blockIdx.z, h = blockIdx.y, g = h / G.group;
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kRows;
  const int64_t qstride = G.hq * D, kstride = G.hkv * D;
  const bf16* qh = q + (bi * G.tq * G.hq + h) * D;
  const bf16* doh = dout + (bi * G.tq * G.hq + h) * D;
  const bf16* kh = k + (bi * G.tk * G.hkv + g) * D;
  const bf16* vh = v + (bi * G.tk * G.hkv + g) * D;
  const int64_t block_last = G.last_key(imin(q0 + kRows, G.tq) - 1);
  const int tiles = static_cast<int>(block_last / kTile) + 1;

  load_tile<D>(qs, qh, q0, G.tq - q0, qstride);
  load_tile<D>(dos, doh, q0, G.tq - q0, qstride);
  load_tile<D>(ks, kh, 0, G.tk, kstride);
  load_tile<D>(vs, vh, 0, G.tk, kstride);
  cp_async_commit();

  const int64_t row_lo = q0 + warp * 16 + (lane >> 2);
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = row_lo + r * 8;
    const int64_t at = (bi * G.hq + h) * G.tq + (i < G.tq ? i : 0);
    row_lse[r] = i < G.tq ? lse[at] * kLog2e : INFINITY;  // rows past Tq: p = 0
    row_delta[r] = delta[at];
  }
  const float sl2 = G.scale * kLog2e;
  uint32_t qf[D / 16][4], dof[D / 16][4];
  float acc[D / 8][4];
  zero<D / 8>(acc);

  for (int t = 0; t < tiles; ++t) {
    const int buf = t & 1;
    if (t + 1 < tiles) {
      const int64_t j1 = int64_t(t + 1) * kTile;
      load_tile<D>(ks + (buf ^ 1) * tile_elems<D>(), kh, j1, G.tk - j1, kstride);
      load_tile<D>(vs + (buf ^ 1) * tile_elems<D>(), vh, j1, G.tk - j1, kstride);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (t == 0) {
      load_a<D>(qf, qs, warp, lane);
      load_a<D>(dof, dos, warp, lane);
    }
    const bf16* kt = ks + buf * tile_elems<D>();
    const bf16* vt = vs + buf * tile_elems<D>();
    float s[8][4], dp[8][4];
    zero<8>(s);
    zero<8>(dp);
    mul_abt<D>(s, qf, kt, lane);
    mul_abt<D>(dp, dof, vt, lane);
    const int64_t j0 = int64_t(t) * kTile;
    const bool edge = (G.causal && j0 + kTile - 1 > q0 + G.off()) || j0 + kTile > G.tk;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float p = exp2f(s[nt][e] * sl2 - row_lse[r]);
        if (edge && !G.visible(row_lo + r * 8, j0 + nt * 8 + 2 * (lane & 3) + (e & 1))) p = 0.0f;
        s[nt][e] = p * (dp[nt][e] - row_delta[r]);  // dS
      }
    // acc += dS (16 x 64) * K tile (64 x D).
    mul_pb<D>(acc, s, kt, lane);
    __syncthreads();
  }
  const float mul[2] = {G.scale, G.scale};
  store_rows<D>(dq, gt, (bi * G.tq * G.hq + h) * D, qstride, q0 + warp * 16, G.tq, acc, mul, lane);
}

// ---------------------------------------------------------------- backward: dK, dV

// For key j of kv head g, over the group's query heads h and visible queries i:
// dv_j = sum p_ij dO_i, dk_j = scale * sum p_ij (dO_i . v_j - delta_i) q_i.
template <int D>
__global__ void __launch_bounds__(kThreads)
    mma_dkv_kernel(Geometry G, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                   const float* lse, const float* delta, void* dk, void* dv, Elem gt) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + tile_elems<D>();
  bf16* qs = vs + tile_elems<D>();                                     // two buffers
  bf16* dos = qs + 2 * tile_elems<D>();                                // two buffers
  float* stats = reinterpret_cast<float*>(dos + 2 * tile_elems<D>());  // [2][lse, delta][64]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bi = blockIdx.z, g = blockIdx.y;
  const int64_t j0 = int64_t(blockIdx.x) * kRows;
  const int64_t qstride = G.hq * D, kstride = G.hkv * D;
  const bf16* kh = k + (bi * G.tk * G.hkv + g) * D;
  const bf16* vh = v + (bi * G.tk * G.hkv + g) * D;
  const int64_t first = G.first_query(j0);
  const int64_t q_tiles = first < G.tq ? (G.tq - first + kTile - 1) / kTile : 0;
  const int64_t steps = q_tiles * G.group;  // (head, query tile) pairs, head-major

  // Stages step n's query rows, dO rows and their stats into buffer `buf`.
  auto stage = [&](int64_t n, int buf) {
    const int64_t h = g * G.group + n / q_tiles, i0 = first + (n % q_tiles) * kTile;
    const int64_t head = (bi * G.tq * G.hq + h) * D;
    load_tile<D>(qs + buf * tile_elems<D>(), q + head, i0, G.tq - i0, qstride);
    load_tile<D>(dos + buf * tile_elems<D>(), dout + head, i0, G.tq - i0, qstride);
    float* st = stats + buf * 2 * kTile;
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      const bool ok = i0 + r < G.tq;
      const int64_t at = (bi * G.hq + h) * G.tq + i0 + r;
      st[r] = ok ? lse[at] * kLog2e : 0.0f;
      st[kTile + r] = ok ? delta[at] : 0.0f;
    }
  };

  load_tile<D>(ks, kh, j0, G.tk - j0, kstride);
  load_tile<D>(vs, vh, j0, G.tk - j0, kstride);
  if (steps > 0) stage(0, 0);
  cp_async_commit();

  const float sl2 = G.scale * kLog2e;
  const int64_t key_lo = j0 + warp * 16 + (lane >> 2);
  float dka[D / 8][4], dva[D / 8][4];
  zero<D / 8>(dka);
  zero<D / 8>(dva);

  for (int64_t n = 0; n < steps; ++n) {
    const int buf = static_cast<int>(n & 1);
    if (n + 1 < steps) {
      stage(n + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* qt = qs + buf * tile_elems<D>();
    const bf16* dot = dos + buf * tile_elems<D>();
    const float* st = stats + buf * 2 * kTile;
    const int64_t i0 = first + (n % q_tiles) * kTile;

    // S^T (16 keys x 64 queries) and dP^T = V dO^T.
    float s[8][4], dp[8][4];
    zero<8>(s);
    zero<8>(dp);
    mul_abt_shared<D>(s, ks, qt, warp, lane);
    mul_abt_shared<D>(dp, vs, dot, warp, lane);
    const bool edge = (G.causal && j0 + kRows - 1 > i0 + G.off()) || i0 + kTile > G.tq;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + 2 * (lane & 3) + (e & 1);  // query column in the tile
        float p = exp2f(s[nt][e] * sl2 - st[c]);
        if (edge && !G.visible(i0 + c, key_lo + (e >> 1) * 8)) p = 0.0f;
        s[nt][e] = p;
        dp[nt][e] = p * (dp[nt][e] - st[kTile + c]);  // dS^T
      }
    mul_pb<D>(dva, s, dot, lane);  // dV += P^T dO
    mul_pb<D>(dka, dp, qt, lane);  // dK += dS^T Q
    __syncthreads();
  }
  cp_async_wait<0>();  // nothing may be in flight at exit (steps == 0 leaves K/V pending)
  const float one[2] = {1.0f, 1.0f}, scale[2] = {G.scale, G.scale};
  store_rows<D>(dk, gt, (bi * G.tk * G.hkv + g) * D, kstride, j0 + warp * 16, G.tk, dka, scale,
                lane);
  store_rows<D>(dv, gt, (bi * G.tk * G.hkv + g) * D, kstride, j0 + warp * 16, G.tk, dva, one, lane);
}

// ---------------------------------------------------------------- launch

Geometry geometry_of(const AttentionShape& s) {
  return Geometry{s.b, s.tq, s.tk, s.hq, s.hkv, s.hq / s.hkv, s.scale, s.causal};
}

template <int D>
size_t forward_smem() {
  return 5 * tile_elems<D>() * sizeof(bf16);
}
template <int D>
size_t backward_smem() {
  return 6 * tile_elems<D>() * sizeof(bf16) + 4 * kTile * sizeof(float);
}

// Raises a kernel's dynamic shared memory limit once (above the default 48 KiB).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(bytes));
}

dim3 grid_of(int64_t rows, int64_t heads, int64_t b) {
  return dim3(static_cast<unsigned>((rows + kRows - 1) / kRows), static_cast<unsigned>(heads),
              static_cast<unsigned>(b));
}

template <int D>
void forward(cudaStream_t s, const AttentionShape& sh, const void* q, const void* k, const void* v,
             void* out, Elem ot, float* lse) {
  static const bool once = (allow_smem(mma_forward_kernel<D>, forward_smem<D>()), true);
  (void)once;
  mma_forward_kernel<D><<<grid_of(sh.tq, sh.hq, sh.b), kThreads, forward_smem<D>(), s>>>(
      geometry_of(sh), static_cast<const bf16*>(q), static_cast<const bf16*>(k),
      static_cast<const bf16*>(v), out, ot, lse);
}

template <int D>
void backward(cudaStream_t s, const AttentionShape& sh, const void* q, const void* k, const void* v,
              const void* dout, const float* lse, const float* delta, void* dq, void* dk, void* dv,
              Elem gt) {
  static const bool once = (allow_smem(mma_dq_kernel<D>, backward_smem<D>()),
                            allow_smem(mma_dkv_kernel<D>, backward_smem<D>()), true);
  (void)once;
  const Geometry G = geometry_of(sh);
  const auto* qb = static_cast<const bf16*>(q);
  const auto* kb = static_cast<const bf16*>(k);
  const auto* vb = static_cast<const bf16*>(v);
  const auto* db = static_cast<const bf16*>(dout);
  mma_dq_kernel<D><<<grid_of(sh.tq, sh.hq, sh.b), kThreads, backward_smem<D>(), s>>>(
      G, qb, kb, vb, db, lse, delta, dq, gt);
  mma_dkv_kernel<D><<<grid_of(sh.tk, sh.hkv, sh.b), kThreads, backward_smem<D>(), s>>>(
      G, qb, kb, vb, db, lse, delta, dk, dv, gt);
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace

bool attention_mma_applies(const AttentionShape& sh, Elem t,
                           std::initializer_list<const void*> ptrs) {
  if (t != Elem::kBF16 || (sh.d != 64 && sh.d != 128)) return false;
  if ((sh.window > 0 && sh.window < sh.tk) || sh.softcap > 0.0f) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

void attention_mma_forward(cudaStream_t s, const AttentionShape& sh, const void* q, const void* k,
                           const void* v, void* out, Elem ot, float* lse) {
  if (sh.d == 64)
    forward<64>(s, sh, q, k, v, out, ot, lse);
  else
    forward<128>(s, sh, q, k, v, out, ot, lse);
}

void attention_mma_backward(cudaStream_t s, const AttentionShape& sh, const void* q, const void* k,
                            const void* v, const void* dout, const float* lse, const float* delta,
                            void* dq, void* dk, void* dv, Elem gt) {
  if (sh.d == 64)
    backward<64>(s, sh, q, k, v, dout, lse, delta, dq, dk, dv, gt);
  else
    backward<128>(s, sh, q, k, v, dout, lse, delta, dq, dk, dv, gt);
}

}  // namespace hyperion::cuda
