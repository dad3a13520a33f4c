// The CUDA kernels' launchers: plain pointers, sizes and a stream, so that the .cu files
// (compiled by nvcc) need none of the project's C++20 headers and the backend
// (cuda_backend.cc, compiled by the host compiler) does the checking and the dispatch.
//
// Every launcher queues its kernels on `stream` and returns at once; nothing here
// synchronises. Element storage is f32 or bf16 (Elem); all math is f32, every reduction
// runs in a fixed order (no float atomics), so results do not depend on scheduling.
// Errors a kernel finds in its data (an id out of range) are recorded in the device
// error word (DeviceError, first error wins) that the backend reads at its next
// synchronisation and turns into a hyperion::Error naming the op.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/conv_columns.h"

namespace hyperion::cuda {

enum class Elem : int32_t { kF32 = 0, kBF16 = 1 };

// The first data error a kernel found (code 0: none). Lives in device memory.
struct DeviceError {
  int32_t code = 0;  // ErrorCode
  int32_t pad = 0;
  int64_t a = 0, b = 0, c = 0;  // what the op names: position, value, bound
};
enum ErrorCode : int32_t {
  kNoError = 0,
  kEmbeddingIdOutOfRange = 1,  // a = position, b = id, c = vocabulary size
  kTargetOutOfRange = 2,       // a = row, b = target, c = vocabulary size
  kPageOutOfRange = 3,         // a = row, b = page id, c = num_pages
  kExpertOutOfRange = 4,       // a = pair, b = expert id, c = experts
  kPositionOutOfRange = 5,     // a = token, b = position, c = table length
  kSlotOutOfRange = 6,         // a = row, b = slot, c = cache capacity
};

// ---- elementwise.cu
void convert(cudaStream_t s, const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype,
             int64_t n);  // dtypes: the project's DType values for f32, bf16, f16, e4m3, e5m2
void add_bias(cudaStream_t s, void* c, Elem ct, int64_t m, int64_t n, int64_t ldc,
              const float* bias);
void transpose_bytes(cudaStream_t s, const uint8_t* src, int64_t rows, int64_t cols, int64_t ld,
                     uint8_t* dst);  // dst [cols, rows] contiguous
void gated_forward(cudaStream_t s, int act, const void* g, const void* u, void* h, Elem t,
                   int64_t n);
void gated_backward(cudaStream_t s, int act, const void* dh, const void* g, const void* u, void* dg,
                    void* du, Elem t, int64_t n);
// positions: nullptr (position of token t is start + t), [T] or [B, T] (pos_per_batch).
void rope(cudaStream_t s, const void* x, void* out, Elem t, int64_t b, int64_t tt, int64_t heads,
          int64_t d, int64_t start, const int32_t* positions, bool pos_per_batch,
          const float* cos_table, const float* sin_table, int64_t max_positions, bool inverse,
          DeviceError* err);
void embedding_forward(cudaStream_t s, const void* table, Elem tt, const int32_t* ids, int64_t n,
                       int64_t h, int64_t vocab, void* out, Elem ot, float scale, DeviceError* err);
void embedding_backward(cudaStream_t s, const int32_t* ids, int64_t n, const void* dout, Elem dt,
                        int64_t h, int64_t vocab, float* dtable, float scale);
// AdamW (kernels/adamw.h semantics); params_bf16 may be null.
void adamw(cudaStream_t s, float* params, const void* grads, Elem gt, float* m, float* v, int64_t n,
           float lr, float beta1, float beta2, float eps, float weight_decay, float bias1,
           float bias2, float grad_scale, uint16_t* params_bf16);
// partial[blockIdx] = sum of squares of its chunk (f64); finish with sum_partials.
int64_t sum_squares_blocks(int64_t n);
void sum_squares(cudaStream_t s, const void* x, Elem t, int64_t n, double* partial);
void sum_partials(cudaStream_t s, const double* partial, int64_t count, double* out);
void scale(cudaStream_t s, void* x, Elem t, int64_t n, float factor);
// x <- cap * tanh(x / cap) in place; y (f32) += x (kernels/softcap.h).
void softcap(cudaStream_t s, void* x, Elem t, int64_t n, float cap);
void residual_add(cudaStream_t s, const void* x, Elem t, float* y, int64_t n);
// y = D(x) or y += D(x): kernels/dropout.h's mask (dropout_hash) from its parameters.
void dropout(cudaStream_t s, const void* x, Elem xt, void* y, Elem yt, int64_t n, uint32_t k0, uint32_t k1,
             uint32_t threshold, float scale, bool accumulate);

// ---- norm.cu
void rmsnorm_forward(cudaStream_t s, const void* x, Elem xt, const float* w, float eps, void* y,
                     Elem yt, float* rstd, int64_t n, int64_t h, float offset);
// scratch: rmsnorm_scratch_floats(n, h) floats for the deterministic weight-gradient sum.
int64_t rmsnorm_scratch_floats(int64_t n, int64_t h);
void rmsnorm_backward(cudaStream_t s, const void* dy, const void* x, Elem t, const float* w,
                      const float* rstd, void* dx, float* dweight, bool accumulate_dx, int64_t n,
                      int64_t h, float offset, float* scratch);

// ---- argmax.cu
// scratch: argmax_scratch_bytes(rows, n) of device memory.
int64_t argmax_scratch_bytes(int64_t rows, int64_t n);
void argmax_rows(cudaStream_t s, const float* x, int64_t rows, int64_t n, int32_t* out,
                 void* scratch);

// ---- cross_entropy.cu
// row_loss [n] f32 (0 for ignored rows); result[0] = mean loss (f64), result[1] = count.
// dlogits may be null (forward only) or alias logits. softcap > 0: the loss is over
// softcap * tanh(logits / softcap), the gradient w.r.t. the logits before the cap.
void cross_entropy(cudaStream_t s, const void* logits, Elem t, const int32_t* targets, int64_t n,
                   int64_t vocab, int32_t ignore_index, float dloss, float softcap, void* dlogits,
                   float* row_loss, double* result, DeviceError* err);

// ---- attention.cu (kernels/attention.h layout: q [B,Tq,Hq,D], k/v [B,Tk,Hkv,D],
// lse [B,Hq,Tq]).
// window > 0: query i (absolute position i + tk - tq) sees its `window` latest keys;
// softcap > 0: scores are softcap * tanh(scale q.k / softcap) (kernels/attention.h).
struct AttentionShape {
  int64_t b, tq, tk, hq, hkv, d;
  float scale;
  bool causal;
  int64_t window = 0;
  float softcap = 0.0f;
};
void attention_forward(cudaStream_t s, const AttentionShape& sh, const void* q, const void* k,
                       const void* v, Elem t, void* out, Elem ot, float* lse);
// delta: [B, Hq, Tq] f32 scratch (rowsum(dout * out)).
void attention_backward(cudaStream_t s, const AttentionShape& sh, const void* q, const void* k,
                        const void* v, const void* out, const void* dout, Elem t, const float* lse,
                        float* delta, void* dq, void* dk, void* dv, Elem gt);

// ---- attention_mma.cu: the tensor-core version of the two above, for bf16 q/k/v with
// head_dim 64 or 128 and 16-byte aligned tensors, without a window or a soft cap (the
// `applies` check); attention.cu routes there.
bool attention_mma_applies(const AttentionShape& sh, Elem t,
                           std::initializer_list<const void*> tensors);
void attention_mma_forward(cudaStream_t s, const AttentionShape& sh, const void* q, const void* k,
                           const void* v, void* out, Elem ot, float* lse);
// delta: rowsum(dout * out), already computed.
void attention_mma_backward(cudaStream_t s, const AttentionShape& sh, const void* q, const void* k,
                            const void* v, const void* dout, const float* lse, const float* delta,
                            void* dq, void* dk, void* dv, Elem gt);

// ---- paged.cu (kernels/paged_attention.h layout). dtype: the project's DType value of
// the cache (f32, bf16 or i8).
struct PagedCacheArgs {
  void* k;
  void* v;
  float* k_scale;
  float* v_scale;
  int32_t dtype;
  int64_t num_pages, page_tokens, n_kv_heads, head_dim;
};
// slots < 0: nothing written (padding rows); >= capacity: recorded as kSlotOutOfRange.
void paged_kv_write(cudaStream_t s, const PagedCacheArgs& c, const void* k, const void* v, Elem t,
                    const int64_t* slots, int64_t n, DeviceError* err);
void paged_kv_read(cudaStream_t s, const PagedCacheArgs& c, const int32_t* pages, int64_t length,
                   void* k, void* v, Elem t);
// rows: page tables of all rows back to back; row r's table starts at page_offset[r].
// window > 0: row r reads only keys [max(0, length - window), length) (its table's
// entries before that page are never read); softcap > 0: capped scores.
struct PagedScores {
  float scale;
  int64_t window = 0;
  float softcap = 0.0f;
};
void paged_attention(cudaStream_t s, const PagedCacheArgs& c, const void* q, Elem qt,
                     int64_t n_rows, int64_t n_heads, const int32_t* pages,
                     const int64_t* page_offset, const int64_t* lengths, const PagedScores& scores,
                     void* out, Elem ot, DeviceError* err);
// ---- paged_decode.cu: the same attention split over positions (flash-decoding), for
// head_dim 64 or 128, n_heads / n_kv_heads in 1..8 and f32 / bf16 / int8 pages (the
// `applies` check). splits (paged_decode_splits: about blocks_per_multiprocessor blocks
// per multiprocessor) depends on the row count only, and a row uses as many of them as
// leave min_per_split positions each. With splits > 1 the launcher needs
// paged_decode_scratch_bytes of device scratch, and the splits are merged either by a
// second kernel (counters null) or by the last split to finish (n_rows * n_kv_heads
// counters that start at zero; the kernel leaves them at zero).
bool paged_decode_applies(const PagedCacheArgs& c, int64_t n_heads);
int paged_decode_splits(int64_t n_rows, int64_t n_kv_heads, int multiprocessors,
                        int blocks_per_multiprocessor);
size_t paged_decode_scratch_bytes(int64_t n_rows, int64_t n_heads, int64_t head_dim, int splits);
void paged_decode(cudaStream_t s, const PagedCacheArgs& c, const void* q, Elem qt, int64_t n_rows,
                  int64_t n_heads, const int32_t* pages, const int64_t* page_start,
                  const int64_t* lengths, const PagedScores& scores, int splits, int min_per_split,
                  float* scratch, int* counters, void* out, Elem ot, DeviceError* err);

// ---- gemv.cu: C[m, n] = alpha A[m, k] B[n, k]^T + beta C for m <= 8 (more rows are
// clamped to 8: callers check), bf16 A and B (contiguous, 16-byte aligned, k % 8 == 0),
// C f32 or bf16 [m, n] contiguous.
void gemv_bf16(cudaStream_t s, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
               void* c, Elem ct, float alpha, float beta);
// y_t[m, out_t] = A[m, k] W_t^T for count <= kGemvMaxTargets bf16 weights W_t [out_t, k]
// of one input, in one launch; y_t contiguous of ct.
constexpr int kGemvMaxTargets = 4;
void gemv_bf16_many(cudaStream_t s, int64_t m, int64_t k, const void* a, const void* const* w,
                    const int64_t* out, void* const* y, int count, Elem ct);

// ---- int8.cu: per-row absmax int8 quantisation (kernels/quantize.h numerics) and the
// scaled int8 GEMM C = alpha a_scale[m] b_scale[n] (A B^T) + beta C, A [m, k], B [n, k]
// int8 contiguous and 16-byte aligned, k % 16 == 0, exact int32 sums.
void quantize_rows_i8(cudaStream_t s, const void* x, Elem xt, int64_t rows, int64_t cols,
                      int8_t* q, float* scales);
void int8_gemm_scaled(cudaStream_t s, int64_t m, int64_t n, int64_t k, const int8_t* a,
                      const float* a_scale, const int8_t* b, const float* b_scale, void* c,
                      Elem ct, float alpha, float beta);
// KernelBackend::linear_int8_many for a decode step's rows: x [m, k] bf16 quantised per
// row inside the kernel (the same rule), then y_t = (qx W_t^T) * qscale * scales_t +
// beta_t y_t for
// count <= kInt8MaxTargets int8 weights W_t [out_t, k], one launch. Applies for m <= 4,
// k % 16 == 0 and m * k <= 40 KiB (the quantised rows sit in shared memory), x and W_t
// 16-byte aligned.
constexpr int kInt8MaxTargets = 4;
constexpr int64_t kInt8QuantisingMaxRows = 4;
bool int8_linear_quantising_applies(int64_t m, int64_t k);
void int8_linear_quantising(cudaStream_t s, int64_t m, int64_t k, const void* x,
                            const int8_t* const* w, const float* const* scales,
                            const int64_t* out, void* const* y, const float* beta, int count,
                            Elem ct);

// ---- diffusion_ops.cu: the diffusion models' layers (kernels/conv2d.h, group_norm.h,
// layer_norm.h, upsample.h, timestep_embedding.h, activation.h), channels-last, f32
// unless an Elem says otherwise.
// ConvGeometry and the column matrix's index arithmetic: conv_columns.h.
// col[r - r0, (ky K + kx) Ci + i] = x[n, oy s - p + ky, ox s - p + kx, i] (0 in the
// padding) for the output rows r = (n OH + oy) OW + ox in [r0, r0 + rows).
void conv_im2col(cudaStream_t s, const ConvGeometry& g, const void* x, Elem xt, int64_t r0,
                 int64_t rows, void* col, Elem ct);
// wr[o, (ky K + kx) Ci + i] = w[o, i, ky, kx] (the weights as rows of the column matrix's
// order), stored as wt.
void conv_weight_to_rows(cudaStream_t s, const ConvGeometry& g, const float* w, void* wr, Elem wt);
// dw[o, i, ky, kx] += dwr[o, (ky K + kx) Ci + i].
void conv_weight_rows_add(cudaStream_t s, const ConvGeometry& g, const float* dwr, float* dw);
// dx += the column gradient dcol [rows, K K Ci] of output rows [r0, r0 + rows), each input
// element summing the entries that read it (no atomics).
void conv_col2im_add(cudaStream_t s, const ConvGeometry& g, const float* dcol, int64_t r0,
                     int64_t rows, float* dx);
// out[j] += sum over rows of a[r, j]; scratch: column_sums_scratch_floats(rows, cols).
int64_t column_sums_scratch_floats(int64_t rows, int64_t cols);
void column_sums_add(cudaStream_t s, const void* a, Elem at, int64_t rows, int64_t cols,
                     float* scratch, float* out);
void group_norm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta,
                        float eps, int64_t batch, int64_t pixels, int64_t channels,
                        int64_t groups, float* y, float* mean, float* rstd);
// scratch: column_sums_scratch_floats(batch * pixels, channels); dgamma, dbeta accumulated.
void group_norm_backward(cudaStream_t s, const float* dy, const float* x, const float* gamma,
                         const float* mean, const float* rstd, int64_t batch, int64_t pixels,
                         int64_t channels, int64_t groups, float* dx, float* dgamma,
                         float* dbeta, float* scratch);
// mean, rstd may be null (not kept).
// x [rows, cols] f32 := softmax of each row, in place; lse[r] = its log-sum-exp.
void softmax_rows(cudaStream_t s, float* x, int64_t rows, int64_t cols, float* lse);
void layer_norm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta,
                        float eps, int64_t rows, int64_t cols, float* y, float* mean, float* rstd);
// scratch: column_sums_scratch_floats(rows, cols); dgamma, dbeta (either may be null)
// accumulated.
void layer_norm_backward(cudaStream_t s, const float* dy, const float* x, const float* gamma,
                         const float* mean, const float* rstd, int64_t rows, int64_t cols,
                         float* dx, float* dgamma, float* dbeta, float* scratch);
void upsample_nearest_forward(cudaStream_t s, const float* x, int64_t n, int64_t h, int64_t w,
                              int64_t c, int64_t oh, int64_t ow, float* y);
void upsample_nearest_backward(cudaStream_t s, const float* dy, int64_t n, int64_t h, int64_t w,
                               int64_t c, int64_t oh, int64_t ow, float* dx);
void timestep_embedding(cudaStream_t s, const float* t, int64_t n, int64_t dim, bool flip,
                        float freq_shift, float scale, float max_period, float* out);
// act: kernels/activation.h's Activation value (0 silu, 1 gelu, 2 quick_gelu).
void activation_forward(cudaStream_t s, int act, const float* x, float* y, int64_t n);
void activation_backward(cudaStream_t s, int act, const float* dy, const float* x, float* dx,
                         int64_t n);
void geglu_forward(cudaStream_t s, const float* x, int64_t rows, int64_t f, float* h);
void geglu_backward(cudaStream_t s, const float* dh, const float* x, int64_t rows, int64_t f,
                    float* dx);

// ---- profiling (cuda_backend.cc, HYPERION_CUDA_OP_TIMES): a kernel that holds the stream
// for `nanoseconds`, so that the ops queued behind it run back to back and the events
// between them time the ops alone.
void hold_stream(cudaStream_t s, int64_t nanoseconds);

// ---- moe.cu (kernels/moe_routing.h semantics).
void router_topk_forward(cudaStream_t s, const float* logits, int64_t n, int64_t e, int64_t k,
                         bool normalize, float* probs, int32_t* experts, float* weights);
void router_topk_backward(cudaStream_t s, const float* probs, const int32_t* experts,
                          const float* weights, const float* dweights, const float* dprobs,
                          int64_t n, int64_t e, int64_t k, bool normalize, float* dlogits);
// result: one float (the loss); dprobs / dlogits may be null. scratch: 2 * b * e floats
// (load balance), n floats (z-loss).
void load_balance_loss(cudaStream_t s, const float* probs, const int32_t* experts, int64_t b,
                       int64_t t, int64_t e, int64_t k, float weight, float* dprobs, float dscale,
                       float* scratch, float* result, DeviceError* err);
void router_z_loss(cudaStream_t s, const float* logits, int64_t n, int64_t e, float weight,
                   float* dlogits, float dscale, float* scratch, float* result);
void moe_gather_rows(cudaStream_t s, const void* src, Elem t, const int32_t* row_token,
                     int64_t rows, int64_t d, void* dst);
void moe_scatter_add_rows(cudaStream_t s, const void* drows, Elem t, const int32_t* pair_row,
                          int64_t n, int64_t k, int64_t d, float* dsrc);
void moe_combine(cudaStream_t s, const void* y, Elem t, const int32_t* pair_row,
                 const float* weights, int64_t n, int64_t k, int64_t d, float* out);
void moe_combine_backward(cudaStream_t s, const float* dout, const void* y, Elem t,
                          const int32_t* pair_row, const int32_t* row_token, const float* weights,
                          int64_t n, int64_t k, int64_t d, int64_t rows, void* dy, float* dweights);

}  // namespace hyperion::cuda
