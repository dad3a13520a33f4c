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
  lora_slots.clear();
}

void PagedKvSource::attend(const Decoder& dec, int l, const PassRows& pass, DecoderActs& s) {
  const DecoderConfig& c = dec.config();
  const DType act = dec.act();
  const size_t a = dtype_size(act);
  const int64_t hq = c.n_heads, hkv = c.n_kv_heads, hd = c.head_dim, qd = c.q_dim();
  const PagedKvCache& cache = (*caches)[static_cast<size_t>(l)];
  KernelBackend& kern = dec.kernels();
  const int64_t nd = batch->decode_rows;
  const AttentionParams ap = dec.attention_params(l);
  PagedAttentionParams layer_params = params;
  layer_params.window = ap.window;
  layer_params.scale = ap.scale;
  layer_params.softcap = ap.softcap;
  if (tables != nullptr) {
    // Every row of the padded step: padding rows write nothing and get zeros (finite
    // inputs for the next matmuls); prefill rows get zeros here and their attention below.
    const int64_t n = tables->n;
    kern.paged_kv_write(cache, kern.view(s.k, act, {n, hkv, hd}),
                        kern.view(s.v, act, {n, hkv, hd}), *tables);
    kern.paged_attention(cache, kern.view(s.q, act, {n, hq, hd}), *tables,
                         kern.view(s.att, act, {n, hq, hd}), layer_params);
  } else {
    kern.paged_kv_write(cache, kern.view(s.k, act, {rows, hkv, hd}),
                        kern.view(s.v, act, {rows, hkv, hd}), batch->slots.data());
    if (nd > 0)
      kern.paged_attention(cache, kern.view(s.q, act, {nd, hq, hd}), batch->attn.data(),
                           kern.view(s.att, act, {nd, hq, hd}), layer_params);
  }
  auto* q = static_cast<unsigned char*>(s.q);
  auto* att = static_cast<unsigned char*>(s.att);
  for (const auto& [r0, cnt] : batch->segments) {
    const PagedAttentionRow& last = batch->attn[static_cast<size_t>(r0 + cnt - 1)];
    // A windowed layer reads from the page holding the chunk's first query's oldest key:
    // the keys before it are masked anyway (and their pages may be released). The query
    // offset tk - cnt shifts with the keys, so the window is the same.
    const int64_t pt = cache.page_tokens;
    const int64_t k0 =
        ap.window > 0 ? std::max<int64_t>(0, last.length - cnt - ap.window + 1) / pt * pt : 0;
    const int64_t tk = last.length - k0;
    kern.paged_kv_read(cache, last.pages + k0 / pt, tk, kern.view(kctx, act, {tk, hkv, hd}),
                       kern.view(vctx, act, {tk, hkv, hd}));
    kern.attention_forward(kern.view(q + static_cast<size_t>(r0 * qd) * a, act, {1, cnt, hq, hd}),
                           kern.view(kctx, act, {1, tk, hkv, hd}),
                           kern.view(vctx, act, {1, tk, hkv, hd}),
                           kern.view(att + static_cast<size_t>(r0 * qd) * a, act, {1, cnt, hq, hd}),
                           kern.view(lse, DType::kF32, {1, hq, cnt}), ap);
  }
}

ModelRunner::ModelRunner(const ParamStore& params, const RunnerOptions& options)
    : cfg_(params.config()),
      opt_(options),
      act_(act_dtype_for(options.weights)),
      weights_(params, options.weights),
      decoder_(params, weights_, options.max_positions),
      kern_(decoder_.kernels()) {
  HYP_CHECK(opt_.num_pages > 0 && opt_.page_tokens > 0,
            "serve: kv_pages ({}) and kv_page_tokens ({}) must be > 0", opt_.num_pages,
            opt_.page_tokens);
  HYP_CHECK(opt_.max_positions > 0, "serve: max_seq_len must be > 0");
  HYP_CHECK(opt_.kv_dtype == DType::kF32 || opt_.kv_dtype == DType::kBF16 ||
                opt_.kv_dtype == DType::kI8 || opt_.kv_dtype == DType::kE4M3,
            "serve: kv_dtype must be float32, bfloat16, int8 or fp8_e4m3");
  HYP_CHECK(!opt_.padded_attention || cfg_.arch.sliding_window == 0,
            "serve: attention=padded has no sliding window, which this model ({} positions) "
            "uses; use attention=ragged",
            cfg_.arch.sliding_window);
  const bool host = kern_.device() == Device::kHost;
  const int64_t hkv = cfg_.n_kv_heads, hd = cfg_.head_dim;
  const size_t elems = static_cast<size_t>(opt_.num_pages * opt_.page_tokens * hkv * hd);
  const bool scaled = opt_.kv_dtype == DType::kI8 || opt_.kv_dtype == DType::kE4M3;
  const size_t rows = static_cast<size_t>(opt_.num_pages * opt_.page_tokens * hkv);
  // Host memory: the pool was checked against the machine's memory, not against what is
  // free now: backing more than that would swap or meet the OOM killer at start-up, so
  // then the pages are left to first use (and the steps that first write them stall).
  const int64_t available = host ? available_memory_bytes() : -1;
  const bool commit = host && (available < 0 || kv_cache_bytes() <= available / 10 * 9);
  if (host && !commit)
    log_warn(
        "serve: the KV cache ({}) is more than 90% of the memory available now ({}); its "
        "pages are backed when first written, which stalls those decode steps",
        format_bytes(kv_cache_bytes()), format_bytes(available));
  const auto commit_start = std::chrono::steady_clock::now();
  const size_t layer_bytes = elems * dtype_size(opt_.kv_dtype);  // one layer's K (or V)
  Allocator& alloc = kern_.allocator();
  for (int l = 0; l < cfg_.n_layers; ++l) {
    k_pages_.emplace_back(alloc, layer_bytes);
    v_pages_.emplace_back(alloc, layer_bytes);
    if (scaled) {
      k_scales_.emplace_back(alloc, rows * sizeof(float));
      v_scales_.emplace_back(alloc, rows * sizeof(float));
    }
  }
  for (auto* pool : {&k_pages_, &v_pages_, &k_scales_, &v_scales_})
    for (DeviceBuffer& buf : *pool) {
      if (commit)
        commit_pages(buf.data(), buf.bytes());
      else if (!host)  // a device pool starts zeroed, as committed host pages do
        kern_.zero(buf.data(), buf.bytes());
    }
  kern_.synchronize();
  kv_commit_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - commit_start).count();
  for (int l = 0; l < cfg_.n_layers; ++l) {
    PagedKvCache c;
    c.k = k_pages_[static_cast<size_t>(l)].data();
    c.v = v_pages_[static_cast<size_t>(l)].data();
    c.k_scale = scaled ? k_scales_[static_cast<size_t>(l)].as<float>() : nullptr;
    c.v_scale = scaled ? v_scales_[static_cast<size_t>(l)].as<float>() : nullptr;
    c.dtype = opt_.kv_dtype;
    c.num_pages = opt_.num_pages;
    c.page_tokens = opt_.page_tokens;
    c.n_kv_heads = hkv;
    c.head_dim = hd;
    caches_.push_back(c);
  }
  pages_per_row_ = (opt_.max_positions + opt_.page_tokens - 1) / opt_.page_tokens;
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const int64_t w = cfg_.arch.layer_window(l);
    if (w <= 0) {
      table_window_ = 0;
      break;
    }
    table_window_ = std::max(table_window_, w);
  }
  const size_t ctx = static_cast<size_t>(opt_.max_positions * cfg_.kv_dim()) * dtype_size(act_);
  kctx_ = DeviceBuffer(alloc, ctx);
  vctx_ = DeviceBuffer(alloc, ctx);
}

namespace {

// Byte offsets of the step buffer's arrays for n padded rows (each 64-byte aligned).
struct StepLayout {
  size_t tokens = 0, positions = 0, logit_ids = 0, slots = 0, page_start = 0, lengths = 0,
         pages = 0, bytes = 0;
  StepLayout(int64_t n, int64_t pages_per_row) {
    size_t at = 0;
    auto take = [&at](size_t size) {
      const size_t here = at;
      at = (at + size + 63) & ~size_t{63};
      return here;
    };
    const auto rows = static_cast<size_t>(n);
    tokens = take(rows * 4);
    positions = take(rows * 4);
    logit_ids = take(rows * 4);
    slots = take(rows * 8);
    page_start = take(rows * 8);
    lengths = take(rows * 8);
    pages = take(rows * static_cast<size_t>(pages_per_row) * 4);
    bytes = at;
  }
};

}  // namespace

int64_t ModelRunner::kv_bytes_per_token() const {
  return cfg_.n_layers * paged_kv_bytes_per_token(opt_.kv_dtype, cfg_.n_kv_heads, cfg_.head_dim);
}

int64_t ModelRunner::kv_bytes_read(int64_t context) const {
  const int64_t per_layer =
      paged_kv_bytes_per_token(opt_.kv_dtype, cfg_.n_kv_heads, cfg_.head_dim);
  int64_t bytes = 0;
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const int64_t w = cfg_.arch.layer_window(l);
    bytes += per_layer * (w > 0 ? std::min(context, w) : context);
  }
  return bytes;
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
  const size_t vocab = static_cast<size_t>(cfg_.vocab_size);
  Allocator& alloc = kern_.allocator();
  // Released first: on a device the old and new sets together may not fit.
  for (DeviceBuffer* b : {&x_, &rstd_, &xl_, &logits_, &lse_, &h_, &q_, &k_, &v_, &att_, &g_, &u_,
                          &step_, &greedy_})
    *b = DeviceBuffer();
  x_ = DeviceBuffer(alloc, rows * d * 4);
  rstd_ = DeviceBuffer(alloc, rows * 4);
  xl_ = DeviceBuffer(alloc, rows * d * 4);
  logits_ = DeviceBuffer(alloc, rows * vocab * 4);
  lse_ = DeviceBuffer(alloc, rows * static_cast<size_t>(cfg_.n_heads) * 4);
  h_ = DeviceBuffer(alloc, rows * d * a);
  q_ = DeviceBuffer(alloc, rows * q * a);
  k_ = DeviceBuffer(alloc, rows * kv * a);
  v_ = DeviceBuffer(alloc, rows * kv * a);
  att_ = DeviceBuffer(alloc, rows * q * a);
  g_ = DeviceBuffer(alloc, rows * f * a);
  u_ = DeviceBuffer(alloc, rows * f * a);
  const StepLayout layout(n, pages_per_row_);
  staging_ = AlignedBuffer<unsigned char>(layout.bytes);
  if (kern_.device() != Device::kHost) {
    step_ = DeviceBuffer(alloc, layout.bytes);
    greedy_ = DeviceBuffer(alloc, rows * 4);
    logits_host_ = AlignedBuffer<float>(rows * vocab);
  }
  // Expert groups padded to 32 rows, as in training: a few GEMM shapes, compiled once.
  if (cfg_.is_moe())
    moe_.reserve(moe_shape(cfg_, MoeOptions{}, 1, n, kMoeTrainRowAlign), act_, alloc);
  capacity_ = n;
}

const float* ModelRunner::forward(const StepBatch& batch) {
  const float* logits = run(batch);
  const int64_t m = static_cast<int64_t>(batch.logit_rows.size());
  if (kern_.device() == Device::kHost) return logits;
  if (m > 0)
    kern_.download(logits, logits_host_.data(),
                   static_cast<size_t>(m * cfg_.vocab_size) * sizeof(float));
  return logits_host_.data();
}

const int32_t* ModelRunner::forward_greedy(const StepBatch& batch) {
  const float* logits = run(batch);
  const int64_t m = static_cast<int64_t>(batch.logit_rows.size());
  greedy_host_.resize(static_cast<size_t>(m));
  if (m == 0) return greedy_host_.data();
  auto* ids = kern_.device() == Device::kHost ? greedy_host_.data() : greedy_.as<int32_t>();
  kern_.argmax_rows(kern_.view(const_cast<float*>(logits), DType::kF32, {m, cfg_.vocab_size}),
                    kern_.view(ids, DType::kI32, {m}));
  if (kern_.device() != Device::kHost)
    kern_.download(ids, greedy_host_.data(), static_cast<size_t>(m) * sizeof(int32_t));
  return greedy_host_.data();
}

const float* ModelRunner::run(const StepBatch& batch) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t rows = batch.size();
  HYP_CHECK(rows > 0, "serve: empty step batch");
  HYP_CHECK(static_cast<int64_t>(batch.positions.size()) == rows &&
                static_cast<int64_t>(batch.slots.size()) == rows &&
                static_cast<int64_t>(batch.attn.size()) == rows,
            "serve: step batch arrays disagree on the row count {}", rows);
  const int64_t nd = batch.decode_rows;
  HYP_CHECK(nd >= 0 && nd <= rows, "serve: {} decode rows in a batch of {}", nd, rows);
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
  const int64_t m = static_cast<int64_t>(batch.logit_rows.size());
  for (int32_t r : batch.logit_rows)
    HYP_CHECK(r >= 0 && r < rows, "serve: logit row {} outside the batch of {}", r, rows);
  // The matmuls run on a bucketed row count (padding rows hold token 0 at position 0):
  // oneDNN compiles a kernel per shape (and a GPU runs a tuned kernel per shape), and a
  // server sees every batch size from 1 to slots + prefill_chunk; buckets keep that to a
  // few shapes compiled once. The LM head runs on bucketed logit rows too.
  const int64_t n = padded_rows(rows), mp = m > 0 ? padded_rows(m) : 0;
  ensure_capacity(n);
  pack_step(batch, n, mp);
  prepare_lora_rows(batch, n);
  if (lora_step_ || !run_recorded(batch, n, mp)) queue_step(batch, n, mp);
  decoder_.set_lora_rows(nullptr, nullptr);
  // The steps' queueing time (on the host backend, the work itself; the greedy pick that
  // may follow is one more launch, not counted).
  queue_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return logits_.as<float>();
}

void ModelRunner::pack_step(const StepBatch& batch, int64_t n, int64_t mp) {
  const int64_t rows = batch.size(), m = static_cast<int64_t>(batch.logit_rows.size());
  const int64_t nd = batch.decode_rows, pt = opt_.page_tokens;
  const StepLayout L(n, pages_per_row_);
  unsigned char* base = staging_.data();
  auto* tokens = reinterpret_cast<int32_t*>(base + L.tokens);
  auto* positions = reinterpret_cast<int32_t*>(base + L.positions);
  auto* logit_ids = reinterpret_cast<int32_t*>(base + L.logit_ids);
  auto* slots = reinterpret_cast<int64_t*>(base + L.slots);
  auto* page_start = reinterpret_cast<int64_t*>(base + L.page_start);
  auto* lengths = reinterpret_cast<int64_t*>(base + L.lengths);
  auto* pages = reinterpret_cast<int32_t*>(base + L.pages);
  const int64_t capacity = opt_.num_pages * pt;
  int64_t used = 0;  // page-table entries
  for (int64_t r = 0; r < n; ++r) {
    const bool real = r < rows;
    tokens[r] = real ? batch.tokens[static_cast<size_t>(r)] : 0;
    positions[r] = real ? batch.positions[static_cast<size_t>(r)] : 0;
    slots[r] = real ? batch.slots[static_cast<size_t>(r)] : -1;
    HYP_CHECK(slots[r] < capacity && (slots[r] >= 0 || !real),
              "paged_kv_write: slot {} of row {} is outside the cache's [0, {})", slots[r], r,
              capacity);
    page_start[r] = used;
    lengths[r] = 0;
    if (r >= nd || opt_.padded_attention) continue;  // prefill and padding rows: no decode read
    const PagedAttentionRow& row = batch.attn[static_cast<size_t>(r)];
    HYP_CHECK(row.length >= 1 && row.length <= opt_.max_positions,
              "paged_attention: row {} has length {} (must be in [1, {}])", r, row.length,
              opt_.max_positions);
    lengths[r] = row.length;
    const int64_t n_pages = (row.length + pt - 1) / pt;
    // Entries before the widest window's first page are read by no layer (and may name
    // released pages): they go up as 0.
    const int64_t first_page =
        table_window_ > 0 && row.length > table_window_ ? (row.length - table_window_) / pt : 0;
    for (int64_t i = 0; i < n_pages; ++i) {
      int32_t id = 0;
      if (i >= first_page) {
        id = row.pages[i];
        HYP_CHECK(id >= 0 && id < opt_.num_pages, "paged_attention: row {} reads page {}, outside [0, {})",
                  r, id, opt_.num_pages);
      }
      pages[used + i] = id;
    }
    used += n_pages;
  }
  std::copy(batch.logit_rows.begin(), batch.logit_rows.end(), logit_ids);
  std::fill(logit_ids + m, logit_ids + mp, m > 0 ? batch.logit_rows[0] : 0);
  const size_t bytes = L.pages + static_cast<size_t>(used) * 4;
  const unsigned char* at = base;
  if (!step_.empty()) {  // a device reads the step from its own memory: one upload
    kern_.upload(base, step_.data(), bytes);
    at = step_.as<unsigned char>();
  }
  tokens_ = reinterpret_cast<const int32_t*>(at + L.tokens);
  positions_ = reinterpret_cast<const int32_t*>(at + L.positions);
  logit_ids_ = reinterpret_cast<const int32_t*>(at + L.logit_ids);
  tables_.slots = reinterpret_cast<const int64_t*>(at + L.slots);
  tables_.page_start = reinterpret_cast<const int64_t*>(at + L.page_start);
  tables_.lengths = reinterpret_cast<const int64_t*>(at + L.lengths);
  tables_.pages = reinterpret_cast<const int32_t*>(at + L.pages);
  tables_.n = n;
  tables_.n_pages = used;
}

void ModelRunner::queue_step(const StepBatch& batch, int64_t n, int64_t mp) {
  const int64_t rows = batch.size(), m = static_cast<int64_t>(batch.logit_rows.size());
  const int64_t nd = batch.decode_rows;
  const size_t a = dtype_size(act_);
  if (opt_.padded_attention && n > rows)  // attention leaves padding rows alone: keep them finite
    kern_.zero(att_.as<unsigned char>() + static_cast<size_t>(rows * cfg_.q_dim()) * a,
               static_cast<size_t>((n - rows) * cfg_.q_dim()) * a);
  const int64_t d = cfg_.dim;
  float* x = x_.as<float>();
  decoder_.embed(tokens_, n, x);
  kv_.params = PagedAttentionParams{};
  if (opt_.padded_attention) {
    kv_.params.mode = PagedAttentionMode::kPadded;
    for (int64_t i = 0; i < nd; ++i)
      kv_.params.padded_length =
          std::max(kv_.params.padded_length, batch.attn[static_cast<size_t>(i)].length);
  }
  kv_.batch = &batch;
  kv_.tables = opt_.padded_attention ? nullptr : &tables_;
  kv_.caches = &caches_;
  kv_.rows = rows;
  kv_.kctx = kctx_.as<unsigned char>();
  kv_.vctx = vctx_.as<unsigned char>();
  kv_.lse = lse_.as<float>();
  DecoderActs s = in_place_acts(x, rstd_.as<float>(), h_.data(), q_.data(), k_.data(), v_.data(),
                                att_.data(), lse_.as<float>(), g_.data(), u_.data());
  if (cfg_.is_moe()) s.moe = moe_.acts();
  PassRows pass;
  pass.t = n;
  pass.positions = positions_;
  const MoeShape ms =
      cfg_.is_moe() ? moe_shape(cfg_, MoeOptions{}, 1, n, kMoeTrainRowAlign) : MoeShape{};
  for (int l = 0; l < cfg_.n_layers; ++l) {
    decoder_.attention_block(l, pass, s, kv_);
    decoder_.mlp_block(l, n, s, ms, MoeOptions{}, x);
  }
  auto* logits = logits_.as<float>();
  if (m > 0) {
    // Final norm and LM head only for the rows whose logits are wanted, gathered as
    // embedding rows of x (padding rows repeat the first).
    kern_.embedding_forward(kern_.view(x, DType::kF32, {n, d}),
                            kern_.view(const_cast<int32_t*>(logit_ids_), DType::kI32, {mp}),
                            kern_.view(xl_.data(), DType::kF32, {mp, d}), 1.0f);
    decoder_.head(xl_.as<float>(), mp, h_.data(), rstd_.as<float>(), logits, DType::kF32);
    decoder_.cap_logits(logits, mp, DType::kF32);
  }
}

void ModelRunner::prepare_lora_rows(const StepBatch& batch, int64_t n) {
  lora_step_ = false;
  if (bank_ == nullptr || batch.lora_slots.empty()) return;
  HYP_CHECK(static_cast<int64_t>(batch.lora_slots.size()) == batch.size(),
            "serve: {} LoRA slots for a batch of {} rows", batch.lora_slots.size(), batch.size());
  lora_slot_scratch_.assign(batch.lora_slots.begin(), batch.lora_slots.end());
  // Padding rows take the last row's adapter (their output is never read): rows the engine
  // sorted by adapter then stay sorted, and the step needs no gathers.
  lora_slot_scratch_.resize(static_cast<size_t>(n), batch.lora_slots.back());
  if (!lora_rows_from_slots(lora_slot_scratch_, bank_->slots(), lora_perm_, lora_inverse_, lora_rows_)) return;
  lora_step_ = true;
  if (kern_.device() == Device::kHost) {
    lora_rows_.perm = lora_perm_.data();
    lora_rows_.inverse = lora_inverse_.data();
  } else {
    const size_t bytes = 2 * static_cast<size_t>(n) * sizeof(int32_t);
    if (lora_index_.bytes() < bytes) lora_index_ = DeviceBuffer(kern_.allocator(), bytes);
    std::vector<int32_t> both(lora_perm_);
    both.insert(both.end(), lora_inverse_.begin(), lora_inverse_.end());
    kern_.upload(both.data(), lora_index_.data(), bytes);
    lora_rows_.perm = lora_index_.as<int32_t>();
    lora_rows_.inverse = lora_index_.as<int32_t>() + n;
  }
  decoder_.set_lora_rows(bank_, &lora_rows_);
}

bool ModelRunner::run_recorded(const StepBatch& batch, int64_t n, int64_t mp) {
  // Decode-only steps of a dense model, every row sampling: their work depends on the
  // padded row count alone. (An MoE step plans its expert groups on the host; a prefill
  // chunk's shapes follow its length.)
  if (!opt_.graphs || !kern_.can_record() || opt_.padded_attention || cfg_.is_moe() ||
      !batch.segments.empty() || static_cast<int64_t>(batch.logit_rows.size()) != batch.size())
    return false;
  Recorded& r = recorded_[n];
  if (r.rec != nullptr) {
    if (kern_.replay(*r.rec)) {
      ++replayed_steps_;
      return true;
    }
    r.rec.reset();  // device memory was freed since it was made: record again
  }
  // A size's first step runs as usual: it sizes every buffer and plan a recording points at.
  if (r.plain_runs++ == 0 || r.failures >= 2) return false;
  kern_.record_begin();
  try {
    queue_step(batch, n, mp);
  } catch (const Error& e) {
    kern_.record_abort();
    ++r.failures;
    log_warn("serve: the decode step of {} rows could not be recorded ({}); it runs op by op", n,
             e.what());
    return false;
  }
  r.rec = kern_.record_end();
  ++recordings_;
  if (r.rec == nullptr || !kern_.replay(*r.rec)) {
    r.rec.reset();
    if (++r.failures >= 2)
      log_warn("serve: the decode step of {} rows cannot be recorded; it runs op by op", n);
    return false;
  }
  ++replayed_steps_;
  return true;
}

}  // namespace hyperion::serve
