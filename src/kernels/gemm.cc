#include "kernels/gemm.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/aligned.h"
#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "kernels/amx_bf16_gemm.h"
#include "kernels/batch_gemm.h"
#include "kernels/gemm_widened.h"
#include "kernels/gemv.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using dt = dnnl::memory::data_type;

dt to_dnnl(DType d) {
  switch (d) {
    case DType::kF32:
      return dt::f32;
    case DType::kBF16:
      return dt::bf16;
    case DType::kF16:
      return dt::f16;
    case DType::kI8:
      return dt::s8;
    case DType::kU8:
      return dt::u8;
    case DType::kI32:
      return dt::s32;
    default:
      fail("gemm: dtype {} is not supported by the GEMM backend", dtype_name(d));
  }
}

// Everything that determines the primitive. Pointers, alpha and the scale values are
// run-time arguments, so they are not part of the key.
struct Key {
  Trans ta, tb;
  int64_t m, n, k, lda, ldb, ldc, batch, sa, sb, sc;
  DType ad, bd, cd;
  float beta;       // only when !scaled (then oneDNN applies it as a sum post-op)
  bool bias;        // only when !scaled (then oneDNN adds it as a binary post-op)
  bool scaled;      // alpha / a_scale / b_scale present: raw f32 sums, our epilogue
  bool to_scratch;  // scaled and (beta != 0 or C not f32): sums go to f32 scratch
  bool operator==(const Key& o) const { return std::memcmp(this, &o, sizeof(Key)) == 0; }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(&k);
    size_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(Key); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
  }
};

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a_md, b_md, c_md, bias_md, scratch_md;
};

struct Backend {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  // Shared: a caller executes its entry outside the mutex, so a clear() (on shape churn,
  // or gemm_cache_clear) by another thread must not destroy a primitive in use.
  std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash> cache;
  int64_t hits = 0;
  Backend() {
    // AMX needs per-process permission from the kernel before any tile instruction.
    request_amx();
  }
};

Backend& backend() {
  static Backend b;
  return b;
}

dnnl::memory::desc matrix_desc(dt type, int64_t batch, int64_t rows, int64_t cols, Trans t,
                               int64_t ld, int64_t batch_stride, bool batched) {
  // Logical [batch, rows, cols]; physical row-major (kN) or column-major (kT) per matrix.
  // Unbatched calls use 2-D descriptors: oneDNN only picks its brgemm (AMX) kernels for
  // those, and falls back to a slower generic GEMM for a 3-D problem of batch 1.
  if (!batched) {
    return dnnl::memory::desc(
        {rows, cols}, type, t == Trans::kN ? dnnl::memory::dims{ld, 1} : dnnl::memory::dims{1, ld});
  }
  dnnl::memory::dims dims = {batch, rows, cols};
  dnnl::memory::dims strides = t == Trans::kN ? dnnl::memory::dims{batch_stride, ld, 1}
                                              : dnnl::memory::dims{batch_stride, 1, ld};
  return dnnl::memory::desc(dims, type, strides);
}

Entry create(const Key& key) {
  Backend& be = backend();
  Entry e;
  const bool batched = key.batch > 1;
  const int64_t sa = key.batch > 1 ? key.sa : key.m * key.k;
  const int64_t sb = key.batch > 1 ? key.sb : key.k * key.n;
  const int64_t sc = key.batch > 1 ? key.sc : key.m * key.ldc;
  // A batch stride of 0 shares one operand across the batch (oneDNN broadcasts batch 1).
  const int64_t batch_a = key.batch > 1 && key.sa == 0 ? 1 : key.batch;
  const int64_t batch_b = key.batch > 1 && key.sb == 0 ? 1 : key.batch;
  e.a_md = matrix_desc(to_dnnl(key.ad), batch_a, key.m, key.k, key.ta, key.lda,
                       std::max<int64_t>(sa, 1), batched);
  e.b_md = matrix_desc(to_dnnl(key.bd), batch_b, key.k, key.n, key.tb, key.ldb,
                       std::max<int64_t>(sb, 1), batched);
  if (key.to_scratch) {
    e.c_md =
        matrix_desc(dt::f32, key.batch, key.m, key.n, Trans::kN, key.n, key.m * key.n, batched);
  } else {
    e.c_md = matrix_desc(key.scaled ? dt::f32 : to_dnnl(key.cd), key.batch, key.m, key.n, Trans::kN,
                         key.ldc, std::max<int64_t>(sc, 1), batched);
  }
  // No output-scale attribute: with one, oneDNN 2.6 leaves its brgemm (AMX) kernels for
  // the generic gemm:jit path at half the speed or less. Scales are applied by our own
  // epilogue instead; plain bias and beta stay oneDNN post-ops, which brgemm supports.
  dnnl::primitive_attr attr;
  dnnl::post_ops ops;
  if (key.bias) {
    e.bias_md = batched ? dnnl::memory::desc({1, 1, key.n}, dt::f32, dnnl::memory::format_tag::abc)
                        : dnnl::memory::desc({1, key.n}, dt::f32, dnnl::memory::format_tag::ab);
    ops.append_binary(dnnl::algorithm::binary_add, e.bias_md);
  }
  if (key.beta != 0.0f) ops.append_sum(key.beta);
  attr.set_post_ops(ops);
  // Our own scratchpad, kept per thread across calls: in oneDNN's default mode every
  // execution allocates (and the kernel page-faults in) a fresh buffer for packed B,
  // which cost more than the AMX GEMM itself.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    auto desc = dnnl::matmul::desc(e.a_md, e.b_md, e.c_md);
    auto pd = dnnl::matmul::primitive_desc(desc, attr, be.engine);
    e.prim = dnnl::matmul(pd);
    e.scratch_md = pd.scratchpad_desc();
  } catch (const dnnl::error& err) {
    fail("gemm: oneDNN cannot create a matmul for {}x{}x{} ({} x {} -> {}): {}", key.m, key.n,
         key.k, dtype_name(key.ad), dtype_name(key.bd), dtype_name(key.cd), err.what());
  }
  return e;
}

void validate(const GemmArgs& g) {
  HYP_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1,
            "gemm: invalid sizes m={} n={} k={} batch={}", g.m, g.n, g.k, g.batch);
  const int64_t a_cols = g.trans_a == Trans::kN ? g.k : g.m;
  const int64_t b_cols = g.trans_b == Trans::kN ? g.n : g.k;
  HYP_CHECK(g.lda >= std::max<int64_t>(a_cols, 1),
            "gemm: lda={} is smaller than the {} columns of A ({}x{}, {})", g.lda, a_cols, g.m, g.k,
            g.trans_a == Trans::kN ? "N" : "T");
  HYP_CHECK(g.ldb >= std::max<int64_t>(b_cols, 1),
            "gemm: ldb={} is smaller than the {} columns of B ({}x{}, {})", g.ldb, b_cols, g.k, g.n,
            g.trans_b == Trans::kN ? "N" : "T");
  HYP_CHECK(g.ldc >= std::max<int64_t>(g.n, 1), "gemm: ldc={} is smaller than N={}", g.ldc, g.n);
  const bool f32 = g.a_dtype == DType::kF32 && g.b_dtype == DType::kF32 && g.c_dtype == DType::kF32;
  const bool bf16 = g.a_dtype == DType::kBF16 && g.b_dtype == DType::kBF16 &&
                    (g.c_dtype == DType::kF32 || g.c_dtype == DType::kBF16);
  const bool int8 =
      (g.a_dtype == DType::kI8 || g.a_dtype == DType::kU8) && g.b_dtype == DType::kI8 &&
      (g.c_dtype == DType::kF32 || g.c_dtype == DType::kBF16 || g.c_dtype == DType::kI32);
  HYP_CHECK(f32 || bf16 || int8,
            "gemm: unsupported dtypes A {} x B {} -> C {} (supported: f32 x f32 -> f32, bf16 x "
            "bf16 -> f32|bf16, "
            "int8|uint8 x int8 -> f32|bf16|int32)",
            dtype_name(g.a_dtype), dtype_name(g.b_dtype), dtype_name(g.c_dtype));
  if (g.c_dtype == DType::kI32) {
    HYP_CHECK(g.alpha == 1.0f && g.beta == 0.0f && !g.bias && !g.a_scale && !g.b_scale,
              "gemm: int32 output takes raw sums: alpha, beta, bias and scales are not allowed");
  }
  HYP_CHECK(g.m * g.n == 0 || (g.a && g.b && g.c) || g.k == 0,
            "gemm: null operand pointer for {}x{}x{}", g.m, g.n, g.k);
  HYP_CHECK(g.c != nullptr || g.m * g.n == 0, "gemm: null output pointer for {}x{}", g.m, g.n);
}

// Rows per block of a tall scaled GEMM (see gemm()): a block's f32 sums, 512 x N, stay in
// the L2 cache for the epilogue at the training shapes (N <= 2048).
constexpr int64_t kScaledBlockRows = 512;

// C = beta * C (+ bias), used when K == 0 (oneDNN rejects empty reductions); also how a
// Linear layer's bias is added after its product. Row by row in f32.
void empty_k(const GemmArgs& g) {
  std::vector<float> row(static_cast<size_t>(g.n));
  const size_t csize = dtype_size(g.c_dtype);
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    for (int64_t i = 0; i < g.m; ++i) {
      auto* c = static_cast<unsigned char*>(g.c) + size_t(bi * g.stride_c + i * g.ldc) * csize;
      if (g.beta != 0.0f) {
        convert_any(c, g.c_dtype, row.data(), DType::kF32, row.size());
        for (float& v : row) v *= g.beta;
      } else {
        std::fill(row.begin(), row.end(), 0.0f);
      }
      if (g.bias != nullptr)
        for (int64_t j = 0; j < g.n; ++j) row[size_t(j)] += g.bias[j];
      convert_any(row.data(), DType::kF32, c, g.c_dtype, row.size());
    }
  }
}

}  // namespace

namespace detail {

// C = alpha * a_scale[m] * b_scale[n] * sums + bias[n] + beta * C, converted to C's dtype.
// `sums` may be C itself (f32, beta == 0): each element is read before it is written.
// The per-column factors are materialised once so the row loops are branch-free and
// vectorise.
void scale_epilogue(const GemmArgs& g, const float* sums, int64_t sums_ld, int64_t sums_stride) {
  thread_local std::vector<float> col_scale, col_bias;
  col_scale.assign(size_t(g.n), 1.0f);
  col_bias.assign(size_t(g.n), 0.0f);
  if (g.b_scale) std::copy(g.b_scale, g.b_scale + g.n, col_scale.begin());
  if (g.bias) std::copy(g.bias, g.bias + g.n, col_bias.begin());
  const float* cs = col_scale.data();
  const float* cb = col_bias.data();
  const int64_t rows = g.batch * g.m, n = g.n;
  const float beta = g.beta;
  parallel_chunks(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)),
                  [&](int64_t r0, int64_t r1) {
                    thread_local std::vector<float> tmp;
                    tmp.resize(size_t(n));
                    for (int64_t r = r0; r < r1; ++r) {
                      const int64_t bi = r / g.m, i = r % g.m;
                      const float rs = g.alpha * (g.a_scale ? g.a_scale[i] : 1.0f);
                      const float* src = sums + bi * sums_stride + i * sums_ld;
                      const int64_t c_off = bi * g.stride_c + i * g.ldc;
                      if (g.c_dtype == DType::kF32) {
                        float* dst = static_cast<float*>(g.c) + c_off;
                        if (beta == 0.0f) {
                          for (int64_t j = 0; j < n; ++j) dst[j] = src[j] * rs * cs[j] + cb[j];
                        } else {
                          for (int64_t j = 0; j < n; ++j)
                            dst[j] = src[j] * rs * cs[j] + cb[j] + beta * dst[j];
                        }
                      } else {  // bf16
                        bf16* dst = static_cast<bf16*>(g.c) + c_off;
                        float* t = tmp.data();
                        if (beta != 0.0f) {
                          convert_bf16_to_f32(dst, t, size_t(n));
                          for (int64_t j = 0; j < n; ++j)
                            t[j] = src[j] * rs * cs[j] + cb[j] + beta * t[j];
                        } else {
                          for (int64_t j = 0; j < n; ++j) t[j] = src[j] * rs * cs[j] + cb[j];
                        }
                        convert_f32_to_bf16(t, dst, size_t(n));
                      }
                    }
                  });
}


}  // namespace detail

void gemm_contiguous(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                     DType a_dtype, const void* b, DType b_dtype, void* c, DType c_dtype,
                     float beta) {
  gemm(contiguous_gemm_args(trans_a, trans_b, m, n, k, a, a_dtype, b, b_dtype, c, c_dtype, beta));
}

GemmArgs contiguous_gemm_args(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k,
                              const void* a, DType a_dtype, const void* b, DType b_dtype, void* c,
                              DType c_dtype, float beta) {
  GemmArgs g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a;
  g.a_dtype = a_dtype;
  g.lda = trans_a == Trans::kN ? k : m;
  g.b = b;
  g.b_dtype = b_dtype;
  g.ldb = trans_b == Trans::kN ? n : k;
  g.c = c;
  g.c_dtype = c_dtype;
  g.ldc = n;
  g.beta = beta;
  return g;
}

void gemm(const GemmArgs& g) {
  validate(g);
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    empty_k(g);
    return;
  }
  // Decode shapes (a few rows times a big [N, K] weight) stream W at memory bandwidth
  // in our own kernel; oneDNN reaches about half of that for them.
  if (detail::gemv_applies(g)) {
    detail::gemv(g);
    return;
  }
  // Decode batches past the GEMV's rows: AMX tiles reading the weight in place, once for
  // up to 32 rows.
  if (amx_bf16_gemm_applies(g)) {
    amx_bf16_gemm(g);
    return;
  }
  // The rest of the decode batches (bf16 without AMX, int8): our AVX512-BF16 / VNNI
  // kernel, which also reads each weight once for the whole batch; oneDNN ran these shapes
  // at 30-45% of peak.
  if (detail::batch_gemm_applies(g)) {
    detail::batch_gemm(g);
    return;
  }
  // A scaled GEMM (int8 dequantisation, fp8 alpha) applies its scales in a second pass
  // over C; on a tall C that pass streams C through memory again (as long as the GEMM
  // itself at training shapes). Row blocks keep each block's sums in cache for it.
  const bool scaled = g.alpha != 1.0f || g.a_scale != nullptr || g.b_scale != nullptr;
  if (scaled && g.batch == 1 && g.m >= 2 * kScaledBlockRows) {
    for (int64_t r0 = 0; r0 < g.m; r0 += kScaledBlockRows) {
      GemmArgs b = g;
      b.m = std::min(kScaledBlockRows, g.m - r0);
      const size_t as = dtype_size(g.a_dtype);
      b.a = static_cast<const char*>(g.a) + size_t(g.trans_a == Trans::kN ? r0 * g.lda : r0) * as;
      b.c = static_cast<char*>(g.c) + size_t(r0 * g.ldc) * dtype_size(g.c_dtype);
      if (g.a_scale != nullptr) b.a_scale = g.a_scale + r0;
      gemm(b);
    }
    return;
  }
  // bf16 without AVX-512, int8 without VNNI: oneDNN cannot run them (or its int8 kernels
  // saturate), so they run widened to f32, exactly; f32 without AVX-512 runs in tiles of
  // a fixed size, for results that do not depend on the thread count
  // (kernels/gemm_widened.h).
  if (!detail::onednn_runs_natively(g)) {
    detail::widened_gemm(g);
    return;
  }
  if (detail::tiles_for_determinism(g)) {
    detail::tiled_f32_gemm(g);
    return;
  }
  detail::onednn_gemm(g);
}

void detail::onednn_gemm(const GemmArgs& g) {
  Key key{};
  std::memset(&key, 0, sizeof(key));  // padding bytes take part in hashing and comparison
  key.ta = g.trans_a;
  key.tb = g.trans_b;
  key.m = g.m;
  key.n = g.n;
  key.k = g.k;
  key.lda = g.lda;
  key.ldb = g.ldb;
  key.ldc = g.ldc;
  key.batch = g.batch;
  key.sa = g.batch > 1 ? g.stride_a : 0;
  key.sb = g.batch > 1 ? g.stride_b : 0;
  key.sc = g.batch > 1 ? g.stride_c : 0;
  key.ad = g.a_dtype;
  key.bd = g.b_dtype;
  key.cd = g.c_dtype;
  key.scaled = g.alpha != 1.0f || g.a_scale != nullptr || g.b_scale != nullptr;
  key.to_scratch = key.scaled && (g.beta != 0.0f || g.c_dtype != DType::kF32);
  key.beta = key.scaled ? 0.0f : g.beta;
  key.bias = !key.scaled && g.bias != nullptr;

  Backend& be = backend();
  std::shared_ptr<const Entry> entry;
  {
    std::lock_guard<std::mutex> lock(be.mutex);
    auto it = be.cache.find(key);
    if (it == be.cache.end()) {
      if (be.cache.size() >= 4096) be.cache.clear();  // bound memory on shape churn
      it = be.cache.emplace(key, std::make_shared<const Entry>(create(key))).first;
    } else {
      ++be.hits;
    }
    entry = it->second;
  }
  // The stream is per thread; execution of one primitive from several threads is safe.
  thread_local dnnl::stream stream(be.engine);
  std::unordered_map<int, dnnl::memory> margs;
  margs.reserve(6);
  margs.emplace(DNNL_ARG_SRC, dnnl::memory(entry->a_md, be.engine, const_cast<void*>(g.a)));
  margs.emplace(DNNL_ARG_WEIGHTS, dnnl::memory(entry->b_md, be.engine, const_cast<void*>(g.b)));
  float* sums = static_cast<float*>(g.c);
  if (key.to_scratch) {
    thread_local AlignedBuffer<float> scratch;
    const size_t need = size_t(g.batch * g.m * g.n);
    if (scratch.size() < need) scratch = AlignedBuffer<float>(need);
    sums = scratch.data();
  }
  margs.emplace(DNNL_ARG_DST, dnnl::memory(entry->c_md, be.engine, sums));
  if (key.bias) {
    margs.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                  dnnl::memory(entry->bias_md, be.engine, const_cast<float*>(g.bias)));
  }
  if (size_t bytes = entry->scratch_md.get_size(); bytes > 0) {
    thread_local AlignedBuffer<unsigned char> scratchpad;
    if (scratchpad.size() < bytes) scratchpad = AlignedBuffer<unsigned char>(bytes);
    margs.emplace(DNNL_ARG_SCRATCHPAD,
                  dnnl::memory(entry->scratch_md, be.engine, scratchpad.data()));
  }
  entry->prim.execute(stream, margs);
  stream.wait();
  if (key.scaled) {
    const int64_t sums_ld = key.to_scratch ? g.n : g.ldc;
    const int64_t sums_stride = key.to_scratch ? g.m * g.n : g.stride_c;
    detail::scale_epilogue(g, sums, sums_ld, sums_stride);
  }
}

void gemm(const TensorView& a, Trans ta, const TensorView& b, Trans tb, const TensorView& c,
          float alpha, float beta, const float* bias) {
  HYP_CHECK(a.rank() == 2 && b.rank() == 2 && c.rank() == 2,
            "gemm: operands must be 2-D, got A {} B {} C {}", a.str(), b.str(), c.str());
  HYP_CHECK(a.strides[1] == 1 && b.strides[1] == 1 && c.strides[1] == 1,
            "gemm: operands need unit stride in the last dimension: A {} B {} C {}", a.str(),
            b.str(), c.str());
  const int64_t m = ta == Trans::kN ? a.shape[0] : a.shape[1];
  const int64_t k = ta == Trans::kN ? a.shape[1] : a.shape[0];
  const int64_t kb = tb == Trans::kN ? b.shape[0] : b.shape[1];
  const int64_t n = tb == Trans::kN ? b.shape[1] : b.shape[0];
  HYP_CHECK(k == kb && c.shape[0] == m && c.shape[1] == n,
            "gemm: shape mismatch: op(A) {}x{} from A {}{}, op(B) {}x{} from B {}{}, C {}", m, k,
            a.str(), ta == Trans::kT ? "^T" : "", kb, n, b.str(), tb == Trans::kT ? "^T" : "",
            c.str());
  GemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a.data;
  g.a_dtype = a.dtype;
  g.lda = std::max<int64_t>(a.strides[0], a.shape[1]);
  g.b = b.data;
  g.b_dtype = b.dtype;
  g.ldb = std::max<int64_t>(b.strides[0], b.shape[1]);
  g.c = c.data;
  g.c_dtype = c.dtype;
  g.ldc = std::max<int64_t>(c.strides[0], c.shape[1]);
  g.alpha = alpha;
  g.beta = beta;
  g.bias = bias;
  gemm(g);
}

GemmCacheStats gemm_cache_stats() {
  Backend& be = backend();
  std::lock_guard<std::mutex> lock(be.mutex);
  return {int64_t(be.cache.size()), be.hits};
}

void gemm_cache_clear() {
  Backend& be = backend();
  std::lock_guard<std::mutex> lock(be.mutex);
  be.cache.clear();
  be.hits = 0;
}

namespace ref {

void gemm(const GemmArgs& g) {
  validate(g);
  auto at = [&](const void* p, DType d, int64_t idx) {
    return double(load_as_f32(p, d, size_t(idx)));
  };
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < g.k; ++p) {
          int64_t ia = bi * g.stride_a + (g.trans_a == Trans::kN ? i * g.lda + p : p * g.lda + i);
          int64_t ib = bi * g.stride_b + (g.trans_b == Trans::kN ? p * g.ldb + j : j * g.ldb + p);
          acc += at(g.a, g.a_dtype, ia) * at(g.b, g.b_dtype, ib);
        }
        const int64_t ic = bi * g.stride_c + i * g.ldc + j;
        unsigned char* cp = static_cast<unsigned char*>(g.c) + ic * int64_t(dtype_size(g.c_dtype));
        if (g.c_dtype == DType::kI32) {
          *reinterpret_cast<int32_t*>(cp) = static_cast<int32_t>(acc);
          continue;
        }
        double v =
            acc * g.alpha * (g.a_scale ? g.a_scale[i] : 1.0) * (g.b_scale ? g.b_scale[j] : 1.0);
        if (g.bias) v += g.bias[j];
        if (g.beta != 0.0f) v += double(g.beta) * at(g.c, g.c_dtype, ic);
        float f = static_cast<float>(v);
        convert_any(&f, DType::kF32, cp, g.c_dtype, 1);
      }
    }
  }
}

}  // namespace ref
}  // namespace hyperion
