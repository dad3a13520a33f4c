// Decode attention over the paged KV cache, split over positions (flash-decoding): the
// GPU form of kernels/paged_attention.h's ragged mode for the common shapes (head_dim 64
// or 128, up to 8 query heads per kv head, f32 / bf16 / int8 pages).
//
// Why: a decode step has few rows, so one warp per (row, head) walking the positions one
// after another (paged.cu) leaves most of the GPU idle and pays a chain of dependent
// global loads per position. Here a block of 4 warps owns (row, kv head, split): every
// query head of the GQA group shares each K and V load, a warp reads 2 or 4 keys per
// instruction (8 elements per lane, 16-byte loads for bf16), and the splits of one row
// run on different multiprocessors. Each split keeps an online softmax over tiles of 32 to
// 128 positions; the splits' (max, sum, accumulator) are merged in split order, so the
// result does not depend on scheduling.
//
// The grid depends on the row count only (the split count is chosen from it): a row's
// effective split count follows its length on the device, so a recorded step (a CUDA
// graph) stays valid as the rows grow. Rows of length 0 (padding) get zeros. One launch:
// the last split of a (row, kv head) to finish merges the others.
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kThreads = 128, kWarpsPerBlock = kThreads / 32;
constexpr int kMaxSplits = 32;  // a warp merges the splits, a lane each
enum : int32_t { kF32 = 0, kBF16 = 1, kI8 = 5 };

// Eight consecutive cache elements of one row, as loaded (so that a lane can have several
// rows' loads in flight before it uses any) and then as f32.
template <int CT>
struct Piece;
template <>
struct Piece<kBF16> {
  uint4 raw;
  __device__ __forceinline__ void load(const void* base, const float*, int64_t row, int64_t i) {
    raw = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(base) + i);
  }
  __device__ __forceinline__ void get(float (&v)[8]) const { bf16x8(raw, v); }
};
template <>
struct Piece<kF32> {
  float4 a, b;
  __device__ __forceinline__ void load(const void* base, const float*, int64_t row, int64_t i) {
    const auto* f4 = reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    a = f4[0];
    b = f4[1];
  }
  __device__ __forceinline__ void get(float (&v)[8]) const {
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
    v[7] = b.w;
  }
};
template <>
struct Piece<kI8> {
  uint2 raw;
  float scale;
  __device__ __forceinline__ void load(const void* base, const float* scales, int64_t row,
                                       int64_t i) {
    raw = *reinterpret_cast<const uint2*>(static_cast<const int8_t*>(base) + i);
    scale = scales[row];
  }
  __device__ __forceinline__ void get(float (&v)[8]) const {
    const auto* b = reinterpret_cast<const int8_t*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = static_cast<float>(b[j]) * scale;
  }
};

// A row's splits: no more than `splits`, none shorter than min_per_split positions.
__device__ __forceinline__ int64_t effective_splits(int64_t span, int splits, int min_per_split) {
  const int64_t want = (span + min_per_split - 1) / min_per_split;
  return want < 1 ? 1 : (want < splits ? want : splits);
}

// One warp merges the eff splits of (row, query head) hw: lane t holds split t's max and
// sum, the weights exp(m_t - max) go round by shuffles, each lane sums its columns over
// the splits in split order.
__device__ __forceinline__ void merge_head(const float* part, int64_t hw, int splits,
                                           int64_t eff, int d, void* out, Elem ot) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = d + 2;
  const float* base = part + hw * splits * stride;
  const float m_t = lane < eff ? __ldcg(base + lane * stride) : -INFINITY;
  const float l_t = lane < eff ? __ldcg(base + lane * stride + 1) : 0.0f;
  const float m = warp_max(m_t);
  const float w_t = m_t == -INFINITY ? 0.0f : __expf(m_t - m);
  const float l = warp_sum(l_t * w_t);
  for (int col = lane; col < d; col += 32) {
    float a = 0.0f;
    for (int t = 0; t < eff; ++t)
      a += __ldcg(base + t * stride + 2 + col) * __shfl_sync(0xffffffffu, w_t, t);
    store(out, ot, hw * d + col, l != 0.0f ? a / l : 0.0f);  // a row with no keys: zeros
  }
}

// Grid (splits, kv heads, rows). D: head_dim; G: query heads per kv head, rounded up to a
// power of two (the group's real size is n_heads / n_kv_heads). Each lane owns 8 columns
// of kPasses positions per tile: their page ids, then their keys (and values) are loaded
// before any is used, so a tile costs a few memory latencies rather than one per position.
// With several splits, the last block of a (row, kv head) to finish merges the splits'
// partials in split order (counters: one per (row, kv head), left at zero).
template <int D, int G, int CT>
__global__ void __launch_bounds__(kThreads, G >= 8 ? 2 : 3)
    paged_decode_kernel(PagedCacheArgs c, const void* q, Elem qt, int64_t n_heads,
                        const int32_t* pages, const int64_t* page_start, const int64_t* lengths,
                        PagedScores sc, int splits, int min_per_split, float* part,
                        int* counters, void* out, Elem ot, DeviceError* err) {
  constexpr int kLanesPerRow = D / 8;
  constexpr int kRowsPerWarp = 32 / kLanesPerRow;
  constexpr int kRowsPerPass = kRowsPerWarp * kWarpsPerBlock;
  // Loads in flight per lane: fewer where the registers are taken (8 query heads, f32).
  constexpr int kPasses = (G >= 8 || CT == kF32) ? 4 : 8;
  constexpr int kTile = kRowsPerPass * kPasses;
  constexpr bool kEarlyV = CT != kF32;  // values loaded with the keys
  __shared__ float s_score[G][kTile];
  __shared__ float s_m[G], s_l[G], s_corr[G];
  __shared__ float s_acc[kWarpsPerBlock][G][D];
  __shared__ int s_last;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lg = lane / kLanesPerRow, sub = lane % kLanesPerRow;
  const int64_t r = blockIdx.z, h = blockIdx.y;
  const int split = static_cast<int>(blockIdx.x);
  const int group = static_cast<int>(n_heads / c.n_kv_heads);
  const int64_t head0 = r * n_heads + h * group;  // the group's first (row, query head)
  const int64_t len = lengths[r];
  const int64_t first = sc.window > 0 && len > sc.window ? len - sc.window : 0;
  const int64_t span = len - first;
  const int64_t eff = effective_splits(span, splits, min_per_split);
  if (split >= eff && splits > 1) return;  // the merge reads only the effective splits
  const int64_t per = (span + eff - 1) / eff;
  const int64_t lo = first + split * per;
  const int64_t hi = imin(len, lo + per);
  const int32_t* table = pages + (len > 0 ? page_start[r] : 0);
  const int64_t pt = c.page_tokens;

  float qv[G][8], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      qv[g][j] = g < group ? load(q, qt, (head0 + g) * D + sub * 8 + j) : 0.0f;
      acc[g][j] = 0.0f;
    }
  if (threadIdx.x < G) {
    s_m[threadIdx.x] = -INFINITY;
    s_l[threadIdx.x] = 0.0f;
  }
  __syncthreads();

  for (int64_t t0 = lo; t0 < hi; t0 += kTile) {
    const int tn = static_cast<int>(imin(kTile, hi - t0));
    // This lane's positions of the tile: pass ps holds tile row ps * kRowsPerPass + ...
    int32_t row[kPasses];  // cache rows fit (paged_decode_applies)
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      const int i = ps * kRowsPerPass + warp * kRowsPerWarp + lg;
      row[ps] = -1;
      if (i < tn) {
        const int64_t p = t0 + i;
        const int32_t page = table[p / pt];
        if (page >= 0 && page < c.num_pages)
          row[ps] = static_cast<int32_t>((int64_t(page) * c.n_kv_heads + h) * pt + p % pt);
        else if (sub == 0)
          record_error(err, kPageOutOfRange, r, page, c.num_pages);
      }
    }
    Piece<CT> kp[kPasses], vp[kEarlyV ? kPasses : 1];
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps)
      if (row[ps] >= 0) {
        kp[ps].load(c.k, c.k_scale, row[ps], int64_t(row[ps]) * D + sub * 8);
        if constexpr (kEarlyV) vp[ps].load(c.v, c.v_scale, row[ps], int64_t(row[ps]) * D + sub * 8);
      }
    // Scores: every lane runs every pass (the shuffles need the whole warp).
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      const int i = ps * kRowsPerPass + warp * kRowsPerWarp + lg;
      float kv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (row[ps] >= 0) kp[ps].get(kv);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) dot += qv[g][j] * kv[j];
#pragma unroll
        for (int o = kLanesPerRow / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (i < tn && sub == 0 && g < group) {
          float sv = dot * sc.scale;
          if (sc.softcap > 0.0f) sv = sc.softcap * tanhf(sv / sc.softcap);
          s_score[g][i] = row[ps] >= 0 ? sv : -INFINITY;
        }
      }
    }
    __syncthreads();
    // The tile's softmax, one warp per query head.
    for (int g = warp; g < group; g += kWarpsPerBlock) {
      float mx = -INFINITY;
      for (int i = lane; i < tn; i += 32) mx = fmaxf(mx, s_score[g][i]);
      mx = warp_max(mx);
      const float m_old = s_m[g], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int i = lane; i < tn; i += 32) {
        // Masked positions weigh 0; a NaN score stays NaN (as on the host), even when
        // every score is NaN and m_new is still -inf.
        const float sv = s_score[g][i];
        const float pr = sv == -INFINITY ? 0.0f : __expf(sv - m_new);
        s_score[g][i] = pr;
        sum += pr;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float corr = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
        s_corr[g] = corr;
        s_l[g] = s_l[g] * corr + sum;
        s_m[g] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float corr = g < group ? s_corr[g] : 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[g][j] *= corr;
    }
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      if (row[ps] < 0) continue;
      const int i = ps * kRowsPerPass + warp * kRowsPerWarp + lg;
      float vv[8];
      if constexpr (kEarlyV) {
        vp[ps].get(vv);
      } else {
        Piece<CT> v;
        v.load(c.v, c.v_scale, row[ps], int64_t(row[ps]) * D + sub * 8);
        v.get(vv);
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float pr = g < group ? s_score[g][i] : 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] += pr * vv[j];
      }
    }
    __syncthreads();  // the next tile rewrites s_score
  }

  // Sum the lane groups of each warp (lanes with the same columns), then the warps.
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float a = acc[g][j];
#pragma unroll
      for (int o = kLanesPerRow; o < 32; o <<= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lg == 0) s_acc[warp][g][sub * 8 + j] = a;
    }
  __syncthreads();
  const int64_t stride = D + 2;  // one split's partial of one head: m, l, D sums
  for (int idx = threadIdx.x; idx < group * D; idx += kThreads) {
    const int g = idx / D, col = idx % D;
    float a = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarpsPerBlock; ++w) a += s_acc[w][g][col];
    if (splits == 1) {
      const float l = s_l[g];
      store(out, ot, (head0 + g) * D + col, l != 0.0f ? a / l : 0.0f);  // NaN stays NaN
    } else {
      part[((head0 + g) * splits + split) * stride + 2 + col] = a;
    }
  }
  if (splits == 1) return;
  if (threadIdx.x < group) {
    float* ml = part + ((head0 + threadIdx.x) * splits + split) * stride;
    ml[0] = s_m[threadIdx.x];
    ml[1] = s_l[threadIdx.x];
  }
  if (counters == nullptr) return;  // merged by paged_decode_merge_kernel
  // The last split of this (row, kv head) to finish merges all of them, in split order.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int done = atomicAdd(counters + r * c.n_kv_heads + h, 1);
    s_last = done == eff - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int g = warp; g < group; g += kWarpsPerBlock) merge_head(part, head0 + g, splits, eff, D, out, ot);
  if (threadIdx.x == 0) counters[r * c.n_kv_heads + h] = 0;  // ready for the next launch
}

// One warp per (row, query head): the splits' partials merged in split order.
__global__ void paged_decode_merge_kernel(const float* part, const int64_t* lengths,
                                          int64_t n_rows, int64_t n_heads, int d, int splits,
                                          int min_per_split, int64_t window, void* out, Elem ot) {
  const int64_t hw = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (hw >= n_rows * n_heads) return;
  const int64_t len = lengths[hw / n_heads];
  const int64_t first = window > 0 && len > window ? len - window : 0;
  if (len == 0) {
    for (int col = threadIdx.x & 31; col < d; col += 32) store(out, ot, hw * d + col, 0.0f);
    return;
  }
  merge_head(part, hw, splits, effective_splits(len - first, splits, min_per_split), d, out, ot);
}

template <int D, int G>
void launch_for_cache(cudaStream_t s, dim3 grid, const PagedCacheArgs& c, const void* q, Elem qt,
                      int64_t n_heads, const int32_t* pages, const int64_t* page_start,
                      const int64_t* lengths, const PagedScores& sc, int splits,
                      int min_per_split, float* part, int* counters, void* out, Elem ot,
                      DeviceError* err) {
  if (c.dtype == kBF16)
    paged_decode_kernel<D, G, kBF16><<<grid, kThreads, 0, s>>>(
        c, q, qt, n_heads, pages, page_start, lengths, sc, splits, min_per_split, part, counters,
        out, ot, err);
  else if (c.dtype == kF32)
    paged_decode_kernel<D, G, kF32><<<grid, kThreads, 0, s>>>(
        c, q, qt, n_heads, pages, page_start, lengths, sc, splits, min_per_split, part, counters,
        out, ot, err);
  else
    paged_decode_kernel<D, G, kI8><<<grid, kThreads, 0, s>>>(
        c, q, qt, n_heads, pages, page_start, lengths, sc, splits, min_per_split, part, counters,
        out, ot, err);
}

template <int D>
void launch_for_dim(cudaStream_t s, dim3 grid, int group, const PagedCacheArgs& c, const void* q,
                    Elem qt, int64_t n_heads, const int32_t* pages, const int64_t* page_start,
                    const int64_t* lengths, const PagedScores& sc, int splits,
                    int min_per_split, float* part, int* counters, void* out, Elem ot,
                    DeviceError* err) {
  if (group <= 1)
    launch_for_cache<D, 1>(s, grid, c, q, qt, n_heads, pages, page_start, lengths, sc, splits,
                           min_per_split, part, counters, out, ot, err);
  else if (group <= 2)
    launch_for_cache<D, 2>(s, grid, c, q, qt, n_heads, pages, page_start, lengths, sc, splits,
                           min_per_split, part, counters, out, ot, err);
  else if (group <= 4)
    launch_for_cache<D, 4>(s, grid, c, q, qt, n_heads, pages, page_start, lengths, sc, splits,
                           min_per_split, part, counters, out, ot, err);
  else
    launch_for_cache<D, 8>(s, grid, c, q, qt, n_heads, pages, page_start, lengths, sc, splits,
                           min_per_split, part, counters, out, ot, err);
}

}  // namespace

bool paged_decode_applies(const PagedCacheArgs& c, int64_t n_heads) {
  const int64_t group = c.n_kv_heads > 0 ? n_heads / c.n_kv_heads : 0;
  return (c.head_dim == 64 || c.head_dim == 128) && group >= 1 && group <= 8 &&
         n_heads % c.n_kv_heads == 0 && c.num_pages * c.n_kv_heads * c.page_tokens < (1LL << 31) &&
         (c.dtype == kF32 || c.dtype == kBF16 || c.dtype == kI8);
}

int paged_decode_splits(int64_t n_rows, int64_t n_kv_heads, int multiprocessors,
                        int blocks_per_multiprocessor) {
  const int64_t blocks = n_rows * n_kv_heads,
                target = int64_t(blocks_per_multiprocessor) * multiprocessors;
  if (blocks <= 0 || blocks >= target) return 1;
  const int64_t want = (target + blocks - 1) / blocks;
  return static_cast<int>(want < kMaxSplits ? want : kMaxSplits);
}

size_t paged_decode_scratch_bytes(int64_t n_rows, int64_t n_heads, int64_t head_dim, int splits) {
  return splits <= 1 ? 0
                     : static_cast<size_t>(n_rows * n_heads * splits * (head_dim + 2)) *
                           sizeof(float);
}

void paged_decode(cudaStream_t s, const PagedCacheArgs& c, const void* q, Elem qt, int64_t n_rows,
                  int64_t n_heads, const int32_t* pages, const int64_t* page_start,
                  const int64_t* lengths, const PagedScores& sc, int splits, int min_per_split,
                  float* scratch, int* counters, void* out, Elem ot, DeviceError* err) {
  if (n_rows <= 0) return;
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(c.n_kv_heads),
                  static_cast<unsigned>(n_rows));
  const int group = static_cast<int>(n_heads / c.n_kv_heads);
  if (c.head_dim == 64)
    launch_for_dim<64>(s, grid, group, c, q, qt, n_heads, pages, page_start, lengths, sc, splits,
                       min_per_split, scratch, counters, out, ot, err);
  else
    launch_for_dim<128>(s, grid, group, c, q, qt, n_heads, pages, page_start, lengths, sc, splits,
                        min_per_split, scratch, counters, out, ot, err);
  if (splits > 1 && counters == nullptr) {
    const int64_t warps = n_rows * n_heads;
    paged_decode_merge_kernel<<<static_cast<unsigned>((warps + 3) / 4), 128, 0, s>>>(
        scratch, lengths, n_rows, n_heads, static_cast<int>(c.head_dim), splits, min_per_split,
        sc.window, out, ot);
  }
}

}  // namespace hyperion::cuda
