// GQA attention, causal or not, forward and backward (kernels/attention.h semantics and layout),
// flash-attention style: no Tq x Tk matrix is stored. One warp per query row (forward,
// dQ) or key row (dK, dV); the other operand streams through shared memory in tiles of
// kTile rows, shared by the block's warps. The backward recomputes the probabilities
// from lse and splits into a dQ pass and a dK/dV pass, so every output element is summed
// by one warp in a fixed order: deterministic, no atomics.
//
// Head dims up to 256 (8 values per lane). This is the portable version, for f32, for
// head dims other than 64 and 128, and for sliding windows and soft-capped scores; bf16
// at those head dims without either runs on the tensor cores (attention_mma.cu).
//
// A window narrows each query's keys to (p - window, p] (p its absolute position), so a
// block starts at its first query's first key and the dK/dV pass stops at its last
// key's last query: the work is the window's band, not the causal triangle. A soft cap
// maps each scaled score s to c = cap * tanh(s / cap); the backward multiplies dS by
// dc/ds = 1 - (c / cap)^2.
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = 8;  // head_dim <= 256

// Rows per shared-memory tile: two (three with the stats) f32 tiles stay within 48 KiB.
__host__ __device__ int tile_rows(int64_t d) {
  return d <= 128 ? 32 : 16;
}

struct Layout {
  int64_t b, tq, tk, hq, hkv, d, group;
  float scale;
  bool causal;
  int64_t window;  // > 0: sliding window (causal only)
  float softcap;   // > 0: capped scores
  // Row offsets (elements) of [B, T, H, D] tensors.
  __device__ int64_t q_row(int64_t bi, int64_t i, int64_t h) const {
    return ((bi * tq + i) * hq + h) * d;
  }
  __device__ int64_t k_row(int64_t bi, int64_t j, int64_t g) const {
    return ((bi * tk + j) * hkv + g) * d;
  }
  // Last key query i sees (inclusive).
  __device__ int64_t last_key(int64_t i) const { return causal ? i + (tk - tq) : tk - 1; }
  // First key query i sees.
  __device__ int64_t first_key(int64_t i) const {
    if (window <= 0) return 0;
    const int64_t f = last_key(i) - window + 1;
    return f < 0 ? 0 : f;
  }
  // First query that sees key j.
  __device__ int64_t first_query(int64_t j) const {
    const int64_t f = causal ? j - (tk - tq) : 0;
    return f < 0 ? 0 : f;
  }
  // Last query that sees key j (inclusive; < first_query(j) when none does).
  __device__ int64_t last_query(int64_t j) const {
    if (window <= 0) return tq - 1;
    const int64_t l = j - (tk - tq) + window - 1;
    return l < tq - 1 ? l : tq - 1;
  }
  // The score of a warp-summed dot product: scaled, then capped.
  __device__ float score(float dot) const {
    const float s = dot * scale;
    return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
  }
  // dS w.r.t. the scaled score, from dS w.r.t. the (capped) score s.
  __device__ float uncap(float ds, float s) const {
    if (softcap <= 0.0f) return ds;
    const float t = s / softcap;
    return ds * (1.0f - t * t);
  }
};

Layout layout_of(const AttentionShape& s) {
  const bool windowed = s.causal && s.window > 0 && s.window < s.tk;
  return Layout{s.b,     s.tq,    s.tk,     s.hq,
                s.hkv,   s.d,     s.hq / s.hkv,
                s.scale, s.causal, windowed ? s.window : 0,
                s.softcap > 0.0f ? s.softcap : 0.0f};
}

// Loads rows [r0, r0 + n) of one head of a [B, T, H, D] tensor into tile[n][d] (f32).
__device__ void load_tile(const void* x, Elem t, int64_t row0_offset, int64_t row_stride, int64_t n,
                          int64_t d, float* tile) {
  for (int64_t idx = threadIdx.x; idx < n * d; idx += blockDim.x) {
    const int64_t r = idx / d, c = idx % d;
    tile[idx] = load(x, t, row0_offset + r * row_stride + c);
  }
}

// The block's next tile of keys and values (rows j0.. of kv head g) into shared memory,
// between barriers; returns the rows loaded.
__device__ int64_t load_kv_tiles(const Layout& L, const void* k, const void* v, Elem t, int64_t bi,
                                 int64_t g, int64_t j0, int tile, float* ks, float* vs) {
  const int64_t n = imin(tile, L.tk - j0), row_stride = L.hkv * L.d;
  __syncthreads();
  load_tile(k, t, L.k_row(bi, j0, g), row_stride, n, L.d, ks);
  load_tile(v, t, L.k_row(bi, j0, g), row_stride, n, L.d, vs);
  __syncthreads();
  return n;
}

__global__ void attention_forward_kernel(Layout L, const void* q, const void* k, const void* v,
                                         Elem t, void* out, Elem ot, float* lse) {
  extern __shared__ float smem[];
  const int tile = tile_rows(L.d);
  float* ks = smem;
  float* vs = smem + tile * L.d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bi = blockIdx.z, h = blockIdx.y, g = h / L.group;
  const int64_t i0 = int64_t(blockIdx.x) * kWarps, i = i0 + warp;
  const bool active = i < L.tq;
  float qv[kMaxPerLane], acc[kMaxPerLane];
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t c = lane + 32 * e;
    qv[e] = active && c < L.d ? load(q, t, L.q_row(bi, i, h) + c) : 0.0f;
    acc[e] = 0;
  }
  float m = -INFINITY, l = 0;
  const int64_t block_last = L.last_key(imin(i0 + kWarps, L.tq) - 1);
  const int64_t my_first = active ? L.first_key(i) : 0;
  const int64_t my_last = active ? L.last_key(i) : -1;
  for (int64_t j0 = L.first_key(i0); j0 <= block_last && j0 < L.tk; j0 += tile) {
    const int64_t n = load_kv_tiles(L, k, v, t, bi, g, j0, tile, ks, vs);
    for (int64_t jj = 0; jj < n && j0 + jj <= my_last; ++jj) {
      if (j0 + jj < my_first) continue;
      float dot = 0;
      for (int e = 0; e < kMaxPerLane; ++e) {
        const int64_t c = lane + 32 * e;
        if (c < L.d) dot += qv[e] * ks[jj * L.d + c];
      }
      const float s = L.score(warp_sum(dot));
      const float m_new = fmaxf(m, s);
      const float corr = __expf(m - m_new), p = __expf(s - m_new);
      l = l * corr + p;
      for (int e = 0; e < kMaxPerLane; ++e) {
        const int64_t c = lane + 32 * e;
        if (c < L.d) acc[e] = acc[e] * corr + p * vs[jj * L.d + c];
      }
      m = m_new;
    }
  }
  if (!active) return;
  const float inv = 1.0f / l;
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t c = lane + 32 * e;
    if (c < L.d) store(out, ot, L.q_row(bi, i, h) + c, acc[e] * inv);
  }
  if (lane == 0) lse[(bi * L.hq + h) * L.tq + i] = m + logf(l);
}

// delta[b, h, i] = sum_c dout * out.
__global__ void attention_delta_kernel(Layout L, const void* out, const void* dout, Elem t,
                                       float* delta) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);  // (b, i, h) order
  if (row >= L.b * L.tq * L.hq) return;
  float dot = 0;
  for (int64_t c = lane; c < L.d; c += 32)
    dot += load(out, t, row * L.d + c) * load(dout, t, row * L.d + c);
  dot = warp_sum(dot);
  const int64_t h = row % L.hq, bi = row / (L.tq * L.hq), i = (row / L.hq) % L.tq;
  if (lane == 0) delta[(bi * L.hq + h) * L.tq + i] = dot;
}

// dq_i = scale * sum_j p_ij (dO_i . v_j - delta_i) k_j.
__global__ void attention_dq_kernel(Layout L, const void* q, const void* k, const void* v,
                                    const void* dout, Elem t, const float* lse, const float* delta,
                                    void* dq, Elem gt) {
  extern __shared__ float smem[];
  const int tile = tile_rows(L.d);
  float* ks = smem;
  float* vs = smem + tile * L.d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bi = blockIdx.z, h = blockIdx.y, g = h / L.group;
  const int64_t i0 = int64_t(blockIdx.x) * kWarps, i = i0 + warp;
  const bool active = i < L.tq;
  float qv[kMaxPerLane], dov[kMaxPerLane], acc[kMaxPerLane];
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t c = lane + 32 * e;
    const bool in = active && c < L.d;
    qv[e] = in ? load(q, t, L.q_row(bi, i, h) + c) : 0.0f;
    dov[e] = in ? load(dout, t, L.q_row(bi, i, h) + c) : 0.0f;
    acc[e] = 0;
  }
  const int64_t stat = (bi * L.hq + h) * L.tq + (active ? i : 0);
  const float row_lse = lse[stat], row_delta = delta[stat];
  const int64_t block_last = L.last_key(imin(i0 + kWarps, L.tq) - 1);
  const int64_t my_first = active ? L.first_key(i) : 0;
  const int64_t my_last = active ? L.last_key(i) : -1;
  for (int64_t j0 = L.first_key(i0); j0 <= block_last && j0 < L.tk; j0 += tile) {
    const int64_t n = load_kv_tiles(L, k, v, t, bi, g, j0, tile, ks, vs);
    for (int64_t jj = 0; jj < n && j0 + jj <= my_last; ++jj) {
      if (j0 + jj < my_first) continue;
      float s = 0, dp = 0;
      for (int e = 0; e < kMaxPerLane; ++e) {
        const int64_t c = lane + 32 * e;
        if (c < L.d) {
          s += qv[e] * ks[jj * L.d + c];
          dp += dov[e] * vs[jj * L.d + c];
        }
      }
      s = L.score(warp_sum(s));
      dp = warp_sum(dp);
      const float ds = L.uncap(__expf(s - row_lse) * (dp - row_delta), s);
      for (int e = 0; e < kMaxPerLane; ++e) {
        const int64_t c = lane + 32 * e;
        if (c < L.d) acc[e] += ds * ks[jj * L.d + c];
      }
    }
  }
  if (!active) return;
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t c = lane + 32 * e;
    if (c < L.d) store(dq, gt, L.q_row(bi, i, h) + c, acc[e] * L.scale);
  }
}

// For key j of kv head g: dv_j = sum_{h in group, i} p_ij dO_i,
// dk_j = scale * sum_{h, i} p_ij (dO_i . v_j - delta_i) q_i.
__global__ void attention_dkv_kernel(Layout L, const void* q, const void* k, const void* v,
                                     const void* dout, Elem t, const float* lse, const float* delta,
                                     void* dk, void* dv, Elem gt) {
  extern __shared__ float smem[];
  const int tile = tile_rows(L.d);
  float* qs = smem;
  float* dos = smem + tile * L.d;
  float* stats = smem + 2 * tile * L.d;  // lse[tile], delta[tile]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bi = blockIdx.z, g = blockIdx.y;
  const int64_t j0k = int64_t(blockIdx.x) * kWarps, j = j0k + warp;
  const bool active = j < L.tk;
  float kv[kMaxPerLane], vv[kMaxPerLane], dka[kMaxPerLane], dva[kMaxPerLane];
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t c = lane + 32 * e;
    const bool in = active && c < L.d;
    kv[e] = in ? load(k, t, L.k_row(bi, j, g) + c) : 0.0f;
    vv[e] = in ? load(v, t, L.k_row(bi, j, g) + c) : 0.0f;
    dka[e] = dva[e] = 0;
  }
  const int64_t block_first = L.first_query(j0k);
  const int64_t block_end = L.last_query(imin(j0k + kWarps, L.tk) - 1) + 1;
  const int64_t my_first = active ? L.first_query(j) : L.tq;
  const int64_t my_last = active ? L.last_query(j) : -1;
  const int64_t row_stride = L.hq * L.d;
  for (int64_t h = g * L.group; h < (g + 1) * L.group; ++h) {
    for (int64_t r0 = block_first; r0 < block_end; r0 += tile) {
      const int64_t n = imin(tile, block_end - r0);
      __syncthreads();
      load_tile(q, t, L.q_row(bi, r0, h), row_stride, n, L.d, qs);
      load_tile(dout, t, L.q_row(bi, r0, h), row_stride, n, L.d, dos);
      for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
        stats[r] = lse[(bi * L.hq + h) * L.tq + r0 + r];
        stats[tile + r] = delta[(bi * L.hq + h) * L.tq + r0 + r];
      }
      __syncthreads();
      for (int64_t ii = 0; ii < n; ++ii) {
        if (r0 + ii < my_first || r0 + ii > my_last) continue;
        float s = 0, dp = 0;
        for (int e = 0; e < kMaxPerLane; ++e) {
          const int64_t c = lane + 32 * e;
          if (c < L.d) {
            s += qs[ii * L.d + c] * kv[e];
            dp += dos[ii * L.d + c] * vv[e];
          }
        }
        s = L.score(warp_sum(s));
        dp = warp_sum(dp);
        const float p = __expf(s - stats[ii]);
        const float ds = L.uncap(p * (dp - stats[tile + ii]), s);
        for (int e = 0; e < kMaxPerLane; ++e) {
          const int64_t c = lane + 32 * e;
          if (c < L.d) {
            dva[e] += p * dos[ii * L.d + c];
            dka[e] += ds * qs[ii * L.d + c];
          }
        }
      }
    }
  }
  if (!active) return;
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t c = lane + 32 * e;
    if (c < L.d) {
      store(dk, gt, L.k_row(bi, j, g) + c, dka[e] * L.scale);
      store(dv, gt, L.k_row(bi, j, g) + c, dva[e]);
    }
  }
}

dim3 grid_of(int64_t rows, int64_t heads, int64_t b) {
  return dim3(static_cast<unsigned>((rows + kWarps - 1) / kWarps), static_cast<unsigned>(heads),
              static_cast<unsigned>(b));
}

size_t tile_bytes(int64_t d) {
  return static_cast<size_t>(2 * tile_rows(d) * d) * sizeof(float);
}

}  // namespace

void attention_forward(cudaStream_t s, const AttentionShape& sh, const void* q, const void* k,
                       const void* v, Elem t, void* out, Elem ot, float* lse) {
  if (sh.b * sh.tq * sh.hq == 0) return;
  if (attention_mma_applies(sh, t, {q, k, v, out})) {
    attention_mma_forward(s, sh, q, k, v, out, ot, lse);
    return;
  }
  attention_forward_kernel<<<grid_of(sh.tq, sh.hq, sh.b), kWarps * 32, tile_bytes(sh.d), s>>>(
      layout_of(sh), q, k, v, t, out, ot, lse);
}

void attention_backward(cudaStream_t s, const AttentionShape& sh, const void* q, const void* k,
                        const void* v, const void* out, const void* dout, Elem t, const float* lse,
                        float* delta, void* dq, void* dk, void* dv, Elem gt) {
  if (sh.b * sh.tq * sh.hq == 0) return;
  const Layout L = layout_of(sh);
  const int64_t rows = sh.b * sh.tq * sh.hq;
  attention_delta_kernel<<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kWarps * 32, 0,
                           s>>>(L, out, dout, t, delta);
  if (attention_mma_applies(sh, t, {q, k, v, out, dout, dq, dk, dv})) {
    attention_mma_backward(s, sh, q, k, v, dout, lse, delta, dq, dk, dv, gt);
    return;
  }
  attention_dq_kernel<<<grid_of(sh.tq, sh.hq, sh.b), kWarps * 32, tile_bytes(sh.d), s>>>(
      L, q, k, v, dout, t, lse, delta, dq, gt);
  const size_t dkv_bytes = tile_bytes(sh.d) + 2 * tile_rows(sh.d) * sizeof(float);
  attention_dkv_kernel<<<grid_of(sh.tk, sh.hkv, sh.b), kWarps * 32, dkv_bytes, s>>>(
      L, q, k, v, dout, t, lse, delta, dk, dv, gt);
}

}  // namespace hyperion::cuda
