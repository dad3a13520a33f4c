#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "kernels/block_quant.h"
#include "tensor/convert.h"

namespace hyperion {

namespace {

// A packed document's rows of a [N, heads, hd] activation.
void* doc_rows(const void* base, DType dt, const PackedDocument& doc, int64_t heads, int64_t hd) {
  return const_cast<char*>(static_cast<const char*>(base)) +
         static_cast<size_t>(doc.start * heads * hd) * dtype_size(dt);
}

}  // namespace

void SelfAttentionOnly::attend(const Decoder& dec, int l, const PassRows& rows, DecoderActs& s) {
  const DecoderConfig& c = dec.config();
  const DType a = dec.act();
  const int64_t b = rows.b, t = rows.t, hq = c.n_heads, hkv = c.n_kv_heads, hd = c.head_dim;
  if (rows.documents != nullptr) {
    // Packed rows: each document is its own causal sequence (a batch of one), its lse
    // rows the [Hq, length] block at start * Hq (the documents partition the tokens).
    KernelBackend& k = dec.kernels();
    for (const PackedDocument& d : *rows.documents) {
      const int64_t len = d.length;
      k.attention_forward(k.view(doc_rows(s.q, a, d, hq, hd), a, {1, len, hq, hd}),
                          k.view(doc_rows(s.k, a, d, hkv, hd), a, {1, len, hkv, hd}),
                          k.view(doc_rows(s.v, a, d, hkv, hd), a, {1, len, hkv, hd}),
                          k.view(doc_rows(s.att, a, d, hq, hd), a, {1, len, hq, hd}),
                          k.view(s.lse + d.start * hq, DType::kF32, {1, hq, len}), dec.attention_params(l));
    }
    return;
  }
  dec.kernels().attention_forward(
      dec.kernels().view(s.q, a, {b, t, hq, hd}), dec.kernels().view(s.k, a, {b, t, hkv, hd}),
      dec.kernels().view(s.v, a, {b, t, hkv, hd}), dec.kernels().view(s.att, a, {b, t, hq, hd}),
      dec.kernels().view(s.lse, DType::kF32, {b, hq, t}), dec.attention_params(l));
}

Decoder::Decoder(const ParamStore& params, LinearWeights& weights, int64_t rope_positions)
    : params_(params),
      cfg_(params.config()),
      weights_(weights),
      k_(weights.backend()),
      act_(weights.act_dtype()),
      rope_(std::max<int64_t>(rope_positions, 1), params.config().head_dim,
            params.config().rope_theta, params.config().rope_scaling),
      norm_offset_(params.config().arch.norm_weight_offset) {
  if (cfg_.arch.local_rope_theta > 0)
    rope_local_ = std::make_unique<RopeTable>(std::max<int64_t>(rope_positions, 1), cfg_.head_dim,
                                              cfg_.arch.local_rope_theta);
}

AttentionParams Decoder::attention_params(int l) const {
  AttentionParams p;
  p.window = cfg_.arch.layer_window(l);
  if (cfg_.arch.query_pre_attn_scalar > 0)
    p.scale = static_cast<float>(1.0 / std::sqrt(cfg_.arch.query_pre_attn_scalar));
  p.softcap = static_cast<float>(cfg_.arch.attn_logit_softcap);
  return p;
}

void Decoder::cap_logits(void* logits, int64_t n, DType ld) const {
  if (cfg_.arch.final_logit_softcap <= 0 || n == 0) return;
  k_.softcap_forward(k_.view(logits, ld, {n, cfg_.vocab_size}), final_logit_softcap());
}

const RopeTable& Decoder::rope_table(int l) const {
  return rope_local_ != nullptr && cfg_.arch.local_rope(l) ? *rope_local_ : rope_;
}

float* Decoder::post_scratch(int64_t n) {
  if (post_rows_ < n) {
    post_ = DeviceBuffer(k_.allocator(),
                         static_cast<size_t>(n * (2 * cfg_.dim + 1)) * sizeof(float));
    post_rows_ = n;
  }
  return post_.as<float>();
}

void Decoder::post_norm(int index, const float* o, int64_t n, float* rstd, float* res,
                        const DecoderActs& s) {
  const int64_t d = cfg_.dim;
  float* y = s.post_y != nullptr ? s.post_y : post_scratch(n);
  k_.rmsnorm_forward(k_.view(const_cast<float*>(o), DType::kF32, {n, d}), params_.param(index),
                     static_cast<float>(cfg_.norm_eps), k_.view(y, DType::kF32, {n, d}),
                     k_.view(rstd, DType::kF32, {n}), norm_offset_);
  if (res != nullptr)
    k_.residual_add(k_.view(y, DType::kF32, {n, d}), k_.view(res, DType::kF32, {n, d}));
}

const void* Decoder::post_norm_backward(int index, const float* o, int64_t n, const float* rstd,
                                        const DecoderGrads& g) {
  const int64_t d = cfg_.dim;
  HYP_CHECK(o != nullptr && rstd != nullptr,
            "decoder: the post-norm backward needs the saved block output and its rstd");
  k_.rmsnorm_backward(k_.view(g.dres, DType::kF32, {n, d}),
                      k_.view(const_cast<float*>(o), DType::kF32, {n, d}), params_.param(index),
                      k_.view(const_cast<float*>(rstd), DType::kF32, {n}),
                      k_.view(g.dh, DType::kF32, {n, d}), norm_grad(index), false, norm_offset_);
  if (act_ == DType::kF32) return g.dh;
  k_.convert(g.dh, DType::kF32, g.dres_c, DType::kBF16, static_cast<size_t>(n * d));
  return g.dres_c;
}

void Decoder::embed(const int32_t* tokens, int64_t n, float* x) const {
  if (const ParamStore::BlockWeight* b = params_.block_weight(params_.embed())) {
    block_embedding_forward(b->type, b->data, cfg_.vocab_size, cfg_.dim, tokens, n, x,
                            cfg_.arch.embedding_scale(cfg_.dim));
    return;
  }
  k_.embedding_forward(params_.param(params_.embed()),
                       k_.view(const_cast<int32_t*>(tokens), DType::kI32, {n}),
                       k_.view(x, DType::kF32, {n, cfg_.dim}), cfg_.arch.embedding_scale(cfg_.dim));
}

void Decoder::norm(const float* x, int64_t n, int index, void* y, float* rstd) const {
  const int64_t d = cfg_.dim;
  k_.rmsnorm_forward(k_.view(const_cast<float*>(x), DType::kF32, {n, d}), params_.param(index),
                     static_cast<float>(cfg_.norm_eps), k_.view(y, act_, {n, d}),
                     k_.view(rstd, DType::kF32, {n}), norm_offset_);
}

void Decoder::rope(int l, const PassRows& rows, void* q, void* k) const {
  const RopeTable& table = rope_table(l);
  const int64_t b = rows.b, t = rows.t, hq = cfg_.n_heads, hkv = cfg_.n_kv_heads;
  const int64_t hd = cfg_.head_dim;
  const TensorView qv = k_.view(q, act_, {b, t, hq, hd}), kv = k_.view(k, act_, {b, t, hkv, hd});
  if (rows.positions != nullptr) {
    const TensorView pos = k_.view(const_cast<int32_t*>(rows.positions), DType::kI32, {rows.b, rows.t});
    k_.rope_forward(qv, qv, pos, table);
    k_.rope_forward(kv, kv, pos, table);
  } else {
    k_.rope_forward(qv, qv, rows.position, table);
    k_.rope_forward(kv, kv, rows.position, table);
  }
}

void Decoder::add_bias(int index, void* y, DType yd, int64_t n) const {
  if (index < 0 || n == 0) return;
  const TensorView b = params_.param(index);
  // C = C + bias: the GEMM's empty-product form, on every backend.
  GemmArgs g;
  g.m = n;
  g.n = b.shape[0];
  g.k = 0;
  g.a_dtype = g.b_dtype = yd == DType::kF32 ? DType::kF32 : DType::kBF16;
  g.lda = 1;
  g.ldb = g.n;
  g.c = y;
  g.c_dtype = yd;
  g.ldc = g.n;
  g.beta = 1.0f;
  g.bias = b.as<float>();
  k_.gemm(g);
}

void Decoder::bias_backward(int index, const void* dy, int64_t n) {
  if (index < 0 || n == 0 || !base_trains()) return;
  if (ones_rows_ < n) {
    const size_t es = dtype_size(act_);
    ones_ = DeviceBuffer(k_.allocator(), static_cast<size_t>(n) * es);
    std::vector<float> one(static_cast<size_t>(n), 1.0f);
    std::vector<unsigned char> host(static_cast<size_t>(n) * es);
    convert_any(one.data(), DType::kF32, host.data(), act_, one.size());
    k_.upload(host.data(), ones_.data(), host.size());
    ones_rows_ = n;
  }
  // grad [1, out] += ones [1, n] dy [n, out].
  const TensorView gb = params_.grad(index);
  k_.gemm_contiguous(Trans::kN, Trans::kN, 1, gb.shape[0], n, ones_.data(), act_, dy, act_, gb.data,
                     DType::kF32, 1.0f);
}

float* Decoder::qk_rstd_scratch(int64_t rows) {
  if (qk_rstd_rows_ < rows) {
    qk_rstd_ = DeviceBuffer(k_.allocator(), static_cast<size_t>(rows) * sizeof(float));
    qk_rstd_rows_ = rows;
  }
  return qk_rstd_.as<float>();
}

void Decoder::head_norm(int index, const void* x, void* y, float* rstd, int64_t rows) const {
  const int64_t hd = cfg_.head_dim;
  k_.rmsnorm_forward(k_.view(const_cast<void*>(x), act_, {rows, hd}), params_.param(index),
                     static_cast<float>(cfg_.norm_eps), k_.view(y, act_, {rows, hd}),
                     k_.view(rstd, DType::kF32, {rows}), norm_offset_);
}

void Decoder::head_norm_backward(int index, const void* dy, const void* x, const float* rstd,
                                 void* dx, int64_t rows) const {
  const int64_t hd = cfg_.head_dim;
  k_.rmsnorm_backward(k_.view(const_cast<void*>(dy), act_, {rows, hd}),
                      k_.view(const_cast<void*>(x), act_, {rows, hd}), params_.param(index),
                      k_.view(const_cast<float*>(rstd), DType::kF32, {rows}),
                      k_.view(dx, act_, {rows, hd}), norm_grad(index), false, norm_offset_);
}

void Decoder::attention_block(int l, const PassRows& rows, DecoderActs& s, KvSource& kv) {
  const LayerParamIndex& p = params_.layer(l);
  const int64_t n = rows.n();
  norm(s.x, n, p.input_norm, s.h, s.rstd1);
  kv.place(*this, l, rows, s);
  // With qk-norm the projections land in q_pre / k_pre (or in place) and the norm writes
  // q / k; without, straight in q / k.
  const bool qkn = p.q_norm >= 0;
  void* qp = qkn && s.q_pre != nullptr ? s.q_pre : s.q;
  void* kp = qkn && s.k_pre != nullptr ? s.k_pre : s.k;
  if (quant_ == nullptr) {  // q, k and v of one input: one pass where the backend can
    const int w[3] = {p.q, p.k, p.v};
    void* const y[3] = {qp, kp, s.v};
    weights_.forward_many(w, s.h, y, act_, n);
    for (int i = 0; i < 3; ++i) lora_forward(w[i], s.h, y[i], act_, n);
  } else {
    matmul(l, 0, p.q, s.h, qp, act_, n);
    matmul(l, 0, p.k, s.h, kp, act_, n);
    matmul(l, 0, p.v, s.h, s.v, act_, n);
  }
  add_bias(p.q_bias, qp, act_, n);
  add_bias(p.k_bias, kp, act_, n);
  add_bias(p.v_bias, s.v, act_, n);
  if (qkn) {
    const int64_t rq = n * cfg_.n_heads, rk = n * cfg_.n_kv_heads;
    float* rstd_q = s.rstd_q;
    float* rstd_k = s.rstd_k;
    if (rstd_q == nullptr || rstd_k == nullptr) {
      rstd_q = qk_rstd_scratch(rq + rk);
      rstd_k = rstd_q + rq;
    }
    head_norm(p.q_norm, qp, s.q, rstd_q, rq);
    head_norm(p.k_norm, kp, s.k, rstd_k, rk);
  }
  rope(l, rows, s.q, s.k);
  kv.attend(*this, l, rows, s);
  if (s.x2 != s.x) k_.copy(s.x, s.x2, static_cast<size_t>(n * cfg_.dim) * sizeof(float));
  if (p.attn_out_norm < 0) {
    matmul(l, 1, p.o, s.att, s.x2, DType::kF32, n, 1.0f);
    add_bias(p.o_bias, s.x2, DType::kF32, n);
    return;
  }
  // Post-norm: x2 = x + norm(att Wo^T + bo). (Training's acts keep ao and its rstd.)
  float* scratch = s.ao != nullptr ? nullptr : post_scratch(n);
  float* ao = s.ao != nullptr ? s.ao : scratch + n * cfg_.dim;
  float* rstd = s.rstd_ao != nullptr ? s.rstd_ao : scratch + 2 * n * cfg_.dim;
  matmul(l, 1, p.o, s.att, ao, DType::kF32, n, 0.0f);
  add_bias(p.o_bias, ao, DType::kF32, n);
  post_norm(p.attn_out_norm, ao, n, rstd, s.x2, s);
}

void Decoder::mlp_block(int l, int64_t n, DecoderActs& s, const MoeShape& ms, const MoeOptions& mo,
                        float* out) {
  norm(s.x2, n, params_.layer(l).mlp_norm, s.h2, s.rstd2);
  mlp(l, n, s, ms, mo, out);
}

void Decoder::mlp(int l, int64_t n, DecoderActs& s, const MoeShape& ms, const MoeOptions& mo,
                  float* out) {
  const LayerParamIndex& p = params_.layer(l);
  const int64_t f = cfg_.ffn_dim;
  if (p.moe()) {
    if (out != nullptr) k_.copy(s.x2, out, static_cast<size_t>(n * cfg_.dim) * sizeof(float));
    moe::forward(params_, p, ms, mo, s.h2, act_, s.moe, out);
    return;
  }
  if (quant_ == nullptr) {
    const int w[2] = {p.gate, p.up};
    void* const y[2] = {s.g, s.u};
    weights_.forward_many(w, s.h2, y, act_, n);
    for (int i = 0; i < 2; ++i) lora_forward(w[i], s.h2, y[i], act_, n);
  } else {
    matmul(l, 2, p.gate, s.h2, s.g, act_, n);
    matmul(l, 2, p.up, s.h2, s.u, act_, n);
  }
  k_.gated_forward(cfg_.arch.activation, k_.view(s.g, act_, {n, f}), k_.view(s.u, act_, {n, f}),
                   k_.view(s.a, act_, {n, f}));
  if (out != nullptr && out != s.x2)
    k_.copy(s.x2, out, static_cast<size_t>(n * cfg_.dim) * sizeof(float));
  if (p.mlp_out_norm < 0) {
    if (out != nullptr) matmul(l, 3, p.down, s.a, out, DType::kF32, n, 1.0f);
    return;
  }
  // Post-norm: out = x2 + norm(a Wd^T). Without `out` (a full-remat recompute) the output
  // and its rstd are still what the backward reads.
  float* scratch = s.mo != nullptr ? nullptr : post_scratch(n);
  float* mlp_out = s.mo != nullptr ? s.mo : scratch + n * cfg_.dim;
  float* rstd = s.rstd_mo != nullptr ? s.rstd_mo : scratch + 2 * n * cfg_.dim;
  matmul(l, 3, p.down, s.a, mlp_out, DType::kF32, n, 0.0f);
  post_norm(p.mlp_out_norm, mlp_out, n, rstd, out, s);
}

void Decoder::recompute_elementwise(int l, int64_t n, DecoderActs& s, const MoeShape& ms) {
  const LayerParamIndex& p = params_.layer(l);
  const int64_t f = cfg_.ffn_dim;
  // Quantised matmuls keep their own inputs (the slots): a dense layer's backward reads
  // nothing of h, h2 or a, and rstd is saved.
  if (quant_ != nullptr && !p.moe() && lora_ == nullptr) return;  // (adapters read h, h2 and a)
  norm(s.x, n, p.input_norm, s.h, s.rstd1);
  norm(s.x2, n, p.mlp_norm, s.h2, s.rstd2);
  if (p.moe()) {
    moe::recompute(k_, ms, s.h2, act_, s.moe);
    return;
  }
  k_.gated_forward(cfg_.arch.activation, k_.view(s.g, act_, {n, f}), k_.view(s.u, act_, {n, f}),
                   k_.view(s.a, act_, {n, f}));
}

void Decoder::head(const float* x, int64_t n, void* h, float* rstd, void* logits, DType ld) {
  norm(x, n, params_.final_norm(), h, rstd);
  matmul(-1, 0, params_.lm_head(), h, logits, ld, n);
}

void Decoder::matmul(int l, int kind, int index, const void* x, void* y, DType yd, int64_t n,
                     float beta) {
  if (quant_ != nullptr && quant_->covers(index)) {
    quant_->forward(index, l < 0 ? quant_->head_slot() : quant_->slot(l, kind), x, y, yd, n, beta);
  } else {
    weights_.forward(index, x, y, yd, n, beta);
  }
  lora_forward(index, x, y, yd, n);
}

void Decoder::matmul_backward(int l, int kind, int index, const void* dy, const void* x, void* dx,
                              DType dxd, int64_t n, float beta) {
  if (quant_ != nullptr && quant_->covers(index)) {
    quant_->backward(index, l < 0 ? quant_->head_slot() : quant_->slot(l, kind), dy, dx, dxd, n,
                     beta);
  } else {
    linear::backward_input(k_, dy, act_, params_.compute_weight(index), dx, dxd, n, beta);
    if (base_trains()) linear::backward_weight(k_, dy, x, act_, params_.grad(index), n);
  }
  lora_backward(index, dy, x, dx, dxd, n);
}

void Decoder::set_lora(const LoraAdapter* adapter) {
  if (adapter != nullptr) {
    HYP_CHECK(adapter->store().has_bf16() == (act_ == DType::kBF16),
              "decoder: a LoRA adapter computing in {} on a {} model",
              adapter->store().has_bf16() ? "bf16" : "f32", dtype_name(act_));
    HYP_CHECK(adapter->store().device() == params_.device(),
              "decoder: the LoRA adapter lives on another device than the model");
  }
  lora_ = adapter;
}

void* Decoder::lora_scratch(int64_t n) {
  if (lora_rows_ < n) {
    lora_scratch_ = DeviceBuffer(k_.allocator(),
                                 static_cast<size_t>(2 * n * lora_->rank()) * dtype_size(act_));
    lora_rows_ = n;
  }
  return lora_scratch_.data();
}

void Decoder::bank_forward(int index, const void* x, void* y, DType yd, int64_t n) {
  const LoraRows& r = *bank_rows_;
  if (!bank_->covers(index) || r.adapted() == 0) return;
  HYP_CHECK(r.n == n, "decoder: the LoRA rows describe {} rows, the pass has {}", r.n, n);
  const TensorView a = bank_->a(index), b = bank_->b(index);
  const int64_t slots = a.shape[0], rank = a.shape[1], in = a.shape[2], out = b.shape[1];
  const int64_t m0 = r.sizes[0];  // slot 0's rows come first and stay as they are
  const size_t ea = dtype_size(act_), ey = dtype_size(yd);
  const size_t need = static_cast<size_t>(n * in) * ea + static_cast<size_t>(n * out) * ey + static_cast<size_t>(n * rank) * ea;
  if (bank_scratch_bytes_ < need) {
    bank_scratch_ = DeviceBuffer(k_.allocator(), need);
    bank_scratch_bytes_ = need;
  }
  char* xs = static_cast<char*>(bank_scratch_.data());
  char* ys = xs + static_cast<size_t>(n * in) * ea;
  char* t = ys + static_cast<size_t>(n * out) * ey;
  const void* xa = x;
  void* ya = y;
  if (!r.identity) {  // rows into slot order
    k_.moe_gather_rows(x, act_, r.perm, n, in, xs);
    k_.moe_gather_rows(y, yd, r.perm, n, out, ys);
    xa = xs;
    ya = ys;
  }
  // Per slot with rows (each a run of rows after slot 0's): t = x A_s^T, then
  // y += t B_s^T (B holds s * B). Plain GEMMs of a few rows against small weights take the
  // decode GEMM path (weights streamed once per call); a grouped GEMM ran these shapes
  // through oneDNN at several times the cost.
  const size_t a_slot = static_cast<size_t>(rank * in) * ea, b_slot = static_cast<size_t>(out * rank) * ea;
  int64_t row = m0;
  for (int64_t g = 1; g < slots; ++g) {
    const int64_t rows = r.sizes[static_cast<size_t>(g)];
    if (rows == 0) continue;
    GemmArgs ga = contiguous_gemm_args(Trans::kN, Trans::kT, rows, rank, in,
                                       static_cast<const char*>(xa) + static_cast<size_t>(row * in) * ea, act_,
                                       static_cast<const char*>(a.data) + static_cast<size_t>(g) * a_slot, act_, t, act_,
                                       0.0f);
    k_.gemm(ga);
    GemmArgs gb = contiguous_gemm_args(Trans::kN, Trans::kT, rows, out, rank, t, act_,
                                       static_cast<const char*>(b.data) + static_cast<size_t>(g) * b_slot, act_,
                                       static_cast<char*>(ya) + static_cast<size_t>(row * out) * ey, yd, 1.0f);
    k_.gemm(gb);
    row += rows;
  }
  if (!r.identity) k_.moe_gather_rows(ys, yd, r.inverse, n, out, y);  // back in row order
}

float Decoder::lora_dropout() const {
  return lora_ != nullptr && lora_dropout_key_ != 0 ? static_cast<float>(lora_->config().dropout) : 0.0f;
}

void* Decoder::lora_drop_scratch(size_t bytes) {
  if (lora_drop_bytes_ < bytes) {
    lora_drop_ = DeviceBuffer(k_.allocator(), bytes);
    lora_drop_bytes_ = bytes;
  }
  return lora_drop_.data();
}

void Decoder::lora_forward(int index, const void* x, void* y, DType yd, int64_t n) {
  if (bank_ != nullptr && bank_rows_ != nullptr && n > 0) bank_forward(index, x, y, yd, n);
  if (lora_ == nullptr || n == 0) return;
  const int ai = lora_->a_of(index);
  if (ai < 0) return;
  const TensorView a = lora_->store().compute_weight(ai), b = lora_->store().compute_weight(ai + 1);
  const int64_t r = a.shape[0], in = a.shape[1], out = b.shape[0];
  if (const float p = lora_dropout(); p > 0.0f) {  // PEFT's lora_dropout: on the adapter's input only
    void* xd = lora_drop_scratch(static_cast<size_t>(n * in) * dtype_size(act_));
    k_.dropout_apply(k_.view(const_cast<void*>(x), act_, {n * in}), k_.view(xd, act_, {n * in}), p,
                     dropout_key(lora_dropout_key_, static_cast<uint64_t>(index)), false);
    x = xd;
  }
  void* t = lora_scratch(n);
  // t [n, r] = x A^T, then y [n, out] += s t B^T.
  k_.gemm_contiguous(Trans::kN, Trans::kT, n, r, in, x, act_, a.data, a.dtype, t, act_);
  GemmArgs g = contiguous_gemm_args(Trans::kN, Trans::kT, n, out, r, t, act_, b.data, b.dtype, y, yd, 1.0f);
  g.alpha = lora_->scale();
  k_.gemm(g);
}

void Decoder::lora_backward(int index, const void* dy, const void* x, void* dx, DType dxd, int64_t n) {
  if (lora_ == nullptr || n == 0) return;
  const int ai = lora_->a_of(index);
  if (ai < 0) return;
  const ParamStore& st = lora_->store();
  const TensorView a = st.compute_weight(ai), b = st.compute_weight(ai + 1);
  const TensorView ga = st.grad(ai), gb = st.grad(ai + 1);
  const int64_t r = a.shape[0], in = a.shape[1], out = b.shape[0];
  const float s = lora_->scale();
  // With dropout the adapter saw D(x): its mask recomputed from the key, and dx gets
  // D(s u A) (D is its own adjoint), through an f32 scratch that reuses D(x)'s bytes.
  const float p = lora_dropout();
  const uint64_t key = p > 0.0f ? dropout_key(lora_dropout_key_, static_cast<uint64_t>(index)) : 0;
  void* drop = p > 0.0f ? lora_drop_scratch(static_cast<size_t>(n * in) * sizeof(float)) : nullptr;
  if (p > 0.0f) {
    k_.dropout_apply(k_.view(const_cast<void*>(x), act_, {n * in}), k_.view(drop, act_, {n * in}), p, key, false);
    x = drop;
  }
  void* t = lora_scratch(n);
  void* u = static_cast<char*>(t) + static_cast<size_t>(n * r) * dtype_size(act_);
  // t = x A^T (recomputed: r columns, cheaper than keeping it), u = dy B.
  k_.gemm_contiguous(Trans::kN, Trans::kT, n, r, in, x, act_, a.data, a.dtype, t, act_);
  k_.gemm_contiguous(Trans::kN, Trans::kN, n, r, out, dy, act_, b.data, b.dtype, u, act_);
  // grad(B) [out, r] += s dy^T t ; grad(A) [r, in] += s u^T x ; dx [n, in] += s u A.
  GemmArgs g = contiguous_gemm_args(Trans::kT, Trans::kN, out, r, n, dy, act_, t, act_, gb.data, DType::kF32, 1.0f);
  g.alpha = s;
  k_.gemm(g);
  g = contiguous_gemm_args(Trans::kT, Trans::kN, r, in, n, u, act_, x, act_, ga.data, DType::kF32, 1.0f);
  g.alpha = s;
  k_.gemm(g);
  if (p > 0.0f) {
    g = contiguous_gemm_args(Trans::kN, Trans::kN, n, in, r, u, act_, a.data, a.dtype, drop, DType::kF32, 0.0f);
    g.alpha = s;
    k_.gemm(g);
    k_.dropout_apply(k_.view(drop, DType::kF32, {n * in}), k_.view(dx, dxd, {n * in}), p, key, true);
    return;
  }
  g = contiguous_gemm_args(Trans::kN, Trans::kN, n, in, r, u, act_, a.data, a.dtype, dx, dxd, 1.0f);
  g.alpha = s;
  k_.gemm(g);
}

TensorView Decoder::norm_grad(int index) const {
  if (base_trains()) return params_.grad(index);
  const ParamInfo& p = params_.infos()[static_cast<size_t>(index)];
  if (discard_.bytes() < static_cast<size_t>(p.numel) * sizeof(float))
    discard_ = DeviceBuffer(k_.allocator(), static_cast<size_t>(p.numel) * sizeof(float));
  return k_.view(discard_.data(), DType::kF32, p.shape);
}

const void* Decoder::dres_compute(int64_t n, const DecoderGrads& g) const {
  if (act_ == DType::kF32) return g.dres;
  k_.convert(g.dres, DType::kF32, g.dres_c, DType::kBF16, static_cast<size_t>(n * cfg_.dim));
  return g.dres_c;
}

void Decoder::norm_backward(const float* x, int64_t n, int index, const float* rstd, float* dx,
                            bool accumulate, const DecoderGrads& g) const {
  const int64_t d = cfg_.dim;
  k_.rmsnorm_backward(
      k_.view(g.dh, DType::kF32, {n, d}), k_.view(const_cast<float*>(x), DType::kF32, {n, d}),
      params_.param(index), k_.view(const_cast<float*>(rstd), DType::kF32, {n}),
      k_.view(dx, DType::kF32, {n, d}), norm_grad(index), accumulate, norm_offset_);
}

void Decoder::layer_backward(int l, const PassRows& rows, DecoderActs& s, const DecoderGrads& gr,
                             const MoeShape& ms, const MoeOptions& mo, float dloss) {
  const LayerParamIndex& p = params_.layer(l);
  const int64_t n = rows.n(), b = rows.b, t = rows.t;
  const int64_t hq = cfg_.n_heads, hkv = cfg_.n_kv_heads, hd = cfg_.head_dim;

  mlp_backward(l, n, s, gr, ms, mo, dloss);
  norm_backward(s.x2, n, p.mlp_norm, s.rstd2, gr.dres, true, gr);

  // Attention branch: x2 = x + attention(rope(h Wq^T), rope(h Wk^T), h Wv^T) Wo^T (or, with
  // a post-norm, + norm of it).
  const void* g_out = p.attn_out_norm >= 0
                          ? post_norm_backward(p.attn_out_norm, s.ao, n, s.rstd_ao, gr)
                          : dres_compute(n, gr);
  bias_backward(p.o_bias, g_out, n);
  matmul_backward(l, 1, p.o, g_out, s.att, gr.datt, act_, n, 0.0f);
  const TensorView dqv = k_.view(gr.dq, act_, {b, t, hq, hd});
  const TensorView dkv = k_.view(gr.dk, act_, {b, t, hkv, hd});
  if (rows.documents != nullptr) {
    for (const PackedDocument& d : *rows.documents) {
      const int64_t len = d.length;
      auto v = [&](const void* base, int64_t heads) {
        return k_.view(doc_rows(base, act_, d, heads, hd), act_, {1, len, heads, hd});
      };
      k_.attention_backward(v(s.q, hq), v(s.k, hkv), v(s.v, hkv), v(s.att, hq), v(gr.datt, hq),
                            k_.view(s.lse + d.start * hq, DType::kF32, {1, hq, len}), v(gr.dq, hq),
                            v(gr.dk, hkv), v(gr.dv, hkv), attention_params(l));
    }
  } else {
    k_.attention_backward(k_.view(s.q, act_, {b, t, hq, hd}), k_.view(s.k, act_, {b, t, hkv, hd}),
                          k_.view(s.v, act_, {b, t, hkv, hd}), k_.view(s.att, act_, {b, t, hq, hd}),
                          k_.view(gr.datt, act_, {b, t, hq, hd}),
                          k_.view(s.lse, DType::kF32, {b, hq, t}), dqv, dkv,
                          k_.view(gr.dv, act_, {b, t, hkv, hd}), attention_params(l));
  }
  if (rows.positions != nullptr) {
    const TensorView pos = k_.view(const_cast<int32_t*>(rows.positions), DType::kI32, {rows.b, rows.t});
    k_.rope_backward(dqv, dqv, pos, rope_table(l));
    k_.rope_backward(dkv, dkv, pos, rope_table(l));
  } else {
    k_.rope_backward(dqv, dqv, rows.position, rope_table(l));
    k_.rope_backward(dkv, dkv, rows.position, rope_table(l));
  }
  if (p.q_norm >= 0) {
    HYP_CHECK(s.q_pre != nullptr && s.k_pre != nullptr && s.rstd_q != nullptr &&
                  s.rstd_k != nullptr,
              "decoder: the qk-norm backward needs the saved q_pre, k_pre and their rstd");
    head_norm_backward(p.q_norm, gr.dq, s.q_pre, s.rstd_q, gr.dq, n * hq);
    head_norm_backward(p.k_norm, gr.dk, s.k_pre, s.rstd_k, gr.dk, n * hkv);
  }
  bias_backward(p.q_bias, gr.dq, n);
  bias_backward(p.k_bias, gr.dk, n);
  bias_backward(p.v_bias, gr.dv, n);
  // The projections' inputs were h; with qk-norm their outputs were q_pre / k_pre.
  matmul_backward(l, 0, p.q, gr.dq, s.h, gr.dh, DType::kF32, n, 0.0f);
  matmul_backward(l, 0, p.k, gr.dk, s.h, gr.dh, DType::kF32, n, 1.0f);
  matmul_backward(l, 0, p.v, gr.dv, s.h, gr.dh, DType::kF32, n, 1.0f);
  norm_backward(s.x, n, p.input_norm, s.rstd1, gr.dres, true, gr);
}

void Decoder::mlp_backward(int l, int64_t n, DecoderActs& s, const DecoderGrads& gr,
                           const MoeShape& ms, const MoeOptions& mo, float dloss) {
  const LayerParamIndex& p = params_.layer(l);
  const ParamStore& ps = params_;
  const int64_t f = cfg_.ffn_dim;
  if (p.moe()) {
    // x' = x2 + moe(h2).
    moe::backward(ps, p, ms, mo, s.h2, act_, s.moe, gr.dres, dloss, gr.moe, gr.dh);
    return;
  }
  // x' = x2 + act(h2 Wg^T, h2 Wu^T) Wd^T (or, with a post-norm, + norm of it).
  const void* g_out = p.mlp_out_norm >= 0
                          ? post_norm_backward(p.mlp_out_norm, s.mo, n, s.rstd_mo, gr)
                          : dres_compute(n, gr);
  matmul_backward(l, 3, p.down, g_out, s.a, gr.da, act_, n, 0.0f);
  // dg and du overwrite the saved gate and up (read before written, never needed again).
  const TensorView gv = k_.view(s.g, act_, {n, f}), uv = k_.view(s.u, act_, {n, f});
  k_.gated_backward(cfg_.arch.activation, k_.view(gr.da, act_, {n, f}), gv, uv, gv, uv);
  matmul_backward(l, 2, p.gate, s.g, s.h2, gr.dh, DType::kF32, n, 0.0f);
  matmul_backward(l, 2, p.up, s.u, s.h2, gr.dh, DType::kF32, n, 1.0f);
}

void Decoder::head_backward(const float* x, int64_t n, const void* h, const float* rstd,
                            const void* dlogits, const DecoderGrads& g) {
  matmul_backward(-1, 0, params_.lm_head(), dlogits, h, g.dh, DType::kF32, n, 0.0f);
  norm_backward(x, n, params_.final_norm(), rstd, g.dres, false, g);
}

void Decoder::embed_backward(const int32_t* tokens, int64_t n, const DecoderGrads& g) {
  if (!base_trains()) return;  // frozen: nothing below the first layer has a gradient
  k_.embedding_backward(k_.view(const_cast<int32_t*>(tokens), DType::kI32, {n}),
                        k_.view(g.dres, DType::kF32, {n, cfg_.dim}), params_.grad(params_.embed()),
                        cfg_.arch.embedding_scale(cfg_.dim));
}

}  // namespace hyperion
