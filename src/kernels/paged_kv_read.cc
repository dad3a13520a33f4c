// paged_kv_read: a sequence's cached keys and values back into contiguous rows (see
// paged_attention.h). One (token, kv head) row of head_dim values at a time, tokens
// split across threads; bandwidth-bound, the conversions vectorise.
#include <cstring>

#include "base/error.h"
#include "base/threads.h"
#include "kernels/paged_attention.h"
#include "tensor/convert.h"

namespace hyperion {

namespace {

void read_row(const PagedKvCache& c, const void* base, const float* scales, int64_t slot, void* dst,
              DType dd) {
  const int64_t d = c.head_dim;
  const unsigned char* src =
      static_cast<const unsigned char*>(base) + slot * d * int64_t(dtype_size(c.dtype));
  if (c.dtype == dd) {
    std::memcpy(dst, src, size_t(d) * dtype_size(dd));
    return;
  }
  if (c.dtype == DType::kF32) {  // dd bf16
    convert_f32_to_bf16(reinterpret_cast<const float*>(src), static_cast<bf16*>(dst), size_t(d));
    return;
  }
  if (c.dtype == DType::kBF16) {  // dd f32
    convert_bf16_to_f32(reinterpret_cast<const bf16*>(src), static_cast<float*>(dst), size_t(d));
    return;
  }
  float row[1024];
  float* f = dd == DType::kF32 ? static_cast<float*>(dst) : row;
  const float s = scales[slot];
  if (c.dtype == DType::kI8) {
    const int8_t* q = reinterpret_cast<const int8_t*>(src);
    for (int64_t i = 0; i < d; ++i) f[i] = float(q[i]) * s;
  } else {
    const fp8_e4m3* q = reinterpret_cast<const fp8_e4m3*>(src);
    for (int64_t i = 0; i < d; ++i) f[i] = e4m3_to_f32(q[i]) * s;
  }
  if (dd == DType::kBF16) convert_f32_to_bf16(f, static_cast<bf16*>(dst), size_t(d));
}

}  // namespace

void paged_kv_read(const PagedKvCache& cache, const int32_t* pages, int64_t length,
                   const TensorView& k, const TensorView& v) {
  const char* op = "paged_kv_read";
  const int64_t hkv = cache.n_kv_heads, d = cache.head_dim, pt = cache.page_tokens;
  HYP_CHECK(pages != nullptr && length >= 1, "{}: needs a page table and length >= 1", op);
  HYP_CHECK(d <= 1024, "{}: head_dim {} above 1024", op, d);
  for (const TensorView* t : {&k, &v}) {
    HYP_CHECK(t->dtype == DType::kF32 || t->dtype == DType::kBF16,
              "{}: outputs must be f32 or bf16, got {}", op, t->str());
    HYP_CHECK(t->rank() == 3 && t->shape[0] == length && t->shape[1] == hkv && t->shape[2] == d &&
                  t->is_contiguous(),
              "{}: output {} must be contiguous [{}, {}, {}]", op, t->str(), length, hkv, d);
  }
  const int64_t n_pages = (length + pt - 1) / pt;
  for (int64_t p = 0; p < n_pages; ++p)
    HYP_CHECK(pages[p] >= 0 && pages[p] < cache.num_pages, "{}: page {} (entry {}) outside [0, {})",
              op, pages[p], p, cache.num_pages);
  const size_t ks = dtype_size(k.dtype), vs = dtype_size(v.dtype);
  const int64_t grain = std::max<int64_t>(1, 4096 / (hkv * d));
  parallel_chunks(length, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < hkv; ++h) {
        const int64_t slot = (int64_t(pages[t / pt]) * hkv + h) * pt + t % pt;
        const int64_t row = t * hkv + h;
        read_row(cache, cache.k, cache.k_scale, slot,
                 static_cast<unsigned char*>(k.data) + size_t(row * d) * ks, k.dtype);
        read_row(cache, cache.v, cache.v_scale, slot,
                 static_cast<unsigned char*>(v.data) + size_t(row * d) * vs, v.dtype);
      }
  });
}

}  // namespace hyperion
