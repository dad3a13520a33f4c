// Paged KV cache writes and ragged decode attention over the pages.
//
// Work unit: a task covers one range of positions of one row for some kv heads. It walks
// the range in blocks of 16 positions (one AVX-512 vector of scores; the positions may
// straddle pages) and keeps, per query head, the online-softmax state in log2 units:
// running max m, running sum l and an f32 accumulator of head_dim values. Per block and
// kv head:
//   scores  s[h][t] = k_scale[t] * dot(q[h] * scale * log2(e), k[t])   (lanes = positions)
//   softmax m' = max(m, max_t s), alpha = 2^(m - m'), p = 2^(s - m'), l = l alpha + sum p
//   values  acc[h] = acc[h] alpha + sum_t (p[t] v_scale[t]) v[t]
// (the SIMD path moves m only when a score exceeds it by more than 8, i.e. p > 256, and
// keeps l lane by lane until the end of the task: no horizontal reductions per block).
// Each key/value row is loaded (and widened from bf16 / int8 / e4m3) once per block for
// all query heads of the group; nothing is ever dequantised into a copy. A bf16 cache
// whose head_dim is a multiple of 32 is widened 32 values at a time in even/odd order
// (one load, a shift and a mask: see load_pair), with q and the accumulator kept in that
// order for the task and put back in order at its end.
#include "kernels/paged_attention.h"
#include "kernels/exp2_avx512.h"

// GCC 12's AVX-512 intrinsic headers fill "don't care" operands from self-initialised
// _mm*_undefined_*() values, which -Wuninitialized flags once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "base/aligned.h"
#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "kernels/quantize.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

#define HYP_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

constexpr int kBlock = 16;  // positions per block: one vector of scores
// Target positions per task: longer rows are split into ranges of whole pages of about
// this many positions and merged afterwards. A function of page_tokens only, so the
// split (and the result) never depends on the thread count.
constexpr int64_t kChunkTokens = 512;
// Lazy rescaling threshold of the SIMD online softmax, in log2 units (see
// block_heads_avx512).
constexpr float kRescaleSlack = 8.0f;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool is_quantised(DType d) {
  return d == DType::kI8 || d == DType::kE4M3;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

void check_cache(const char* op, const PagedKvCache& c) {
  HYP_CHECK(c.dtype == DType::kF32 || c.dtype == DType::kBF16 || is_quantised(c.dtype),
            "{}: cache dtype must be f32, bf16, int8 or fp8_e4m3, got {}", op, dtype_name(c.dtype));
  HYP_CHECK(c.num_pages > 0 && c.page_tokens > 0 && c.n_kv_heads > 0 && c.head_dim > 0,
            "{}: cache dimensions must be positive, got num_pages {} page_tokens {} n_kv_heads {} "
            "head_dim {}",
            op, c.num_pages, c.page_tokens, c.n_kv_heads, c.head_dim);
  HYP_CHECK(c.k != nullptr && c.v != nullptr, "{}: cache k or v is null", op);
  if (is_quantised(c.dtype))
    HYP_CHECK(c.k_scale != nullptr && c.v_scale != nullptr,
              "{}: {} cache needs k_scale and v_scale, got null", op, dtype_name(c.dtype));
}

void check_activation(const char* op, const char* name, const TensorView& t) {
  check_rank(op, name, t, 3);
  HYP_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16, "{}: {} must be f32 or bf16, got {}",
            op, name, t.str());
  check_contiguous(op, name, t);
}

// Everything the kernels need after the boundary checks.
struct Problem {
  int64_t n = 0, hq = 0, hkv = 0, d = 0, dp = 0, group = 1, pt = 0;
  float qscale = 1.0f;  // scale * log2(e): scores come out in log2 units
  bool padded = false;
  int64_t padded_length = 0;
  int64_t window = 0;
  float cap2 = 0.0f;  // a soft cap in log2 units (softcap * log2(e)); 0: none
  // The first position row r attends to (a sliding window's oldest).
  int64_t first(int64_t length) const {
    return window > 0 ? std::max<int64_t>(0, length - window) : 0;
  }
};

Problem check_attention(const char* op, const PagedKvCache& cache, const TensorView& q,
                        const PagedAttentionRow* rows, const TensorView& out,
                        const PagedAttentionParams& params) {
  check_cache(op, cache);
  check_activation(op, "q", q);
  check_activation(op, "out", out);
  HYP_CHECK(out.shape == q.shape, "{}: out {} must have the shape of q {}", op, out.str(), q.str());
  Problem p;
  p.n = q.shape[0];
  p.hq = q.shape[1];
  p.d = q.shape[2];
  p.hkv = cache.n_kv_heads;
  p.pt = cache.page_tokens;
  HYP_CHECK(p.d == cache.head_dim, "{}: q {} has head size {} but the cache head_dim is {}", op,
            q.str(), p.d, cache.head_dim);
  HYP_CHECK(p.hq > 0 && p.hq % p.hkv == 0,
            "{}: q heads must be a positive multiple of the cache's {} kv heads, got q {}", op,
            p.hkv, q.str());
  p.group = p.hq / p.hkv;
  p.dp = ceil_div(p.d, 16) * 16;
  float scale = params.scale;
  if (scale == 0.0f) {
    scale = static_cast<float>(1.0 / std::sqrt(double(p.d)));
  } else {
    HYP_CHECK(std::isfinite(scale) && scale > 0.0f, "{}: scale must be finite and positive, got {}",
              op, scale);
  }
  p.qscale = scale * kLog2e;
  p.padded = params.mode == PagedAttentionMode::kPadded;
  HYP_CHECK(params.mode == PagedAttentionMode::kRagged || p.padded, "{}: unknown mode {}", op,
            int(params.mode));
  p.padded_length = params.padded_length;
  HYP_CHECK(params.window >= 0 && (params.window == 0 || !p.padded),
            "{}: a sliding window ({}) needs the ragged mode and a size >= 1", op, params.window);
  p.window = params.window;
  HYP_CHECK(params.softcap == 0.0f || (std::isfinite(params.softcap) && params.softcap > 0.0f),
            "{}: softcap must be 0 (off) or finite and > 0, got {}", op, params.softcap);
  p.cap2 = params.softcap * kLog2e;
  HYP_CHECK(rows != nullptr || p.n == 0, "{}: null rows for q {}", op, q.str());
  for (int64_t i = 0; i < p.n; ++i) {
    const PagedAttentionRow& r = rows[i];
    HYP_CHECK(r.length >= 1, "{}: row {} has length {} (must be >= 1)", op, i, r.length);
    HYP_CHECK(!p.padded || r.length <= p.padded_length,
              "{}: padded_length {} is shorter than row {}'s length {}", op, p.padded_length, i,
              r.length);
    HYP_CHECK(r.pages != nullptr, "{}: row {} has a null page table", op, i);
    // Only the pages the row reads (a window's start on): older ones may be released.
    const int64_t npages = ceil_div(p.padded ? p.padded_length : r.length, p.pt);
    for (int64_t j = p.first(r.length) / p.pt; j < npages; ++j)
      HYP_CHECK(r.pages[j] >= 0 && r.pages[j] < cache.num_pages,
                "{}: row {} page table entry {} is page {}, outside [0, {})", op, i, j, r.pages[j],
                cache.num_pages);
  }
  return p;
}

// ---------------------------------------------------------------------------------------
// A block of up to 16 positions: where each key/value row lives, and its scales.

struct Block {
  const unsigned char* k[kBlock];
  const unsigned char* v[kBlock];
  alignas(64) float ks[kBlock];
  alignas(64) float vs[kBlock];
  int nt = 0;   // positions in the block
  int ntv = 0;  // of which the first ntv are visible (< length); the rest are masked
};

struct TaskArgs {
  const PagedKvCache* cache;
  const int32_t* pages;
  int64_t kvh, begin, end, length;
  int64_t group, d, dp;
  const float* qf;  // [group, dp] q * qscale, zero beyond d
  float* m;         // [group] running max (log2 units), starts at -inf
  float* l;         // [group] running sum, starts at 0
  float* lanes;     // [group, 16] SIMD path: the running sums lane by lane, folded into l
                    // at the end of the task (no horizontal sum per block)
  float* acc;       // [group, dp] accumulator, starts at 0
  bool pairs;       // bf16 pairs mode: qf and acc in even/odd order within each 32 columns
  float cap2;       // soft cap in log2 units (the portable path only); 0: none
};

void gather_block(const TaskArgs& a, int64_t pos, Block* b) {
  const PagedKvCache& c = *a.cache;
  const int64_t row_bytes = c.head_dim * int64_t(dtype_size(c.dtype));
  const bool quant = is_quantised(c.dtype);
  b->nt = int(std::min<int64_t>(kBlock, a.end - pos));
  b->ntv = int(std::clamp<int64_t>(a.length - pos, 0, b->nt));
  // Runs of positions within one page: their rows and scales are contiguous.
  for (int t = 0; t < b->nt;) {
    const int64_t p = pos + t, off = p % c.page_tokens;
    const int run = int(std::min<int64_t>(c.page_tokens - off, b->nt - t));
    const int64_t slot =
        (int64_t(a.pages[p / c.page_tokens]) * c.n_kv_heads + a.kvh) * c.page_tokens + off;
    const unsigned char* k = static_cast<const unsigned char*>(c.k) + slot * row_bytes;
    const unsigned char* v = static_cast<const unsigned char*>(c.v) + slot * row_bytes;
    for (int i = 0; i < run; ++i) {
      b->k[t + i] = k + i * row_bytes;
      b->v[t + i] = v + i * row_bytes;
    }
    if (quant) {
      std::memcpy(b->ks + t, c.k_scale + slot, size_t(run) * sizeof(float));
      std::memcpy(b->vs + t, c.v_scale + slot, size_t(run) * sizeof(float));
    }
    t += run;
  }
  if (!quant) std::fill(b->ks, b->ks + b->nt, 1.0f), std::fill(b->vs, b->vs + b->nt, 1.0f);
  // Positions past the block's end: valid rows to read (row 0) with zero scales, so the
  // SIMD loops can run a few positions over without branches; their lanes are masked.
  for (int t = b->nt; t < kBlock; ++t) {
    b->k[t] = b->k[0];
    b->v[t] = b->v[0];
    b->ks[t] = b->vs[t] = 0.0f;
  }
}

// Asks for the scale lines of positions [pos, pos + 16) of this task's kv head (a quantised
// cache's): one line per page run. run_task issues it a few (block, head) steps before the
// block is gathered, since gathering copies the scales.
void prefetch_scales(const TaskArgs& a, int64_t pos) {
  const PagedKvCache& c = *a.cache;
  const int64_t end = std::min<int64_t>(a.end, pos + kBlock);
  while (pos < end) {
    const int64_t off = pos % c.page_tokens;
    const int64_t run = std::min<int64_t>(c.page_tokens - off, end - pos);
    const int64_t slot =
        (int64_t(a.pages[pos / c.page_tokens]) * c.n_kv_heads + a.kvh) * c.page_tokens + off;
    _mm_prefetch(reinterpret_cast<const char*>(c.k_scale + slot), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c.v_scale + slot), _MM_HINT_T0);
    pos += run;
  }
}

// Prefetches the key and value rows of block `pf` (a row per position of 16), called by
// the block kernel between its position groups so that the requests are spread over its
// work rather than issued in one burst.
HYP_AVX512 inline void prefetch_rows(const Block& pf, int t, int64_t row_bytes) {
  for (int64_t o = 0; o < row_bytes; o += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(pf.k[t]) + o, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(pf.v[t]) + o, _MM_HINT_T0);
  }
}

// ---------------------------------------------------------------------------------------
// Portable path

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = e4m3_to_f32(fp8_e4m3{uint8_t(c)});
    return t;
  }();
  return table;
}

template <typename KT>
inline float kv_at(const unsigned char* row, int64_t i, const float* table) {
  if constexpr (std::is_same_v<KT, float>) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (std::is_same_v<KT, bf16>) {
    return bf16_to_f32(reinterpret_cast<const bf16*>(row)[i]);
  } else if constexpr (std::is_same_v<KT, int8_t>) {
    return float(reinterpret_cast<const int8_t*>(row)[i]);
  } else {
    return table[row[i]];
  }
}

template <typename KT>
void block_portable(const TaskArgs& a, const Block& b) {
  const float* table = e4m3_table().data();
  const int64_t d = a.d;
  float p[kBlock];
  for (int64_t h = 0; h < a.group; ++h) {
    const float* qh = a.qf + h * a.dp;
    float bmax = kNegInf;
    float s[kBlock];
    for (int t = 0; t < b.nt; ++t) {
      float dot = 0.0f;
      for (int64_t i = 0; i < d; ++i) dot += qh[i] * kv_at<KT>(b.k[t], i, table);
      s[t] = t < b.ntv ? dot * b.ks[t]
                       : kNegInf;  // scores beyond the length are computed, then masked
      if (a.cap2 > 0.0f && t < b.ntv) s[t] = a.cap2 * std::tanh(s[t] / a.cap2);
      bmax = std::max(bmax, s[t]);
    }
    const float mold = a.m[h], mnew = std::max(mold, bmax);
    const float alpha = mold == kNegInf ? 0.0f : std::exp2(mold - mnew);
    float sum = 0.0f;
    for (int t = 0; t < b.nt; ++t) {
      p[t] = t < b.ntv ? std::exp2(s[t] - mnew) : 0.0f;
      sum += p[t];
      p[t] = t < b.ntv ? p[t] * b.vs[t] : 0.0f;
    }
    a.l[h] = a.l[h] * alpha + sum;
    a.m[h] = mnew;
    float* acc = a.acc + h * a.dp;
    for (int64_t i = 0; i < d; ++i) acc[i] *= alpha;
    for (int t = 0; t < b.ntv; ++t)
      for (int64_t i = 0; i < d; ++i) acc[i] += p[t] * kv_at<KT>(b.v[t], i, table);
    // (Padded positions contribute nothing; the portable path does not bother reading them.)
  }
}

// ---------------------------------------------------------------------------------------
// AVX-512 path

using detail::exp2_avx512;

// E4M3 codes (one per 32-bit lane) to f32, exactly: the 7 magnitude bits shifted into an
// f32 pattern with the exponent rebased by 120 give every normal value; subnormals
// (exponent 0) are built as 2^-6 * (1 + m/8) - 2^-6; code 0x7F is NaN.
HYP_AVX512 inline __m512 e4m3_decode(__m512i code) {
  const __m512i mag = _mm512_and_si512(code, _mm512_set1_epi32(0x7F));
  const __mmask16 sub = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8));
  const __mmask16 nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F));
  __m512i bits = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
  bits = _mm512_mask_add_epi32(bits, sub, bits, _mm512_set1_epi32(1 << 23));
  __m512 f = _mm512_castsi512_ps(bits);
  f = _mm512_mask_sub_ps(f, sub, f, _mm512_set1_ps(0x1p-6f));
  f = _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(code, _mm512_set1_epi32(0x80)), 24);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(f), sign));
}

// 16 (masked) elements of a key/value row as f32.
template <typename KT>
HYP_AVX512 inline __m512 load_kv(const unsigned char* p, __mmask16 k) {
  if constexpr (std::is_same_v<KT, float>) {
    return _mm512_maskz_loadu_ps(k, p);
  } else if constexpr (std::is_same_v<KT, bf16>) {
    const __m256i h = _mm256_maskz_loadu_epi16(k, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (std::is_same_v<KT, int8_t>) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, p)));
  } else {
    return e4m3_decode(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, p)));
  }
}

// 16 elements of a key/value row as f32: masked (the last chunk of a head_dim that is
// not a multiple of 16) or plain.
template <typename KT, bool kMasked>
HYP_AVX512 inline __m512 load_chunk(const unsigned char* p, __mmask16 k) {
  if constexpr (kMasked) {
    return load_kv<KT>(p, k);
  } else if constexpr (std::is_same_v<KT, float>) {
    return _mm512_loadu_ps(p);
  } else if constexpr (std::is_same_v<KT, bf16>) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (std::is_same_v<KT, int8_t>) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  } else {
    return e4m3_decode(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
}

// 32 bf16 values of a key/value row as two f32 vectors: lo = the even-indexed values,
// hi = the odd ones. A bf16 in the low half of a 32-bit lane becomes f32 by a shift, one
// in the high half by clearing the low half: one load and two ALU ops for 32 values,
// against a widening load (two uops) and a shift for each 16 with load_chunk.
HYP_AVX512 inline void load_pair(const unsigned char* p, __m512* lo, __m512* hi) {
  const __m512i x = _mm512_loadu_si512(p);
  *lo = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  *hi = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(int32_t(0xFFFF0000u))));
}

// W = 1: chunk c of a row (16 values) as f32. W = 2 (bf16 pairs mode): chunks c and c + 1
// (32 values) in even/odd order.
template <typename KT, bool kTail, int W>
HYP_AVX512 inline void load_w(const unsigned char* p, __mmask16 k, __m512* out) {
  if constexpr (W == 2)
    load_pair(p, &out[0], &out[1]);
  else
    out[0] = load_chunk<KT, kTail>(p, k);
}

// r[i] = sum of the 16 lanes of row i of p[16][16]: a transpose-and-add tree, ~3 ops
// per row instead of a horizontal reduction each.
HYP_AVX512 inline __m512 reduce16(const float* p) {
  __m512 w[8], y[4];
  for (int i = 0; i < 8; ++i) {
    const __m512 a = _mm512_load_ps(p + 32 * i), b = _mm512_load_ps(p + 32 * i + 16);
    w[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
  for (int j = 0; j < 4; ++j) {
    const __m512d a = _mm512_castps_pd(w[2 * j]), b = _mm512_castps_pd(w[2 * j + 1]);
    y[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 z01 =
      _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88), _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
  const __m512 z23 =
      _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], 0x88), _mm512_shuffle_f32x4(y[2], y[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z01, z23, 0x88), _mm512_shuffle_f32x4(z01, z23, 0xDD));
}

// One block for query heads [h0, h0 + GB) of the group. kTail: head_dim is not a multiple
// of 16, so the last chunk of each row is a masked load. W = 2: bf16 pairs mode, two
// chunks per load (see load_pair).
template <typename KT, int GB, bool kTail, int W>
HYP_AVX512 void block_heads_avx512(const TaskArgs& a, const Block& b, int64_t h0, const Block* pf) {
  static_assert(W == 1 || (W == 2 && std::is_same_v<KT, bf16> && !kTail));
  constexpr int64_t es = sizeof(KT);
  constexpr bool kQuant = std::is_same_v<KT, int8_t> || std::is_same_v<KT, fp8_e4m3>;
  const int64_t nc = a.dp / 16;
  const __mmask16 last = static_cast<__mmask16>(0xFFFFu >> (a.dp - a.d));
  const float* qf = a.qf + h0 * a.dp;
  float* acc = a.acc + h0 * a.dp;

  // With few heads, U positions at a time give U x GB independent FMA chains (positions
  // past nt read row 0, see gather_block; their lanes are masked below).
  constexpr int U = GB >= 4 ? 1 : 4 / GB;
  const int ntu = (b.nt + U - 1) / U * U;

  // Scores: per position, partial dot vectors of all GB heads, then a 16-way reduction.
  alignas(64) float part[GB][kBlock][16];
  for (int t0 = 0; t0 < ntu; t0 += U) {
    __m512 s[U][GB];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
      for (int h = 0; h < GB; ++h) s[u][h] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nc; c += W) {
      const __mmask16 k = c + 1 < nc ? __mmask16(0xFFFF) : last;
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        if (pf != nullptr && c == 0) prefetch_rows(*pf, t0 + u, a.d * es);
        __m512 kv[W];
        load_w<KT, kTail, W>(b.k[t0 + u] + 16 * c * es, k, kv);
#pragma GCC unroll 2
        for (int w = 0; w < W; ++w)
#pragma GCC unroll 8
          for (int h = 0; h < GB; ++h)
            s[u][h] = _mm512_fmadd_ps(_mm512_load_ps(qf + h * a.dp + 16 * (c + w)), kv[w], s[u][h]);
      }
    }
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
      for (int h = 0; h < GB; ++h) _mm512_store_ps(part[h][t0 + u], s[u][h]);
  }
  for (int t = ntu; t < kBlock; ++t)
#pragma GCC unroll 8
    for (int h = 0; h < GB; ++h) _mm512_store_ps(part[h][t], _mm512_setzero_ps());

  const __mmask16 visible = static_cast<__mmask16>((1u << b.ntv) - 1u);
  alignas(64) float pv[GB][kBlock];
  float alpha[GB];
  for (int h = 0; h < GB; ++h) {
    __m512 s = reduce16(&part[h][0][0]);
    if constexpr (kQuant) s = _mm512_mul_ps(s, _mm512_load_ps(b.ks));
    s = _mm512_mask_blend_ps(visible, _mm512_set1_ps(kNegInf), s);
    // Lazy rescaling: the running max moves only when a score exceeds it by more than
    // kRescaleSlack (so p <= 2^kRescaleSlack, harmless in f32), which after the first
    // blocks is rare: a vector compare replaces the horizontal max of every block.
    float m = a.m[h0 + h];
    alpha[h] = 1.0f;
    float* lanes = a.lanes + (h0 + h) * 16;
    if (_mm512_cmp_ps_mask(s, _mm512_set1_ps(m + kRescaleSlack), _CMP_GT_OQ) != 0) {
      const float mnew = _mm512_reduce_max_ps(s);
      alpha[h] = m == kNegInf ? 0.0f : _mm512_cvtss_f32(exp2_avx512(_mm512_set1_ps(m - mnew)));
      m = a.m[h0 + h] = mnew;
      _mm512_store_ps(lanes, _mm512_mul_ps(_mm512_load_ps(lanes), _mm512_set1_ps(alpha[h])));
    }
    __m512 p = _mm512_maskz_mov_ps(visible, exp2_avx512(_mm512_sub_ps(s, _mm512_set1_ps(m))));
    _mm512_store_ps(lanes, _mm512_add_ps(_mm512_load_ps(lanes), p));
    if constexpr (kQuant) p = _mm512_maskz_mul_ps(visible, p, _mm512_load_ps(b.vs));
    _mm512_store_ps(pv[h], p);
  }

  // Values: GB x U accumulators per 16 columns stay in registers across the block (U
  // interleaved chains over the positions); positions past nt have p = 0.
  for (int64_t c = 0; c < nc; c += W) {
    const __mmask16 k = c + 1 < nc ? __mmask16(0xFFFF) : last;
    __m512 acc_v[W][U][GB];
#pragma GCC unroll 2
    for (int w = 0; w < W; ++w)
#pragma GCC unroll 8
      for (int h = 0; h < GB; ++h) {
        acc_v[w][0][h] =
            _mm512_mul_ps(_mm512_load_ps(acc + h * a.dp + 16 * (c + w)), _mm512_set1_ps(alpha[h]));
#pragma GCC unroll 8
        for (int u = 1; u < U; ++u) acc_v[w][u][h] = _mm512_setzero_ps();
      }
    // Padded block: masked positions are read and multiplied like the others, but zeroed
    // first so that whatever they hold (unwritten pages) cannot make 0 * v NaN.
    const bool padded = b.ntv != b.nt;
    for (int t0 = 0; t0 < ntu; t0 += U)
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        __m512 vv[W];
        load_w<KT, kTail, W>(b.v[t0 + u] + 16 * c * es, k, vv);
        if (padded) {
          const __mmask16 tk = t0 + u < b.ntv ? __mmask16(0xFFFF) : __mmask16(0);
#pragma GCC unroll 2
          for (int w = 0; w < W; ++w) vv[w] = _mm512_maskz_mov_ps(tk, vv[w]);
        }
#pragma GCC unroll 8
        for (int h = 0; h < GB; ++h) {
          const __m512 ph = _mm512_set1_ps(pv[h][t0 + u]);
#pragma GCC unroll 2
          for (int w = 0; w < W; ++w) acc_v[w][u][h] = _mm512_fmadd_ps(ph, vv[w], acc_v[w][u][h]);
        }
      }
#pragma GCC unroll 2
    for (int w = 0; w < W; ++w)
#pragma GCC unroll 8
      for (int h = 0; h < GB; ++h) {
        __m512 r = acc_v[w][0][h];
        if constexpr (U == 2) r = _mm512_add_ps(r, acc_v[w][1][h]);
        if constexpr (U == 4)
          r = _mm512_add_ps(_mm512_add_ps(r, acc_v[w][1][h]),
                            _mm512_add_ps(acc_v[w][2][h], acc_v[w][3][h]));
        _mm512_store_ps(acc + h * a.dp + 16 * (c + w), r);
      }
  }
}

template <typename KT, bool kTail, int W>
HYP_AVX512 void block_avx512_t(const TaskArgs& a, const Block& b, const Block* pf) {
  // The group in sub-groups of 8, 4, 2, 1 heads (register-resident accumulators); the
  // block's rows are in L1 after the first sub-group.
  int64_t h = 0;
  for (; h + 8 <= a.group; h += 8)
    block_heads_avx512<KT, 8, kTail, W>(a, b, h, h == 0 ? pf : nullptr);
  if (h + 4 <= a.group) block_heads_avx512<KT, 4, kTail, W>(a, b, h, h == 0 ? pf : nullptr), h += 4;
  if (h + 2 <= a.group) block_heads_avx512<KT, 2, kTail, W>(a, b, h, h == 0 ? pf : nullptr), h += 2;
  if (h < a.group) block_heads_avx512<KT, 1, kTail, W>(a, b, h, h == 0 ? pf : nullptr);
}

template <typename KT>
HYP_AVX512 void block_avx512(const TaskArgs& a, const Block& b, const Block* pf) {
  if constexpr (std::is_same_v<KT, bf16>)
    if (a.pairs) return block_avx512_t<KT, false, 2>(a, b, pf);
  if (a.d == a.dp)
    block_avx512_t<KT, false, 1>(a, b, pf);
  else
    block_avx512_t<KT, true, 1>(a, b, pf);
}

// ---------------------------------------------------------------------------------------
// Tasks

// Pairs mode keeps each 32 columns as [the 16 even ones, the 16 odd ones]. Puts a row of
// d values (a multiple of 32) into that order in place, or back into column order.
void reorder_pairs(float* x, int64_t d, bool to_pairs) {
  float tmp[32];
  for (int64_t j = 0; j < d; j += 32) {
    for (int64_t e = 0; e < 16; ++e) {
      if (to_pairs) {
        tmp[e] = x[j + 2 * e];
        tmp[16 + e] = x[j + 2 * e + 1];
      } else {
        tmp[2 * e] = x[j + e];
        tmp[2 * e + 1] = x[j + 16 + e];
      }
    }
    std::copy(tmp, tmp + 32, x + j);
  }
}

// A task: positions [begin, end) of one row for kv heads heads[0 .. n). Blocks outer,
// heads inner: the kv heads of a page are contiguous in the pool, so a task over all heads
// reads each page as one stream (8 KB to 16 KB for 8 heads of 64) instead of one 1-2 KB
// piece per head, which the hardware prefetcher follows much better (measured on a
// 2-core Sapphire Rapids VM: random 1 KB pieces read at ~5 GB/s per core, 16 KB at ~9).
template <typename KT>
void run_task(const TaskArgs* heads, int64_t n, bool simd) {
  if (simd)
    for (int64_t i = 0; i < n; ++i)
      std::fill(heads[i].lanes, heads[i].lanes + heads[i].group * 16, 0.0f);
  // The (block, head) steps in order: positions in blocks of 16, and for each block every
  // kv head of the task. Step j + kRowsAhead is gathered before step j runs, and its rows
  // are prefetched by step j's kernel; step j + kScalesAhead's scales before that.
  // Pages are scattered through the pool, so the hardware prefetcher loses the stream at
  // every page; prefetching the whole next block in one burst before each kernel call
  // did not overlap with the kernel's work (bench kernels --filter paged_attn on 2 Zen 5
  // cores, bf16: no prefetch 19-20 GB/s, a burst one block ahead 27, spread 2 steps
  // ahead 33; 1 step ahead measured the same, 3-6 steps slower).
  constexpr int64_t kRowsAhead = 2, kScalesAhead = 4;
  const int64_t steps = ceil_div(heads[0].end - heads[0].begin, kBlock) * n;
  const bool quant = is_quantised(heads[0].cache->dtype);
  auto step_head = [&](int64_t j) -> const TaskArgs& { return heads[j % n]; };
  auto step_pos = [&](int64_t j) { return heads[0].begin + j / n * kBlock; };
  Block ring[kRowsAhead + 1];
  if (quant)
    for (int64_t j = 0; j < std::min(kScalesAhead, steps); ++j)
      prefetch_scales(step_head(j), step_pos(j));
  for (int64_t j = 0; j < std::min(kRowsAhead, steps); ++j)
    gather_block(step_head(j), step_pos(j), &ring[j]);
  for (int64_t j = 0; j < steps; ++j) {
    if (quant && j + kScalesAhead < steps)
      prefetch_scales(step_head(j + kScalesAhead), step_pos(j + kScalesAhead));
    const Block* next = nullptr;
    if (j + kRowsAhead < steps) {
      Block* slot = &ring[(j + kRowsAhead) % (kRowsAhead + 1)];
      gather_block(step_head(j + kRowsAhead), step_pos(j + kRowsAhead), slot);
      next = slot;
    }
    const Block& b = ring[j % (kRowsAhead + 1)];
    if (simd)
      block_avx512<KT>(step_head(j), b, next);
    else
      block_portable<KT>(step_head(j), b);
  }
  if (simd)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t g = 0; g < heads[i].group; ++g) {
        float sum = 0.0f;
        for (int j = 0; j < 16; ++j) sum += heads[i].lanes[g * 16 + j];
        heads[i].l[g] = sum;
      }
  for (int64_t i = 0; i < n; ++i)
    if (heads[i].pairs)
      for (int64_t g = 0; g < heads[i].group; ++g)
        reorder_pairs(heads[i].acc + g * heads[i].dp, heads[i].d, false);
}

void run_task_dtype(const TaskArgs* heads, int64_t n, bool simd) {
  switch (heads[0].cache->dtype) {
    case DType::kF32:
      return run_task<float>(heads, n, simd);
    case DType::kBF16:
      return run_task<bf16>(heads, n, simd);
    case DType::kI8:
      return run_task<int8_t>(heads, n, simd);
    default:
      return run_task<fp8_e4m3>(heads, n, simd);
  }
}

struct Task {
  int64_t row, begin, end;  // positions [begin, end) of the row
  int64_t h0, h1;           // kv heads [h0, h1)
  int64_t partial;          // state of (row, range, kv head 0) in the partial buffer, or -1: the
                            // row is not split and the task writes out itself
};

// Flash-decoding merge of one split (row, kv head): count range states, stride apart.
struct Merge {
  int64_t row, kvh, first, stride, count;
};

// Per-thread scratch, reused across calls.
struct Scratch {
  AlignedBuffer<float> buf;
  float* get(size_t n) {
    if (buf.size() < n) buf = AlignedBuffer<float>(n);
    return buf.data();
  }
};
thread_local Scratch t_scratch;

void store_out(const TensorView& out, int64_t row, int64_t head, const float* acc, float l,
               int64_t d) {
  const int64_t base = (row * out.shape[1] + head) * d;
  const float inv = 1.0f / l;
  if (out.dtype == DType::kF32) {
    float* o = static_cast<float*>(out.data) + base;
    for (int64_t i = 0; i < d; ++i) o[i] = acc[i] * inv;
  } else {
    bf16* o = static_cast<bf16*>(out.data) + base;
    for (int64_t i = 0; i < d; ++i) o[i] = f32_to_bf16(acc[i] * inv);
  }
}

}  // namespace

int64_t paged_kv_bytes_per_token(DType dtype, int64_t n_kv_heads, int64_t head_dim) {
  const int64_t scale_bytes = is_quantised(dtype) ? int64_t(sizeof(float)) : 0;
  return 2 * n_kv_heads * (head_dim * int64_t(dtype_size(dtype)) + scale_bytes);
}

void paged_kv_write(const PagedKvCache& cache, const TensorView& k, const TensorView& v,
                    const int64_t* slots) {
  const char* op = "paged_kv_write";
  check_cache(op, cache);
  check_activation(op, "k", k);
  check_activation(op, "v", v);
  HYP_CHECK(v.shape == k.shape, "{}: k {} and v {} must have the same shape", op, k.str(), v.str());
  HYP_CHECK(k.shape[1] == cache.n_kv_heads && k.shape[2] == cache.head_dim,
            "{}: k {} must be [n, {}, {}] ([n, n_kv_heads, head_dim] of the cache)", op, k.str(),
            cache.n_kv_heads, cache.head_dim);
  const int64_t n = k.shape[0], capacity = cache.num_pages * cache.page_tokens;
  HYP_CHECK(slots != nullptr || n == 0, "{}: null slots for k {}", op, k.str());
  std::vector<int64_t> sorted(slots, slots + n);
  for (int64_t i = 0; i < n; ++i)
    HYP_CHECK(slots[i] >= 0 && slots[i] < capacity,
              "{}: slot {} of token {} is outside the cache's [0, {}) ({} pages of {} tokens)", op,
              slots[i], i, capacity, cache.num_pages, cache.page_tokens);
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  HYP_CHECK(dup == sorted.end(), "{}: slot {} is written twice in one call", op,
            dup == sorted.end() ? 0 : *dup);

  const int64_t hkv = cache.n_kv_heads, d = cache.head_dim, pt = cache.page_tokens;
  const int64_t ces = int64_t(dtype_size(cache.dtype));
  const bool quant = is_quantised(cache.dtype);
  auto write_row = [&](const TensorView& src, int64_t i, int64_t h, void* base, float* scales) {
    const int64_t page = slots[i] / pt, off = slots[i] % pt;
    const int64_t slot = (page * hkv + h) * pt + off;
    const unsigned char* x =
        static_cast<const unsigned char*>(src.data) + (i * hkv + h) * d * dtype_size(src.dtype);
    void* dst = static_cast<unsigned char*>(base) + slot * d * ces;
    if (quant) {
      scales[slot] = quantize_row(x, src.dtype, d, dst, cache.dtype);
    } else if (src.dtype == cache.dtype) {
      std::memcpy(dst, x, size_t(d * ces));
    } else if (src.dtype == DType::kF32) {
      convert_f32_to_bf16(reinterpret_cast<const float*>(x), static_cast<bf16*>(dst), size_t(d));
    } else {
      convert_bf16_to_f32(reinterpret_cast<const bf16*>(x), static_cast<float*>(dst), size_t(d));
    }
  };
  const int64_t grain = std::max<int64_t>(1, 8192 / (hkv * d));
  parallel_chunks(n, grain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t h = 0; h < hkv; ++h) {
        write_row(k, i, h, cache.k, cache.k_scale);
        write_row(v, i, h, cache.v, cache.v_scale);
      }
  });
}

void paged_attention(const PagedKvCache& cache, const TensorView& q, const PagedAttentionRow* rows,
                     const TensorView& out, const PagedAttentionParams& params) {
  const Problem p = check_attention("paged_attention", cache, q, rows, out, params);
  if (p.n == 0) return;
  const CpuFeatures& cpu = cpu_features();
  // A soft cap (Gemma 2) runs the portable path: the AVX-512 blocks do not apply it.
  const bool simd = !params.force_portable && p.cap2 == 0.0f && cpu.avx512f && cpu.avx512bw &&
                    cpu.avx512vl;

  // The split. Positions: ragged rows in ranges of whole pages (about kChunkTokens
  // positions; a function of the lengths only), padded rows in one range. Each split
  // (row, kv head) gets one partial state per range, merged afterwards in range order.
  // Heads: a task takes all kv heads of its range, unless there are too few ranges to
  // keep the threads busy; then the heads are spread over more tasks. Each (row, range,
  // kv head) is computed the same way whichever task holds it, so the result does not
  // depend on this choice or on the thread count.
  const int64_t chunk = p.padded ? 0 : std::max<int64_t>(1, kChunkTokens / p.pt) * p.pt;
  // State of one (range, kv head): m [group], l [group], padded to 16 floats so that
  // acc [group, dp] stays 64-byte aligned.
  const int64_t hdr = ceil_div(2 * p.group, 16) * 16;
  const int64_t state = hdr + p.group * p.dp;
  int64_t ranges = 0;
  // A row's ranges: chunk-aligned pieces of [first, length) (a window's start cuts the first).
  auto first_chunk = [&](int64_t len) { return p.padded ? 0 : p.first(len) / chunk; };
  for (int64_t i = 0; i < p.n; ++i)
    ranges += p.padded ? 1 : ceil_div(rows[i].length, chunk) - first_chunk(rows[i].length);
  const int64_t head_groups = std::clamp<int64_t>(ceil_div(4 * num_threads(), ranges), 1, p.hkv);
  const int64_t heads_per_task = ceil_div(p.hkv, head_groups);

  // The calling thread's reusable lists (named through references: inside the parallel
  // lambdas a thread_local would resolve to each worker's own, empty, instance).
  thread_local std::vector<Task> tls_tasks;
  thread_local std::vector<Merge> tls_merges;
  thread_local AlignedBuffer<float> tls_partials;
  std::vector<Task>& tasks = tls_tasks;
  std::vector<Merge>& merges = tls_merges;
  tasks.clear();
  merges.clear();
  int64_t partials = 0;
  for (int64_t i = 0; i < p.n; ++i) {
    const int64_t len = rows[i].length;
    const int64_t c0 = first_chunk(len);
    const int64_t nchunks = p.padded ? 1 : ceil_div(len, chunk) - c0;
    const int64_t row_base = nchunks > 1 ? partials : -1;
    if (nchunks > 1) {
      for (int64_t h = 0; h < p.hkv; ++h)
        merges.push_back({i, h, row_base + h * state, p.hkv * state, nchunks});
      partials += nchunks * p.hkv * state;
    }
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t begin = p.padded ? 0 : std::max(p.first(len), (c0 + c) * chunk);
      const int64_t end = p.padded ? p.padded_length : std::min(len, (c0 + c + 1) * chunk);
      for (int64_t h0 = 0; h0 < p.hkv; h0 += heads_per_task)
        tasks.push_back({i, begin, end, h0, std::min(p.hkv, h0 + heads_per_task),
                         nchunks > 1 ? row_base + c * p.hkv * state : -1});
    }
  }
  // Largest first, so dynamic scheduling ends balanced (the order never changes results).
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& x, const Task& y) {
    return (x.end - x.begin) * (x.h1 - x.h0) > (y.end - y.begin) * (y.h1 - y.h0);
  });
  if (tls_partials.size() < size_t(partials)) tls_partials = AlignedBuffer<float>(size_t(partials));
  float* partial = tls_partials.data();

  const size_t qes = dtype_size(q.dtype);
  const bool pairs = simd && cache.dtype == DType::kBF16 && p.d % 32 == 0;
  // Per kv head of a task: q [group, dp] (scaled), its own state, lane sums [group, 16].
  const int64_t per_head = p.group * p.dp + state + p.group * 16;
  parallel_for_dynamic(int64_t(tasks.size()), [&](int64_t ti) {
    const Task& task = tasks[size_t(ti)];
    const int64_t nh = task.h1 - task.h0;
    float* s = t_scratch.get(size_t(nh * per_head));
    thread_local std::vector<TaskArgs> args;  // this worker's
    args.clear();
    for (int64_t j = 0; j < nh; ++j) {
      const int64_t kvh = task.h0 + j;
      float* qf = s + j * per_head;
      float* own = qf + p.group * p.dp;
      float* st = task.partial >= 0 ? partial + task.partial + kvh * state : own;
      for (int64_t g = 0; g < p.group; ++g) {
        const int64_t head = kvh * p.group + g;
        const unsigned char* qsrc =
            static_cast<const unsigned char*>(q.data) + (task.row * p.hq + head) * p.d * qes;
        for (int64_t i = 0; i < p.dp; ++i)
          qf[g * p.dp + i] = i < p.d ? load_as_f32(qsrc, q.dtype, size_t(i)) * p.qscale : 0.0f;
        if (pairs) reorder_pairs(qf + g * p.dp, p.d, true);
        st[g] = kNegInf;         // m
        st[p.group + g] = 0.0f;  // l
      }
      std::fill(st + hdr, st + state, 0.0f);
      args.push_back({.cache = &cache,
                      .pages = rows[task.row].pages,
                      .kvh = kvh,
                      .begin = task.begin,
                      .end = task.end,
                      .length = rows[task.row].length,
                      .group = p.group,
                      .d = p.d,
                      .dp = p.dp,
                      .qf = qf,
                      .m = st,
                      .l = st + p.group,
                      .lanes = own + state,
                      .acc = st + hdr,
                      .pairs = pairs,
                      .cap2 = p.cap2});
    }
    run_task_dtype(args.data(), nh, simd);
    if (task.partial < 0)
      for (const TaskArgs& a : args)
        for (int64_t g = 0; g < p.group; ++g)
          store_out(out, task.row, a.kvh * p.group + g, a.acc + g * p.dp, a.l[g], p.d);
  });

  // Flash-decoding merge of each split (row, kv head), ranges in order.
  parallel_for_dynamic(int64_t(merges.size()), [&](int64_t mi) {
    const Merge& mg = merges[size_t(mi)];
    float* acc = t_scratch.get(size_t(p.dp));
    for (int64_t g = 0; g < p.group; ++g) {
      float mmax = kNegInf;
      for (int64_t c = 0; c < mg.count; ++c)
        mmax = std::max(mmax, partial[mg.first + c * mg.stride + g]);
      float l = 0.0f;
      std::fill(acc, acc + p.dp, 0.0f);
      for (int64_t c = 0; c < mg.count; ++c) {
        const float* st = partial + mg.first + c * mg.stride;
        const float w = std::exp2(st[g] - mmax);
        l += st[p.group + g] * w;
        const float* pa = st + hdr + g * p.dp;
        for (int64_t i = 0; i < p.d; ++i) acc[i] += pa[i] * w;
      }
      store_out(out, mg.row, mg.kvh * p.group + g, acc, l, p.d);
    }
  });
}

namespace ref {

void paged_attention(const PagedKvCache& cache, const TensorView& q, const PagedAttentionRow* rows,
                     const TensorView& out, const PagedAttentionParams& params) {
  const Problem p = check_attention("paged_attention", cache, q, rows, out, params);
  const double scale = double(p.qscale) / double(kLog2e);
  const bool quant = is_quantised(cache.dtype);
  auto value = [&](const void* base, const float* scales, int64_t slot, int64_t i) {
    const double x = load_as_f32(base, cache.dtype, size_t(slot * p.d + i));
    return quant ? x * double(scales[slot]) : x;
  };
  std::vector<double> s, o(size_t(p.d));
  for (int64_t r = 0; r < p.n; ++r) {
    const int64_t len = rows[r].length, first = p.first(len);
    s.assign(size_t(len), 0.0);
    for (int64_t h = 0; h < p.hq; ++h) {
      const int64_t kvh = h / p.group;
      auto slot_of = [&](int64_t pos) {
        return (int64_t(rows[r].pages[pos / p.pt]) * p.hkv + kvh) * p.pt + pos % p.pt;
      };
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t t = first; t < len; ++t) {
        double dot = 0.0;
        for (int64_t i = 0; i < p.d; ++i)
          dot += double(load_as_f32(q.data, q.dtype, size_t((r * p.hq + h) * p.d + i))) *
                 value(cache.k, cache.k_scale, slot_of(t), i);
        s[size_t(t)] = scale * dot;
        if (params.softcap > 0.0f)
          s[size_t(t)] = params.softcap * std::tanh(s[size_t(t)] / params.softcap);
        mx = std::max(mx, s[size_t(t)]);
      }
      double sum = 0.0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t t = first; t < len; ++t) {
        const double w = std::exp(s[size_t(t)] - mx);
        sum += w;
        for (int64_t i = 0; i < p.d; ++i)
          o[size_t(i)] += w * value(cache.v, cache.v_scale, slot_of(t), i);
      }
      for (int64_t i = 0; i < p.d; ++i) {
        const float y = float(o[size_t(i)] / sum);
        const size_t idx = size_t((r * p.hq + h) * p.d + i);
        if (out.dtype == DType::kF32)
          static_cast<float*>(out.data)[idx] = y;
        else
          static_cast<bf16*>(out.data)[idx] = f32_to_bf16(y);
      }
    }
  }
}

}  // namespace ref

}  // namespace hyperion
