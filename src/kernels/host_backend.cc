// The host backend: the Highway and oneDNN kernels of this directory behind the
// KernelBackend interface, multi-threaded by base/threads.
#include <algorithm>
#include <cstring>
#include <mutex>

#include "base/error.h"
#include "base/threads.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/diffusion_op_checks.h"
#include "kernels/embedding.h"
#include "kernels/global_norm.h"
#include "kernels/grouped_gemm.h"
#include "kernels/layer_norm.h"
#include "kernels/moe_routing.h"
#include "kernels/quantize.h"
#include "kernels/rmsnorm.h"
#include "kernels/upsample.h"
#include "tensor/convert.h"

namespace hyperion {

namespace {

// Every view a host kernel reads or writes must be host memory.
void check_host(const char* op, std::initializer_list<const TensorView*> views) {
  for (const TensorView* v : views)
    HYP_CHECK(v->data == nullptr || v->device == Device::kHost,
              "{}: the host backend was given a {} tensor {}", op, device_name(v->device),
              v->str());
}

class HostBackend final : public KernelBackend {
 public:
  Device device() const override { return Device::kHost; }
  const char* name() const override { return "host"; }
  Allocator& allocator() override { return host_allocator(); }

  void gemm(const GemmArgs& args) override { hyperion::gemm(args); }
  void rmsnorm_forward(const TensorView& x, const TensorView& weight, float eps,
                       const TensorView& y, const TensorView& rstd, float offset) override {
    check_host("rmsnorm_forward", {&x, &weight, &y, &rstd});
    hyperion::rmsnorm_forward(x, weight, eps, y, rstd, offset);
  }
  void rmsnorm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                        const TensorView& rstd, const TensorView& dx, const TensorView& dweight,
                        bool accumulate_dx, float offset) override {
    check_host("rmsnorm_backward", {&dy, &x, &weight, &rstd, &dx, &dweight});
    hyperion::rmsnorm_backward(dy, x, weight, rstd, dx, dweight, accumulate_dx, offset);
  }
  void gated_forward(GatedActivation act, const TensorView& g, const TensorView& u,
                     const TensorView& h) override {
    check_host("gated_forward", {&g, &u, &h});
    hyperion::gated_forward(act, g, u, h);
  }
  void gated_backward(GatedActivation act, const TensorView& dh, const TensorView& g,
                      const TensorView& u, const TensorView& dg, const TensorView& du) override {
    check_host("gated_backward", {&dh, &g, &u, &dg, &du});
    hyperion::gated_backward(act, dh, g, u, dg, du);
  }
  void rope_forward(const TensorView& x, const TensorView& out, int64_t start_pos,
                    const RopeTable& table) override {
    check_host("rope_forward", {&x, &out});
    hyperion::rope_forward(x, out, start_pos, table);
  }
  void rope_forward(const TensorView& x, const TensorView& out, const TensorView& positions,
                    const RopeTable& table) override {
    check_host("rope_forward", {&x, &out, &positions});
    hyperion::rope_forward(x, out, positions, table);
  }
  void rope_backward(const TensorView& dy, const TensorView& dx, int64_t start_pos,
                     const RopeTable& table) override {
    check_host("rope_backward", {&dy, &dx});
    hyperion::rope_backward(dy, dx, start_pos, table);
  }
  void rope_backward(const TensorView& dy, const TensorView& dx, const TensorView& positions,
                     const RopeTable& table) override {
    check_host("rope_backward", {&dy, &dx, &positions});
    hyperion::rope_backward(dy, dx, positions, table);
  }
  void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const TensorView& lse,
                         const AttentionParams& params) override {
    check_host("attention_forward", {&q, &k, &v, &out, &lse});
    hyperion::attention_forward(q, k, v, out, lse, params);
  }
  void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const TensorView& dout, const TensorView& lse,
                          const TensorView& dq, const TensorView& dk, const TensorView& dv,
                          const AttentionParams& params) override {
    check_host("attention_backward", {&q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv});
    hyperion::attention_backward(q, k, v, out, dout, lse, dq, dk, dv, params);
  }
  void paged_kv_write(const PagedKvCache& cache, const TensorView& k, const TensorView& v,
                      const int64_t* slots) override {
    check_host("paged_kv_write", {&k, &v});
    hyperion::paged_kv_write(cache, k, v, slots);
  }
  void paged_kv_read(const PagedKvCache& cache, const int32_t* pages, int64_t length,
                     const TensorView& k, const TensorView& v) override {
    check_host("paged_kv_read", {&k, &v});
    hyperion::paged_kv_read(cache, pages, length, k, v);
  }
  void paged_attention(const PagedKvCache& cache, const TensorView& q,
                       const PagedAttentionRow* rows, const TensorView& out,
                       const PagedAttentionParams& params) override {
    check_host("paged_attention", {&q, &out});
    hyperion::paged_attention(cache, q, rows, out, params);
  }
  void quantize_rows(const TensorView& x, const TensorView& q, float* scales) override {
    check_host("quantize_rows", {&x, &q});
    hyperion::quantize_rows(x, q, scales);
  }
  void paged_kv_write(const PagedKvCache& cache, const TensorView& k, const TensorView& v,
                      const PagedStepTables& tables) override {
    check_host("paged_kv_write", {&k, &v});
    hyperion::paged_kv_write(cache, k, v, tables);
  }
  void paged_attention(const PagedKvCache& cache, const TensorView& q,
                       const PagedStepTables& tables, const TensorView& out,
                       const PagedAttentionParams& params) override {
    check_host("paged_attention", {&q, &out});
    hyperion::paged_attention(cache, q, tables, out, params);
  }
  void router_topk_forward(const float* logits, int64_t n, int64_t e, int64_t k, bool normalize,
                           float* probs, int32_t* experts, float* weights) override {
    hyperion::router_topk_forward(logits, n, e, k, normalize, probs, experts, weights);
  }
  void router_topk_backward(const float* probs, const int32_t* experts, const float* weights,
                            const float* dweights, const float* dprobs, int64_t n, int64_t e,
                            int64_t k, bool normalize, float* dlogits) override {
    hyperion::router_topk_backward(probs, experts, weights, dweights, dprobs, n, e, k, normalize,
                                   dlogits);
  }
  float load_balance_loss(const float* probs, const int32_t* experts, int64_t b, int64_t t,
                          int64_t e, int64_t k, float weight, float* dprobs,
                          float dscale) override {
    return hyperion::load_balance_loss(probs, experts, b, t, e, k, weight, dprobs, dscale);
  }
  float router_z_loss(const float* logits, int64_t n, int64_t e, float weight, float* dlogits,
                      float dscale) override {
    return hyperion::router_z_loss(logits, n, e, weight, dlogits, dscale);
  }
  void moe_gather_rows(const void* src, DType dt, const int32_t* row_token, int64_t rows, int64_t d,
                       void* dst) override {
    hyperion::moe_gather_rows(src, dt, row_token, rows, d, dst);
  }
  void moe_scatter_add_rows(const void* drows, DType dt, const int32_t* pair_row, int64_t n,
                            int64_t k, int64_t d, float* dsrc) override {
    hyperion::moe_scatter_add_rows(drows, dt, pair_row, n, k, d, dsrc);
  }
  void moe_combine(const void* y, DType dt, const int32_t* pair_row, const float* weights,
                   int64_t n, int64_t k, int64_t d, float* out) override {
    hyperion::moe_combine(y, dt, pair_row, weights, n, k, d, out);
  }
  void moe_combine_backward(const float* dout, const void* y, DType dt, const int32_t* pair_row,
                            const int32_t* row_token, const float* weights, int64_t n, int64_t k,
                            int64_t d, int64_t rows, void* dy, float* dweights) override {
    hyperion::moe_combine_backward(dout, y, dt, pair_row, row_token, weights, n, k, d, rows, dy,
                                   dweights);
  }
  void grouped_gemm(const TensorView& a, const TensorView& w, std::span<const int64_t> sizes,
                    const TensorView& c, float beta) override {
    check_host("grouped_gemm", {&a, &w, &c});
    hyperion::grouped_gemm(a, w, sizes, c, beta);
  }
  void grouped_gemm_input_grad(const TensorView& dc, const TensorView& w,
                               std::span<const int64_t> sizes, const TensorView& da,
                               float beta) override {
    check_host("grouped_gemm_input_grad", {&dc, &w, &da});
    hyperion::grouped_gemm_input_grad(dc, w, sizes, da, beta);
  }
  void grouped_gemm_weight_grad(const TensorView& a, const TensorView& dc,
                                std::span<const int64_t> sizes, const TensorView& dw) override {
    check_host("grouped_gemm_weight_grad", {&a, &dc, &dw});
    hyperion::grouped_gemm_weight_grad(a, dc, sizes, dw);
  }
  void embedding_forward(const TensorView& table, const TensorView& ids, const TensorView& out,
                         float scale) override {
    check_host("embedding_forward", {&table, &ids, &out});
    hyperion::embedding_forward(table, ids, out, scale);
  }
  void embedding_backward(const TensorView& ids, const TensorView& dout, const TensorView& dtable,
                          float scale) override {
    check_host("embedding_backward", {&ids, &dout, &dtable});
    hyperion::embedding_backward(ids, dout, dtable, scale);
  }
  void argmax_rows(const TensorView& x, const TensorView& out) override {
    check_host("argmax_rows", {&x, &out});
    hyperion::argmax_rows(x, out);
  }
  void softcap_forward(const TensorView& x, float cap) override {
    check_host("softcap_forward", {&x});
    hyperion::softcap_forward(x, cap);
  }
  void residual_add(const TensorView& x, const TensorView& y) override {
    check_host("residual_add", {&x, &y});
    hyperion::residual_add(x, y);
  }
  void dropout_apply(const TensorView& x, const TensorView& y, float p, uint64_t key,
                     bool accumulate) override {
    check_host("dropout_apply", {&x, &y});
    hyperion::dropout_apply(x, y, p, key, accumulate);
  }
  CrossEntropyResult cross_entropy_forward(const TensorView& logits, const TensorView& targets,
                                           float softcap) override {
    check_host("cross_entropy_forward", {&logits, &targets});
    return hyperion::cross_entropy_forward(logits, targets, TensorView(), kIgnoreIndex, softcap);
  }
  CrossEntropyResult cross_entropy_fused(const TensorView& logits, const TensorView& targets,
                                         const TensorView& dlogits, float dloss,
                                         float softcap) override {
    check_host("cross_entropy_fused", {&logits, &targets, &dlogits});
    return hyperion::cross_entropy_fused(logits, targets, dlogits, dloss, TensorView(),
                                         kIgnoreIndex, softcap);
  }
  void conv2d_forward(const Conv2dShape& s, const TensorView& x, const TensorView& w,
                      const TensorView& bias, const TensorView& y) override {
    check_host("conv2d_forward", {&x, &w, &bias, &y});
    check_conv2d_forward_views(s, x, w, bias, y);
    if (x.dtype == DType::kBF16)
      hyperion::conv2d_forward_bf16(s, x.as<bf16>(), w.as<float>(), bias.as<float>(),
                                    y.as<float>());
    else
      hyperion::conv2d_forward(s, x.as<float>(), w.as<float>(), bias.as<float>(), y.as<float>());
  }
  void conv2d_backward(const Conv2dShape& s, const TensorView& dy, const TensorView& x,
                       const TensorView& w, const TensorView& dx, const TensorView& dw,
                       const TensorView& dbias) override {
    check_host("conv2d_backward", {&dy, &x, &w, &dx, &dw, &dbias});
    check_conv2d_backward_views(s, dy, x, w, dx, dw, dbias);
    if (x.dtype == DType::kBF16)
      hyperion::conv2d_backward_bf16(s, dy.as<bf16>(), x.as<bf16>(), w.as<float>(), dx.as<float>(),
                                     dw.as<float>(), dbias.as<float>());
    else
      hyperion::conv2d_backward(s, dy.as<float>(), x.as<float>(), w.as<float>(), dx.as<float>(),
                                dw.as<float>(), dbias.as<float>());
  }
  void group_norm_forward(const GroupNormShape& s, const TensorView& x, const TensorView& gamma,
                          const TensorView& beta, float eps, const TensorView& y,
                          const TensorView& mean, const TensorView& rstd) override {
    check_host("group_norm_forward", {&x, &gamma, &beta, &y, &mean, &rstd});
    check_group_norm_forward_views(s, x, gamma, beta, y, mean, rstd);
    hyperion::group_norm_forward(s, x.as<float>(), gamma.as<float>(), beta.as<float>(), eps,
                                 y.as<float>(), mean.as<float>(), rstd.as<float>());
  }
  void group_norm_backward(const GroupNormShape& s, const TensorView& dy, const TensorView& x,
                           const TensorView& gamma, const TensorView& mean, const TensorView& rstd,
                           const TensorView& dx, const TensorView& dgamma,
                           const TensorView& dbeta) override {
    check_host("group_norm_backward", {&dy, &x, &gamma, &mean, &rstd, &dx, &dgamma, &dbeta});
    check_group_norm_backward_views(s, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
    hyperion::group_norm_backward(s, dy.as<float>(), x.as<float>(), gamma.as<float>(),
                                  mean.as<float>(), rstd.as<float>(), dx.as<float>(),
                                  dgamma.as<float>(), dbeta.as<float>());
  }
  void layer_norm_forward(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                          float eps, const TensorView& y, const TensorView& mean,
                          const TensorView& rstd) override {
    check_host("layer_norm_forward", {&x, &gamma, &beta, &y, &mean, &rstd});
    const RowsCols rc = check_layer_norm_forward_views(x, gamma, beta, y, mean, rstd);
    hyperion::layer_norm_forward(x.as<float>(), rc.rows, rc.cols, gamma.as<float>(),
                                 beta.as<float>(), eps, y.as<float>(), mean.as<float>(),
                                 rstd.as<float>());
  }
  void layer_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& gamma,
                           const TensorView& mean, const TensorView& rstd, const TensorView& dx,
                           const TensorView& dgamma, const TensorView& dbeta) override {
    check_host("layer_norm_backward", {&dy, &x, &gamma, &mean, &rstd, &dx, &dgamma, &dbeta});
    const RowsCols rc =
        check_layer_norm_backward_views(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
    hyperion::layer_norm_backward(dy.as<float>(), x.as<float>(), rc.rows, rc.cols,
                                  gamma.as<float>(), mean.as<float>(), rstd.as<float>(),
                                  dx.as<float>(), dgamma.as<float>(), dbeta.as<float>());
  }
  void upsample_nearest_forward(const TensorView& x, const TensorView& y) override {
    check_host("upsample_nearest_forward", {&x, &y});
    check_upsample_views("upsample_nearest_forward", x, y);
    const auto& a = x.shape;
    const auto& b = y.shape;
    if (b[1] % a[1] == 0 && b[1] / a[1] == b[2] / a[2] && b[2] % a[2] == 0)
      hyperion::upsample_nearest_forward(x.as<float>(), a[0], a[1], a[2], a[3], b[1] / a[1],
                                         y.as<float>());
    else
      hyperion::upsample_nearest_to_forward(x.as<float>(), a[0], a[1], a[2], a[3], b[1], b[2],
                                            y.as<float>());
  }
  void upsample_nearest_backward(const TensorView& dy, const TensorView& dx) override {
    check_host("upsample_nearest_backward", {&dy, &dx});
    check_upsample_views("upsample_nearest_backward", dx, dy);
    const auto& a = dx.shape;
    const auto& b = dy.shape;
    if (b[1] % a[1] == 0 && b[1] / a[1] == b[2] / a[2] && b[2] % a[2] == 0)
      hyperion::upsample_nearest_backward(dy.as<float>(), a[0], a[1], a[2], a[3], b[1] / a[1],
                                          dx.as<float>());
    else
      hyperion::upsample_nearest_to_backward(dy.as<float>(), a[0], a[1], a[2], a[3], b[1], b[2],
                                             dx.as<float>());
  }
  void timestep_embedding(const TensorView& t, const TimestepEmbeddingParams& p,
                          const TensorView& out) override {
    check_host("timestep_embedding", {&t, &out});
    check_timestep_embedding_views(t, p, out);
    hyperion::timestep_embedding(t.as<float>(), t.numel(), p, out.as<float>());
  }
  void activation_forward(Activation a, const TensorView& x, const TensorView& y) override {
    check_host("activation_forward", {&x, &y});
    check_activation_views("activation_forward", x, y);
    hyperion::activation_forward(a, x.as<float>(), y.as<float>(), x.numel());
  }
  void activation_backward(Activation a, const TensorView& dy, const TensorView& x,
                           const TensorView& dx) override {
    check_host("activation_backward", {&dy, &x, &dx});
    check_activation_views("activation_backward", x, dy);
    check_activation_views("activation_backward", x, dx);
    hyperion::activation_backward(a, dy.as<float>(), x.as<float>(), dx.as<float>(), x.numel());
  }
  void geglu_forward(const TensorView& x, const TensorView& h) override {
    check_host("geglu_forward", {&x, &h});
    const RowsCols rc = check_geglu_views("geglu_forward", x, h);
    hyperion::geglu_rows_forward(x.as<float>(), rc.rows, rc.cols, h.as<float>());
  }
  void geglu_backward(const TensorView& dh, const TensorView& x, const TensorView& dx) override {
    check_host("geglu_backward", {&dh, &x, &dx});
    const RowsCols rc = check_geglu_views("geglu_backward", x, dh);
    check_geglu_views("geglu_backward", dx, dh);
    hyperion::geglu_rows_backward(dh.as<float>(), x.as<float>(), rc.rows, rc.cols, dx.as<float>());
  }
  void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) override {
    const size_t si = dtype_size(src_dtype), di = dtype_size(dst_dtype);
    parallel_chunks(static_cast<int64_t>(n), 1 << 16, [&](int64_t b, int64_t e) {
      convert_any(static_cast<const unsigned char*>(src) + static_cast<size_t>(b) * si, src_dtype,
                  static_cast<unsigned char*>(dst) + static_cast<size_t>(b) * di, dst_dtype,
                  static_cast<size_t>(e - b));
    });
  }
  void copy(const void* src, void* dst, size_t bytes) override {
    if (src == dst || bytes == 0) return;
    parallel_chunks(static_cast<int64_t>(bytes), 1 << 18, [&](int64_t b, int64_t e) {
      std::memcpy(static_cast<unsigned char*>(dst) + b, static_cast<const unsigned char*>(src) + b,
                  static_cast<size_t>(e - b));
    });
  }
  void copy_2d(const void* src, size_t src_pitch, void* dst, size_t dst_pitch, size_t row_bytes,
               size_t rows) override {
    check_copy_2d(src_pitch, dst_pitch, row_bytes);
    if (row_bytes == 0 || rows == 0) return;
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / static_cast<int64_t>(row_bytes));
    parallel_chunks(static_cast<int64_t>(rows), grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        std::memcpy(static_cast<unsigned char*>(dst) + static_cast<size_t>(r) * dst_pitch,
                    static_cast<const unsigned char*>(src) + static_cast<size_t>(r) * src_pitch,
                    row_bytes);
    });
  }
  void adamw_step(const TensorView& params, const TensorView& grads, const TensorView& m,
                  const TensorView& v, const AdamWParams& hp,
                  const TensorView& params_bf16) override {
    check_host("adamw_step", {&params, &grads, &m, &v, &params_bf16});
    hyperion::adamw_step(params, grads, m, v, hp, params_bf16);
  }
  double global_l2_norm(std::span<const TensorView> buffers) override {
    for (const TensorView& b : buffers) check_host("global_l2_norm", {&b});
    return hyperion::global_l2_norm(buffers);
  }
  void scale_buffers(std::span<const TensorView> buffers, float s) override {
    for (const TensorView& b : buffers) check_host("scale_buffers", {&b});
    hyperion::scale_buffers(buffers, s);
  }
  void upload(const void* host_src, void* dst, size_t bytes) override {
    copy(host_src, dst, bytes);
  }
  void download(const void* src, void* host_dst, size_t bytes) override {
    copy(src, host_dst, bytes);
  }
  void synchronize() override {}
  void zero(void* dst, size_t bytes) override {
    parallel_chunks(static_cast<int64_t>(bytes), 1 << 18, [&](int64_t b, int64_t e) {
      std::memset(static_cast<unsigned char*>(dst) + b, 0, static_cast<size_t>(e - b));
    });
  }
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<KernelBackend*>& registry() {
  // The CUDA backend joins when this binary has it and a device is usable.
  static std::vector<KernelBackend*> backends = [] {
    std::vector<KernelBackend*> b{&host_backend()};
    if (KernelBackend* cuda = cuda_backend()) b.push_back(cuda);
    return b;
  }();
  return backends;
}

}  // namespace

void KernelBackend::gemm_contiguous(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k,
                                    const void* a, DType a_dtype, const void* b, DType b_dtype,
                                    void* c, DType c_dtype, float beta) {
  gemm(contiguous_gemm_args(trans_a, trans_b, m, n, k, a, a_dtype, b, b_dtype, c, c_dtype, beta));
}

KernelBackend& host_backend() {
  static HostBackend host;
  return host;
}

KernelBackend& backend_for(Device device) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (KernelBackend* b : registry())
    if (b->device() == device) return *b;
  if (device == Device::kCuda)
    fail("no cuda kernel backend is usable in this process: cuda {}", cuda_status().summary);
  fail("no {} kernel backend is built into this binary (backends: host)", device_name(device));
}

void register_backend(KernelBackend* backend) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().push_back(backend);
}

std::vector<KernelBackend*> built_backends() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry();
}

}  // namespace hyperion
