#include "kernels/gemm_widened.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <vector>

#include "base/aligned.h"
#include "base/cpu.h"
#include "base/threads.h"
#include "tensor/convert.h"

namespace hyperion::detail {

namespace {

bool force_widen() {
  static const bool on = [] {
    const char* v = std::getenv("HYPERION_GEMM_WIDEN");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

// oneDNN single-threaded on this thread for the guard's life (restored however it ends).
class OneDnnOnOneThread {
 public:
  OneDnnOnOneThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneDnnOnOneThread() { omp_set_num_threads(saved_); }
  OneDnnOnOneThread(const OneDnnOnOneThread&) = delete;
  OneDnnOnOneThread& operator=(const OneDnnOnOneThread&) = delete;

 private:
  int saved_;
};

// Runs task(i) for i in [0, n) on the pool; an exception in any task (a GEMM oneDNN
// refuses) is rethrown here, after the loop, instead of ending the process inside the
// parallel region.
template <typename Task>
void run_tasks(int64_t n, Task&& task) {
  std::exception_ptr error;
  std::mutex mu;
  parallel_for_dynamic(n, [&](int64_t i) {
    try {
      task(i);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

// Fixed sizes (never the thread count): a tile of C, and the K chunk of a GEMM with too
// few tiles to keep the pool busy (a long sum into a small output, as a weight gradient's).
constexpr int64_t kTile = 128;
constexpr int64_t kSplitK = 1024;

// A tile of f (rows i0.., cols j0.. of batch entry bi, K from k0, kc deep) as its own GEMM.
GemmArgs tile_of(const GemmArgs& f, int64_t bi, int64_t i0, int64_t j0, int64_t k0, int64_t kc) {
  const bool ta = f.trans_a == Trans::kT, tb = f.trans_b == Trans::kT;
  GemmArgs x = f;
  x.batch = 1;
  x.m = std::min(kTile, f.m - i0);
  x.n = std::min(kTile, f.n - j0);
  x.k = kc;
  x.a = static_cast<const float*>(f.a) + bi * f.stride_a + (ta ? i0 + k0 * f.lda : i0 * f.lda + k0);
  x.b = static_cast<const float*>(f.b) + bi * f.stride_b + (tb ? j0 * f.ldb + k0 : j0 + k0 * f.ldb);
  x.c = static_cast<float*>(f.c) + bi * f.stride_c + i0 * f.ldc + j0;
  if (f.bias) x.bias = f.bias + j0;
  if (f.a_scale) x.a_scale = f.a_scale + i0;
  if (f.b_scale) x.b_scale = f.b_scale + j0;
  x.stride_a = x.stride_b = x.stride_c = 0;
  return x;
}

// Runs one tile on this thread. oneDNN's fast f32 matmul takes a bias post-op only into
// a dense output; into a tile of a wider C (ldc > n) it falls back to its reference
// implementation, tens of times slower (measured on a Zen 3: dlrm-tiny's bias layers).
// Such a tile is computed densely into scratch with its bias, then combined with C.
void run_tile(const GemmArgs& x) {
  const OneDnnOnOneThread one;
  if (x.bias == nullptr || x.ldc == x.n) {
    onednn_gemm(x);
    return;
  }
  thread_local std::vector<float> scratch;
  scratch.resize(size_t(x.m * x.n));
  GemmArgs d = x;
  d.c = scratch.data();
  d.ldc = x.n;
  d.beta = 0.0f;
  onednn_gemm(d);
  auto* c = static_cast<float*>(x.c);
  for (int64_t i = 0; i < x.m; ++i) {
    float* row = c + i * x.ldc;
    const float* t = scratch.data() + i * x.n;
    if (x.beta == 0.0f)
      std::copy(t, t + x.n, row);
    else
      for (int64_t j = 0; j < x.n; ++j) row[j] = t[j] + x.beta * row[j];
  }
}

// The K depth of one widened piece: A's rows x kc and B's kc x columns of a tile, in
// f32, stay in a core's L2 (2 x 128 KiB). For int8 it also keeps every f32 partial sum
// an exact integer: |u8 x s8| <= 255 * 128 = 32640, and 256 of them stay below 2^24.
constexpr int64_t kWidenK = 256;

// rows x cols of `src` (leading dimension ld, any GEMM operand dtype) as dense f32.
void widen_block(const void* src, DType dtype, int64_t ld, int64_t rows, int64_t cols,
                 float* dst) {
  const size_t es = dtype_size(dtype);
  for (int64_t r = 0; r < rows; ++r)
    convert_any(static_cast<const unsigned char*>(src) + size_t(r * ld) * es, dtype,
                dst + r * cols, DType::kF32, size_t(cols));
}

// One thread's scratch for a widened tile.
struct WidenScratch {
  std::vector<float> a, b, part, acc;
  std::vector<int32_t> sums;
};

// Tile (bi, i0, j0) of a bf16 or int8 GEMM: K in kWidenK pieces, each piece of A's tile
// rows and B's tile columns widened to f32 in this thread's scratch and multiplied there
// by oneDNN on this thread; bf16 pieces accumulate in f32 (oneDNN's sum post-op), int8
// pieces as exact int32. Then alpha, scales, bias and beta once, into C's dtype. Only
// the tile's operands are ever widened (never a whole weight matrix), and each element
// of W once per row tile: a decode step reads its bf16 weights once.
void widened_tile(const GemmArgs& g, int64_t bi, int64_t i0, int64_t j0) {
  thread_local WidenScratch w;
  const bool ta = g.trans_a == Trans::kT, tb = g.trans_b == Trans::kT;
  const bool int8 = g.a_dtype != DType::kBF16;
  const int64_t tm = std::min(kTile, g.m - i0), tn = std::min(kTile, g.n - j0);
  const size_t as = dtype_size(g.a_dtype), bs = dtype_size(g.b_dtype);
  const auto* a = static_cast<const unsigned char*>(g.a) + size_t(bi * g.stride_a) * as;
  const auto* b = static_cast<const unsigned char*>(g.b) + size_t(bi * g.stride_b) * bs;
  w.a.resize(size_t(tm * kWidenK));
  w.b.resize(size_t(kWidenK * tn));
  w.acc.resize(size_t(tm * tn));
  if (int8) {
    w.part.resize(size_t(tm * tn));
    w.sums.assign(size_t(tm * tn), 0);
  }
  for (int64_t k0 = 0; k0 < g.k; k0 += kWidenK) {
    const int64_t kc = std::min(kWidenK, g.k - k0);
    // A's piece as stored: [tm][kc] (N) or [kc][tm] (T); B's: [kc][tn] (N) or [tn][kc] (T).
    if (ta)
      widen_block(a + size_t(k0 * g.lda + i0) * as, g.a_dtype, g.lda, kc, tm, w.a.data());
    else
      widen_block(a + size_t(i0 * g.lda + k0) * as, g.a_dtype, g.lda, tm, kc, w.a.data());
    if (tb)
      widen_block(b + size_t(j0 * g.ldb + k0) * bs, g.b_dtype, g.ldb, tn, kc, w.b.data());
    else
      widen_block(b + size_t(k0 * g.ldb + j0) * bs, g.b_dtype, g.ldb, kc, tn, w.b.data());
    GemmArgs f = contiguous_gemm_args(g.trans_a, g.trans_b, tm, tn, kc, w.a.data(), DType::kF32,
                                      w.b.data(), DType::kF32,
                                      int8 ? w.part.data() : w.acc.data(), DType::kF32);
    f.beta = !int8 && k0 > 0 ? 1.0f : 0.0f;
    onednn_gemm(f);
    if (int8)
      for (int64_t i = 0; i < tm * tn; ++i)
        w.sums[size_t(i)] += static_cast<int32_t>(std::lrintf(w.part[size_t(i)]));
  }
  if (g.c_dtype == DType::kI32) {
    auto* c = static_cast<int32_t*>(g.c) + bi * g.stride_c + i0 * g.ldc + j0;
    for (int64_t i = 0; i < tm; ++i)
      std::copy(w.sums.data() + i * tn, w.sums.data() + (i + 1) * tn, c + i * g.ldc);
    return;
  }
  if (int8)  // the integer sums as f32, rounded as oneDNN's s32 -> f32 does
    for (int64_t i = 0; i < tm * tn; ++i) w.acc[size_t(i)] = static_cast<float>(w.sums[size_t(i)]);
  GemmArgs x = g;
  x.batch = 1;
  x.m = tm;
  x.n = tn;
  x.c = static_cast<unsigned char*>(g.c) +
        size_t(bi * g.stride_c + i0 * g.ldc + j0) * dtype_size(g.c_dtype);
  x.bias = g.bias ? g.bias + j0 : nullptr;
  x.a_scale = g.a_scale ? g.a_scale + i0 : nullptr;
  x.b_scale = g.b_scale ? g.b_scale + j0 : nullptr;
  x.stride_c = 0;
  scale_epilogue(x, w.acc.data(), tn, 0);  // runs inline: this is a pool task
}

}  // namespace

bool tiles_for_determinism(const GemmArgs& g) {
  // tile_of addresses A, B and C as f32.
  if (g.a_dtype != DType::kF32 || g.b_dtype != DType::kF32 || g.c_dtype != DType::kF32)
    return false;
  // HYPERION_GEMM_TILES=0: oneDNN's own threading (faster for some shapes, not
  // reproducible across thread counts); for measuring what the tiles cost.
  static const bool off = [] {
    const char* v = std::getenv("HYPERION_GEMM_TILES");
    return v != nullptr && std::strcmp(v, "0") == 0;
  }();
  if (off) return false;
  if (force_widen()) return true;
  const CpuFeatures& f = cpu_features();
  return !(f.avx512f && f.avx512bw && f.avx512vl);
}

void tiled_f32_gemm(const GemmArgs& f) {
  if (f.m == 0 || f.n == 0 || f.k == 0) return gemm(f);  // nothing to tile
  const int64_t tm = (f.m + kTile - 1) / kTile, tn = (f.n + kTile - 1) / kTile;
  const int64_t tiles = f.batch * tm * tn;
  const int64_t chunks = tiles <= 2 && f.k >= 4 * kSplitK ? (f.k + kSplitK - 1) / kSplitK : 1;
  if (chunks == 1) {
    run_tasks(tiles, [&](int64_t t) {
      run_tile(tile_of(f, t / (tm * tn), (t / tn) % tm * kTile, t % tn * kTile, 0, f.k));
    });
    return;
  }
  // A small output with a long sum: K chunks of the same fixed size, in parallel, each into
  // its own partial sums, added in chunk order; then alpha, scales, bias and beta once.
  const int64_t mn = f.m * f.n, total = f.batch * mn;
  AlignedBuffer<float> partial(size_t(chunks * total));
  float* const part = partial.data();
  run_tasks(tiles * chunks, [&](int64_t task) {
    const int64_t t = task / chunks, ch = task % chunks, k0 = ch * kSplitK;
    const int64_t bi = t / (tm * tn), i0 = (t / tn) % tm * kTile, j0 = t % tn * kTile;
    GemmArgs x = tile_of(f, bi, i0, j0, k0, std::min(kSplitK, f.k - k0));
    x.alpha = 1.0f;
    x.beta = 0.0f;
    x.bias = x.a_scale = x.b_scale = nullptr;
    x.c = part + ch * total + bi * mn + i0 * f.n + j0;
    x.ldc = f.n;
    const OneDnnOnOneThread one;
    onednn_gemm(x);
  });
  parallel_chunks(total, 1 << 12, [&](int64_t b, int64_t e) {
    for (int64_t ch = 1; ch < chunks; ++ch)
      for (int64_t i = b; i < e; ++i) part[i] += part[ch * total + i];
  });
  scale_epilogue(f, part, f.n, mn);
}

bool onednn_runs_natively(const GemmArgs& g) {
  const bool bf16 = g.a_dtype == DType::kBF16;
  const bool int8 = g.a_dtype == DType::kI8 || g.a_dtype == DType::kU8;
  if (!bf16 && !int8) return true;
  if (force_widen()) return false;
  const CpuFeatures& f = cpu_features();
  if (bf16) return f.avx512f && f.avx512bw && f.avx512vl;
  return f.avx512_vnni || f.amx_int8;
}

void widened_gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0 || g.k == 0) return gemm(g);  // gemm() handles these itself
  const int64_t tm = (g.m + kTile - 1) / kTile, tn = (g.n + kTile - 1) / kTile;
  run_tasks(g.batch * tm * tn, [&](int64_t t) {
    const OneDnnOnOneThread one;
    widened_tile(g, t / (tm * tn), (t / tn) % tm * kTile, t % tn * kTile);
  });
}

}  // namespace hyperion::detail
