#include "model/decoder.h"

#include <algorithm>
#include <vector>

#include "base/error.h"
#include "tensor/convert.h"

namespace hyperion {

void SelfAttentionOnly::attend(const Decoder& dec, int l, const PassRows& rows, DecoderActs& s) {
  const LlamaConfig& c = dec.config();
  const DType a = dec.act();
  const int64_t b = rows.b, t = rows.t, hq = c.n_heads, hkv = c.n_kv_heads, hd = c.head_dim;
  dec.kernels().attention_forward(
      dec.kernels().view(s.q, a, {b, t, hq, hd}), dec.kernels().view(s.k, a, {b, t, hkv, hd}),
      dec.kernels().view(s.v, a, {b, t, hkv, hd}), dec.kernels().view(s.att, a, {b, t, hq, hd}),
      dec.kernels().view(s.lse, DType::kF32, {b, hq, t}), c.arch.layer_window(l));
}

Decoder::Decoder(const ParamStore& params, LinearWeights& weights, int64_t rope_positions)
    : params_(params),
      cfg_(params.config()),
      weights_(weights),
      k_(weights.backend()),
      act_(weights.act_dtype()),
      rope_(std::max<int64_t>(rope_positions, 1), params.config().head_dim,
            params.config().rope_theta, params.config().rope_scaling),
      norm_offset_(params.config().arch.norm_weight_offset) {}

void Decoder::embed(const int32_t* tokens, int64_t n, float* x) const {
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

void Decoder::rope(const PassRows& rows, void* q, void* k) const {
  const int64_t b = rows.b, t = rows.t, hq = cfg_.n_heads, hkv = cfg_.n_kv_heads;
  const int64_t hd = cfg_.head_dim;
  const TensorView qv = k_.view(q, act_, {b, t, hq, hd}), kv = k_.view(k, act_, {b, t, hkv, hd});
  if (rows.positions != nullptr) {
    const TensorView pos = k_.view(const_cast<int32_t*>(rows.positions), DType::kI32, {rows.n()});
    k_.rope_forward(qv, qv, pos, rope_);
    k_.rope_forward(kv, kv, pos, rope_);
  } else {
    k_.rope_forward(qv, qv, rows.position, rope_);
    k_.rope_forward(kv, kv, rows.position, rope_);
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
  if (index < 0 || n == 0) return;
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
                      k_.view(dx, act_, {rows, hd}), params_.grad(index), false, norm_offset_);
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
  matmul(l, 0, p.q, s.h, qp, act_, n);
  add_bias(p.q_bias, qp, act_, n);
  matmul(l, 0, p.k, s.h, kp, act_, n);
  add_bias(p.k_bias, kp, act_, n);
  matmul(l, 0, p.v, s.h, s.v, act_, n);
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
  rope(rows, s.q, s.k);
  kv.attend(*this, l, rows, s);
  k_.copy(s.x, s.x2, static_cast<size_t>(n * cfg_.dim) * sizeof(float));
  matmul(l, 1, p.o, s.att, s.x2, DType::kF32, n, 1.0f);
  add_bias(p.o_bias, s.x2, DType::kF32, n);
}

void Decoder::mlp_block(int l, int64_t n, DecoderActs& s, const MoeShape& ms, const MoeOptions& mo,
                        float* out) {
  norm(s.x2, n, params_.layer(l).post_norm, s.h2, s.rstd2);
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
  matmul(l, 2, p.gate, s.h2, s.g, act_, n);
  matmul(l, 2, p.up, s.h2, s.u, act_, n);
  k_.gated_forward(cfg_.arch.activation, k_.view(s.g, act_, {n, f}), k_.view(s.u, act_, {n, f}),
                   k_.view(s.a, act_, {n, f}));
  if (out != nullptr) {
    k_.copy(s.x2, out, static_cast<size_t>(n * cfg_.dim) * sizeof(float));
    matmul(l, 3, p.down, s.a, out, DType::kF32, n, 1.0f);
  }
}

void Decoder::recompute_elementwise(int l, int64_t n, DecoderActs& s, const MoeShape& ms) {
  const LayerParamIndex& p = params_.layer(l);
  const int64_t f = cfg_.ffn_dim;
  // Quantised matmuls keep their own inputs (the slots): a dense layer's backward reads
  // nothing of h, h2 or a, and rstd is saved.
  if (quant_ != nullptr && !p.moe()) return;
  norm(s.x, n, p.input_norm, s.h, s.rstd1);
  norm(s.x2, n, p.post_norm, s.h2, s.rstd2);
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
    return;
  }
  weights_.forward(index, x, y, yd, n, beta);
}

void Decoder::matmul_backward(int l, int kind, int index, const void* dy, const void* x, void* dx,
                              DType dxd, int64_t n, float beta) {
  if (quant_ != nullptr && quant_->covers(index)) {
    quant_->backward(index, l < 0 ? quant_->head_slot() : quant_->slot(l, kind), dy, dx, dxd, n,
                     beta);
    return;
  }
  linear::backward_input(k_, dy, act_, params_.compute_weight(index), dx, dxd, n, beta);
  linear::backward_weight(k_, dy, x, act_, params_.grad(index), n);
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
      k_.view(dx, DType::kF32, {n, d}), params_.grad(index), accumulate, norm_offset_);
}

void Decoder::layer_backward(int l, const PassRows& rows, DecoderActs& s, const DecoderGrads& gr,
                             const MoeShape& ms, const MoeOptions& mo, float dloss) {
  const LayerParamIndex& p = params_.layer(l);
  const int64_t n = rows.n(), b = rows.b, t = rows.t;
  const int64_t hq = cfg_.n_heads, hkv = cfg_.n_kv_heads, hd = cfg_.head_dim;

  mlp_backward(l, n, s, gr, ms, mo, dloss);
  norm_backward(s.x2, n, p.post_norm, s.rstd2, gr.dres, true, gr);

  // Attention branch: x2 = x + attention(rope(h Wq^T), rope(h Wk^T), h Wv^T) Wo^T.
  const void* g_out = dres_compute(n, gr);
  bias_backward(p.o_bias, g_out, n);
  matmul_backward(l, 1, p.o, g_out, s.att, gr.datt, act_, n, 0.0f);
  const TensorView dqv = k_.view(gr.dq, act_, {b, t, hq, hd});
  const TensorView dkv = k_.view(gr.dk, act_, {b, t, hkv, hd});
  k_.attention_backward(k_.view(s.q, act_, {b, t, hq, hd}), k_.view(s.k, act_, {b, t, hkv, hd}),
                        k_.view(s.v, act_, {b, t, hkv, hd}), k_.view(s.att, act_, {b, t, hq, hd}),
                        k_.view(gr.datt, act_, {b, t, hq, hd}),
                        k_.view(s.lse, DType::kF32, {b, hq, t}), dqv, dkv,
                        k_.view(gr.dv, act_, {b, t, hkv, hd}), cfg_.arch.layer_window(l));
  k_.rope_backward(dqv, dqv, rows.position, rope_);
  k_.rope_backward(dkv, dkv, rows.position, rope_);
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
  // x' = x2 + act(h2 Wg^T, h2 Wu^T) Wd^T.
  const void* g_out = dres_compute(n, gr);
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
  k_.embedding_backward(k_.view(const_cast<int32_t*>(tokens), DType::kI32, {n}),
                        k_.view(g.dres, DType::kF32, {n, cfg_.dim}), params_.grad(params_.embed()),
                        cfg_.arch.embedding_scale(cfg_.dim));
}

}  // namespace hyperion
