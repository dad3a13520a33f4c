#include "serve/model_runner.h"

#include <cstring>

#include "base/error.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/quantize.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu.h"
#include "model/linear.h"

namespace hyperion::serve {

void StepBatch::clear() {
  decode_rows = 0;
  segments.clear();
  tokens.clear();
  positions.clear();
  slots.clear();
  attn.clear();
  logit_rows.clear();
}

namespace {

DType act_dtype_for(WeightFormat w) {
  return w == WeightFormat::kF32 ? DType::kF32 : DType::kBF16;
}

}  // namespace

ModelRunner::ModelRunner(const ParamStore& params, const RunnerOptions& options)
    : params_(params),
      cfg_(params.config()),
      opt_(options),
      act_(act_dtype_for(options.weights)),
      rope_(std::max<int64_t>(options.max_positions, 1), params.config().head_dim,
            params.config().rope_theta) {
  HYP_CHECK(opt_.num_pages > 0 && opt_.page_tokens > 0,
            "serve: kv_pages ({}) and kv_page_tokens ({}) must be > 0", opt_.num_pages,
            opt_.page_tokens);
  HYP_CHECK(opt_.max_positions > 0, "serve: max_seq_len must be > 0");
  HYP_CHECK(opt_.kv_dtype == DType::kF32 || opt_.kv_dtype == DType::kBF16 ||
                opt_.kv_dtype == DType::kI8 || opt_.kv_dtype == DType::kE4M3,
            "serve: kv_dtype must be float32, bfloat16, int8 or fp8_e4m3");
  HYP_CHECK(opt_.weights == WeightFormat::kF32 || params.has_bf16(),
            "serve: bf16 or int8 weights need the parameter store's bf16 copy");
  const int64_t hkv = cfg_.n_kv_heads, hd = cfg_.head_dim;
  const size_t elems = static_cast<size_t>(opt_.num_pages * opt_.page_tokens * hkv * hd);
  const bool scaled = opt_.kv_dtype == DType::kI8 || opt_.kv_dtype == DType::kE4M3;
  const size_t rows = static_cast<size_t>(opt_.num_pages * opt_.page_tokens * hkv);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    k_pages_.emplace_back(elems * dtype_size(opt_.kv_dtype));
    v_pages_.emplace_back(elems * dtype_size(opt_.kv_dtype));
    if (scaled) {
      k_scales_.emplace_back(rows);
      v_scales_.emplace_back(rows);
    }
  }
  for (int l = 0; l < cfg_.n_layers; ++l) {
    PagedKvCache c;
    c.k = k_pages_[static_cast<size_t>(l)].data();
    c.v = v_pages_[static_cast<size_t>(l)].data();
    c.k_scale = scaled ? k_scales_[static_cast<size_t>(l)].data() : nullptr;
    c.v_scale = scaled ? v_scales_[static_cast<size_t>(l)].data() : nullptr;
    c.dtype = opt_.kv_dtype;
    c.num_pages = opt_.num_pages;
    c.page_tokens = opt_.page_tokens;
    c.n_kv_heads = hkv;
    c.head_dim = hd;
    caches_.push_back(c);
  }

  // Weights in their serving format; int8 quantises every matrix except stacked experts.
  for (const ParamInfo& info : params.infos()) {
    if (info.kind == ParamKind::kNorm) continue;
    const bool expert = info.name.find(".experts.") != std::string::npos;
    const bool matmul = info.kind == ParamKind::kMatrix ||
                        (info.kind == ParamKind::kEmbedding && params.lm_head() == params.embed());
    if (!matmul) continue;
    if (opt_.weights == WeightFormat::kInt8 && !expert)
      weight_bytes_ += info.numel + info.shape[0] * 4;
    else
      weight_bytes_ += info.numel * static_cast<int64_t>(dtype_size(act_));
  }
  if (opt_.weights == WeightFormat::kInt8) {
    std::vector<int> mats;
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const LayerParamIndex& p = params.layer(l);
      for (int i : {p.q, p.k, p.v, p.o}) mats.push_back(i);
      if (!p.moe())
        for (int i : {p.gate, p.up, p.down}) mats.push_back(i);
    }
    mats.push_back(params.lm_head());
    for (int i : mats) {
      if (quant_.count(i)) continue;
      const TensorView w = params.param(i);
      QuantMatrix qm;
      qm.out = w.shape[0];
      qm.in = w.shape[1];
      qm.w = AlignedBuffer<int8_t>(static_cast<size_t>(qm.out * qm.in));
      qm.scale = AlignedBuffer<float>(static_cast<size_t>(qm.out));
      quantize_rows(w, TensorView(qm.w.data(), DType::kI8, {qm.out, qm.in}), qm.scale.data());
      quant_.emplace(i, std::move(qm));
    }
  }
  logits_ = AlignedBuffer<float>(static_cast<size_t>(cfg_.vocab_size));
  const size_t ctx = static_cast<size_t>(opt_.max_positions * cfg_.kv_dim()) * dtype_size(act_);
  kctx_ = AlignedBuffer<unsigned char>(ctx);
  vctx_ = AlignedBuffer<unsigned char>(ctx);
}

int64_t ModelRunner::kv_bytes_per_token() const {
  return cfg_.n_layers * paged_kv_bytes_per_token(opt_.kv_dtype, cfg_.n_kv_heads, cfg_.head_dim);
}

int64_t padded_rows(int64_t n) {
  if (n <= 4) return n;  // the GEMV path: no compiled kernels
  if (n <= 64) return (n + 15) / 16 * 16;
  return (n + 63) / 64 * 64;
}

void ModelRunner::ensure_capacity(int64_t n) {
  if (n <= capacity_) return;
  const size_t a = dtype_size(act_);
  const size_t d = static_cast<size_t>(cfg_.dim), q = static_cast<size_t>(cfg_.q_dim());
  const size_t kv = static_cast<size_t>(cfg_.kv_dim());
  const size_t f = static_cast<size_t>(cfg_.ffn_dim), rows = static_cast<size_t>(n);
  const size_t widest = std::max(std::max(d, q), f);
  x_ = AlignedBuffer<float>(rows * d);
  rstd_ = AlignedBuffer<float>(rows);
  xl_ = AlignedBuffer<float>(rows * d);
  logits_ = AlignedBuffer<float>(rows * static_cast<size_t>(cfg_.vocab_size));
  qscale_ = AlignedBuffer<float>(rows);
  lse_ = AlignedBuffer<float>(rows * static_cast<size_t>(cfg_.n_heads));
  qx_ = AlignedBuffer<int8_t>(rows * widest);
  h_ = AlignedBuffer<unsigned char>(rows * d * a);
  q_ = AlignedBuffer<unsigned char>(rows * q * a);
  k_ = AlignedBuffer<unsigned char>(rows * kv * a);
  v_ = AlignedBuffer<unsigned char>(rows * kv * a);
  att_ = AlignedBuffer<unsigned char>(rows * q * a);
  g_ = AlignedBuffer<unsigned char>(rows * f * a);
  u_ = AlignedBuffer<unsigned char>(rows * f * a);
  // Expert groups padded to 32 rows, as in training: a few GEMM shapes, compiled once.
  if (cfg_.is_moe()) moe_.reserve(moe_shape(cfg_, MoeOptions{}, 1, n, kMoeTrainRowAlign), act_);
  capacity_ = n;
}

void ModelRunner::linear(int index, const void* x, void* y, DType yd, int64_t n, bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  auto it = quant_.find(index);
  if (it == quant_.end()) {
    linear::forward(x, act_, params_.compute_weight(index), y, yd, n, beta);
    return;
  }
  const QuantMatrix& qm = it->second;
  quantize_rows(TensorView(const_cast<void*>(x), act_, {n, qm.in}),
                TensorView(qx_.data(), DType::kI8, {n, qm.in}), qscale_.data());
  GemmArgs g;
  g.trans_a = Trans::kN;
  g.trans_b = Trans::kT;
  g.m = n;
  g.n = qm.out;
  g.k = qm.in;
  g.a = qx_.data();
  g.a_dtype = DType::kI8;
  g.lda = qm.in;
  g.b = qm.w.data();
  g.b_dtype = DType::kI8;
  g.ldb = qm.in;
  g.c = y;
  g.c_dtype = yd;
  g.ldc = qm.out;
  g.beta = beta;
  g.a_scale = qscale_.data();
  g.b_scale = qm.scale.data();
  gemm(g);
}

const float* ModelRunner::forward(const StepBatch& batch) {
  const int64_t rows = batch.size();
  HYP_CHECK(rows > 0, "serve: empty step batch");
  HYP_CHECK(static_cast<int64_t>(batch.positions.size()) == rows &&
                static_cast<int64_t>(batch.slots.size()) == rows &&
                static_cast<int64_t>(batch.attn.size()) == rows,
            "serve: step batch arrays disagree on the row count {}", rows);
  // The matmuls run on a bucketed row count (padding rows hold token 0 at position 0):
  // oneDNN compiles a kernel per shape, and a server sees every batch size from 1 to
  // slots + prefill_chunk; buckets keep that to a few shapes compiled once.
  const int64_t n = padded_rows(rows);
  ensure_capacity(n);
  tokens_.assign(batch.tokens.begin(), batch.tokens.end());
  tokens_.resize(static_cast<size_t>(n), 0);
  positions_.assign(batch.positions.begin(), batch.positions.end());
  positions_.resize(static_cast<size_t>(n), 0);
  if (n > rows)  // attention leaves padding rows alone: keep them finite
    std::memset(att_.data() + static_cast<size_t>(rows * cfg_.q_dim()) * dtype_size(act_), 0,
                static_cast<size_t>((n - rows) * cfg_.q_dim()) * dtype_size(act_));
  const int64_t d = cfg_.dim, f = cfg_.ffn_dim, hq = cfg_.n_heads, hkv = cfg_.n_kv_heads;
  const int64_t hd = cfg_.head_dim;
  const float eps = static_cast<float>(cfg_.norm_eps);
  const ParamStore& ps = params_;
  embedding_forward(ps.param(ps.embed()), TensorView(tokens_.data(), DType::kI32, {n}),
                    TensorView(x_.data(), DType::kF32, {n, d}));
  const TensorView xv(x_.data(), DType::kF32, {n, d});
  const TensorView rstd(rstd_.data(), DType::kF32, {n});
  const TensorView pos(positions_.data(), DType::kI32, {n});
  const int64_t nd = batch.decode_rows;
  HYP_CHECK(nd >= 0 && nd <= rows, "serve: {} decode rows in a batch of {}", nd, rows);
  PagedAttentionParams ap;
  if (opt_.padded_attention) {
    ap.mode = PagedAttentionMode::kPadded;
    for (int64_t i = 0; i < nd; ++i)
      ap.padded_length = std::max(ap.padded_length, batch.attn[static_cast<size_t>(i)].length);
  }
  const size_t a = dtype_size(act_);
  const int64_t qd = cfg_.q_dim();
  int64_t covered = nd;
  for (const auto& [r0, c] : batch.segments) {
    HYP_CHECK(r0 == covered && c >= 1, "serve: prefill segment ({}, {}) out of order", r0, c);
    const PagedAttentionRow& last = batch.attn[static_cast<size_t>(r0 + c - 1)];
    HYP_CHECK(batch.positions[static_cast<size_t>(r0)] == last.length - c &&
                  last.length <= opt_.max_positions,
              "serve: prefill segment at row {} is not consecutive positions ending at {}", r0,
              last.length);
    covered += c;
  }
  HYP_CHECK(covered == rows, "serve: {} decode rows and segments cover {} of {} rows", nd, covered,
            rows);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const LayerParamIndex& p = ps.layer(l);
    rmsnorm_forward(xv, ps.param(p.input_norm), eps, TensorView(h_.data(), act_, {n, d}), rstd);
    linear(p.q, h_.data(), q_.data(), act_, n, false);
    linear(p.k, h_.data(), k_.data(), act_, n, false);
    linear(p.v, h_.data(), v_.data(), act_, n, false);
    const TensorView qv(q_.data(), act_, {1, n, hq, hd}), kv(k_.data(), act_, {1, n, hkv, hd});
    rope_forward(qv, qv, pos, rope_);
    rope_forward(kv, kv, pos, rope_);
    const PagedKvCache& cache = caches_[static_cast<size_t>(l)];
    paged_kv_write(cache, TensorView(k_.data(), act_, {rows, hkv, hd}),
                   TensorView(v_.data(), act_, {rows, hkv, hd}), batch.slots.data());
    if (nd > 0)
      paged_attention(cache, TensorView(q_.data(), act_, {nd, hq, hd}), batch.attn.data(),
                      TensorView(att_.data(), act_, {nd, hq, hd}), ap);
    for (const auto& [r0, c] : batch.segments) {
      const PagedAttentionRow& last = batch.attn[static_cast<size_t>(r0 + c - 1)];
      const int64_t tk = last.length;
      paged_kv_read(cache, last.pages, tk, TensorView(kctx_.data(), act_, {tk, hkv, hd}),
                    TensorView(vctx_.data(), act_, {tk, hkv, hd}));
      attention_forward(
          TensorView(q_.data() + static_cast<size_t>(r0 * qd) * a, act_, {1, c, hq, hd}),
          TensorView(kctx_.data(), act_, {1, tk, hkv, hd}),
          TensorView(vctx_.data(), act_, {1, tk, hkv, hd}),
          TensorView(att_.data() + static_cast<size_t>(r0 * qd) * a, act_, {1, c, hq, hd}),
          TensorView(lse_.data(), DType::kF32, {1, hq, c}));
    }
    linear(p.o, att_.data(), x_.data(), DType::kF32, n, true);
    rmsnorm_forward(xv, ps.param(p.post_norm), eps, TensorView(h_.data(), act_, {n, d}), rstd);
    if (p.moe()) {
      MoeActs m = moe_.acts();
      moe::forward(ps, p, moe_shape(cfg_, MoeOptions{}, 1, n, kMoeTrainRowAlign), MoeOptions{},
                   h_.data(), act_, m, x_.data());
      continue;
    }
    linear(p.gate, h_.data(), g_.data(), act_, n, false);
    linear(p.up, h_.data(), u_.data(), act_, n, false);
    swiglu_forward(TensorView(g_.data(), act_, {n, f}), TensorView(u_.data(), act_, {n, f}),
                   TensorView(g_.data(), act_, {n, f}));
    linear(p.down, g_.data(), x_.data(), DType::kF32, n, true);
  }
  // Final norm and lm_head only for the rows whose logits are wanted.
  const int64_t m = static_cast<int64_t>(batch.logit_rows.size());
  if (m == 0) return logits_.data();
  for (int64_t i = 0; i < m; ++i) {
    const int32_t r = batch.logit_rows[static_cast<size_t>(i)];
    HYP_CHECK(r >= 0 && r < rows, "serve: logit row {} outside the batch of {}", r, rows);
    std::memcpy(xl_.data() + i * d, x_.data() + r * d, static_cast<size_t>(d) * sizeof(float));
  }
  const int64_t mp = padded_rows(m);  // lm_head on bucketed rows too (zeros beyond m)
  if (mp > m) std::memset(xl_.data() + m * d, 0, static_cast<size_t>((mp - m) * d) * sizeof(float));
  rmsnorm_forward(TensorView(xl_.data(), DType::kF32, {mp, d}), ps.param(ps.final_norm()), eps,
                  TensorView(h_.data(), act_, {mp, d}),
                  TensorView(rstd_.data(), DType::kF32, {mp}));
  linear(ps.lm_head(), h_.data(), logits_.data(), DType::kF32, mp, false);
  return logits_.data();
}

}  // namespace hyperion::serve
