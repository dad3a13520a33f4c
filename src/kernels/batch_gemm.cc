#include "kernels/batch_gemm.h"

// GCC 12's AVX-512 intrinsic headers fill "don't care" operands from self-initialised
// _mm*_undefined_*() values, which -Wuninitialized flags once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/aligned.h"
#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "kernels/gemv.h"
#include "kernels/transpose_avx512.h"

namespace hyperion::detail {
namespace {

#define HYP_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define HYP_INLINE __attribute__((always_inline)) inline
#define HYP_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define HYP_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

// A K step is 4 bytes of a row: a pair of bf16 values (one dpbf16ps lane) or four int8
// values (one dpbusd lane). The kernel broadcasts a step of one W row to all 16 lanes and
// multiplies it by a vector holding the same step of 16 activation rows, so each lane
// accumulates one output C[m, n] over K: no horizontal sums, and the activations (small,
// packed once per call) are the only operand that needs a special layout. W is read in
// place.
constexpr int kStepBytes = 4;
constexpr int kLanes = 16;
// Activation rows per pass: two vectors, dotted with a group of 8 W rows (16 accumulators;
// a last pass of one vector keeps two sets of 8, see phases()).
constexpr int kPassRows = 2 * kLanes;
constexpr int kGroupRows = 8;

enum class Kind { kBf16, kU8, kS8, kS8Sums };

// Everything a group kernel needs.
struct Ctx {
  const GemmArgs* g;
  int64_t m, mpad, n;
  int64_t steps;       // K steps; the last is partial when K is not a whole number of them
  int64_t full_steps;  // steps that lie wholly inside a row
  int64_t tail_bytes;  // bytes of the partial step (0 if none)
  // Activations, packed per block of kPassRows rows (the last block may be kLanes): block
  // at row m0 starts at x + m0 * steps * kStepBytes and holds [steps][width] steps. Rows
  // past m are zero; signed int8 is stored as x + 128.
  const unsigned char* x;
  const unsigned char* w;  // W row 0
  int64_t ldb_bytes;
  const float* row_scale;  // [mpad]: alpha * a_scale[m], 0 past m
};

// W row r of the group at n0 (rows past N repeat row N - 1; their sums are not stored).
HYP_INLINE const unsigned char* wrow(const Ctx& c, int64_t n0, int r) {
  return c.w + std::min(n0 + r, c.n - 1) * c.ldb_bytes;
}

// The partial last step of a row: its bytes, zero-extended (reading a whole step could
// cross the end of the matrix, and W's next element times a zero activation is NaN if
// that element is Inf).
HYP_INLINE int32_t tail_step(const unsigned char* p, int64_t bytes) {
  int32_t v = 0;
  std::memcpy(&v, p, size_t(bytes));
  return v;
}

HYP_INLINE int32_t load_step(const unsigned char* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// ---- The epilogue: scale, transpose to C's rows, add beta * C and store. ----

// f32 -> bf16 of 8 values, the same bits as tensor/convert.h's f32_to_bf16 (round to
// nearest even, NaN quieted).
HYP_AVX512 HYP_INLINE __m128i to_bf16(__m256 f) {
  const __m256i b = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  const __mmask8 nan = _mm256_cmpgt_epu32_mask(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                                               _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
  return _mm256_cvtepi32_epi16(_mm256_mask_mov_epi32(rounded, nan, quiet));
}

// Transposes 8 vectors a[r] (lane l: activation row l) into rows: row(l) gives the 8
// values a[0..8)[l]. Bits are only moved, so it serves int32 sums cast to float too.
struct Transposed8 {
  alignas(64) float u[8][kLanes];

  HYP_AVX512 HYP_INLINE explicit Transposed8(const __m512* a) {
    __m512 t[8];
    for (int p = 0; p < 4; ++p) {
      t[2 * p] = _mm512_unpacklo_ps(a[2 * p], a[2 * p + 1]);
      t[2 * p + 1] = _mm512_unpackhi_ps(a[2 * p], a[2 * p + 1]);
    }
    // u[4h + j], 128-bit block b: a[4h .. 4h + 4)[4b + j].
    for (int h = 0; h < 2; ++h) {
      const __m512* th = t + 4 * h;
      _mm512_store_ps(u[4 * h + 0], _mm512_shuffle_ps(th[0], th[2], _MM_SHUFFLE(1, 0, 1, 0)));
      _mm512_store_ps(u[4 * h + 1], _mm512_shuffle_ps(th[0], th[2], _MM_SHUFFLE(3, 2, 3, 2)));
      _mm512_store_ps(u[4 * h + 2], _mm512_shuffle_ps(th[1], th[3], _MM_SHUFFLE(1, 0, 1, 0)));
      _mm512_store_ps(u[4 * h + 3], _mm512_shuffle_ps(th[1], th[3], _MM_SHUFFLE(3, 2, 3, 2)));
    }
  }
  HYP_AVX512 HYP_INLINE __m256 row(int l) const {
    const int j = l % 4, b = l / 4;
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_load_ps(u[j] + 4 * b)),
                                _mm_load_ps(u[4 + j] + 4 * b), 1);
  }
};

// Stores C[row, col .. col + 8) from v (f32 values, or int32 sums for an int32 C), with
// beta * C added; `cols` masks columns past N.
HYP_AVX512 HYP_INLINE void store_row(const Ctx& c, int64_t row, int64_t col, __mmask8 cols,
                                     __m256 v) {
  const GemmArgs& g = *c.g;
  const int64_t idx = row * g.ldc + col;
  if (g.c_dtype == DType::kI32) {
    _mm256_mask_storeu_epi32(static_cast<int32_t*>(g.c) + idx, cols, _mm256_castps_si256(v));
  } else if (g.c_dtype == DType::kF32) {
    float* dst = static_cast<float*>(g.c) + idx;
    if (g.beta != 0.0f)
      v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_set1_ps(g.beta), _mm256_maskz_loadu_ps(cols, dst)));
    _mm256_mask_storeu_ps(dst, cols, v);
  } else {  // bf16
    uint16_t* dst = static_cast<uint16_t*>(g.c) + idx;
    if (g.beta != 0.0f) {
      const __m256i old = _mm256_cvtepu16_epi32(_mm_maskz_loadu_epi16(cols, dst));
      v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_set1_ps(g.beta),
                                         _mm256_castsi256_ps(_mm256_slli_epi32(old, 16))));
    }
    _mm_mask_storeu_epi16(dst, cols, to_bf16(v));
  }
}

// Finishes a pass: v[r * MV + i] holds C[m0 + 16 i + lane, n0 + r] as f32 sums (or raw
// int32 sums, cast, for an int32 C). Applies gemm.h's
// alpha * a_scale[m] * b_scale[n] * sum + bias[n] (+ beta * C in store_row), in that order.
template <int MV>
HYP_AVX512 HYP_INLINE void store_pass(const Ctx& c, __m512* v, int64_t m0, int64_t n0) {
  const GemmArgs& g = *c.g;
  if (g.c_dtype != DType::kI32) {
    for (int i = 0; i < MV; ++i) {
      const __m512 rs = _mm512_loadu_ps(c.row_scale + m0 + kLanes * i);
      for (int r = 0; r < kGroupRows; ++r) {
        const int64_t col = std::min(n0 + r, c.n - 1);
        __m512 s = _mm512_mul_ps(v[r * MV + i], rs);
        if (g.b_scale) s = _mm512_mul_ps(s, _mm512_set1_ps(g.b_scale[col]));
        if (g.bias) s = _mm512_add_ps(s, _mm512_set1_ps(g.bias[col]));
        v[r * MV + i] = s;
      }
    }
  }
  static_assert(kGroupRows == 8, "one 8 x 16 transpose per vector of rows");
  const __mmask8 cols = __mmask8((1u << std::min<int64_t>(kGroupRows, c.n - n0)) - 1);
  for (int i = 0; i < MV; ++i) {
    __m512 a[kGroupRows];
    for (int r = 0; r < kGroupRows; ++r) a[r] = v[r * MV + i];
    const Transposed8 t(a);
    const int64_t row0 = m0 + kLanes * i;
    const int rows = int(std::min<int64_t>(kLanes, c.m - row0));
    for (int l = 0; l < rows; ++l) store_row(c, row0 + l, n0, cols, t.row(l));
  }
}

// ---- The passes. x points at the block's packed steps, `width` rows per step. While a
// pass runs it prefetches the next group's rows (pf), a line per row every 16 steps, so
// memory streams the next weights while this group computes. ----

// Accumulator sets a pass keeps: kGroupRows x MV accumulators are independent chains, and one
// vector of rows (MV = 1) gives only 8, fewer than dpbf16ps / dpbusd need in flight to
// keep both FMA pipes busy; its even and odd K steps go to two sets, added at the end.
constexpr int phases(int mv) {
  return mv == 1 ? 2 : 1;
}

// Calls body(s, wd, s % PH) for every K step s with wd[r] the step's 4 bytes of W row r
// (the partial last step zero-extended, in set 0). Every 16 steps (one line of each row)
// it prefetches the same line of the next group's rows into L2: into L1 they would meet
// this group's rows in the same L1 set whenever the row length is a multiple of 4 KiB
// (K = 2048 or 4096 in bf16), 16 lines for 12 ways, and evict them between steps.
template <int PH, typename Body>
HYP_INLINE void for_each_step(const Ctx& c, const unsigned char* const* w, const char* const* pf,
                              Body&& body) {
  const int64_t full = c.full_steps;
  for (int64_t s0 = 0; s0 < full; s0 += kLanes) {
    for (int r = 0; r < kGroupRows; ++r) _mm_prefetch(pf[r] + s0 * kStepBytes, _MM_HINT_T1);
    const int64_t s1 = std::min(full, s0 + kLanes);
    int64_t s = s0;
    for (; s + PH <= s1; s += PH) {
      for (int p = 0; p < PH; ++p) {
        int32_t wd[kGroupRows];
        for (int r = 0; r < kGroupRows; ++r) wd[r] = load_step(w[r] + (s + p) * kStepBytes);
        body(s + p, wd, p);
      }
    }
    if (s < s1) {  // an odd count at the end: s is even, set 0
      int32_t wd[kGroupRows];
      for (int r = 0; r < kGroupRows; ++r) wd[r] = load_step(w[r] + s * kStepBytes);
      body(s, wd, 0);
    }
  }
  if (c.tail_bytes > 0) {
    int32_t wd[kGroupRows];
    for (int r = 0; r < kGroupRows; ++r) wd[r] = tail_step(w[r] + full * kStepBytes, c.tail_bytes);
    body(full, wd, 0);
  }
}

template <int MV>
HYP_BF16 void bf16_pass(const Ctx& c, const unsigned char* const* w, const char* const* pf,
                        const unsigned char* x, int64_t width, int64_t m0, int64_t n0) {
  constexpr int PH = phases(MV);
  __m512 acc[PH][kGroupRows * MV];
  for (int p = 0; p < PH; ++p)
    for (int j = 0; j < kGroupRows * MV; ++j) acc[p][j] = _mm512_setzero_ps();
  auto step = [&](int64_t s, const int32_t* wd, __m512* a) HYP_BF16 {
    __m512bh xv[MV];
    for (int i = 0; i < MV; ++i)
      xv[i] = (__m512bh)_mm512_load_si512(x + (s * width + kLanes * i) * kStepBytes);
    for (int r = 0; r < kGroupRows; ++r) {
      const __m512bh wb = (__m512bh)_mm512_set1_epi32(wd[r]);
      for (int i = 0; i < MV; ++i) a[r * MV + i] = _mm512_dpbf16_ps(a[r * MV + i], xv[i], wb);
    }
  };
  for_each_step<PH>(c, w, pf,
                    [&](int64_t s, const int32_t* wd, int p) HYP_BF16 { step(s, wd, acc[p]); });
  if constexpr (PH == 2)
    for (int j = 0; j < kGroupRows * MV; ++j) acc[0][j] = _mm512_add_ps(acc[0][j], acc[1][j]);
  store_pass<MV>(c, acc[0], m0, n0);
}

// int8: dpbusd multiplies the activations' unsigned bytes by W's signed ones; `excess`
// (128 * the W row's sum for signed activations stored as x + 128, else 0) comes off
// each sum. int32 arithmetic wraps, like the GEMV's and oneDNN's.
template <int MV>
HYP_VNNI void i8_pass(const Ctx& c, const unsigned char* const* w, const char* const* pf,
                      const unsigned char* x, int64_t width, int64_t m0, int64_t n0,
                      const int32_t* excess) {
  constexpr int PH = phases(MV);
  __m512i acc[PH][kGroupRows * MV];
  for (int p = 0; p < PH; ++p)
    for (int j = 0; j < kGroupRows * MV; ++j) acc[p][j] = _mm512_setzero_si512();
  auto step = [&](int64_t s, const int32_t* wd, __m512i* a) HYP_VNNI {
    __m512i xv[MV];
    for (int i = 0; i < MV; ++i)
      xv[i] = _mm512_load_si512(x + (s * width + kLanes * i) * kStepBytes);
    for (int r = 0; r < kGroupRows; ++r) {
      const __m512i wb = _mm512_set1_epi32(wd[r]);
      for (int i = 0; i < MV; ++i) a[r * MV + i] = _mm512_dpbusd_epi32(a[r * MV + i], xv[i], wb);
    }
  };
  for_each_step<PH>(c, w, pf,
                    [&](int64_t s, const int32_t* wd, int p) HYP_VNNI { step(s, wd, acc[p]); });
  if constexpr (PH == 2)
    for (int j = 0; j < kGroupRows * MV; ++j) acc[0][j] = _mm512_add_epi32(acc[0][j], acc[1][j]);
  __m512 v[kGroupRows * MV];
  const bool raw = c.g->c_dtype == DType::kI32;
  for (int r = 0; r < kGroupRows; ++r) {
    const __m512i e = _mm512_set1_epi32(excess[r]);
    for (int i = 0; i < MV; ++i) {
      const __m512i sum = _mm512_sub_epi32(acc[0][r * MV + i], e);
      v[r * MV + i] = raw ? _mm512_castsi512_ps(sum) : _mm512_cvtepi32_ps(sum);
    }
  }
  store_pass<MV>(c, v, m0, n0);
}

// 128 * sum(W row) for each of the group's rows, wrapping (dpbusd of ones against W).
HYP_VNNI void row_excess(const Ctx& c, const unsigned char* const* w, int32_t* out) {
  const int64_t k = c.g->k;
  const __m512i ones = _mm512_set1_epi8(1);
  for (int r = 0; r < kGroupRows; ++r) {
    __m512i sum = _mm512_setzero_si512();
    for (int64_t p = 0; p < k; p += 64) {
      const __mmask64 mask = k - p >= 64 ? ~__mmask64(0) : (__mmask64(1) << (k - p)) - 1;
      sum = _mm512_dpbusd_epi32(sum, ones, _mm512_maskz_loadu_epi8(mask, w[r] + p));
    }
    out[r] = int32_t(uint32_t(_mm512_reduce_add_epi32(sum)) * 128u);
  }
}

// One group of W rows at n0: every pass of kPassRows activation rows, prefetching the
// group at pf0.
template <Kind K>
void run_group(const Ctx& c, int64_t n0, int64_t pf0) {
  const unsigned char* w[kGroupRows];
  const char* pf[kGroupRows];
  for (int r = 0; r < kGroupRows; ++r) {
    w[r] = wrow(c, n0, r);
    pf[r] = reinterpret_cast<const char*>(wrow(c, pf0, r));
  }
  int32_t excess[kGroupRows] = {};
  if constexpr (K == Kind::kS8) {
    row_excess(c, w, excess);
  } else if constexpr (K == Kind::kS8Sums) {
    for (int r = 0; r < kGroupRows; ++r)
      excess[r] = int32_t(uint32_t(c.g->b_sums[std::min(n0 + r, c.n - 1)]) * 128u);
  }
  for (int64_t m0 = 0; m0 < c.mpad; m0 += kPassRows) {
    const int64_t width = std::min<int64_t>(kPassRows, c.mpad - m0);
    const unsigned char* x = c.x + m0 * c.steps * kStepBytes;
    if constexpr (K == Kind::kBf16) {
      if (width == kPassRows) {
        bf16_pass<2>(c, w, pf, x, width, m0, n0);
      } else {
        bf16_pass<1>(c, w, pf, x, width, m0, n0);
      }
    } else {
      if (width == kPassRows) {
        i8_pass<2>(c, w, pf, x, width, m0, n0, excess);
      } else {
        i8_pass<1>(c, w, pf, x, width, m0, n0, excess);
      }
    }
  }
}

// Packs the activations into the layout of Ctx::x, 16 rows by 16 steps at a time through
// a transpose (one gather per step measured 5 cycles a value on Zen 5: 8% of a batch-32
// step, serial before the parallel part).
HYP_AVX512 void pack_x(const Ctx& c, unsigned char* out) {
  const GemmArgs& g = *c.g;
  const int64_t lda_bytes = g.lda * int64_t(dtype_size(g.a_dtype));
  const bool flip = g.a_dtype == DType::kI8;  // signed int8 -> u8 as x + 128
  const __m512i excess = _mm512_set1_epi32(int32_t(0x80808080u));
  for (int64_t m0 = 0; m0 < c.mpad; m0 += kPassRows) {
    const int64_t width = std::min<int64_t>(kPassRows, c.mpad - m0);
    unsigned char* block = out + m0 * c.steps * kStepBytes;
    for (int64_t i = 0; i < width; i += kLanes) {
      const int64_t row0 = m0 + i;
      const int64_t valid = std::clamp<int64_t>(c.m - row0, 0, kLanes);
      const __mmask16 rows = __mmask16((1u << valid) - 1);
      const unsigned char* src = static_cast<const unsigned char*>(g.a) + row0 * lda_bytes;
      for (int64_t s0 = 0; s0 < c.full_steps; s0 += kLanes) {
        const int64_t n = std::min<int64_t>(kLanes, c.full_steps - s0);
        const __mmask16 steps = __mmask16((1u << n) - 1);
        __m512 r[kLanes];
        for (int l = 0; l < kLanes; ++l)
          r[l] = _mm512_castsi512_ps(
              l < valid ? _mm512_maskz_loadu_epi32(steps, src + l * lda_bytes + s0 * kStepBytes)
                        : _mm512_setzero_si512());
        simd::transpose16x16(r);
        for (int64_t s = 0; s < n; ++s) {
          const __m512i v = flip ? _mm512_maskz_xor_epi32(rows, _mm512_castps_si512(r[s]), excess)
                                 : _mm512_castps_si512(r[s]);
          _mm512_store_si512(block + ((s0 + s) * width + i) * kStepBytes, v);
        }
      }
      if (c.tail_bytes > 0) {
        int32_t* dst = reinterpret_cast<int32_t*>(block + (c.full_steps * width + i) * kStepBytes);
        for (int l = 0; l < kLanes; ++l) {
          if (l >= valid) {
            dst[l] = 0;
            continue;
          }
          int32_t v = tail_step(src + l * lda_bytes + c.full_steps * kStepBytes, c.tail_bytes);
          if (flip) v ^= int32_t(0x80808080u >> (8 * (kStepBytes - c.tail_bytes)));
          dst[l] = v;
        }
      }
    }
  }
}

using GroupFn = void (*)(const Ctx&, int64_t n0, int64_t pf0);

// The kernel for g, or nullptr when this CPU or dtype combination has none.
GroupFn select(const GemmArgs& g) {
  const CpuFeatures& f = cpu_features();
  if (!f.avx512f || !f.avx512bw || !f.avx512vl) return nullptr;
  if (g.a_dtype == DType::kBF16 && g.b_dtype == DType::kBF16 &&
      (g.c_dtype == DType::kF32 || g.c_dtype == DType::kBF16))
    return f.avx512_bf16 ? &run_group<Kind::kBf16> : nullptr;
  if ((g.a_dtype == DType::kI8 || g.a_dtype == DType::kU8) && g.b_dtype == DType::kI8 &&
      (g.c_dtype == DType::kF32 || g.c_dtype == DType::kBF16 || g.c_dtype == DType::kI32)) {
    if (!f.avx512_vnni) return nullptr;
    if (g.a_dtype == DType::kU8) return &run_group<Kind::kU8>;
    return g.b_sums != nullptr ? &run_group<Kind::kS8Sums> : &run_group<Kind::kS8>;
  }
  return nullptr;
}

bool env_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("HYPERION_BATCH_GEMM");
    return !(env && std::strcmp(env, "0") == 0);
  }();
  return enabled;
}

}  // namespace

bool batch_gemm_applies(const GemmArgs& g) {
  if (g.batch != 1 || g.trans_a != Trans::kN || g.trans_b != Trans::kT) return false;
  if (g.m < 1 || g.n < 1 || g.k < 1 || g.m > kBatchGemmMaxM) return false;
  const int64_t gemv_rows = g.b_dtype == DType::kBF16 ? kGemvMaxMBf16 : kGemvMaxM;
  if (g.m <= gemv_rows) return false;
  return select(g) != nullptr && env_enabled();
}

void batch_gemm(const GemmArgs& g) {
  const GroupFn group = select(g);
  HYP_CHECK(group != nullptr && g.batch == 1 && g.trans_a == Trans::kN && g.trans_b == Trans::kT &&
                g.m >= 1 && g.m <= kBatchGemmMaxM && g.n >= 1 && g.k >= 1,
            "batch_gemm: unsupported arguments (see batch_gemm_applies)");
  Ctx c;
  c.g = &g;
  c.m = g.m;
  c.mpad = (g.m + kLanes - 1) / kLanes * kLanes;
  c.n = g.n;
  const int64_t row_bytes = g.k * int64_t(dtype_size(g.b_dtype));
  c.full_steps = row_bytes / kStepBytes;
  c.tail_bytes = row_bytes % kStepBytes;
  c.steps = c.full_steps + (c.tail_bytes > 0 ? 1 : 0);
  c.w = static_cast<const unsigned char*>(g.b);
  c.ldb_bytes = g.ldb * int64_t(dtype_size(g.b_dtype));

  thread_local AlignedBuffer<unsigned char> xbuf;
  thread_local AlignedBuffer<float> scale_buf;
  const size_t bytes = size_t(c.mpad * c.steps * kStepBytes);
  if (xbuf.size() < bytes) xbuf = AlignedBuffer<unsigned char>(bytes);
  pack_x(c, xbuf.data());
  c.x = xbuf.data();
  if (scale_buf.size() < size_t(c.mpad)) scale_buf = AlignedBuffer<float>(size_t(c.mpad));
  for (int64_t i = 0; i < c.mpad; ++i)
    scale_buf[size_t(i)] = i < g.m ? g.alpha * (g.a_scale ? g.a_scale[i] : 1.0f) : 0.0f;
  c.row_scale = scale_buf.data();

  const int64_t groups = (g.n + kGroupRows - 1) / kGroupRows;
  // At least ~64 KiB of W per chunk, so small GEMMs do not pay for a parallel region.
  const int64_t grain =
      std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(kGroupRows * c.ldb_bytes, 1));
  parallel_chunks(groups, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t gi = g0; gi < g1; ++gi) {
      // Prefetch the next group of this block; the last one re-touches its own rows.
      const int64_t next = gi + 1 < g1 ? gi + 1 : gi;
      group(c, gi * kGroupRows, next * kGroupRows);
    }
  });
}

}  // namespace hyperion::detail
