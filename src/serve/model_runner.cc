#include "serve/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "base/aligned.h"
#include "base/error.h"
#include "base/log.h"
#include "base/system_memory.h"
#include "kernels/attention.h"

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

void PagedKvSource::attend(const Decoder& dec, int l, const PassRows& pass, DecoderActs& s) {
  const LlamaConfig& c = dec.config();
  const DType act = dec.act();
  const size_t a = dtype_size(act);
  const int64_t hq = c.n_heads, hkv = c.n_kv_heads, hd = c.head_dim, qd = c.q_dim();
  const PagedKvCache& cache = (*caches)[static_cast<size_t>(l)];
  KernelBackend& kern = dec.kernels();
  kern.paged_kv_write(cache, kern.view(s.k, act, {rows, hkv, hd}),
                      kern.view(s.v, act, {rows, hkv, hd}), batch->slots.data());
  const int64_t nd = batch->decode_rows;
  if (nd > 0)
    kern.paged_attention(cache, kern.view(s.q, act, {nd, hq, hd}), batch->attn.data(),
                         kern.view(s.att, act, {nd, hq, hd}), params);
  auto* q = static_cast<unsigned char*>(s.q);
  auto* att = static_cast<unsigned char*>(s.att);
  for (const auto& [r0, cnt] : batch->segments) {
    const PagedAttentionRow& last = batch->attn[static_cast<size_t>(r0 + cnt - 1)];
    const int64_t tk = last.length;
    kern.paged_kv_read(cache, last.pages, tk, kern.view(kctx, act, {tk, hkv, hd}),
                       kern.view(vctx, act, {tk, hkv, hd}));
    kern.attention_forward(kern.view(q + static_cast<size_t>(r0 * qd) * a, act, {1, cnt, hq, hd}),
                           kern.view(kctx, act, {1, tk, hkv, hd}),
                           kern.view(vctx, act, {1, tk, hkv, hd}),
                           kern.view(att + static_cast<size_t>(r0 * qd) * a, act, {1, cnt, hq, hd}),
                           kern.view(lse, DType::kF32, {1, hq, cnt}));
  }
}

ModelRunner::ModelRunner(const ParamStore& params, const RunnerOptions& options)
    : cfg_(params.config()),
      opt_(options),
      act_(act_dtype_for(options.weights)),
      weights_(params, options.weights),
      decoder_(params, weights_, options.max_positions) {
  HYP_CHECK(opt_.num_pages > 0 && opt_.page_tokens > 0,
            "serve: kv_pages ({}) and kv_page_tokens ({}) must be > 0", opt_.num_pages,
            opt_.page_tokens);
  HYP_CHECK(opt_.max_positions > 0, "serve: max_seq_len must be > 0");
  HYP_CHECK(opt_.kv_dtype == DType::kF32 || opt_.kv_dtype == DType::kBF16 ||
                opt_.kv_dtype == DType::kI8 || opt_.kv_dtype == DType::kE4M3,
            "serve: kv_dtype must be float32, bfloat16, int8 or fp8_e4m3");
  const int64_t hkv = cfg_.n_kv_heads, hd = cfg_.head_dim;
  const size_t elems = static_cast<size_t>(opt_.num_pages * opt_.page_tokens * hkv * hd);
  const bool scaled = opt_.kv_dtype == DType::kI8 || opt_.kv_dtype == DType::kE4M3;
  const size_t rows = static_cast<size_t>(opt_.num_pages * opt_.page_tokens * hkv);
  // The pool was checked against the machine's memory, not against what is free now:
  // backing more than that would swap or meet the OOM killer at start-up, so then the
  // pages are left to first use (and the steps that first write them stall).
  const int64_t available = available_memory_bytes();
  const bool commit = available < 0 || kv_cache_bytes() <= available / 10 * 9;
  if (!commit)
    log_warn(
        "serve: the KV cache ({}) is more than 90% of the memory available now ({}); its "
        "pages are backed when first written, which stalls those decode steps",
        format_bytes(kv_cache_bytes()), format_bytes(available));
  const auto commit_start = std::chrono::steady_clock::now();
  const size_t layer_bytes = elems * dtype_size(opt_.kv_dtype);  // one layer's K (or V)
  for (int l = 0; l < cfg_.n_layers; ++l) {
    k_pages_.emplace_back(layer_bytes);
    v_pages_.emplace_back(layer_bytes);
    if (scaled) {
      k_scales_.emplace_back(rows);
      v_scales_.emplace_back(rows);
    }
  }
  if (commit) {
    for (auto* pool : {&k_pages_, &v_pages_})
      for (auto& buf : *pool) commit_pages(buf.data(), layer_bytes);
    for (auto* pool : {&k_scales_, &v_scales_})
      for (auto& buf : *pool) commit_pages(buf.data(), rows * sizeof(float));
  }
  kv_commit_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - commit_start).count();
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
  x_ = AlignedBuffer<float>(rows * d);
  rstd_ = AlignedBuffer<float>(rows);
  xl_ = AlignedBuffer<float>(rows * d);
  logits_ = AlignedBuffer<float>(rows * static_cast<size_t>(cfg_.vocab_size));
  lse_ = AlignedBuffer<float>(rows * static_cast<size_t>(cfg_.n_heads));
  h_ = AlignedBuffer<unsigned char>(rows * d * a);
  q_ = AlignedBuffer<unsigned char>(rows * q * a);
  k_ = AlignedBuffer<unsigned char>(rows * kv * a);
  v_ = AlignedBuffer<unsigned char>(rows * kv * a);
  att_ = AlignedBuffer<unsigned char>(rows * q * a);
  g_ = AlignedBuffer<unsigned char>(rows * f * a);
  u_ = AlignedBuffer<unsigned char>(rows * f * a);
  // Expert groups padded to 32 rows, as in training: a few GEMM shapes, compiled once.
  if (cfg_.is_moe())
    moe_.reserve(moe_shape(cfg_, MoeOptions{}, 1, n, kMoeTrainRowAlign), act_,
                 decoder_.kernels().allocator());
  capacity_ = n;
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
  const int64_t d = cfg_.dim;
  decoder_.embed(tokens_.data(), n, x_.data());
  const int64_t nd = batch.decode_rows;
  HYP_CHECK(nd >= 0 && nd <= rows, "serve: {} decode rows in a batch of {}", nd, rows);
  kv_.params = PagedAttentionParams{};
  if (opt_.padded_attention) {
    kv_.params.mode = PagedAttentionMode::kPadded;
    for (int64_t i = 0; i < nd; ++i)
      kv_.params.padded_length =
          std::max(kv_.params.padded_length, batch.attn[static_cast<size_t>(i)].length);
  }
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
  kv_.batch = &batch;
  kv_.caches = &caches_;
  kv_.rows = rows;
  kv_.kctx = kctx_.data();
  kv_.vctx = vctx_.data();
  kv_.lse = lse_.data();
  DecoderActs s = in_place_acts(x_.data(), rstd_.data(), h_.data(), q_.data(), k_.data(), v_.data(),
                                att_.data(), lse_.data(), g_.data(), u_.data());
  if (cfg_.is_moe()) s.moe = moe_.acts();
  PassRows pass;
  pass.t = n;
  pass.positions = positions_.data();
  const MoeShape ms =
      cfg_.is_moe() ? moe_shape(cfg_, MoeOptions{}, 1, n, kMoeTrainRowAlign) : MoeShape{};
  for (int l = 0; l < cfg_.n_layers; ++l) {
    decoder_.attention_block(l, pass, s, kv_);
    decoder_.mlp_block(l, n, s, ms, MoeOptions{}, x_.data());
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
  decoder_.head(xl_.data(), mp, h_.data(), rstd_.data(), logits_.data(), DType::kF32);
  return logits_.data();
}

}  // namespace hyperion::serve
