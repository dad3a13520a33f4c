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

// The elements an operand's GEMM reads, from the first to the last: (rows x cols at
// leading dimension ld, `batch` of them `stride` apart; stride 0 shares one).
int64_t span(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  const int64_t one = (rows - 1) * ld + cols;
  return batch > 1 && stride > 0 ? (batch - 1) * stride + one : one;
}

// Converts `n` elements of any GEMM operand dtype to f32 (exact), on the thread pool.
void widen(const void* src, DType dtype, float* dst, int64_t n) {
  const size_t es = dtype_size(dtype);
  parallel_chunks(n, 1 << 14, [&](int64_t b, int64_t e) {
    convert_any(static_cast<const unsigned char*>(src) + size_t(b) * es, dtype, dst + b, DType::kF32,
                size_t(e - b));
  });
}

// A and B of `g` as f32 copies with the same layout (leading dimensions, batch strides).
struct Widened {
  AlignedBuffer<float> a, b;
};

void widen_operands(const GemmArgs& g, Widened& w) {
  const bool ta = g.trans_a == Trans::kT, tb = g.trans_b == Trans::kT;
  const int64_t na = span(ta ? g.k : g.m, ta ? g.m : g.k, g.lda, g.batch, g.stride_a);
  const int64_t nb = span(tb ? g.n : g.k, tb ? g.k : g.n, g.ldb, g.batch, g.stride_b);
  if (int64_t(w.a.size()) < na) w.a = AlignedBuffer<float>(size_t(na));
  if (int64_t(w.b.size()) < nb) w.b = AlignedBuffer<float>(size_t(nb));
  widen(g.a, g.a_dtype, w.a.data(), na);
  widen(g.b, g.b_dtype, w.b.data(), nb);
}

void bf16_gemm(const GemmArgs& g) {
  thread_local Widened w;
  widen_operands(g, w);
  GemmArgs f = g;
  f.a = w.a.data();
  f.b = w.b.data();
  f.a_dtype = f.b_dtype = DType::kF32;
  if (g.c_dtype == DType::kF32) {
    tiled_f32_gemm(f);
    return;
  }
  // bf16 C: computed in f32 (with the old C when beta needs it), rounded once at the end;
  // only C's m x n elements are written (its padding may be another tensor's). The
  // buffer is this thread's; the workers below get its address, not their own.
  thread_local AlignedBuffer<float> cbuf;
  const int64_t mn = g.m * g.n;
  if (int64_t(cbuf.size()) < g.batch * mn) cbuf = AlignedBuffer<float>(size_t(g.batch * mn));
  float* const c = cbuf.data();
  auto rows = [&](auto&& fn) {
    parallel_chunks(g.batch * g.m, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t bi = r / g.m, i = r % g.m;
        fn(static_cast<bf16*>(g.c) + bi * g.stride_c + i * g.ldc, c + r * g.n);
      }
    });
  };
  if (g.beta != 0.0f)
    rows([&](const bf16* dst, float* t) { convert_bf16_to_f32(dst, t, size_t(g.n)); });
  f.c = c;
  f.c_dtype = DType::kF32;
  f.ldc = g.n;
  f.stride_c = mn;
  tiled_f32_gemm(f);
  rows([&](bf16* dst, const float* t) { convert_f32_to_bf16(t, dst, size_t(g.n)); });
}

// The largest K chunk whose f32 partial sums are exact: |u8 x s8| <= 255 * 128 = 32640,
// and 512 of them stay below 2^24.
constexpr int64_t kExactChunk = 512;

void int8_gemm(const GemmArgs& g) {
  thread_local Widened w;
  widen_operands(g, w);
  const int64_t mn = g.m * g.n, total = g.batch * mn;
  // This thread's buffers, used by the workers below through these pointers.
  thread_local AlignedBuffer<float> chunk_buf;
  thread_local AlignedBuffer<int32_t> sums_buf;
  if (int64_t(chunk_buf.size()) < total) chunk_buf = AlignedBuffer<float>(size_t(total));
  if (int64_t(sums_buf.size()) < total) sums_buf = AlignedBuffer<int32_t>(size_t(total));
  float* const chunk = chunk_buf.data();
  int32_t* const sums = sums_buf.data();
  std::fill(sums, sums + total, 0);
  const bool ta = g.trans_a == Trans::kT, tb = g.trans_b == Trans::kT;
  for (int64_t k0 = 0; k0 < g.k; k0 += kExactChunk) {
    const int64_t kc = std::min(kExactChunk, g.k - k0);
    GemmArgs f;
    f.trans_a = g.trans_a;
    f.trans_b = g.trans_b;
    f.m = g.m;
    f.n = g.n;
    f.k = kc;
    f.a = w.a.data() + (ta ? k0 * g.lda : k0);
    f.lda = g.lda;
    f.b = w.b.data() + (tb ? k0 : k0 * g.ldb);
    f.ldb = g.ldb;
    f.c = chunk;
    f.ldc = g.n;
    f.batch = g.batch;
    f.stride_a = g.stride_a;
    f.stride_b = g.stride_b;
    f.stride_c = mn;
    gemm(f);
    parallel_chunks(total, 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sums[i] += static_cast<int32_t>(std::lrintf(chunk[i]));
    });
  }
  if (g.c_dtype == DType::kI32) {
    parallel_chunks(g.batch * g.m, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t bi = r / g.m, i = r % g.m;
        std::memcpy(static_cast<int32_t*>(g.c) + bi * g.stride_c + i * g.ldc, sums + r * g.n,
                    size_t(g.n) * sizeof(int32_t));
      }
    });
    return;
  }
  // The integer sums as f32 (rounded as oneDNN's s32 -> f32 does), then the scales.
  parallel_chunks(total, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) chunk[i] = static_cast<float>(sums[i]);
  });
  scale_epilogue(g, chunk, g.n, mn);
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
  if (g.a_dtype == DType::kBF16)
    bf16_gemm(g);
  else
    int8_gemm(g);
}

}  // namespace hyperion::detail
