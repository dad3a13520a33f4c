// The CUDA backend's larger ops (GEMMs, RoPE, attention shapes, the paged cache, the
// loss), the device error word, and the probe that decides whether the backend exists.
#include "kernels/cuda/cuda_backend.h"

#include <fmt/format.h>

#include "kernels/cuda/cuda_backend_impl.h"

namespace hyperion {
namespace cuda {

void CudaBackend::raise_device_error() {
  DeviceError e;
  check_cuda(cudaMemcpy(&e, error_.data(), sizeof(e), cudaMemcpyDeviceToHost), "error word");
  if (e.code == kNoError) return;
  check_cuda(cudaMemset(error_.data(), 0, sizeof(e)), "error word");
  switch (e.code) {
    case kEmbeddingIdOutOfRange:
      fail("embedding_forward: id {} at position {} is outside the vocabulary [0, {})", e.b, e.a,
           e.c);
    case kTargetOutOfRange:
      fail("cross_entropy: target {} of row {} is outside [0, {})", e.b, e.a, e.c);
    case kPageOutOfRange:
      fail("paged_attention: row {} reads page {}, outside [0, {})", e.a, e.b, e.c);
    case kExpertOutOfRange:
      fail("load_balance_loss: expert {} of pair {} is outside [0, {})", e.b, e.a, e.c);
    case kPositionOutOfRange:
      fail("rope: position {} of token {} is outside the table [0, {})", e.b, e.a, e.c);
    case kSlotOutOfRange:
      fail("paged_kv_write: slot {} of row {} is outside the cache's [0, {})", e.b, e.a, e.c);
    default:
      fail("cuda: a kernel reported error code {}", e.code);
  }
}

void CudaBackend::gemm(const GemmArgs& g) {
  HYP_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1,
            "gemm: invalid sizes m={} n={} k={} batch={}", g.m, g.n, g.k, g.batch);
  if (g.a_dtype == DType::kI8 || g.b_dtype == DType::kI8) {
    gemm_int8(g);
    return;
  }
  HYP_CHECK(g.a_scale == nullptr && g.b_scale == nullptr,
            "gemm: per-row scales are for int8 operands on the cuda backend; fp8 passes its "
            "scales as alpha");
  const bool f32 = g.a_dtype == DType::kF32 && g.b_dtype == DType::kF32 && g.c_dtype == DType::kF32;
  const bool bf16 = g.a_dtype == DType::kBF16 && g.b_dtype == DType::kBF16 &&
                    (g.c_dtype == DType::kF32 || g.c_dtype == DType::kBF16);
  const bool fp8 = is_fp8(g.a_dtype) && is_fp8(g.b_dtype) &&
                   !(g.a_dtype == DType::kE5M2 && g.b_dtype == DType::kE5M2) &&
                   (g.c_dtype == DType::kF32 || g.c_dtype == DType::kBF16);
  HYP_CHECK(f32 || bf16 || fp8,
            "gemm: unsupported dtypes A {} x B {} -> C {} on the cuda backend (f32 x f32 -> f32, "
            "bf16 x bf16 -> f32|bf16, fp8 e4m3|e5m2 (not both e5m2) -> f32|bf16)",
            dtype_name(g.a_dtype), dtype_name(g.b_dtype), dtype_name(g.c_dtype));
  const int64_t a_cols = g.trans_a == Trans::kN ? g.k : g.m;
  const int64_t b_cols = g.trans_b == Trans::kN ? g.n : g.k;
  HYP_CHECK(g.lda >= std::max<int64_t>(a_cols, 1) && g.ldb >= std::max<int64_t>(b_cols, 1) &&
                g.ldc >= std::max<int64_t>(g.n, 1),
            "gemm: leading dimensions lda={} ldb={} ldc={} too small for m={} n={} k={}", g.lda,
            g.ldb, g.ldc, g.m, g.n, g.k);
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // C = beta C (+ bias): no product to form
    HYP_CHECK(g.batch == 1 && g.ldc == g.n, "gemm: k=0 needs one contiguous C on cuda");
    if (g.beta == 0.0f)
      zero(g.c, static_cast<size_t>(g.m * g.n) * dtype_size(g.c_dtype));
    else
      cuda::scale(stream_, g.c, g.c_dtype == DType::kF32 ? Elem::kF32 : Elem::kBF16, g.m * g.n,
                  g.beta);
  } else if (fp8) {
    HYP_CHECK(g.k % 16 == 0, "gemm: fp8 on the cuda backend needs k % 16 == 0 (k={})", g.k);
    GemmArgs t = g;
    // cuBLASLt's FP8 kernels take only A [m, k] and B [n, k] row-major ("TN" in its
    // column-major terms): other layouts are transposed into scratch first.
    if (g.trans_a == Trans::kT || g.trans_b == Trans::kN) {
      HYP_CHECK(g.batch == 1, "gemm: batched fp8 GEMMs must be A [m,k] x B [n,k]^T on cuda");
      const size_t a_bytes = g.trans_a == Trans::kT ? static_cast<size_t>(g.m * g.k) : 0;
      const size_t b_bytes = g.trans_b == Trans::kN ? static_cast<size_t>(g.n * g.k) : 0;
      auto* base = static_cast<uint8_t*>(fp8_scratch_.get(a_bytes + b_bytes + 256));
      if (a_bytes > 0) {  // A is stored [k, m]
        cuda::transpose_bytes(stream_, static_cast<const uint8_t*>(g.a), g.k, g.m, g.lda, base);
        t.a = base;
        t.lda = g.k;
        t.trans_a = Trans::kN;
      }
      if (b_bytes > 0) {  // B is stored [k, n]
        uint8_t* bt = base + ((a_bytes + 255) & ~size_t(255));
        cuda::transpose_bytes(stream_, static_cast<const uint8_t*>(g.b), g.k, g.n, g.ldb, bt);
        t.b = bt;
        t.ldb = g.k;
        t.trans_b = Trans::kT;
      }
      launched("gemm (fp8 transpose)");
    }
    HYP_CHECK(t.lda % 16 == 0 && t.ldb % 16 == 0,
              "gemm: fp8 on the cuda backend needs leading dimensions % 16 == 0 (lda={} ldb={})",
              t.lda, t.ldb);
    lt_->matmul(t, stream_, workspace_.data(), workspace_.bytes());
  } else if (gemv_enabled_ && bf16 && g.m <= kGemvMaxRows && g.batch == 1 &&
             g.trans_a == Trans::kN && g.trans_b == Trans::kT && g.lda == g.k && g.ldb == g.k &&
             g.ldc == g.n && g.k % 8 == 0 && vec8_aligned({g.a, g.b})) {
    // A decode step's few rows against a weight matrix: one pass over the weights.
    cuda::gemv_bf16(stream_, g.m, g.n, g.k, g.a, g.b, g.c,
                    g.c_dtype == DType::kF32 ? Elem::kF32 : Elem::kBF16, g.alpha, g.beta);
  } else {
    lt_->matmul(g, stream_, workspace_.data(), workspace_.bytes());
  }
  if (g.bias != nullptr) {
    HYP_CHECK(g.batch == 1, "gemm: a bias with batch > 1 is not on the cuda backend");
    cuda::add_bias(stream_, g.c, g.c_dtype == DType::kF32 ? Elem::kF32 : Elem::kBF16, g.m, g.n,
                   g.ldc, g.bias);
  }
  if (profiler_ != nullptr && !recording_) {  // a GEMM's time by shape
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail_cuda(e, "gemm");
    profiler_->mark(fmt::format("gemm {}x{}x{}{} {}->{}", g.m, g.n, g.k,
                                g.batch > 1 ? fmt::format(" x{}", g.batch) : std::string(),
                                dtype_name(g.a_dtype), dtype_name(g.c_dtype)),
                    stream_);
  } else {
    launched("gemm");
  }
}

void CudaBackend::linear_many(const void* x, DType x_dtype, int64_t n, int64_t in, DType w_dtype,
                              DType y_dtype, std::span<const LinearTarget> targets) {
  bool one_pass = gemv_enabled_ && n >= 1 && n <= kGemvMaxRows && x_dtype == DType::kBF16 &&
                  w_dtype == DType::kBF16 &&
                  (y_dtype == DType::kF32 || y_dtype == DType::kBF16) && in % 8 == 0 &&
                  targets.size() <= static_cast<size_t>(cuda::kGemvMaxTargets) &&
                  vec8_aligned({x});
  for (const LinearTarget& t : targets) one_pass = one_pass && vec8_aligned({t.w}) && t.out >= 0;
  if (!one_pass) {
    KernelBackend::linear_many(x, x_dtype, n, in, w_dtype, y_dtype, targets);
    return;
  }
  const void* w[cuda::kGemvMaxTargets];
  int64_t out[cuda::kGemvMaxTargets];
  void* y[cuda::kGemvMaxTargets];
  for (size_t i = 0; i < targets.size(); ++i) {
    w[i] = targets[i].w;
    out[i] = targets[i].out;
    y[i] = targets[i].y;
  }
  cuda::gemv_bf16_many(stream_, n, in, x, w, out, y, static_cast<int>(targets.size()),
                       y_dtype == DType::kF32 ? Elem::kF32 : Elem::kBF16);
  if (profiler_ != nullptr && !recording_) {
    int64_t rows = 0;
    for (const LinearTarget& t : targets) rows += t.out;
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail_cuda(e, "linear_many");
    profiler_->mark(fmt::format("linear_many {}x{}x{} ({} matrices) {}", n, rows, in,
                                targets.size(), dtype_name(y_dtype)),
                    stream_);
  } else {
    launched("linear_many");
  }
}

void CudaBackend::linear_int8_many(const void* x, DType x_dtype, int64_t n, int64_t in,
                                   DType y_dtype, std::span<const Int8Target> targets, int8_t* qx,
                                   float* qscale) {
  bool fused = gemv_enabled_ && x_dtype == DType::kBF16 &&
               (y_dtype == DType::kF32 || y_dtype == DType::kBF16) &&
               cuda::int8_linear_quantising_applies(n, in) &&
               targets.size() <= static_cast<size_t>(cuda::kInt8MaxTargets) && vec8_aligned({x});
  for (const Int8Target& t : targets) fused = fused && vec8_aligned({t.w}) && t.out >= 0;
  if (!fused) {
    KernelBackend::linear_int8_many(x, x_dtype, n, in, y_dtype, targets, qx, qscale);
    return;
  }
  const int8_t* w[cuda::kInt8MaxTargets];
  const float* scales[cuda::kInt8MaxTargets];
  int64_t out[cuda::kInt8MaxTargets];
  void* y[cuda::kInt8MaxTargets];
  float beta[cuda::kInt8MaxTargets];
  for (size_t i = 0; i < targets.size(); ++i) {
    w[i] = targets[i].w;
    scales[i] = targets[i].scale;
    out[i] = targets[i].out;
    y[i] = targets[i].y;
    beta[i] = targets[i].beta;
  }
  cuda::int8_linear_quantising(stream_, n, in, x, w, scales, out, y, beta,
                               static_cast<int>(targets.size()),
                               y_dtype == DType::kF32 ? Elem::kF32 : Elem::kBF16);
  launched("linear_int8_many");
}

// The int8-weight matmul's form (model/linear.cc): A [m, k] int8 rows with a_scale, B
// [n, k] int8 weights with b_scale, C f32|bf16 [m, n]; the layouts the one-pass kernel reads.
void CudaBackend::gemm_int8(const GemmArgs& g) {
  HYP_CHECK(g.a_dtype == DType::kI8 && g.b_dtype == DType::kI8 &&
                (g.c_dtype == DType::kF32 || g.c_dtype == DType::kBF16) &&
                g.a_scale != nullptr && g.b_scale != nullptr && g.bias == nullptr &&
                g.batch == 1 && g.trans_a == Trans::kN && g.trans_b == Trans::kT &&
                g.lda == g.k && g.ldb == g.k && g.ldc == g.n && g.k % 16 == 0 &&
                g.k <= 131072 && vec8_aligned({g.a, g.b}),
            "gemm: int8 on the cuda backend is the int8-weight form only: int8 A [m, k] x int8 "
            "B [n, k]^T with a_scale and b_scale, contiguous and 16-byte aligned, k % 16 == 0 "
            "and at most 131072 (exact int32 sums), -> f32|bf16 C (got A {} B {} C {}, m={} "
            "n={} k={})",
            dtype_name(g.a_dtype), dtype_name(g.b_dtype), dtype_name(g.c_dtype), g.m, g.n, g.k);
  if (g.m == 0 || g.n == 0) return;
  cuda::int8_gemm_scaled(stream_, g.m, g.n, g.k, static_cast<const int8_t*>(g.a), g.a_scale,
                         static_cast<const int8_t*>(g.b), g.b_scale, g.c,
                         g.c_dtype == DType::kF32 ? Elem::kF32 : Elem::kBF16, g.alpha, g.beta);
  launched("gemm (int8)");
}

namespace {

// Row offsets of each group (sizes are host values).
std::vector<int64_t> group_offsets(const char* op, std::span<const int64_t> sizes, int64_t rows) {
  std::vector<int64_t> off(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    HYP_CHECK(sizes[i] >= 0, "{}: negative group size {} for group {}", op, sizes[i], i);
    off[i + 1] = off[i] + sizes[i];
  }
  HYP_CHECK(off.back() == rows, "{}: group sizes sum to {}, the token matrix has {} rows", op,
            off.back(), rows);
  return off;
}

}  // namespace

// C_g = A_g W_g^T (+ beta C_g): one cuBLASLt GEMM per non-empty group.
void CudaBackend::grouped_gemm(const TensorView& a, const TensorView& w,
                               std::span<const int64_t> sizes, const TensorView& c, float beta) {
  const char* op = "grouped_gemm";
  check(op, {&a, &w, &c});
  HYP_CHECK(a.rank() == 2 && w.rank() == 3 && c.rank() == 2 &&
                w.shape[0] == static_cast<int64_t>(sizes.size()) && w.shape[2] == a.shape[1] &&
                c.shape[0] == a.shape[0] && c.shape[1] == w.shape[1],
            "{}: A {}, W {}, C {} and {} groups do not match", op, a.str(), w.str(), c.str(),
            sizes.size());
  const std::vector<int64_t> off = group_offsets(op, sizes, a.shape[0]);
  const int64_t n = w.shape[1], k = w.shape[2];
  const size_t as = dtype_size(a.dtype), ws = dtype_size(w.dtype), cs = dtype_size(c.dtype);
  for (size_t gi = 0; gi < sizes.size(); ++gi) {
    if (sizes[gi] == 0) continue;
    gemm(contiguous_gemm_args(Trans::kN, Trans::kT, sizes[gi], n, k,
                              a.as<unsigned char>() + off[gi] * k * as, a.dtype,
                              w.as<unsigned char>() + static_cast<int64_t>(gi) * n * k * ws,
                              w.dtype, c.as<unsigned char>() + off[gi] * n * cs, c.dtype, beta));
  }
}

// dA_g = dC_g W_g (+ beta dA_g).
void CudaBackend::grouped_gemm_input_grad(const TensorView& dc, const TensorView& w,
                                          std::span<const int64_t> sizes, const TensorView& da,
                                          float beta) {
  const char* op = "grouped_gemm_input_grad";
  check(op, {&dc, &w, &da});
  HYP_CHECK(dc.rank() == 2 && w.rank() == 3 && da.rank() == 2 &&
                w.shape[0] == static_cast<int64_t>(sizes.size()) && w.shape[1] == dc.shape[1] &&
                da.shape[0] == dc.shape[0] && da.shape[1] == w.shape[2],
            "{}: dC {}, W {}, dA {} and {} groups do not match", op, dc.str(), w.str(), da.str(),
            sizes.size());
  const std::vector<int64_t> off = group_offsets(op, sizes, dc.shape[0]);
  const int64_t n = w.shape[1], k = w.shape[2];
  const size_t cs = dtype_size(dc.dtype), ws = dtype_size(w.dtype), as = dtype_size(da.dtype);
  for (size_t gi = 0; gi < sizes.size(); ++gi) {
    if (sizes[gi] == 0) continue;
    gemm(contiguous_gemm_args(Trans::kN, Trans::kN, sizes[gi], k, n,
                              dc.as<unsigned char>() + off[gi] * n * cs, dc.dtype,
                              w.as<unsigned char>() + static_cast<int64_t>(gi) * n * k * ws,
                              w.dtype, da.as<unsigned char>() + off[gi] * k * as, da.dtype, beta));
  }
}

// dW_g += dC_g^T A_g (f32).
void CudaBackend::grouped_gemm_weight_grad(const TensorView& a, const TensorView& dc,
                                           std::span<const int64_t> sizes, const TensorView& dw) {
  const char* op = "grouped_gemm_weight_grad";
  check(op, {&a, &dc, &dw});
  HYP_CHECK(a.rank() == 2 && dc.rank() == 2 && dw.rank() == 3 &&
                dw.shape[0] == static_cast<int64_t>(sizes.size()) && dw.shape[1] == dc.shape[1] &&
                dw.shape[2] == a.shape[1] && a.shape[0] == dc.shape[0],
            "{}: A {}, dC {}, dW {} and {} groups do not match", op, a.str(), dc.str(), dw.str(),
            sizes.size());
  dw.check_dtype(DType::kF32, op);
  const std::vector<int64_t> off = group_offsets(op, sizes, a.shape[0]);
  const int64_t n = dw.shape[1], k = dw.shape[2];
  const size_t as = dtype_size(a.dtype), cs = dtype_size(dc.dtype);
  for (size_t gi = 0; gi < sizes.size(); ++gi) {
    if (sizes[gi] == 0) continue;
    gemm(contiguous_gemm_args(
        Trans::kT, Trans::kN, n, k, sizes[gi], dc.as<unsigned char>() + off[gi] * n * cs, dc.dtype,
        a.as<unsigned char>() + off[gi] * k * as, a.dtype,
        dw.as<float>() + static_cast<int64_t>(gi) * n * k, DType::kF32, 1.0f));
  }
}

void CudaBackend::rope(const char* op, const TensorView& x, const TensorView& out, int64_t start,
                       const TensorView* positions, const RopeTable& table, bool inverse) {
  check(op, {&x, &out});
  HYP_CHECK(x.rank() == 4 && x.shape == out.shape && x.dtype == out.dtype &&
                x.shape[3] == table.head_dim && x.shape[3] % 2 == 0,
            "{}: x {} and out {} must be [B, T, H, {}]", op, x.str(), out.str(), table.head_dim);
  const int64_t b = x.shape[0], t = x.shape[1];
  bool per_batch = false;
  if (positions != nullptr) {
    per_batch = positions->numel() == b * t && b > 1;
    HYP_CHECK(positions->numel() == t || positions->numel() == b * t,
              "{}: positions {} must be [T] or [B, T] for x {}", op, positions->str(), x.str());
  } else {
    HYP_CHECK(start >= 0 && start + t <= table.max_positions,
              "{}: positions [{}, {}) exceed the table's {}", op, start, start + t,
              table.max_positions);
  }
  const float* cos_sin = nullptr;
  {
    std::lock_guard<std::mutex> lock(rope_mutex_);
    const size_t half = static_cast<size_t>(table.max_positions * (table.head_dim / 2));
    auto it = rope_tables_.find(table.key());
    if (it == rope_tables_.end()) {  // into the map only once both uploads are queued
      DeviceBuffer buf(alloc_, 2 * half * sizeof(float));
      upload(table.cos.data(), buf.data(), half * sizeof(float));
      upload(table.sin.data(), buf.as<float>() + half, half * sizeof(float));
      it = rope_tables_.emplace(table.key(), std::move(buf)).first;
    }
    cos_sin = it->second.as<float>();
  }
  const size_t half = static_cast<size_t>(table.max_positions * (table.head_dim / 2));
  cuda::rope(stream_, x.data, out.data, elem_of(op, "x", x), b, t, x.shape[2], x.shape[3], start,
             positions != nullptr ? positions->as<int32_t>() : nullptr, per_batch, cos_sin,
             cos_sin + half, table.max_positions, inverse, device_error());
  launched(op);
}

AttentionShape CudaBackend::attention_shape(const char* op, const TensorView& q,
                                            const TensorView& k, const TensorView& v,
                                            const AttentionParams& params) {
  HYP_CHECK(q.rank() == 4 && k.rank() == 4 && k.shape == v.shape && q.shape[0] == k.shape[0] &&
                q.shape[3] == k.shape[3],
            "{}: q {}, k {} and v {} must be [B, Tq, Hq, D] and [B, Tk, Hkv, D]", op, q.str(),
            k.str(), v.str());
  // Causal (the decoders) or not (a diffusion UNet's self- and cross-attention, where
  // Tq and Tk are any sizes: 4096 latent pixels against 77 text tokens).
  AttentionShape s{q.shape[0], q.shape[1], k.shape[1], q.shape[2],
                   k.shape[2], q.shape[3], 0,          params.causal};
  HYP_CHECK(s.hkv > 0 && s.hq % s.hkv == 0, "{}: {} query heads are not a multiple of {} kv heads",
            op, s.hq, s.hkv);
  HYP_CHECK(!s.causal || s.tq <= s.tk, "{}: causal attention needs Tq={} <= Tk={}", op, s.tq,
            s.tk);
  HYP_CHECK(s.tk > 0 || s.tq == 0, "{}: {} queries attend to no keys", op, s.tq);
  HYP_CHECK(s.d >= 1 && s.d <= 256,
            "{}: head_dim {} is not in [1, 256] on the cuda backend (wider heads: the forward "
            "pass only, non-causal f32)",
            op, s.d);
  HYP_CHECK(params.window >= 0 && (s.causal || params.window == 0),
            "{}: window must be >= 0 and needs causal attention, got {}", op, params.window);
  check_softcap(op, params.softcap);
  s.window = params.window;
  s.softcap = params.softcap;
  HYP_CHECK(params.scale == 0.0f || (std::isfinite(params.scale) && params.scale > 0.0f),
            "{}: scale must be finite and positive, got {}", op, params.scale);
  s.scale = params.scale > 0.0f ? params.scale : 1.0f / std::sqrt(static_cast<float>(s.d));
  return s;
}

namespace {

// C[m, n] = alpha * A[m, k] op(B) (B [k, n], or [n, k] transposed), f32, leading
// dimensions given: the wide-head attention's two products.
GemmArgs f32_gemm(Trans trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc, float alpha) {
  GemmArgs g{};
  g.trans_a = Trans::kN;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a;
  g.lda = lda;
  g.b = b;
  g.ldb = ldb;
  g.c = c;
  g.ldc = ldc;
  g.alpha = alpha;
  return g;
}

}  // namespace

void CudaBackend::wide_head_attention_forward(const TensorView& q, const TensorView& k,
                                              const TensorView& v, const TensorView& out,
                                              const TensorView& lse,
                                              const AttentionParams& params) {
  const char* op = "attention_forward";
  HYP_CHECK(k.rank() == 4 && k.shape == v.shape && q.shape[0] == k.shape[0] &&
                q.shape[3] == k.shape[3] && out.shape == q.shape,
            "{}: q {}, k {}, v {} and out {} must be [B, Tq, Hq, D], [B, Tk, Hkv, D] and q's", op,
            q.str(), k.str(), v.str(), out.str());
  const int64_t b = q.shape[0], tq = q.shape[1], hq = q.shape[2], d = q.shape[3];
  const int64_t tk = k.shape[1], hkv = k.shape[2];
  HYP_CHECK(hkv > 0 && hq % hkv == 0, "{}: {} query heads are not a multiple of {} kv heads", op,
            hq, hkv);
  HYP_CHECK(!params.causal && params.window == 0 && params.softcap == 0.0f,
            "{}: head_dim {} (over 256) runs without a causal mask, window or softcap on the cuda "
            "backend",
            op, d);
  for (const TensorView* t : {&q, &k, &v, &out})
    HYP_CHECK(t->dtype == DType::kF32, "{}: head_dim {} (over 256) runs in f32 on the cuda backend, got {}",
              op, d, t->str());
  HYP_CHECK(lse.numel() == b * hq * tq, "{}: lse {} must be [{}, {}, {}]", op, lse.str(), b, hq, tq);
  HYP_CHECK(tk > 0 || tq == 0, "{}: {} queries attend to no keys", op, tq);
  HYP_CHECK(params.scale == 0.0f || (std::isfinite(params.scale) && params.scale > 0.0f),
            "{}: scale must be finite and positive, got {}", op, params.scale);
  const float scale = params.scale > 0.0f ? params.scale : 1.0f / std::sqrt(static_cast<float>(d));
  if (b * tq == 0) return;
  // Query rows per chunk: the chunk's scores within 256 MiB.
  const int64_t budget = int64_t{256} << 20;
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(tq, budget / (tk * 4)));
  auto* scores = static_cast<float*>(scratch_.get(static_cast<size_t>(rows * tk) * sizeof(float)));
  const auto* qp = q.as<float>();
  const auto* kp = k.as<float>();
  const auto* vp = v.as<float>();
  auto* op_out = out.as<float>();
  auto* lp = f32(op, lse);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kvh = h / (hq / hkv);
      const float* kh = kp + (bi * tk * hkv + kvh) * d;
      const float* vh = vp + (bi * tk * hkv + kvh) * d;
      for (int64_t r0 = 0; r0 < tq; r0 += rows) {
        const int64_t n = std::min(rows, tq - r0);
        // Scores [n, tk] = scale * Q K^T, softmax in place, then out rows = P V.
        gemm(f32_gemm(Trans::kT, n, tk, d, qp + ((bi * tq + r0) * hq + h) * d, hq * d, kh, hkv * d, scores, tk,
                      scale));
        cuda::softmax_rows(stream_, scores, n, tk, lp + (bi * hq + h) * tq + r0);
        launched(op);
        gemm(f32_gemm(Trans::kN, n, d, tk, scores, tk, vh, hkv * d, op_out + ((bi * tq + r0) * hq + h) * d,
                      hq * d, 1.0f));
      }
    }
}

PagedCacheArgs CudaBackend::cache_args(const char* op, const PagedKvCache& cache) {
  HYP_CHECK(cache.dtype == DType::kF32 || cache.dtype == DType::kBF16 || cache.dtype == DType::kI8,
            "{}: a {} KV cache is not on the cuda backend (f32, bf16, int8)", op,
            dtype_name(cache.dtype));
  HYP_CHECK(
      cache.k != nullptr && cache.v != nullptr &&
          (cache.dtype != DType::kI8 || (cache.k_scale != nullptr && cache.v_scale != nullptr)),
      "{}: the cache's buffers (and an int8 cache's scales) must be set", op);
  HYP_CHECK(cache.head_dim >= 1 && cache.head_dim <= 256 && cache.page_tokens >= 1 &&
                cache.n_kv_heads >= 1,
            "{}: unsupported cache geometry (head_dim {}, page_tokens {}, kv heads {})", op,
            cache.head_dim, cache.page_tokens, cache.n_kv_heads);
  return PagedCacheArgs{cache.k,
                        cache.v,
                        cache.k_scale,
                        cache.v_scale,
                        static_cast<int32_t>(cache.dtype),
                        cache.num_pages,
                        cache.page_tokens,
                        cache.n_kv_heads,
                        cache.head_dim};
}

void CudaBackend::paged_attention(const PagedKvCache& cache, const TensorView& q,
                                  const PagedAttentionRow* rows, const TensorView& out,
                                  const PagedAttentionParams& params) {
  const char* op = "paged_attention";
  check(op, {&q, &out});
  const PagedCacheArgs c = cache_args(op, cache);
  HYP_CHECK(q.rank() == 3 && q.shape == out.shape && q.shape[2] == cache.head_dim &&
                q.shape[1] % cache.n_kv_heads == 0,
            "{}: q {} and out {} must be [n, heads (a multiple of {}), {}]", op, q.str(), out.str(),
            cache.n_kv_heads, cache.head_dim);
  HYP_CHECK(params.window >= 0 &&
                (params.window == 0 || params.mode == PagedAttentionMode::kRagged),
            "{}: a sliding window ({}) needs the ragged mode and a size >= 1", op, params.window);
  check_softcap(op, params.softcap);
  const int64_t n = q.shape[0];
  // The rows' page tables, back to back, with offsets and lengths: one upload.
  std::vector<int64_t> meta(static_cast<size_t>(2 * n));
  std::vector<int32_t> pages;
  for (int64_t r = 0; r < n; ++r) {
    HYP_CHECK(rows[r].length >= 1, "{}: row {} has length {} (must be >= 1)", op, r,
              rows[r].length);
    const int64_t len = params.mode == PagedAttentionMode::kPadded
                            ? std::max(params.padded_length, rows[r].length)
                            : rows[r].length;
    meta[static_cast<size_t>(r)] = static_cast<int64_t>(pages.size());
    meta[static_cast<size_t>(n + r)] = rows[r].length;
    const int64_t n_pages = (len + cache.page_tokens - 1) / cache.page_tokens;
    // A window's row never reads (or looks up) the pages before its first key's page:
    // those entries go up as 0 and may name released pages on the host.
    const int64_t first_page =
        params.window > 0 && rows[r].length > params.window
            ? (rows[r].length - params.window) / cache.page_tokens
            : 0;
    for (int64_t i = 0; i < n_pages; ++i) {
      if (i < first_page) {
        pages.push_back(0);
        continue;
      }
      const int32_t id = rows[r].pages[i];
      HYP_CHECK(id >= 0 && id < cache.num_pages, "{}: row {} reads page {}, outside [0, {})", op, r,
                id, cache.num_pages);
      pages.push_back(id);
    }
  }
  const size_t meta_bytes = meta.size() * sizeof(int64_t);
  auto* base = static_cast<unsigned char*>(scratch_.get(meta_bytes + pages.size() * 4 + 16));
  upload(meta.data(), base, meta_bytes);
  upload(pages.data(), base + meta_bytes, pages.size() * 4);
  const auto* dmeta = reinterpret_cast<const int64_t*>(base);
  decode_attention(op, c, q, n, reinterpret_cast<const int32_t*>(base + meta_bytes), dmeta,
                   dmeta + n, params, out);
}

void CudaBackend::paged_attention(const PagedKvCache& cache, const TensorView& q,
                                  const PagedStepTables& t, const TensorView& out,
                                  const PagedAttentionParams& params) {
  const char* op = "paged_attention";
  check(op, {&q, &out});
  const PagedCacheArgs c = cache_args(op, cache);
  HYP_CHECK(q.rank() == 3 && q.shape == out.shape && q.shape[0] == t.n &&
                q.shape[2] == cache.head_dim && q.shape[1] % cache.n_kv_heads == 0,
            "{}: q {} and out {} must be [{} rows of the step tables, heads (a multiple of {}), "
            "{}]",
            op, q.str(), out.str(), t.n, cache.n_kv_heads, cache.head_dim);
  HYP_CHECK(params.mode == PagedAttentionMode::kRagged && params.window >= 0,
            "{}: the step tables run the ragged mode only (window >= 0)", op);
  check_softcap(op, params.softcap);
  decode_attention(op, c, q, t.n, t.pages, t.page_start, t.lengths, params, out);
}

void CudaBackend::decode_attention(const char* op, const PagedCacheArgs& c, const TensorView& q,
                                   int64_t n_rows, const int32_t* pages,
                                   const int64_t* page_start, const int64_t* lengths,
                                   const PagedAttentionParams& params, const TensorView& out) {
  const int64_t heads = q.shape[1];
  const cuda::PagedScores scores{
      params.scale > 0 ? params.scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
      params.window, params.softcap};
  const Elem qt = elem_of(op, "q", q), ot = elem_of(op, "out", out);
  // (Rows go on the grid's z, at most 65535 of them.)
  if (cuda::paged_decode_applies(c, heads) && n_rows <= 65535 &&
      vec8_aligned({q.data, c.k, c.v})) {
    const int splits = cuda::paged_decode_splits(n_rows, c.n_kv_heads, multiprocessors_,
                                                 decode_tuning_.blocks_per_multiprocessor);
    const size_t bytes = cuda::paged_decode_scratch_bytes(n_rows, heads, c.head_dim, splits);
    auto* part = bytes > 0 ? static_cast<float*>(decode_scratch_.get(bytes)) : nullptr;
    int* counters = nullptr;
    if (splits > 1 && decode_tuning_.merge_in_kernel) {  // zeroed when made; left at zero
      const size_t need = static_cast<size_t>(n_rows * c.n_kv_heads) * sizeof(int);
      if (decode_counters_.bytes() < need) {
        not_recording("paged_attention (growing its merge counters)");
        decode_counters_ = DeviceBuffer();
        decode_counters_ = DeviceBuffer(alloc_, need);
        check_cuda(cudaMemsetAsync(decode_counters_.data(), 0, need, stream_), "paged_attention");
      }
      counters = decode_counters_.as<int>();
    }
    cuda::paged_decode(stream_, c, q.data, qt, n_rows, heads, pages, page_start, lengths, scores,
                       splits, decode_tuning_.min_per_split, part, counters, out.data, ot,
                       device_error());
  } else {
    cuda::paged_attention(stream_, c, q.data, qt, n_rows, heads, pages, page_start, lengths,
                          scores, out.data, ot, device_error());
  }
  launched(op);
}

// ---------------------------------------------------------------------------------------
// Recording: CUDA graphs captured from the backend's stream.

namespace {
class CudaRecording final : public KernelBackend::Recording {
 public:
  ~CudaRecording() override {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
  cudaGraphExec_t exec = nullptr;
  uint64_t frees = 0;  // CudaAllocator::frees() when it was recorded
};
}  // namespace

void CudaBackend::record_begin() {
  HYP_CHECK(!recording_, "cuda: record_begin while a recording is open");
  record_frees_ = CudaAllocator::frees();
  // Thread-local: another thread's CUDA calls (a checkpoint upload) do not break it.
  check_cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "record_begin");
  recording_ = true;
}

std::unique_ptr<KernelBackend::Recording> CudaBackend::record_end() {
  HYP_CHECK(recording_, "cuda: record_end without record_begin");
  recording_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
  if (e != cudaSuccess || graph == nullptr || CudaAllocator::frees() != record_frees_) {
    // Invalidated (an op did something a capture cannot hold) or memory moved under it:
    // the caller runs the step as usual.
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    return nullptr;
  }
  auto rec = std::make_unique<CudaRecording>();
  const cudaError_t ie = cudaGraphInstantiate(&rec->exec, graph, 0);
  cudaGraphDestroy(graph);
  if (ie != cudaSuccess) {
    cudaGetLastError();
    rec->exec = nullptr;
    return nullptr;
  }
  rec->frees = record_frees_;
  return rec;
}

void CudaBackend::record_abort() {
  if (!recording_) return;
  recording_ = false;
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream_, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();
}

bool CudaBackend::replay(const Recording& recording) {
  const auto* rec = dynamic_cast<const CudaRecording*>(&recording);
  HYP_CHECK(rec != nullptr && rec->exec != nullptr, "cuda: replay of a foreign recording");
  not_recording("replay");
  if (rec->frees != CudaAllocator::frees()) return false;
  check_cuda(cudaGraphLaunch(rec->exec, stream_), "replay");
  if (profiler_ != nullptr) profiler_->mark("replay (a recorded step)", stream_);
  return true;
}

// Partial sums of squares of every buffer side by side, then one ordered sum: the same
// result for the same buffers on every run.
double CudaBackend::global_l2_norm(std::span<const TensorView> buffers) {
  int64_t partials = 0;
  for (const TensorView& b : buffers) partials += cuda::sum_squares_blocks(b.numel());
  auto* part = static_cast<double*>(scratch_.get(static_cast<size_t>(partials + 1) * 8));
  int64_t at = 0;
  for (const TensorView& b : buffers) {
    check("global_l2_norm", {&b});
    cuda::sum_squares(stream_, b.data, elem_of("global_l2_norm", "buffer", b), b.numel(),
                      part + at);
    at += cuda::sum_squares_blocks(b.numel());
  }
  auto* total = results_.as<double>();
  cuda::sum_partials(stream_, part, partials, total);
  launched("global_l2_norm");
  double host = 0;
  download(total, &host, sizeof(host));
  return std::sqrt(host);
}

const int32_t* CudaBackend::upload_indices(const int32_t* a, int64_t na, const int32_t* b,
                                           int64_t nb) {
  auto* dst = static_cast<int32_t*>(scratch_.get(static_cast<size_t>(na + nb + 1) * 4));
  upload(a, dst, static_cast<size_t>(na) * 4);
  if (b != nullptr) upload(b, dst + na, static_cast<size_t>(nb) * 4);
  return dst;
}

CrossEntropyResult CudaBackend::cross_entropy(const char* op, const TensorView& logits,
                                              const TensorView& targets, void* dlogits,
                                              float dloss, float softcap) {
  check(op, {&logits, &targets});
  check_softcap(op, softcap);
  targets.check_dtype(DType::kI32, op);
  HYP_CHECK(logits.rank() == 2 && targets.numel() == logits.shape[0],
            "{}: logits {} must be [N, V] with N = targets {}", op, logits.str(), targets.str());
  const int64_t n = logits.shape[0], v = logits.shape[1];
  auto* row_loss = static_cast<float*>(scratch_.get(static_cast<size_t>(n + 1) * sizeof(float)));
  auto* result = results_.as<double>();
  cuda::cross_entropy(stream_, logits.data, elem_of(op, "logits", logits), targets.as<int32_t>(), n,
                      v, kIgnoreIndex, dloss, softcap, dlogits, row_loss, result, device_error());
  launched(op);
  double host[2] = {0, 0};
  download(result, host, sizeof(host));
  return CrossEntropyResult{host[0], static_cast<int64_t>(host[1])};
}

}  // namespace cuda

// ---------------------------------------------------------------------------------------
// The probe: built, a device, cuBLASLt.

namespace {

struct Probed {
  CudaStatus status;
  KernelBackend* backend = nullptr;
};

Probed probe() {
  Probed p;
  CudaStatus& s = p.status;
  s.built = true;
  s.cuda_version = HYPERION_CUDA_VERSION;
  s.archs = HYPERION_CUDA_ARCHS;
  const std::string built = fmt::format("built with CUDA {} for sm {}", s.cuda_version, s.archs);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    s.summary = fmt::format("{}; no usable device ({})", built,
                            e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return p;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || cudaSetDevice(0) != cudaSuccess) {
    cudaGetLastError();
    s.summary = fmt::format("{}; device 0 cannot be opened", built);
    return p;
  }
  s.device = prop.name;
  s.compute_capability = prop.major * 10 + prop.minor;
  s.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  auto lt = std::make_unique<cuda::CublasLt>();
  std::string why;
  if (!lt->open(&why)) {
    s.summary = fmt::format("{}; {} found but {}", built, s.device, why);
    return p;
  }
  try {
    p.backend = new cuda::CudaBackend(std::move(lt));  // lives for the process
  } catch (const Error& err) {
    s.summary = fmt::format("{}; {}: {}", built, s.device, err.what());
    return p;
  }
  s.available = true;
  s.summary = fmt::format("{} (sm_{}, {:.1f} GiB), {}", s.device, s.compute_capability,
                          static_cast<double>(s.memory_bytes) / (1 << 30), built);
  return p;
}

const Probed& probed() {
  static const Probed p = probe();
  return p;
}

}  // namespace

const CudaStatus& cuda_status() {
  return probed().status;
}
KernelBackend* cuda_backend() {
  return probed().backend;
}

void cuda_op_profile_restart() {
  if (cuda::OpProfiler* p = cuda::OpProfiler::from_environment()) p->restart();
}

}  // namespace hyperion
