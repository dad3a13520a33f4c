// The kernels a model runs, per device: the one dispatch through which the decoder,
// the parameter store and the models reach every numeric op. The host backend is the
// kernels of this directory (Highway SIMD, oneDNN); a GPU backend implements the same
// interface and registers itself (register_backend), and no model code changes: a
// model takes the backend of the device its parameters live on (backend_for).
//
// Views passed to a backend must live on its device (TensorView::device); the host
// backend refuses anything else by name. Raw pointers are device memory too, except the
// small host-made index arrays named below (paged-cache slots and page tables, the MoE
// dispatch plan's pair_row / row_token, grouped GEMM sizes), which a device backend
// uploads per call. A device backend may queue work and return before it finishes:
// download(), synchronize() and the ops that return a value (the losses) wait for it. The parity
// test (tests/kernels/ backend_parity_test.cc) checks every op of every built backend against the
// scalar ref:: kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/allocator.h"
#include "kernels/activation.h"
#include "kernels/adamw.h"
#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/conv2d.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/gated_activation.h"
#include "kernels/gemm.h"
#include "kernels/group_norm.h"
#include "kernels/paged_attention.h"
#include "kernels/rope.h"
#include "kernels/softcap.h"
#include "kernels/timestep_embedding.h"
#include "tensor/tensor.h"

namespace hyperion {

class KernelBackend {
 public:
  virtual ~KernelBackend() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;
  // Where this backend's buffers are allocated.
  virtual Allocator& allocator() = 0;
  // A contiguous view of this backend's memory (tagged with its device): how model code
  // describes its activation buffers.
  TensorView view(void* data, DType dtype, Shape shape) const {
    TensorView v(data, dtype, shape);
    v.device = device();
    return v;
  }

  // Matmuls (kernels/gemm.h).
  virtual void gemm(const GemmArgs& args) = 0;
  void gemm_contiguous(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                       DType a_dtype, const void* b, DType b_dtype, void* c, DType c_dtype,
                       float beta = 0.0f);
  // Several Linear layers of one input, y_t[n, out_t] = x[n, in] W_t^T for each target t
  // (W_t [out_t, in] contiguous, all of w_dtype; y_t contiguous, y_dtype): a layer's q, k
  // and v projections, or gate and up. A GPU runs a decode step's few rows of all of them
  // in one pass (one launch); the default is one GEMM each.
  struct LinearTarget {
    const void* w = nullptr;
    int64_t out = 0;
    void* y = nullptr;
  };
  virtual void linear_many(const void* x, DType x_dtype, int64_t n, int64_t in, DType w_dtype,
                           DType y_dtype, std::span<const LinearTarget> targets) {
    for (const LinearTarget& t : targets)
      gemm_contiguous(Trans::kN, Trans::kT, n, t.out, in, x, x_dtype, t.w, w_dtype, t.y, y_dtype);
  }
  // The same for int8 weights (model/linear.h, kInt8): x [n, in] quantised per row once
  // (quantize_rows into qx [n, in] and qscale [n], this backend's memory), then each
  // y_t = (qx W_t^T) * qscale * scale_t + beta_t y_t, W_t int8 [out_t, in] with its row
  // scales. A GPU
  // quantises inside the matmul for a decode step's few rows (one launch for all targets).
  struct Int8Target {
    const int8_t* w = nullptr;
    const float* scale = nullptr;
    int64_t out = 0;
    void* y = nullptr;
    float beta = 0.0f;  // y_t = product + beta * y_t
  };
  virtual void linear_int8_many(const void* x, DType x_dtype, int64_t n, int64_t in,
                                DType y_dtype, std::span<const Int8Target> targets, int8_t* qx,
                                float* qscale) {
    quantize_rows(view(const_cast<void*>(x), x_dtype, {n, in}), view(qx, DType::kI8, {n, in}),
                  qscale);
    for (const Int8Target& t : targets) {
      GemmArgs g = contiguous_gemm_args(Trans::kN, Trans::kT, n, t.out, in, qx, DType::kI8, t.w,
                                        DType::kI8, t.y, y_dtype, t.beta);
      g.a_scale = qscale;
      g.b_scale = t.scale;
      gemm(g);
    }
  }
  // Normalisation (kernels/rmsnorm.h).
  virtual void rmsnorm_forward(const TensorView& x, const TensorView& weight, float eps,
                               const TensorView& y, const TensorView& rstd,
                               float weight_offset) = 0;
  virtual void rmsnorm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                                const TensorView& rstd, const TensorView& dx,
                                const TensorView& dweight, bool accumulate_dx,
                                float weight_offset) = 0;
  // Gated MLP activations (kernels/gated_activation.h).
  virtual void gated_forward(GatedActivation act, const TensorView& g, const TensorView& u,
                             const TensorView& h) = 0;
  virtual void gated_backward(GatedActivation act, const TensorView& dh, const TensorView& g,
                              const TensorView& u, const TensorView& dg, const TensorView& du) = 0;
  // Rotary embeddings (kernels/rope.h): from start_pos, or one position per row.
  virtual void rope_forward(const TensorView& x, const TensorView& out, int64_t start_pos,
                            const RopeTable& table) = 0;
  virtual void rope_forward(const TensorView& x, const TensorView& out, const TensorView& positions,
                            const RopeTable& table) = 0;
  virtual void rope_backward(const TensorView& dy, const TensorView& dx, int64_t start_pos,
                             const RopeTable& table) = 0;
  // One position per row (packed sequences: each document's positions start at 0).
  virtual void rope_backward(const TensorView& dy, const TensorView& dx, const TensorView& positions,
                             const RopeTable& table) = 0;
  // Causal attention (kernels/attention.h): the params' scale, window and softcap are the
  // model's (causal stays on; schedule and force_portable are host tuning).
  virtual void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const TensorView& lse,
                                 const AttentionParams& params) = 0;
  virtual void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& out, const TensorView& dout,
                                  const TensorView& lse, const TensorView& dq, const TensorView& dk,
                                  const TensorView& dv, const AttentionParams& params) = 0;
  // The serving engine's paged KV cache (kernels/paged_attention.h).
  virtual void paged_kv_write(const PagedKvCache& cache, const TensorView& k, const TensorView& v,
                              const int64_t* slots) = 0;
  virtual void paged_kv_read(const PagedKvCache& cache, const int32_t* pages, int64_t length,
                             const TensorView& k, const TensorView& v) = 0;
  virtual void paged_attention(const PagedKvCache& cache, const TensorView& q,
                               const PagedAttentionRow* rows, const TensorView& out,
                               const PagedAttentionParams& params) = 0;
  // The same two ops over one step's index arrays held in this backend's memory
  // (PagedStepTables): built and uploaded once per step by the caller and read by every
  // layer, so a step queues no per-layer uploads and can be recorded (record_begin).
  // Rows with a negative slot write nothing; rows of length 0 get zeros. Ragged mode only.
  virtual void paged_kv_write(const PagedKvCache& cache, const TensorView& k, const TensorView& v,
                              const PagedStepTables& tables) = 0;
  virtual void paged_attention(const PagedKvCache& cache, const TensorView& q,
                               const PagedStepTables& tables, const TensorView& out,
                               const PagedAttentionParams& params) = 0;
  // Mixture of experts (kernels/moe_routing.h, kernels/grouped_gemm.h). The dispatch plan
  // (moe_dispatch_plan) is built on the host from the routed expert ids.
  virtual void router_topk_forward(const float* logits, int64_t n, int64_t e, int64_t k,
                                   bool normalize, float* probs, int32_t* experts,
                                   float* weights) = 0;
  virtual void router_topk_backward(const float* probs, const int32_t* experts,
                                    const float* weights, const float* dweights,
                                    const float* dprobs, int64_t n, int64_t e, int64_t k,
                                    bool normalize, float* dlogits) = 0;
  virtual float load_balance_loss(const float* probs, const int32_t* experts, int64_t b, int64_t t,
                                  int64_t e, int64_t k, float weight, float* dprobs,
                                  float dscale) = 0;
  virtual float router_z_loss(const float* logits, int64_t n, int64_t e, float weight,
                              float* dlogits, float dscale) = 0;
  virtual void moe_gather_rows(const void* src, DType dt, const int32_t* row_token, int64_t rows,
                               int64_t d, void* dst) = 0;
  virtual void moe_scatter_add_rows(const void* drows, DType dt, const int32_t* pair_row, int64_t n,
                                    int64_t k, int64_t d, float* dsrc) = 0;
  virtual void moe_combine(const void* y, DType dt, const int32_t* pair_row, const float* weights,
                           int64_t n, int64_t k, int64_t d, float* out) = 0;
  virtual void moe_combine_backward(const float* dout, const void* y, DType dt,
                                    const int32_t* pair_row, const int32_t* row_token,
                                    const float* weights, int64_t n, int64_t k, int64_t d,
                                    int64_t rows, void* dy, float* dweights) = 0;
  virtual void grouped_gemm(const TensorView& a, const TensorView& w,
                            std::span<const int64_t> sizes, const TensorView& c, float beta) = 0;
  virtual void grouped_gemm_input_grad(const TensorView& dc, const TensorView& w,
                                       std::span<const int64_t> sizes, const TensorView& da,
                                       float beta) = 0;
  virtual void grouped_gemm_weight_grad(const TensorView& a, const TensorView& dc,
                                        std::span<const int64_t> sizes, const TensorView& dw) = 0;
  // Token embedding (kernels/embedding.h).
  virtual void embedding_forward(const TensorView& table, const TensorView& ids,
                                 const TensorView& out, float scale) = 0;
  virtual void embedding_backward(const TensorView& ids, const TensorView& dout,
                                  const TensorView& dtable, float scale) = 0;
  // Greedy decoding's pick per row (kernels/argmax.h).
  virtual void argmax_rows(const TensorView& x, const TensorView& out) = 0;
  // Soft-capping in place and the post-norm residual add (kernels/softcap.h).
  virtual void softcap_forward(const TensorView& x, float cap) = 0;
  virtual void residual_add(const TensorView& x, const TensorView& y) = 0;
  // Inverted dropout with a keyed mask, y = D(x) or y += D(x) (kernels/dropout.h).
  virtual void dropout_apply(const TensorView& x, const TensorView& y, float p, uint64_t key,
                             bool accumulate) = 0;
  // Loss (kernels/cross_entropy.h); softcap > 0: over capped logits (0: none).
  virtual CrossEntropyResult cross_entropy_forward(const TensorView& logits,
                                                   const TensorView& targets,
                                                   float softcap = 0.0f) = 0;
  virtual CrossEntropyResult cross_entropy_fused(const TensorView& logits,
                                                 const TensorView& targets,
                                                 const TensorView& dlogits, float dloss,
                                                 float softcap = 0.0f) = 0;
  // Optimizer (kernels/adamw.h, kernels/global_norm.h): the fused AdamW update, the
  // global L2 norm of a set of buffers (f64, summed in a fixed order) and their scaling.
  virtual void adamw_step(const TensorView& params, const TensorView& grads, const TensorView& m,
                          const TensorView& v, const AdamWParams& hp,
                          const TensorView& params_bf16) = 0;
  virtual double global_l2_norm(std::span<const TensorView> buffers) = 0;
  virtual void scale_buffers(std::span<const TensorView> buffers, float s) = 0;
  // The diffusion models' layers, on channels-last activations (the views' shapes are
  // checked against the sizes given; kernels/diffusion_op_checks.h). Weight gradients
  // (dw, dbias, dgamma, dbeta) ACCUMULATE, input gradients are overwritten, as the host
  // kernels do.
  // 2-D convolution (kernels/conv2d.h): x [N, H, W, Cin] and dy [N, OH, OW, Cout] f32, or
  // bf16 for mixed precision (both of one call alike); w [Cout, Cin, K, K], bias [Cout]
  // (may be empty), y, dx f32. dx, dw, dbias may be empty (not computed).
  virtual void conv2d_forward(const Conv2dShape& s, const TensorView& x, const TensorView& w,
                              const TensorView& bias, const TensorView& y) = 0;
  virtual void conv2d_backward(const Conv2dShape& s, const TensorView& dy, const TensorView& x,
                               const TensorView& w, const TensorView& dx, const TensorView& dw,
                               const TensorView& dbias) = 0;
  // GroupNorm (kernels/group_norm.h): x, y [N, P, C]; mean, rstd [N, G]; y may alias x.
  virtual void group_norm_forward(const GroupNormShape& s, const TensorView& x,
                                  const TensorView& gamma, const TensorView& beta, float eps,
                                  const TensorView& y, const TensorView& mean,
                                  const TensorView& rstd) = 0;
  virtual void group_norm_backward(const GroupNormShape& s, const TensorView& dy,
                                   const TensorView& x, const TensorView& gamma,
                                   const TensorView& mean, const TensorView& rstd,
                                   const TensorView& dx, const TensorView& dgamma,
                                   const TensorView& dbeta) = 0;
  // LayerNorm over the last dimension (kernels/layer_norm.h): x, y [R, C]; mean, rstd [R]
  // (may be empty in the forward: inference); dgamma, dbeta may be empty.
  virtual void layer_norm_forward(const TensorView& x, const TensorView& gamma,
                                  const TensorView& beta, float eps, const TensorView& y,
                                  const TensorView& mean, const TensorView& rstd) = 0;
  virtual void layer_norm_backward(const TensorView& dy, const TensorView& x,
                                   const TensorView& gamma, const TensorView& mean,
                                   const TensorView& rstd, const TensorView& dx,
                                   const TensorView& dgamma, const TensorView& dbeta) = 0;
  // Nearest upsampling x [N, H, W, C] -> y [N, OH, OW, C], OH >= H, OW >= W
  // (kernels/upsample.h's sized form; an integer factor is its special case), and its
  // backward dy [N, OH, OW, C] -> dx [N, H, W, C].
  virtual void upsample_nearest_forward(const TensorView& x, const TensorView& y) = 0;
  virtual void upsample_nearest_backward(const TensorView& dy, const TensorView& dx) = 0;
  // t [n] f32 -> out [n, dim] (kernels/timestep_embedding.h).
  virtual void timestep_embedding(const TensorView& t, const TimestepEmbeddingParams& p,
                                  const TensorView& out) = 0;
  // Pointwise SiLU / GELU / QuickGELU and GEGLU's rows (kernels/activation.h), f32; y may
  // alias x, dx may alias dy. GEGLU: x [R, 2F] -> h [R, F].
  virtual void activation_forward(Activation a, const TensorView& x, const TensorView& y) = 0;
  virtual void activation_backward(Activation a, const TensorView& dy, const TensorView& x,
                                   const TensorView& dx) = 0;
  virtual void geglu_forward(const TensorView& x, const TensorView& h) = 0;
  virtual void geglu_backward(const TensorView& dh, const TensorView& x,
                              const TensorView& dx) = 0;
  // Per-row absmax int8 quantisation (kernels/quantize.h, quantize_rows): x [rows, cols]
  // f32|bf16 -> q [rows, cols] i8, scales [rows] f32 in this backend's memory. With the
  // GEMM's a_scale / b_scale (kernels/gemm.h) it is the int8-weight matmul's other half.
  virtual void quantize_rows(const TensorView& x, const TensorView& q, float* scales) = 0;
  // Host <-> device transfers (bytes; the host backend copies). download() returns with the
  // bytes on the host; upload() may return before the copy is done only when the source
  // may be reused at once (the host's pageable memory is staged by the driver).
  virtual void upload(const void* host_src, void* dst, size_t bytes) = 0;
  virtual void download(const void* src, void* host_dst, size_t bytes) = 0;
  // Waits for every op queued on this backend and raises any data error a kernel recorded
  // (an id out of range) as a hyperion::Error naming the op. A no-op on the host.
  virtual void synchronize() = 0;
  // Memory: dtype conversion of n elements, copies and zeroing (bytes).
  virtual void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) = 0;
  virtual void copy(const void* src, void* dst, size_t bytes) = 0;
  // `rows` rows of `row_bytes` each, from rows `src_pitch` bytes apart to rows `dst_pitch`
  // bytes apart (both >= row_bytes; the ranges must not overlap): a channel concatenation
  // of channels-last maps, or a map copied into a padded one.
  virtual void copy_2d(const void* src, size_t src_pitch, void* dst, size_t dst_pitch,
                       size_t row_bytes, size_t rows) = 0;
  virtual void zero(void* dst, size_t bytes) = 0;

  // Recording (a CUDA graph on a GPU): the ops queued between record_begin() and
  // record_end() are captured instead of run, and replay() runs them again later with the
  // same pointers and sizes, at a fraction of the host's cost to queue them one by one.
  // Between begin and end no op may upload, download or synchronise (they fail by name).
  // record_end() returns null when the recording cannot be replayed (device memory was
  // freed or reallocated while recording); replay() returns false when device memory was
  // freed since the recording, which may have held what it points to: record again.
  // Backends that cannot record (the host) say so with can_record() and return null.
  class Recording {
   public:
    virtual ~Recording() = default;
  };
  virtual bool can_record() const { return false; }
  virtual void record_begin() {}
  virtual std::unique_ptr<Recording> record_end() { return nullptr; }
  // Ends a recording abandoned by an error, discarding it (safe when none is open).
  virtual void record_abort() {}
  virtual bool replay(const Recording& /*recording*/) { return false; }
};

// The host kernels.
KernelBackend& host_backend();
// A registered backend for `device` (the host one is always there); throws naming the
// device when none was built.
KernelBackend& backend_for(Device device);
// Adds a backend (a GPU backend's static initialiser calls it). Not owned; lives forever.
void register_backend(KernelBackend* backend);
// Every backend built into this binary, host first (what the parity test iterates).
std::vector<KernelBackend*> built_backends();

}  // namespace hyperion
