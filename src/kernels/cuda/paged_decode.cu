// Decode attention over the paged KV cache, split over positions (flash-decoding): the
// GPU form of kernels/paged_attention.h's ragged mode for the common shapes (head_dim 64
// or 128, up to 8 query heads per kv head, f32 / bf16 / int8 pages).
//
// Why: a decode step has few rows, so one warp per (row, head) walking the positions one
// after another (paged.cu) leaves most of the GPU idle and pays a chain of dependent
// global loads per position. Here a block of 4 warps owns (row, kv head, split): every
// query head of the GQA group shares each K and V load, a warp reads 2 or 4 keys per
// instruction (8 elements per lane, 16-byte loads for bf16), and the splits of one row
// run on different multiprocessors. Each split keeps an online softmax over tiles of 128
// positions; a second kernel merges the splits' (max, sum, accumulator) in split order, so
// the result does not depend on scheduling.
//
// The grid depends on the row count only (the split count is chosen from it): a row's
// effective split count follows its length on the device, so a recorded step (a CUDA
// graph) stays valid as the rows grow. Rows of length 0 (padding) get zeros.
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kThreads = 128, kWarpsPerBlock = kThreads / 32;
constexpr int kTile = 128;         // positions per online-softmax step
constexpr int kMinPerSplit = 32;   // a split shorter than this is not worth its partials
constexpr int kMaxSplits = 32;
enum : int32_t { kF32 = 0, kBF16 = 1, kI8 = 5 };

// Eight consecutive cache elements of row `row` from column `col`, as f32.
template <int CT>
__device__ __forceinline__ void load8_cache(const void* base, const float* scales, int64_t row,
                                            int64_t d, int64_t col, float (&v)[8]) {
  const int64_t i = row * d + col;
  if constexpr (CT == kBF16) {
    load8(base, Elem::kBF16, i, v);
  } else if constexpr (CT == kF32) {
    load8(base, Elem::kF32, i, v);
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const int8_t*>(base) + i);
    const auto* b = reinterpret_cast<const int8_t*>(&raw);
    const float s = scales[row];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = static_cast<float>(b[j]) * s;
  }
}

__device__ __forceinline__ int64_t effective_splits(int64_t span, int splits) {
  const int64_t want = (span + kMinPerSplit - 1) / kMinPerSplit;
  return want < 1 ? 1 : (want < splits ? want : splits);
}

// Grid (splits, kv heads, rows). D: head_dim; G: query heads per kv head, rounded up to a
// power of two (the group's real size is n_heads / n_kv_heads).
template <int D, int G, int CT>
__global__ void __launch_bounds__(kThreads)
    paged_decode_kernel(PagedCacheArgs c, const void* q, Elem qt, int64_t n_heads,
                        const int32_t* pages, const int64_t* page_start, const int64_t* lengths,
                        PagedScores sc, int splits, float* part, void* out, Elem ot,
                        DeviceError* err) {
  constexpr int kLanesPerRow = D / 8;
  constexpr int kRowsPerWarp = 32 / kLanesPerRow;
  constexpr int kRowsPerPass = kRowsPerWarp * kWarpsPerBlock;
  __shared__ float s_score[G][kTile];
  __shared__ int64_t s_row[kTile];
  __shared__ float s_m[G], s_l[G], s_corr[G];
  __shared__ float s_acc[kWarpsPerBlock][G][D];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lg = lane / kLanesPerRow, sub = lane % kLanesPerRow;
  const int64_t r = blockIdx.z, h = blockIdx.y;
  const int split = static_cast<int>(blockIdx.x);
  const int group = static_cast<int>(n_heads / c.n_kv_heads);
  const int64_t head0 = r * n_heads + h * group;  // the group's first (row, query head)
  const int64_t len = lengths[r];
  const int64_t first = sc.window > 0 && len > sc.window ? len - sc.window : 0;
  const int64_t span = len - first;
  const int64_t eff = effective_splits(span, splits);
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
    // Scores: each group of kLanesPerRow lanes takes one position per pass; every lane
    // runs every pass (the shuffles need the whole warp).
    for (int base = warp * kRowsPerWarp; base < tn; base += kRowsPerPass) {
      const int i = base + lg;
      const bool in = i < tn;
      float kv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t row = -1;
      if (in) {
        const int64_t p = t0 + i;
        const int32_t page = table[p / pt];
        if (page >= 0 && page < c.num_pages) {
          row = (int64_t(page) * c.n_kv_heads + h) * pt + p % pt;
          load8_cache<CT>(c.k, c.k_scale, row, D, sub * 8, kv);
        } else if (sub == 0) {
          record_error(err, kPageOutOfRange, r, page, c.num_pages);
        }
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) dot += qv[g][j] * kv[j];
#pragma unroll
        for (int o = kLanesPerRow / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (in && sub == 0 && g < group) {
          float s = dot * sc.scale;
          if (sc.softcap > 0.0f) s = sc.softcap * tanhf(s / sc.softcap);
          s_score[g][i] = row >= 0 ? s : -INFINITY;
        }
      }
      if (in && sub == 0) s_row[i] = row;
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
        const float pr = m_new == -INFINITY ? 0.0f : __expf(s_score[g][i] - m_new);
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
    for (int base = warp * kRowsPerWarp; base < tn; base += kRowsPerPass) {
      const int i = base + lg;
      if (i >= tn || s_row[i] < 0) continue;
      float vv[8];
      load8_cache<CT>(c.v, c.v_scale, s_row[i], D, sub * 8, vv);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float pr = g < group ? s_score[g][i] : 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] += pr * vv[j];
      }
    }
    __syncthreads();  // the next tile rewrites s_score and s_row
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
  for (int idx = threadIdx.x; idx < group * D; idx += kThreads) {
    const int g = idx / D, col = idx % D;
    float a = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarpsPerBlock; ++w) a += s_acc[w][g][col];
    if (splits == 1) {
      const float l = s_l[g];
      store(out, ot, (head0 + g) * D + col, l > 0.0f ? a / l : 0.0f);
    } else {
      part[((head0 + g) * splits + split) * (D + 2) + 2 + col] = a;
    }
  }
  if (splits > 1 && threadIdx.x < group) {
    float* ml = part + ((head0 + threadIdx.x) * splits + split) * (D + 2);
    ml[0] = s_m[threadIdx.x];
    ml[1] = s_l[threadIdx.x];
  }
}

// One warp per (row, query head): the splits' partials merged in split order.
__global__ void paged_decode_merge_kernel(const float* part, const int64_t* lengths,
                                          int64_t n_rows, int64_t n_heads, int64_t d,
                                          int splits, int64_t window, void* out, Elem ot) {
  const int lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (w >= n_rows * n_heads) return;
  const int64_t len = lengths[w / n_heads];
  const int64_t first = window > 0 && len > window ? len - window : 0;
  const int64_t eff = len > 0 ? effective_splits(len - first, splits) : 0;
  const float* base = part + w * splits * (d + 2);
  float m = -INFINITY;
  for (int64_t s = 0; s < eff; ++s) m = fmaxf(m, base[s * (d + 2)]);
  float l = 0.0f;
  for (int64_t s = 0; s < eff; ++s) {
    const float ms = base[s * (d + 2)];
    if (ms != -INFINITY) l += base[s * (d + 2) + 1] * __expf(ms - m);
  }
  for (int64_t col = lane; col < d; col += 32) {
    float a = 0.0f;
    for (int64_t s = 0; s < eff; ++s) {
      const float ms = base[s * (d + 2)];
      if (ms != -INFINITY) a += base[s * (d + 2) + 2 + col] * __expf(ms - m);
    }
    store(out, ot, w * d + col, l > 0.0f ? a / l : 0.0f);
  }
}

template <int D, int G>
void launch_for_cache(cudaStream_t s, dim3 grid, const PagedCacheArgs& c, const void* q, Elem qt,
                      int64_t n_heads, const int32_t* pages, const int64_t* page_start,
                      const int64_t* lengths, const PagedScores& sc, int splits, float* part,
                      void* out, Elem ot, DeviceError* err) {
  if (c.dtype == kBF16)
    paged_decode_kernel<D, G, kBF16><<<grid, kThreads, 0, s>>>(
        c, q, qt, n_heads, pages, page_start, lengths, sc, splits, part, out, ot, err);
  else if (c.dtype == kF32)
    paged_decode_kernel<D, G, kF32><<<grid, kThreads, 0, s>>>(
        c, q, qt, n_heads, pages, page_start, lengths, sc, splits, part, out, ot, err);
  else
    paged_decode_kernel<D, G, kI8><<<grid, kThreads, 0, s>>>(
        c, q, qt, n_heads, pages, page_start, lengths, sc, splits, part, out, ot, err);
}

template <int D>
void launch_for_dim(cudaStream_t s, dim3 grid, int group, const PagedCacheArgs& c, const void* q,
                    Elem qt, int64_t n_heads, const int32_t* pages, const int64_t* page_start,
                    const int64_t* lengths, const PagedScores& sc, int splits, float* part,
                    void* out, Elem ot, DeviceError* err) {
  if (group <= 1)
    launch_for_cache<D, 1>(s, grid, c, q, qt, n_heads, pages, page_start, lengths, sc, splits,
                           part, out, ot, err);
  else if (group <= 2)
    launch_for_cache<D, 2>(s, grid, c, q, qt, n_heads, pages, page_start, lengths, sc, splits,
                           part, out, ot, err);
  else if (group <= 4)
    launch_for_cache<D, 4>(s, grid, c, q, qt, n_heads, pages, page_start, lengths, sc, splits,
                           part, out, ot, err);
  else
    launch_for_cache<D, 8>(s, grid, c, q, qt, n_heads, pages, page_start, lengths, sc, splits,
                           part, out, ot, err);
}

}  // namespace

bool paged_decode_applies(const PagedCacheArgs& c, int64_t n_heads) {
  const int64_t group = c.n_kv_heads > 0 ? n_heads / c.n_kv_heads : 0;
  return (c.head_dim == 64 || c.head_dim == 128) && group >= 1 && group <= 8 &&
         n_heads % c.n_kv_heads == 0 &&
         (c.dtype == kF32 || c.dtype == kBF16 || c.dtype == kI8);
}

int paged_decode_splits(int64_t n_rows, int64_t n_kv_heads, int multiprocessors) {
  const int64_t blocks = n_rows * n_kv_heads;
  if (blocks <= 0 || blocks >= multiprocessors) return 1;
  const int64_t want = (2 * int64_t(multiprocessors) + blocks - 1) / blocks;
  return static_cast<int>(want < kMaxSplits ? want : kMaxSplits);
}

size_t paged_decode_scratch_bytes(int64_t n_rows, int64_t n_heads, int64_t head_dim, int splits) {
  return splits <= 1 ? 0
                     : static_cast<size_t>(n_rows * n_heads * splits * (head_dim + 2)) *
                           sizeof(float);
}

void paged_decode(cudaStream_t s, const PagedCacheArgs& c, const void* q, Elem qt, int64_t n_rows,
                  int64_t n_heads, const int32_t* pages, const int64_t* page_start,
                  const int64_t* lengths, const PagedScores& sc, int splits, float* scratch,
                  void* out, Elem ot, DeviceError* err) {
  if (n_rows <= 0) return;
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(c.n_kv_heads),
                  static_cast<unsigned>(n_rows));
  const int group = static_cast<int>(n_heads / c.n_kv_heads);
  if (c.head_dim == 64)
    launch_for_dim<64>(s, grid, group, c, q, qt, n_heads, pages, page_start, lengths, sc, splits,
                       scratch, out, ot, err);
  else
    launch_for_dim<128>(s, grid, group, c, q, qt, n_heads, pages, page_start, lengths, sc, splits,
                        scratch, out, ot, err);
  if (splits > 1) {
    const int64_t warps = n_rows * n_heads;
    paged_decode_merge_kernel<<<static_cast<unsigned>((warps + 3) / 4), 128, 0, s>>>(
        scratch, lengths, n_rows, n_heads, c.head_dim, splits, sc.window, out, ot);
  }
}

}  // namespace hyperion::cuda
