// The CUDA backend's class: the KernelBackend interface over the kernels of this directory and
// cuBLASLt, on device 0 and one stream. Ops check their views (device, dtype, shape) as
// the host backend does, queue their kernels and return; a value the host needs (a loss,
// a download) synchronises, and a data error a kernel recorded (an id out of range) is
// raised there as a hyperion::Error naming the op.
//
// Arrays the interface passes as raw host pointers (kernels/backend.h: the paged cache's
// slots and page tables, the MoE dispatch plan's row indices, grouped GEMM sizes) are
// uploaded per call; tensors and the other raw pointers are device memory.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "kernels/backend.h"
#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_runtime_util.h"
#include "kernels/cuda/op_profiler.h"
#include "kernels/diffusion_op_checks.h"

namespace hyperion::cuda {

// Small ops are defined here; the larger ones in cuda_backend.cc.

constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

inline Elem elem_of(const char* op, const char* what, const TensorView& v) {
  if (v.dtype == DType::kF32) return Elem::kF32;
  if (v.dtype == DType::kBF16) return Elem::kBF16;
  fail("{}: {} must be f32 or bf16 on the cuda backend, got {}", op, what, v.str());
}
inline Elem elem_of(const char* op, DType dt) {
  HYP_CHECK(dt == DType::kF32 || dt == DType::kBF16,
            "{}: rows must be f32 or bf16 on the cuda backend, got {}", op, dtype_name(dt));
  return dt == DType::kF32 ? Elem::kF32 : Elem::kBF16;
}

// Every pointer 16-byte aligned (the 8-wide loads of the split decode attention).
inline bool vec8_aligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if ((reinterpret_cast<uintptr_t>(p) & 15) != 0) return false;
  return true;
}

inline bool is_fp8(DType dt) {
  return dt == DType::kE4M3 || dt == DType::kE5M2;
}

class CudaBackend final : public KernelBackend {
 public:
  explicit CudaBackend(std::unique_ptr<CublasLt> lt) : lt_(std::move(lt)), scratch_(alloc_) {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
    workspace_ = DeviceBuffer(alloc_, kGemmWorkspaceBytes);
    error_ = DeviceBuffer(alloc_, sizeof(DeviceError));
    results_ = DeviceBuffer(alloc_, 64);
    check_cuda(cudaMemset(error_.data(), 0, sizeof(DeviceError)), "error word");
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, dev) !=
            cudaSuccess)
      multiprocessors_ = 1;
    cudaGetLastError();
    profiler_ = OpProfiler::from_environment();
    const char* gemv = std::getenv("HYPERION_CUDA_GEMV");  // 0: cuBLASLt for every GEMM
    gemv_enabled_ = gemv == nullptr || std::string(gemv) != "0";
    decode_tuning_ = DecodeTuning::from_environment();
  }

  Device device() const override { return Device::kCuda; }
  const char* name() const override { return "cuda"; }
  Allocator& allocator() override { return alloc_; }

  void adamw_step(const TensorView& params, const TensorView& grads, const TensorView& m,
                  const TensorView& v, const AdamWParams& hp,
                  const TensorView& params_bf16) override {
    const char* op = "adamw_step";
    check(op, {&params, &grads, &m, &v, &params_bf16});
    HYP_CHECK(grads.numel() == params.numel() && m.numel() == params.numel() &&
                  v.numel() == params.numel() &&
                  (params_bf16.data == nullptr || params_bf16.numel() == params.numel()),
              "{}: params {}, grads {}, m {}, v {} must have the same size", op, params.str(),
              grads.str(), m.str(), v.str());
    HYP_CHECK(hp.step >= 1, "{}: step {} must be >= 1", op, hp.step);
    if (params_bf16.data != nullptr) params_bf16.check_dtype(DType::kBF16, op);
    // Bias corrections in double, as the host kernel computes them.
    const double t = static_cast<double>(hp.step);
    const auto bias1 = static_cast<float>(1.0 - std::pow(double(hp.beta1), t));
    const auto bias2 = static_cast<float>(1.0 - std::pow(double(hp.beta2), t));
    cuda::adamw(stream_, f32(op, params), grads.data, elem_of(op, "grads", grads), f32(op, m),
                f32(op, v), params.numel(), hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay,
                bias1, bias2, hp.grad_scale, static_cast<uint16_t*>(params_bf16.data));
    launched(op);
  }
  double global_l2_norm(std::span<const TensorView> buffers) override;
  void scale_buffers(std::span<const TensorView> buffers, float s) override {
    for (const TensorView& b : buffers) {
      check("scale_buffers", {&b});
      cuda::scale(stream_, b.data, elem_of("scale_buffers", "buffer", b), b.numel(), s);
    }
    launched("scale_buffers");
  }
  // The diffusion layers (cuda_diffusion_ops.cc, diffusion_ops.cu).
  void conv2d_forward(const Conv2dShape& s, const TensorView& x, const TensorView& w,
                      const TensorView& bias, const TensorView& y) override;
  void conv2d_backward(const Conv2dShape& s, const TensorView& dy, const TensorView& x,
                       const TensorView& w, const TensorView& dx, const TensorView& dw,
                       const TensorView& dbias) override;
  void group_norm_forward(const GroupNormShape& s, const TensorView& x, const TensorView& gamma,
                          const TensorView& beta, float eps, const TensorView& y,
                          const TensorView& mean, const TensorView& rstd) override;
  void group_norm_backward(const GroupNormShape& s, const TensorView& dy, const TensorView& x,
                           const TensorView& gamma, const TensorView& mean, const TensorView& rstd,
                           const TensorView& dx, const TensorView& dgamma,
                           const TensorView& dbeta) override;
  void layer_norm_forward(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                          float eps, const TensorView& y, const TensorView& mean,
                          const TensorView& rstd) override;
  void layer_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& gamma,
                           const TensorView& mean, const TensorView& rstd, const TensorView& dx,
                           const TensorView& dgamma, const TensorView& dbeta) override;
  void upsample_nearest_forward(const TensorView& x, const TensorView& y) override;
  void upsample_nearest_backward(const TensorView& dy, const TensorView& dx) override;
  void timestep_embedding(const TensorView& t, const TimestepEmbeddingParams& p,
                          const TensorView& out) override;
  void activation_forward(Activation a, const TensorView& x, const TensorView& y) override;
  void activation_backward(Activation a, const TensorView& dy, const TensorView& x,
                           const TensorView& dx) override;
  void geglu_forward(const TensorView& x, const TensorView& h) override;
  void geglu_backward(const TensorView& dh, const TensorView& x, const TensorView& dx) override;

  void upload(const void* host_src, void* dst, size_t bytes) override {
    if (bytes == 0) return;
    not_recording("upload");
    {
      std::lock_guard<std::mutex> lock(stage_mutex_);
      if (stage_.upload(host_src, dst, bytes, stream_)) return;
    }
    check_cuda(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
  }
  void download(const void* src, void* host_dst, size_t bytes) override {
    not_recording("download");
    if (bytes > 0)
      check_cuda(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
                 "download");
    synchronize();
  }
  void synchronize() override {
    not_recording("synchronize");
    check_cuda(cudaStreamSynchronize(stream_), "synchronize");
    if (profiler_ != nullptr) profiler_->synchronized(stream_);
    raise_device_error();
  }

  bool can_record() const override { return true; }
  void record_begin() override;
  std::unique_ptr<Recording> record_end() override;
  void record_abort() override;
  bool replay(const Recording& recording) override;

  void gemm(const GemmArgs& g) override;
  void linear_many(const void* x, DType x_dtype, int64_t n, int64_t in, DType w_dtype,
                   DType y_dtype, std::span<const LinearTarget> targets) override;
  void linear_int8_many(const void* x, DType x_dtype, int64_t n, int64_t in, DType y_dtype,
                        std::span<const Int8Target> targets, int8_t* qx, float* qscale) override;
  void quantize_rows(const TensorView& x, const TensorView& q, float* scales) override {
    const char* op = "quantize_rows";
    check(op, {&x, &q});
    HYP_CHECK(x.rank() == 2 && q.shape == x.shape && q.dtype == DType::kI8,
              "{}: x {} and q {} must be [rows, cols], q int8 (the only quantised format on the "
              "cuda backend)",
              op, x.str(), q.str());
    cuda::quantize_rows_i8(stream_, x.data, elem_of(op, "x", x), x.shape[0], x.shape[1],
                           q.as<int8_t>(), scales);
    launched(op);
  }

  void rmsnorm_forward(const TensorView& x, const TensorView& weight, float eps,
                       const TensorView& y, const TensorView& rstd, float offset) override {
    const char* op = "rmsnorm_forward";
    check(op, {&x, &weight, &y, &rstd});
    HYP_CHECK(x.rank() >= 1 && x.shape == y.shape && weight.numel() == x.shape.dim(-1),
              "{}: x {}, y {} and weight {} do not match", op, x.str(), y.str(), weight.str());
    const int64_t h = x.shape.dim(-1), n = h > 0 ? x.numel() / h : 0;
    cuda::rmsnorm_forward(stream_, x.data, elem_of(op, "x", x), f32(op, weight), eps, y.data,
                          elem_of(op, "y", y), f32(op, rstd), n, h, offset);
    launched(op);
  }
  void rmsnorm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                        const TensorView& rstd, const TensorView& dx, const TensorView& dweight,
                        bool accumulate_dx, float offset) override {
    const char* op = "rmsnorm_backward";
    check(op, {&dy, &x, &weight, &rstd, &dx, &dweight});
    HYP_CHECK(x.rank() >= 1 && dy.shape == x.shape && dx.shape == x.shape && dy.dtype == x.dtype &&
                  dx.dtype == x.dtype,
              "{}: dy {}, x {} and dx {} must match", op, dy.str(), x.str(), dx.str());
    const int64_t h = x.shape.dim(-1), n = h > 0 ? x.numel() / h : 0;
    auto* scratch = static_cast<float*>(
        scratch_.get(static_cast<size_t>(rmsnorm_scratch_floats(n, h)) * sizeof(float)));
    cuda::rmsnorm_backward(stream_, dy.data, x.data, elem_of(op, "x", x), f32(op, weight),
                           f32(op, rstd), dx.data, f32(op, dweight), accumulate_dx, n, h, offset,
                           scratch);
    launched(op);
  }
  void gated_forward(GatedActivation act, const TensorView& g, const TensorView& u,
                     const TensorView& h) override {
    const char* op = "gated_forward";
    check(op, {&g, &u, &h});
    same(op, {&g, &u, &h});
    cuda::gated_forward(stream_, static_cast<int>(act), g.data, u.data, h.data, elem_of(op, "g", g),
                        g.numel());
    launched(op);
  }
  void gated_backward(GatedActivation act, const TensorView& dh, const TensorView& g,
                      const TensorView& u, const TensorView& dg, const TensorView& du) override {
    const char* op = "gated_backward";
    check(op, {&dh, &g, &u, &dg, &du});
    same(op, {&dh, &g, &u, &dg, &du});
    cuda::gated_backward(stream_, static_cast<int>(act), dh.data, g.data, u.data, dg.data, du.data,
                         elem_of(op, "g", g), g.numel());
    launched(op);
  }
  void rope_forward(const TensorView& x, const TensorView& out, int64_t start_pos,
                    const RopeTable& table) override {
    rope("rope_forward", x, out, start_pos, nullptr, table, false);
  }
  void rope_forward(const TensorView& x, const TensorView& out, const TensorView& positions,
                    const RopeTable& table) override {
    check("rope_forward", {&positions});
    positions.check_dtype(DType::kI32, "rope_forward");
    rope("rope_forward", x, out, 0, &positions, table, false);
  }
  void rope_backward(const TensorView& dy, const TensorView& dx, int64_t start_pos,
                     const RopeTable& table) override {
    rope("rope_backward", dy, dx, start_pos, nullptr, table, true);
  }
  void rope_backward(const TensorView& dy, const TensorView& dx, const TensorView& positions,
                     const RopeTable& table) override {
    check("rope_backward", {&positions});
    positions.check_dtype(DType::kI32, "rope_backward");
    rope("rope_backward", dy, dx, 0, &positions, table, true);
  }

  void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const TensorView& lse,
                         const AttentionParams& params) override {
    const char* op = "attention_forward";
    check(op, {&q, &k, &v, &out, &lse});
    if (q.rank() == 4 && q.shape[3] > 256) {
      wide_head_attention_forward(q, k, v, out, lse, params);
      return;
    }
    const AttentionShape sh = attention_shape(op, q, k, v, params);
    HYP_CHECK(out.shape == q.shape, "{}: out {} must have q's shape {}", op, out.str(), q.str());
    HYP_CHECK(lse.numel() == sh.b * sh.hq * sh.tq, "{}: lse {} must be [{}, {}, {}]", op, lse.str(),
              sh.b, sh.hq, sh.tq);
    cuda::attention_forward(stream_, sh, q.data, k.data, v.data, elem_of(op, "q", q), out.data,
                            elem_of(op, "out", out), f32(op, lse));
    launched(op);
  }
  void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const TensorView& dout, const TensorView& lse,
                          const TensorView& dq, const TensorView& dk, const TensorView& dv,
                          const AttentionParams& params) override {
    const char* op = "attention_backward";
    check(op, {&q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv});
    const AttentionShape sh = attention_shape(op, q, k, v, params);
    HYP_CHECK(out.shape == q.shape && dout.shape == q.shape && dq.shape == q.shape &&
                  dk.shape == k.shape && dv.shape == v.shape,
              "{}: out {}, dout {}, dq {}, dk {}, dv {} must match q {} and k {}", op, out.str(),
              dout.str(), dq.str(), dk.str(), dv.str(), q.str(), k.str());
    same_dtype(op, {&q, &k, &v, &out, &dout});
    same_dtype(op, {&dq, &dk, &dv});
    auto* delta = static_cast<float*>(
        scratch_.get(static_cast<size_t>(sh.b * sh.hq * sh.tq) * sizeof(float)));
    cuda::attention_backward(stream_, sh, q.data, k.data, v.data, out.data, dout.data,
                             elem_of(op, "q", q), f32(op, lse), delta, dq.data, dk.data, dv.data,
                             elem_of(op, "dq", dq));
    launched(op);
  }

  void paged_kv_write(const PagedKvCache& cache, const TensorView& k, const TensorView& v,
                      const int64_t* slots) override {
    const char* op = "paged_kv_write";
    check(op, {&k, &v});
    const PagedCacheArgs c = cache_args(op, cache);
    HYP_CHECK(k.rank() == 3 && k.shape == v.shape && k.dtype == v.dtype &&
                  k.shape[1] == cache.n_kv_heads && k.shape[2] == cache.head_dim,
              "{}: k {} and v {} must be [n, {}, {}]", op, k.str(), v.str(), cache.n_kv_heads,
              cache.head_dim);
    const int64_t n = k.shape[0], capacity = cache.num_pages * cache.page_tokens;
    for (int64_t i = 0; i < n; ++i)
      HYP_CHECK(slots[i] >= 0 && slots[i] < capacity, "{}: slot {} of token {} is outside [0, {})",
                op, slots[i], i, capacity);
    auto* dslots = static_cast<int64_t*>(scratch_.get(static_cast<size_t>(n) * sizeof(int64_t)));
    upload(slots, dslots, static_cast<size_t>(n) * sizeof(int64_t));
    cuda::paged_kv_write(stream_, c, k.data, v.data, elem_of(op, "k", k), dslots, n,
                         device_error());
    launched(op);
  }
  void paged_kv_write(const PagedKvCache& cache, const TensorView& k, const TensorView& v,
                      const PagedStepTables& t) override {
    const char* op = "paged_kv_write";
    check(op, {&k, &v});
    const PagedCacheArgs c = cache_args(op, cache);
    HYP_CHECK(k.rank() == 3 && k.shape == v.shape && k.dtype == v.dtype && k.shape[0] == t.n &&
                  k.shape[1] == cache.n_kv_heads && k.shape[2] == cache.head_dim,
              "{}: k {} and v {} must be [{} rows of the step tables, {}, {}]", op, k.str(),
              v.str(), t.n, cache.n_kv_heads, cache.head_dim);
    cuda::paged_kv_write(stream_, c, k.data, v.data, elem_of(op, "k", k), t.slots, t.n,
                         device_error());
    launched(op);
  }
  void paged_attention(const PagedKvCache& cache, const TensorView& q,
                       const PagedStepTables& tables, const TensorView& out,
                       const PagedAttentionParams& params) override;
  void paged_kv_read(const PagedKvCache& cache, const int32_t* pages, int64_t length,
                     const TensorView& k, const TensorView& v) override {
    const char* op = "paged_kv_read";
    check(op, {&k, &v});
    const PagedCacheArgs c = cache_args(op, cache);
    HYP_CHECK(k.shape == v.shape && k.dtype == v.dtype &&
                  k.numel() == length * cache.n_kv_heads * cache.head_dim,
              "{}: k {} and v {} must be [{}, {}, {}]", op, k.str(), v.str(), length,
              cache.n_kv_heads, cache.head_dim);
    const int64_t n_pages = (length + cache.page_tokens - 1) / cache.page_tokens;
    for (int64_t p = 0; p < n_pages; ++p)
      HYP_CHECK(pages[p] >= 0 && pages[p] < cache.num_pages,
                "{}: page id {} at table entry {} is outside [0, {})", op, pages[p], p,
                cache.num_pages);
    auto* dpages = static_cast<int32_t*>(scratch_.get(static_cast<size_t>(n_pages) * 4 + 4));
    upload(pages, dpages, static_cast<size_t>(n_pages) * 4);
    cuda::paged_kv_read(stream_, c, dpages, length, k.data, v.data, elem_of(op, "k", k));
    launched(op);
  }
  void paged_attention(const PagedKvCache& cache, const TensorView& q,
                       const PagedAttentionRow* rows, const TensorView& out,
                       const PagedAttentionParams& params) override;

  void router_topk_forward(const float* logits, int64_t n, int64_t e, int64_t k, bool normalize,
                           float* probs, int32_t* experts, float* weights) override {
    HYP_CHECK(n >= 0 && k >= 1 && k <= e, "router_topk_forward: need 1 <= k={} <= e={} (n={})", k,
              e, n);
    cuda::router_topk_forward(stream_, logits, n, e, k, normalize, probs, experts, weights);
    launched("router_topk_forward");
  }
  void router_topk_backward(const float* probs, const int32_t* experts, const float* weights,
                            const float* dweights, const float* dprobs, int64_t n, int64_t e,
                            int64_t k, bool normalize, float* dlogits) override {
    HYP_CHECK(n >= 0 && k >= 1 && k <= e, "router_topk_backward: need 1 <= k={} <= e={} (n={})", k,
              e, n);
    cuda::router_topk_backward(stream_, probs, experts, weights, dweights, dprobs, n, e, k,
                               normalize, dlogits);
    launched("router_topk_backward");
  }
  float load_balance_loss(const float* probs, const int32_t* experts, int64_t b, int64_t t,
                          int64_t e, int64_t k, float weight, float* dprobs,
                          float dscale) override {
    HYP_CHECK(b >= 0 && t >= 0 && k >= 1 && k <= e,
              "load_balance_loss: invalid sizes b={} t={} e={} k={}", b, t, e, k);
    auto* scratch =
        static_cast<float*>(scratch_.get(static_cast<size_t>(std::max<int64_t>(2 * b * e, 1)) * 4));
    cuda::load_balance_loss(stream_, probs, experts, b, t, e, k, weight, dprobs, dscale, scratch,
                            results_.as<float>(), device_error());
    launched("load_balance_loss");
    float loss = 0;
    download(results_.data(), &loss, sizeof(loss));
    return loss;
  }
  float router_z_loss(const float* logits, int64_t n, int64_t e, float weight, float* dlogits,
                      float dscale) override {
    HYP_CHECK(n >= 0 && e >= 1, "router_z_loss: invalid sizes n={} e={}", n, e);
    auto* scratch =
        static_cast<float*>(scratch_.get(static_cast<size_t>(std::max<int64_t>(n, 1)) * 4));
    cuda::router_z_loss(stream_, logits, n, e, weight, dlogits, dscale, scratch,
                        results_.as<float>());
    launched("router_z_loss");
    float loss = 0;
    download(results_.data(), &loss, sizeof(loss));
    return loss;
  }
  void moe_gather_rows(const void* src, DType dt, const int32_t* row_token, int64_t rows, int64_t d,
                       void* dst) override {
    const int32_t* idx = upload_indices(row_token, rows);
    cuda::moe_gather_rows(stream_, src, elem_of("moe_gather_rows", dt), idx, rows, d, dst);
    launched("moe_gather_rows");
  }
  void moe_scatter_add_rows(const void* drows, DType dt, const int32_t* pair_row, int64_t n,
                            int64_t k, int64_t d, float* dsrc) override {
    const int32_t* idx = upload_indices(pair_row, n * k);
    cuda::moe_scatter_add_rows(stream_, drows, elem_of("moe_scatter_add_rows", dt), idx, n, k, d,
                               dsrc);
    launched("moe_scatter_add_rows");
  }
  void moe_combine(const void* y, DType dt, const int32_t* pair_row, const float* weights,
                   int64_t n, int64_t k, int64_t d, float* out) override {
    const int32_t* idx = upload_indices(pair_row, n * k);
    cuda::moe_combine(stream_, y, elem_of("moe_combine", dt), idx, weights, n, k, d, out);
    launched("moe_combine");
  }
  void moe_combine_backward(const float* dout, const void* y, DType dt, const int32_t* pair_row,
                            const int32_t* row_token, const float* weights, int64_t n, int64_t k,
                            int64_t d, int64_t rows, void* dy, float* dweights) override {
    const int32_t* idx = upload_indices(pair_row, n * k, row_token, rows);
    cuda::moe_combine_backward(stream_, dout, y, elem_of("moe_combine_backward", dt), idx,
                               idx + n * k, weights, n, k, d, rows, dy, dweights);
    launched("moe_combine_backward");
  }
  void grouped_gemm(const TensorView& a, const TensorView& w, std::span<const int64_t> sizes,
                    const TensorView& c, float beta) override;
  void grouped_gemm_input_grad(const TensorView& dc, const TensorView& w,
                               std::span<const int64_t> sizes, const TensorView& da,
                               float beta) override;
  void grouped_gemm_weight_grad(const TensorView& a, const TensorView& dc,
                                std::span<const int64_t> sizes, const TensorView& dw) override;

  void embedding_forward(const TensorView& table, const TensorView& ids, const TensorView& out,
                         float scale) override {
    const char* op = "embedding_forward";
    check(op, {&table, &ids, &out});
    ids.check_dtype(DType::kI32, op);
    HYP_CHECK(table.rank() == 2 && out.numel() == ids.numel() * table.shape[1],
              "{}: table {}, ids {} and out {} do not match", op, table.str(), ids.str(),
              out.str());
    cuda::embedding_forward(stream_, table.data, elem_of(op, "table", table), ids.as<int32_t>(),
                            ids.numel(), table.shape[1], table.shape[0], out.data,
                            elem_of(op, "out", out), scale, device_error());
    launched(op);
  }
  void argmax_rows(const TensorView& x, const TensorView& out) override {
    const char* op = "argmax_rows";
    check(op, {&x, &out});
    HYP_CHECK(x.rank() == 2 && x.dtype == DType::kF32 && out.dtype == DType::kI32 &&
                  out.numel() == x.shape[0],
              "{}: x {} must be f32 [rows, n] and out {} i32 [rows]", op, x.str(), out.str());
    void* scratch =
        scratch_.get(static_cast<size_t>(cuda::argmax_scratch_bytes(x.shape[0], x.shape[1])));
    cuda::argmax_rows(stream_, x.as<float>(), x.shape[0], x.shape[1], out.as<int32_t>(),
                      scratch);
    launched(op);
  }
  void embedding_backward(const TensorView& ids, const TensorView& dout, const TensorView& dtable,
                          float scale) override {
    const char* op = "embedding_backward";
    check(op, {&ids, &dout, &dtable});
    ids.check_dtype(DType::kI32, op);
    HYP_CHECK(dtable.rank() == 2 && dout.numel() == ids.numel() * dtable.shape[1],
              "{}: ids {}, dout {} and dtable {} do not match", op, ids.str(), dout.str(),
              dtable.str());
    cuda::embedding_backward(stream_, ids.as<int32_t>(), ids.numel(), dout.data,
                             elem_of(op, "dout", dout), dtable.shape[1], dtable.shape[0],
                             f32(op, dtable), scale);
    launched(op);
  }
  void softcap_forward(const TensorView& x, float cap) override {
    const char* op = "softcap_forward";
    check(op, {&x});
    HYP_CHECK(std::isfinite(cap) && cap > 0.0f, "{}: cap must be finite and > 0, got {}", op, cap);
    cuda::softcap(stream_, x.data, elem_of(op, "x", x), x.numel(), cap);
    launched(op);
  }
  void residual_add(const TensorView& x, const TensorView& y) override {
    const char* op = "residual_add";
    check(op, {&x, &y});
    HYP_CHECK(x.numel() == y.numel(), "{}: x {} and y {} differ in size", op, x.str(), y.str());
    cuda::residual_add(stream_, x.data, elem_of(op, "x", x), f32(op, y), x.numel());
    launched(op);
  }
  void dropout_apply(const TensorView& x, const TensorView& y, float p, uint64_t key,
                     bool accumulate) override {
    const char* op = "dropout_apply";
    check(op, {&x, &y});
    check_dropout(op, x, y, p, accumulate);
    const DropoutMask m = dropout_mask(p, key);
    cuda::dropout(stream_, x.data, elem_of(op, "x", x), y.data, elem_of(op, "y", y), x.numel(), m.k0, m.k1,
                  m.threshold, m.scale, accumulate);
    launched(op);
  }
  CrossEntropyResult cross_entropy_forward(const TensorView& logits, const TensorView& targets,
                                           float softcap) override {
    return cross_entropy("cross_entropy_forward", logits, targets, nullptr, 1.0f, softcap);
  }
  CrossEntropyResult cross_entropy_fused(const TensorView& logits, const TensorView& targets,
                                         const TensorView& dlogits, float dloss,
                                         float softcap) override {
    check("cross_entropy_fused", {&dlogits});
    HYP_CHECK(dlogits.shape == logits.shape && dlogits.dtype == logits.dtype,
              "cross_entropy_fused: dlogits {} must match logits {}", dlogits.str(), logits.str());
    return cross_entropy("cross_entropy_fused", logits, targets, dlogits.data, dloss, softcap);
  }

  void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) override {
    auto ok = [](DType d) { return cuda_data_type(d) >= 0; };
    HYP_CHECK(ok(src_dtype) && ok(dst_dtype),
              "convert: {} -> {} is not on the cuda backend (f32, bf16, f16, e4m3, e5m2)",
              dtype_name(src_dtype), dtype_name(dst_dtype));
    if (src_dtype == dst_dtype) {
      copy(src, dst, n * dtype_size(src_dtype));
      return;
    }
    cuda::convert(stream_, src, static_cast<int32_t>(src_dtype), dst,
                  static_cast<int32_t>(dst_dtype), static_cast<int64_t>(n));
    launched("convert");
  }
  void copy(const void* src, void* dst, size_t bytes) override {
    if (src == dst || bytes == 0) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
    launched("copy");
  }
  void copy_2d(const void* src, size_t src_pitch, void* dst, size_t dst_pitch, size_t row_bytes,
               size_t rows) override {
    check_copy_2d(src_pitch, dst_pitch, row_bytes);
    if (row_bytes == 0 || rows == 0) return;
    check_cuda(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                 cudaMemcpyDeviceToDevice, stream_),
               "copy_2d");
    launched("copy_2d");
  }
  void zero(void* dst, size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaMemsetAsync(dst, 0, bytes, stream_), "zero");
    launched("zero");
  }

 private:
  // Every view must be device memory of this backend (or empty).
  static void check(const char* op, std::initializer_list<const TensorView*> views) {
    for (const TensorView* v : views) {
      if (v->data == nullptr) continue;
      HYP_CHECK(v->device == Device::kCuda, "{}: the cuda backend was given a {} tensor {}", op,
                device_name(v->device), v->str());
      HYP_CHECK(v->is_contiguous(), "{}: {} must be contiguous on the cuda backend", op, v->str());
    }
  }
  static void same(const char* op, std::initializer_list<const TensorView*> views) {
    const TensorView& first = **views.begin();
    for (const TensorView* v : views)
      HYP_CHECK(v->shape == first.shape && v->dtype == first.dtype,
                "{}: {} and {} must have the same shape and dtype", op, first.str(), v->str());
  }
  static void same_dtype(const char* op, std::initializer_list<const TensorView*> views) {
    const TensorView& first = **views.begin();
    for (const TensorView* v : views)
      HYP_CHECK(v->dtype == first.dtype, "{}: {} and {} must have the same dtype", op, first.str(),
                v->str());
  }
  static float* f32(const char* op, const TensorView& v) { return v.typed<float>(op); }

  // As the host kernels check them: 0 is off.
  static void check_softcap(const char* op, float softcap) {
    HYP_CHECK(softcap == 0.0f || (std::isfinite(softcap) && softcap > 0.0f),
              "{}: softcap must be 0 (off) or finite and > 0, got {}", op, softcap);
  }
  // A launch error (bad configuration, no kernel image for this device) names the op.
  void launched(const char* op) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail_cuda(e, op);
    if (profiler_ != nullptr && !recording_) profiler_->mark(op, stream_);
  }
  void not_recording(const char* op) const {
    HYP_CHECK(!recording_,
              "cuda: {} while a step is being recorded (a recording may only queue device work)",
              op);
  }
  // The tensor-core-free decode attention over tables in device memory: the split kernel
  // where it applies, else the general one.
  void decode_attention(const char* op, const PagedCacheArgs& c, const TensorView& q,
                        int64_t n_rows, const int32_t* pages, const int64_t* page_start,
                        const int64_t* lengths, const PagedAttentionParams& params,
                        const TensorView& out);
  DeviceError* device_error() { return error_.as<DeviceError>(); }
  void raise_device_error();

  void gemm_int8(const GemmArgs& g);
  void rope(const char* op, const TensorView& x, const TensorView& out, int64_t start,
            const TensorView* positions, const RopeTable& table, bool inverse);
  AttentionShape attention_shape(const char* op, const TensorView& q, const TensorView& k,
                                 const TensorView& v,
                                 const AttentionParams& params);
  // Heads wider than the flash kernels' 256 (a VAE's mid-block attention: one head of 512
  // channels): the scores of a chunk of query rows in scratch (scale Q K^T on cuBLASLt),
  // softmax in place with the log-sum-exps, then P V. Forward only, f32, no mask.
  void wide_head_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& lse,
                                   const AttentionParams& params);
  PagedCacheArgs cache_args(const char* op, const PagedKvCache& cache);
  const int32_t* upload_indices(const int32_t* a, int64_t na, const int32_t* b = nullptr,
                                int64_t nb = 0);
  CrossEntropyResult cross_entropy(const char* op, const TensorView& logits,
                                   const TensorView& targets, void* dlogits, float dloss,
                                   float softcap);

  CudaAllocator alloc_;
  std::unique_ptr<CublasLt> lt_;
  int multiprocessors_ = 1;
  // GEMMs of at most this many rows with bf16 weights run gemv.cu's one-pass kernel.
  static constexpr int64_t kGemvMaxRows = 8;
  bool gemv_enabled_ = true;
  OpProfiler* profiler_ = nullptr;  // HYPERION_CUDA_OP_TIMES
  bool recording_ = false;
  uint64_t record_frees_ = 0;  // CudaAllocator::frees() when the recording began
  // The split decode attention's shape (paged_decode.cu), overridable for tuning:
  // HYPERION_DECODE_SPLITS_PER_SM, HYPERION_DECODE_MIN_SPLIT, HYPERION_DECODE_MERGE
  // (kernel: a second kernel merges the splits; last: the last split to finish does).
  struct DecodeTuning {
    int blocks_per_multiprocessor = 2;
    int min_per_split = 32;
    bool merge_in_kernel = false;
    static DecodeTuning from_environment() {
      DecodeTuning t;
      auto number = [](const char* name, int fallback) {
        const char* v = std::getenv(name);
        const int n = v != nullptr ? std::atoi(v) : 0;
        return n >= 1 && n <= 4096 ? n : fallback;
      };
      t.blocks_per_multiprocessor = number("HYPERION_DECODE_SPLITS_PER_SM", 2);
      t.min_per_split = number("HYPERION_DECODE_MIN_SPLIT", 32);
      const char* merge = std::getenv("HYPERION_DECODE_MERGE");
      t.merge_in_kernel = merge != nullptr && std::string(merge) == "last";
      return t;
    }
  };
  DecodeTuning decode_tuning_;
  DeviceScratch decode_scratch_{alloc_};  // the split decode attention's partials
  DeviceBuffer decode_counters_;          // and its per-(row, kv head) merge counters
  cudaStream_t stream_ = nullptr;
  DeviceScratch scratch_;
  DeviceScratch fp8_scratch_{alloc_};
  // The convolution's column matrix (and its gradient), its weights as rows (in the
  // GEMM's dtype) and their gradient: separate, as one call holds them together.
  DeviceScratch conv_col_{alloc_}, conv_dcol_{alloc_}, conv_w_{alloc_}, conv_dw_{alloc_};
  DeviceBuffer workspace_, error_, results_;
  PinnedStage stage_;  // small uploads
  std::mutex stage_mutex_;
  // RoPE tables uploaded once per RopeTable::key() (positions, head_dim, theta and the
  // scaling: everything their contents follow from).
  std::map<std::string, DeviceBuffer> rope_tables_;
  std::mutex rope_mutex_;
};

}  // namespace hyperion::cuda
