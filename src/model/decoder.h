// The decoder: one implementation of the layer stack, forward and backward, that
// training (model/causal_lm.h), generation (model/generator.h) and serving
// (serve/model_runner.h) all run. The family's differences come from the config's
// DecoderArch (model/architecture.h); where keys and values come from is a KvSource;
// how matrices are stored is a LinearWeights (model/linear.h).
//
//   x = embed(tokens) * embedding_scale                  residual stream, always f32
//   per layer:  h  = norm(x) ; q,k,v = h Wq^T + bq, h Wk^T + bk, h Wv^T + bv (biases where
//               the family has them) ; q,k = qknorm(q), qknorm(k) per head (Qwen3, Gemma 3) ;
//               rope(q, k)   (local layers may have their own table: Gemma 3)
//               x2 = x + attention(q, k, v) Wo^T          (keys/values: the KvSource)
//               h2 = norm(x2) ; x' = x2 + (act(h2 Wg^T) * h2 Wu^T) Wd^T   or MoE(h2)
//   logits = norm(x) Wlm^T        (soft-capped where the family caps them: Gemma 2)
//   norm(x) = x * rstd * (w + norm_weight_offset);  act = SiLU or GELU-tanh
// With post-norms (Gemma 2/3) each block's output is normalised before its residual add:
//               ao = attention(q, k, v) Wo^T ; x2 = x + norm(ao)
//               mo = (act(h2 Wg^T) * h2 Wu^T) Wd^T ; x' = x2 + norm(mo)
// Attention's scale, window and score soft cap are per layer (attention_params).
//
// Inference runs the blocks in place (x2 == x, one set of scratch activations reused by
// every layer); training keeps each layer's activations (DecoderActs) for the backward.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/rope.h"
#include "model/linear.h"
#include "model/lora.h"
#include "model/lora_bank.h"
#include "model/moe_block.h"
#include "model/param_store.h"
#include "model/quantized_matmul.h"

namespace hyperion {

// One layer's activations: the buffers a forward writes and a backward reads. Inference
// points several at the same scratch (x2 = x, h2 = h, a = g).
struct DecoderActs {
  float* x = nullptr;  // layer input [N, D] f32
  float* rstd1 = nullptr;
  void* h = nullptr;  // [N, D]
  void* q = nullptr;  // [N, Hq * hd], after RoPE
  void* k = nullptr;  // [N, Hkv * hd], after RoPE
  void* v = nullptr;
  // qk-norm: the projections before the per-head norm ([N, Hq * hd], [N, Hkv * hd]) and
  // the norms' rstd ([N * Hq], [N * Hkv]). Null q_pre / k_pre: the norm runs in place on
  // q / k (inference); null rstd: the decoder's scratch holds them.
  void* q_pre = nullptr;
  void* k_pre = nullptr;
  float* rstd_q = nullptr;
  float* rstd_k = nullptr;
  void* att = nullptr;   // [N, Hq * hd]
  float* lse = nullptr;  // [B, Hq, T]
  float* x2 = nullptr;   // [N, D] f32, after the attention residual
  float* rstd2 = nullptr;
  void* h2 = nullptr;  // [N, D]
  void* g = nullptr;   // [N, F]
  void* u = nullptr;
  void* a = nullptr;  // act(g) * u [N, F]
  MoeActs moe;        // an MoE layer's MLP state (instead of g, u, a)
  // Post-norms: the blocks' outputs before their norms ([N, D] f32) and the norms' rstd
  // ([N]), kept for the backward; null: the decoder's scratch holds them (inference).
  float* ao = nullptr;
  float* rstd_ao = nullptr;
  float* mo = nullptr;
  float* rstd_mo = nullptr;
  float* post_y = nullptr;  // [N, D] f32 scratch: a post-norm's output before its add
};

// The inference form: one scratch set reused by every layer, the blocks running in place
// (x2 = x, rstd2 = rstd1, h2 = h, and a = g: the activation overwrites the gate). k and v
// may be null when the KvSource places them (a contiguous cache); moe is the caller's.
inline DecoderActs in_place_acts(float* x, float* rstd, void* h, void* q, void* k, void* v,
                                 void* att, float* lse, void* g, void* u) {
  DecoderActs s;
  s.x = s.x2 = x;
  s.rstd1 = s.rstd2 = rstd;
  s.h = s.h2 = h;
  s.q = q;
  s.k = k;
  s.v = v;
  s.att = att;
  s.lse = lse;
  s.g = s.a = g;
  s.u = u;
  return s;
}

// A document of a packed training row: `length` tokens from row-major token `start`,
// never across rows.
struct PackedDocument {
  int64_t start = 0, length = 0;
};

// The rows one pass runs on: b sequences of t tokens (training), or n rows of one
// sequence from `position` on (generation), or n rows each at its own position
// (serving: `positions`, [n]). Packed training rows (several documents per sequence) have
// both: each token's position within its document (`positions`, this backend's memory)
// and the documents (`documents`, host memory), each attending causally to itself only.
struct PassRows {
  int64_t b = 1, t = 1;
  int64_t position = 0;
  const int32_t* positions = nullptr;
  const std::vector<PackedDocument>* documents = nullptr;
  int64_t n() const { return b * t; }
};

class Decoder;

// Where attention's keys and values live.
class KvSource {
 public:
  virtual ~KvSource() = default;
  // Points s.k and s.v where this source keeps layer l's new keys and values, so the
  // projections write them in place (a contiguous cache); by default they stay put.
  virtual void place(const Decoder& dec, int l, const PassRows& rows, DecoderActs& s) {}
  // s.att (and s.lse) = attention of the rows' queries s.q (after RoPE) over the keys
  // and values each row sees.
  virtual void attend(const Decoder& dec, int l, const PassRows& rows, DecoderActs& s) = 0;
};

// Training and evaluation: each of the b sequences attends causally to its own t rows,
// nothing is cached, and lse is kept for the backward.
class SelfAttentionOnly final : public KvSource {
 public:
  void attend(const Decoder& dec, int l, const PassRows& rows, DecoderActs& s) override;
};

// Gradient buffers of the backward (one set, shared by every layer).
struct DecoderGrads {
  float* dres = nullptr;   // [N, D] f32: gradient w.r.t. the residual stream
  void* dres_c = nullptr;  // [N, D] bf16 copy (bf16 mode)
  float* dh = nullptr;     // [N, D] f32 (gradient at a norm's output)
  void* datt = nullptr;    // [N, Hq * hd]
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* da = nullptr;  // [N, F]
  MoeGradScratch moe;
};

class Decoder {
 public:
  // `weights` reads the matrices (f32, bf16 or int8, its act dtype is the decoder's);
  // RoPE covers positions [0, rope_positions). Both must outlive the decoder.
  Decoder(const ParamStore& params, LinearWeights& weights, int64_t rope_positions);

  const DecoderConfig& config() const { return cfg_; }
  const ParamStore& params() const { return params_; }
  // The kernels of the parameters' device: every op the decoder runs goes through it.
  KernelBackend& kernels() const { return k_; }
  DType act() const { return act_; }
  // Routes the Linear layers `q` covers through quantised matmuls (training with
  // `quantization`); null (the default) keeps every matmul in the compute dtype.
  void set_quantized(QuantizedMatmuls* q) { quant_ = q; }
  // Applies `adapter` in the matmuls it covers (null: none): y += s (x A^T) B^T, and in
  // the backward its gradients into the adapter's store. Its compute dtype must be the
  // decoder's (a bf16 copy in bf16 mode). A base store without gradients is frozen: the
  // backward computes input gradients only. Not owned.
  void set_lora(const LoraAdapter* adapter);
  const LoraAdapter* lora() const { return lora_; }
  // The adapter's dropout (its config's lora_dropout) in the following passes, with masks
  // keyed by `key` and the matrix (kernels/dropout.h), so a pass's backward and any
  // rematerialised forward see its forward's masks; 0 (the default, and for evaluation):
  // no dropout. A training step sets a fresh key per micro-batch (or per row).
  void set_lora_dropout_key(uint64_t key) { lora_dropout_key_ = key; }
  // Serving many adapters at once: each row of the following passes gets its slot's
  // adapter from `bank` (model/lora_bank.h), `rows` saying which; null: none. Forward
  // only. Not owned; rows must stay valid for the passes.
  void set_lora_rows(const LoraBank* bank, const LoraRows* rows) {
    bank_ = bank;
    bank_rows_ = rows;
  }

  // Layer l's attention: its window, scale and score soft cap (causal).
  AttentionParams attention_params(int l) const;
  // Soft-caps logits [n, V] of dtype ld in place (the inference paths; training's loss
  // caps inside the cross-entropy). A no-op for families without a final cap.
  void cap_logits(void* logits, int64_t n, DType ld) const;
  float final_logit_softcap() const { return static_cast<float>(cfg_.arch.final_logit_softcap); }

  // x[n, D] = embedding rows of tokens, times the family's embedding scale.
  void embed(const int32_t* tokens, int64_t n, float* x) const;
  // s.x2 = s.x + attention block (s.x2 may be s.x: in place). Writes s.h, s.rstd1, s.q,
  // s.k, s.v, s.att, s.lse.
  void attention_block(int l, const PassRows& rows, DecoderActs& s, KvSource& kv);
  // The MLP block from s.x2: writes s.h2, s.rstd2 and the MLP activations; when out is
  // not null, out = s.x2 + mlp (out may be s.x2: in place).
  void mlp_block(int l, int64_t n, DecoderActs& s, const MoeShape& ms, const MoeOptions& mo,
                 float* out);
  // The MLP alone (dense or MoE) from s.h2, the norm's output: mlp_block after the norm.
  void mlp(int l, int64_t n, DecoderActs& s, const MoeShape& ms, const MoeOptions& mo, float* out);
  // Its backward: g.dres (gradient w.r.t. the layer output) -> g.dh (w.r.t. h2, written),
  // accumulating the MLP's weight gradients. s.g and s.u are overwritten.
  void mlp_backward(int l, int64_t n, DecoderActs& s, const DecoderGrads& g, const MoeShape& ms,
                    const MoeOptions& mo, float dloss);
  // Recomputes the norms' outputs (h, h2) and the activation's output (a) from the saved
  // inputs and matmul outputs (the minimal remat policy).
  void recompute_elementwise(int l, int64_t n, DecoderActs& s, const MoeShape& ms);
  // logits[n, V] (dtype ld) = lm_head(norm(x)); h [n, D] act and rstd [n] are written.
  void head(const float* x, int64_t n, void* h, float* rstd, void* logits, DType ld);

  // Backward of layer l: g.dres holds the gradient w.r.t. the layer's output on entry,
  // w.r.t. its input on exit; weight gradients accumulate into the store's gradients.
  void layer_backward(int l, const PassRows& rows, DecoderActs& s, const DecoderGrads& g,
                      const MoeShape& ms, const MoeOptions& mo, float dloss);
  // Backward of head(): dlogits [n, V] act (the loss gradient) -> g.dres (written), and
  // the LM head's and final norm's gradients.
  void head_backward(const float* x, int64_t n, const void* h, const float* rstd,
                     const void* dlogits, const DecoderGrads& g);
  // Embedding gradient from g.dres.
  void embed_backward(const int32_t* tokens, int64_t n, const DecoderGrads& g);

 private:
  void norm(const float* x, int64_t n, int index, void* y, float* rstd) const;
  void norm_backward(const float* x, int64_t n, int index, const float* rstd, float* dx,
                     bool accumulate, const DecoderGrads& g) const;
  void rope(int l, const PassRows& rows, void* q, void* k) const;
  const RopeTable& rope_table(int l) const;
  // Post-norm of a block's output: y = norm(o) (rstd written; y is s.post_y or scratch),
  // then res += y when res is not null.
  void post_norm(int index, const float* o, int64_t n, float* rstd, float* res,
                 const DecoderActs& s);
  // Its backward: dres (the gradient at res, unchanged) -> the gradient at o, in the act
  // dtype (g.dh, or g.dres_c in bf16 mode); the norm's weight gradient accumulates.
  const void* post_norm_backward(int index, const float* o, int64_t n, const float* rstd,
                                 const DecoderGrads& g);
  // Post-norm scratch for acts that bring none (inference): [n, D] f32 norm output, then
  // [n, D] f32 block output and [n] rstd.
  float* post_scratch(int64_t n);
  // y[n, out] += bias (parameter `index`; -1: none).
  void add_bias(int index, void* y, DType yd, int64_t n) const;
  // grad(bias) += sum over the n rows of dy [n, out] (act dtype).
  void bias_backward(int index, const void* dy, int64_t n);
  // qk-norm over heads of hd: y = norm(x) per [hd] row ([rows, hd]); x may be y.
  void head_norm(int index, const void* x, void* y, float* rstd, int64_t rows) const;
  // Its backward: dy (gradient at y, [rows, hd]) -> dx (may be dy), grad(weight) +=.
  void head_norm_backward(int index, const void* dy, const void* x, const float* rstd, void* dx,
                          int64_t rows) const;
  // The rstd buffers of a pass whose acts bring none (inference), grown on demand.
  float* qk_rstd_scratch(int64_t rows);
  // y = x W^T (+ beta y) for parameter `index`, quantised when covered; `kind` names the
  // input's saved slot (see QuantizedMatmuls::slot; -1 with the LM head).
  void matmul(int l, int kind, int index, const void* x, void* y, DType yd, int64_t n,
              float beta = 0.0f);
  // Its backward: dx = dy W (+ beta dx) and grad(W) += dy^T x.
  void matmul_backward(int l, int kind, int index, const void* dy, const void* x, void* dx,
                       DType dxd, int64_t n, float beta);
  // y += s (x A^T) B^T for parameter `index`'s adapter (a no-op without one).
  void lora_forward(int index, const void* x, void* y, DType yd, int64_t n);
  // Its backward: grad(B) += s dy^T (x A^T), grad(A) += s (dy B)^T x, dx += s (dy B) A.
  void lora_backward(int index, const void* dy, const void* x, void* dx, DType dxd, int64_t n);
  // [2, n, r] act-dtype scratch of the adapters' low-rank products.
  void* lora_scratch(int64_t n);
  // The gradient a norm's backward accumulates into: the store's, or a scratch that is
  // thrown away when the base is frozen (the kernels compute both gradients in one pass).
  TensorView norm_grad(int index) const;
  bool base_trains() const { return params_.has_grads(); }
  // g.dres (f32) in the matmul-input dtype (a copy in bf16 mode, the buffer in f32).
  const void* dres_compute(int64_t n, const DecoderGrads& g) const;

  const ParamStore& params_;
  DecoderConfig cfg_;
  LinearWeights& weights_;
  KernelBackend& k_;
  DType act_;
  RopeTable rope_;
  std::unique_ptr<RopeTable> rope_local_;  // local layers' table (Gemma 3); null: none
  float norm_offset_;
  QuantizedMatmuls* quant_ = nullptr;
  const LoraAdapter* lora_ = nullptr;
  const LoraBank* bank_ = nullptr;
  const LoraRows* bank_rows_ = nullptr;
  DeviceBuffer bank_scratch_;  // the bank's gathered rows and low-rank products
  size_t bank_scratch_bytes_ = 0;
  // y += each row's slot adapter (the bank's per-row form of lora_forward).
  void bank_forward(int index, const void* x, void* y, DType yd, int64_t n);
  DeviceBuffer lora_scratch_;
  int64_t lora_rows_ = 0;
  uint64_t lora_dropout_key_ = 0;
  DeviceBuffer lora_drop_;  // the dropped input (act) or its gradient's term (f32)
  size_t lora_drop_bytes_ = 0;
  // The dropout probability of the current pass (0: none) and a scratch of `bytes`.
  float lora_dropout() const;
  void* lora_drop_scratch(size_t bytes);
  mutable DeviceBuffer discard_;  // norm_grad's scratch when the base is frozen
  DeviceBuffer ones_;         // [rows] ones in the act dtype: the bias gradient's reduction
  int64_t ones_rows_ = 0;
  DeviceBuffer qk_rstd_;      // qk-norm rstd when the acts have none
  int64_t qk_rstd_rows_ = 0;
  DeviceBuffer post_;         // post-norm scratch (post_scratch)
  int64_t post_rows_ = 0;
};

}  // namespace hyperion
