// The paged KV cache (kernels/paged_attention.h layout and semantics): writes (f32, bf16,
// or int8 with one absmax scale per (token, kv head) row), reads back into contiguous
// rows, and ragged decode attention with one warp per (row, query head) streaming the
// row's pages with an online softmax: the general case (any head_dim up to 256, any GQA
// group); paged_decode.cu is the fast one for the common shapes. Slots < 0 (padding rows
// of a step's tables) write nothing; rows of length 0 get zeros. Page tables arrive in device memory (the backend
// uploads the host's tables for each call). With a sliding window a row starts at its
// window's first key: the pages before it are neither read nor looked up (they may have
// been released).
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kWarps = 4;
enum : int32_t { kF32 = 0, kBF16 = 1, kI8 = 5 };

__device__ int64_t cache_row(const PagedCacheArgs& c, int64_t slot, int64_t h) {
  const int64_t page = slot / c.page_tokens, off = slot % c.page_tokens;
  return (page * c.n_kv_heads + h) * c.page_tokens + off;  // row index; times head_dim
}

__device__ float cache_load(const void* base, const float* scales, int32_t dtype, int64_t row,
                            int64_t hd, int64_t col) {
  const int64_t i = row * hd + col;
  if (dtype == kF32) return static_cast<const float*>(base)[i];
  if (dtype == kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  return static_cast<float>(static_cast<const int8_t*>(base)[i]) * scales[row];
}

// One warp writes one (token, kv head) row of K and of V.
__device__ void write_row(const PagedCacheArgs& c, void* base, float* scales, const void* src,
                          Elem t, int64_t src_row, int64_t row) {
  const int lane = threadIdx.x & 31;
  const int64_t hd = c.head_dim;
  if (c.dtype != kI8) {
    for (int64_t col = lane; col < hd; col += 32) {
      const float v = load(src, t, src_row * hd + col);
      if (c.dtype == kF32)
        static_cast<float*>(base)[row * hd + col] = v;
      else
        static_cast<__nv_bfloat16*>(base)[row * hd + col] = __float2bfloat16_rn(v);
    }
    return;
  }
  float amax = 0;
  for (int64_t col = lane; col < hd; col += 32) {
    const float v = fabsf(load(src, t, src_row * hd + col));
    amax = (v > amax || v != v) ? v : amax;  // NaN wins, as on the host
  }
  amax = warp_max(amax);
  const float scale = amax / 127.0f;
  const bool zero_row = !isfinite(amax) || scale == 0.0f;
  for (int64_t col = lane; col < hd; col += 32) {
    float q = 0;
    if (!zero_row)
      q = fminf(fmaxf(rintf(load(src, t, src_row * hd + col) / scale), -127.0f), 127.0f);
    static_cast<int8_t*>(base)[row * hd + col] = static_cast<int8_t>(q);
  }
  if (lane == 0) scales[row] = scale;
}

__global__ void paged_write_kernel(PagedCacheArgs c, const void* k, const void* v, Elem t,
                                   const int64_t* slots, int64_t n, DeviceError* err) {
  const int64_t w = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (w >= n * c.n_kv_heads) return;
  const int64_t i = w / c.n_kv_heads, h = w % c.n_kv_heads;
  const int64_t slot = slots[i];
  if (slot < 0) return;  // a padding row of a step's tables
  if (slot >= c.num_pages * c.page_tokens) {
    if ((threadIdx.x & 31) == 0 && h == 0)
      record_error(err, kSlotOutOfRange, i, slot, c.num_pages * c.page_tokens);
    return;
  }
  const int64_t row = cache_row(c, slot, h);
  write_row(c, c.k, c.k_scale, k, t, w, row);
  write_row(c, c.v, c.v_scale, v, t, w, row);
}

__global__ void paged_read_kernel(PagedCacheArgs c, const int32_t* pages, int64_t length, void* k,
                                  void* v, Elem t) {
  const int64_t total = length * c.n_kv_heads * c.head_dim;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t col = idx % c.head_dim, h = (idx / c.head_dim) % c.n_kv_heads,
                  p = idx / (c.head_dim * c.n_kv_heads);
    const int64_t slot = int64_t(pages[p / c.page_tokens]) * c.page_tokens + p % c.page_tokens;
    const int64_t row = cache_row(c, slot, h);
    store(k, t, idx, cache_load(c.k, c.k_scale, c.dtype, row, c.head_dim, col));
    store(v, t, idx, cache_load(c.v, c.v_scale, c.dtype, row, c.head_dim, col));
  }
}

constexpr int kMaxPerLane = 8;
__global__ void paged_attention_kernel(PagedCacheArgs c, const void* q, Elem qt, int64_t n_rows,
                                       int64_t n_heads, const int32_t* pages,
                                       const int64_t* page_offset, const int64_t* lengths,
                                       PagedScores sc, void* out, Elem ot, DeviceError* err) {
  const int lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (w >= n_rows * n_heads) return;
  const int64_t r = w / n_heads, h = w % n_heads, g = h / (n_heads / c.n_kv_heads);
  const int64_t hd = c.head_dim;
  float qv[kMaxPerLane], acc[kMaxPerLane];
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t col = lane + 32 * e;
    qv[e] = col < hd ? load(q, qt, w * hd + col) : 0.0f;
    acc[e] = 0;
  }
  float m = -INFINITY, l = 0;
  const int32_t* table = pages + page_offset[r];
  const int64_t first = sc.window > 0 && lengths[r] > sc.window ? lengths[r] - sc.window : 0;
  for (int64_t p = first; p < lengths[r]; ++p) {
    const int32_t page = table[p / c.page_tokens];
    if (page < 0 || page >= c.num_pages) {
      if (lane == 0) record_error(err, kPageOutOfRange, r, page, c.num_pages);
      return;
    }
    const int64_t row = cache_row(c, int64_t(page) * c.page_tokens + p % c.page_tokens, g);
    float dot = 0;
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int64_t col = lane + 32 * e;
      if (col < hd) dot += qv[e] * cache_load(c.k, c.k_scale, c.dtype, row, hd, col);
    }
    float s = warp_sum(dot) * sc.scale;
    if (sc.softcap > 0.0f) s = sc.softcap * tanhf(s / sc.softcap);
    const float m_new = fmaxf(m, s), corr = __expf(m - m_new), pr = __expf(s - m_new);
    l = l * corr + pr;
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int64_t col = lane + 32 * e;
      if (col < hd) acc[e] = acc[e] * corr + pr * cache_load(c.v, c.v_scale, c.dtype, row, hd, col);
    }
    m = m_new;
  }
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t col = lane + 32 * e;
    if (col < hd) store(out, ot, w * hd + col, l != 0.0f ? acc[e] / l : 0.0f);  // length 0: zeros
  }
}

}  // namespace

void paged_kv_write(cudaStream_t s, const PagedCacheArgs& c, const void* k, const void* v, Elem t,
                    const int64_t* slots, int64_t n, DeviceError* err) {
  const int64_t warps = n * c.n_kv_heads;
  if (warps <= 0) return;
  paged_write_kernel<<<static_cast<unsigned>((warps + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(
      c, k, v, t, slots, n, err);
}

void paged_kv_read(cudaStream_t s, const PagedCacheArgs& c, const int32_t* pages, int64_t length,
                   void* k, void* v, Elem t) {
  const int64_t total = length * c.n_kv_heads * c.head_dim;
  if (total <= 0) return;
  paged_read_kernel<<<blocks_for(total, 256), 256, 0, s>>>(c, pages, length, k, v, t);
}

void paged_attention(cudaStream_t s, const PagedCacheArgs& c, const void* q, Elem qt,
                     int64_t n_rows, int64_t n_heads, const int32_t* pages,
                     const int64_t* page_offset, const int64_t* lengths, const PagedScores& scores,
                     void* out, Elem ot, DeviceError* err) {
  const int64_t warps = n_rows * n_heads;
  if (warps <= 0) return;
  paged_attention_kernel<<<static_cast<unsigned>((warps + kWarps - 1) / kWarps), kWarps * 32, 0,
                           s>>>(c, q, qt, n_rows, n_heads, pages, page_offset, lengths, scores, out,
                                ot, err);
}

}  // namespace hyperion::cuda
