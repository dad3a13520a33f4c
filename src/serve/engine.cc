#include "serve/engine.h"

#include <algorithm>

#include "base/log.h"
#include "base/system_memory.h"
#include "base/thread_governor.h"
#include "base/timer.h"
#include "kernels/hardware.h"

namespace hyperion::serve {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

struct Engine::Sequence {
  Sequence(int64_t id_, GenerationRequest r, TokenCallback cb, const text::Tokenizer* tok)
      : id(id_),
        req(std::move(r)),
        callback(std::move(cb)),
        sampler(req.sampling),
        text(tok, req.prompt, req.stop, req.keep_special_text) {
    if (req.grammar) matcher = std::make_unique<text::GrammarMatcher>(req.grammar);
  }
  int64_t id;
  GenerationRequest req;
  TokenCallback callback;
  Sampler sampler;
  TextStream text;
  SequencePages pages;  // ragged mode
  int slot = -1;
  int64_t order = 0;     // admission order
  int64_t computed = 0;  // positions whose KV is in the cache
  int64_t cached = 0;    // prompt tokens reused from the prefix cache
  int64_t reserved = 0;  // pages reserved but not yet allocated
  std::vector<int32_t> output;
  std::unique_ptr<text::GrammarMatcher> matcher;  // structured output (null: none)
  std::vector<uint64_t> mask;  // this step's allowed tokens
  std::vector<float> masked;   // this step's logits with the mask applied
  bool allowed = true;         // the mask allows some token
  int lora_slot() const { return req.adapter ? req.adapter->slot : 0; }  // 0: the base
  bool prefilling() const { return computed < static_cast<int64_t>(req.prompt.size()); }
  int64_t prompt_len() const { return static_cast<int64_t>(req.prompt.size()); }
};

Engine::Engine(const ParamStore& params, const text::Tokenizer* tokenizer, EngineConfig config)
    : cfg_(std::move(config)),
      params_(params),
      tok_(tokenizer),
      pool_(
          [&] {
            resolve_engine_config(cfg_, params.config());
            return cfg_.kv_pages;
          }(),
          cfg_.kv_page_tokens),
      adapters_(static_cast<int>(cfg_.max_loras)) {
  if (cfg_.max_lora_rank == 0) cfg_.max_lora_rank = 16;
  HYP_CHECK(params.device() == cfg_.hardware,
            "serve: hardware={} but the weights are in {} memory", hardware_name(cfg_.hardware),
            device_name(params.device()));
  eos_id_ = params.config().eos_id;
  end_ids_ = {eos_id_};
  if (tok_ != nullptr) {
    if (tok_->eos_id() >= 0) eos_id_ = tok_->eos_id();
    end_ids_ = tok_->end_ids();
    if (std::find(end_ids_.begin(), end_ids_.end(), eos_id_) == end_ids_.end())
      end_ids_.push_back(eos_id_);
    HYP_CHECK(tok_->vocab_size() <= params.config().vocab_size,
              "serve: the tokenizer has {} tokens, the model's vocabulary {}", tok_->vocab_size(),
              params.config().vocab_size);
  }
  RunnerOptions ro;
  ro.weights = cfg_.weights;
  ro.kv_dtype = cfg_.kv_dtype;
  ro.num_pages = cfg_.kv_pages;
  ro.page_tokens = cfg_.kv_page_tokens;
  ro.max_positions = cfg_.max_seq_len;
  ro.padded_attention = cfg_.padded_attention;
  ro.graphs = cfg_.cuda_graphs;
  runner_ = std::make_unique<ModelRunner>(params, ro);
  slots_.resize(static_cast<size_t>(cfg_.max_concurrent_decodes));
  // A window on every layer: a step at position c (queries c .. c + n - 1, n <= the
  // prefill chunk) reads pages floor((c - W + 1) / P) .. floor((c + n - 1) / P) only.
  window_pages_ = max_pages_per_sequence(cfg_, params.config());
  if (window_pages_ < (cfg_.max_seq_len + cfg_.kv_page_tokens - 1) / cfg_.kv_page_tokens)
    window_ = params.config().arch.sliding_window;
  pages_per_slot_ = (cfg_.max_seq_len + cfg_.kv_page_tokens - 1) / cfg_.kv_page_tokens;
  if (cfg_.padded_attention) {
    static_tables_.resize(static_cast<size_t>(pages_per_slot_ * cfg_.max_concurrent_decodes));
    for (size_t i = 0; i < static_tables_.size(); ++i) static_tables_[i] = static_cast<int32_t>(i);
  }
}

Engine::~Engine() = default;

void Engine::validate(const GenerationRequest& request) const {
  const int64_t vocab = runner_->config().vocab_size;
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  if (n == 0) throw RequestError("prompt", "the prompt must hold at least one token");
  for (int32_t t : request.prompt)
    if (t < 0 || t >= vocab)
      throw RequestError("prompt",
                         fmt::format("token id {} is outside the vocabulary [0, {})", t, vocab));
  if (n >= cfg_.max_seq_len)
    throw RequestError("prompt", fmt::format("the prompt is {} tokens; the context is {} (at least "
                                             "one position must remain for the output)",
                                             n, cfg_.max_seq_len));
  if (request.max_tokens < 1)
    throw RequestError("max_tokens",
                       fmt::format("max_tokens must be >= 1, got {}", request.max_tokens));
  if (n + request.max_tokens > cfg_.max_seq_len)
    throw RequestError("max_tokens",
                       fmt::format("prompt ({} tokens) + max_tokens ({}) exceeds the context of {}",
                                   n, request.max_tokens, cfg_.max_seq_len));
  if (request.grammar && request.grammar->vocab().size() != vocab)
    throw RequestError("response_format",
                       fmt::format("the grammar was compiled for a vocabulary of {} tokens; the model has {}",
                                   request.grammar->vocab().size(), vocab));
  try {
    hyperion::validate(request.sampling);
  } catch (const Error& e) {
    const std::string m = e.what();
    const char* field = m.find("top_k") != std::string::npos   ? "top_k"
                        : m.find("top_p") != std::string::npos ? "top_p"
                                                               : "temperature";
    throw RequestError(field, m);
  }
}

int64_t Engine::add(GenerationRequest request, TokenCallback callback, int64_t id) {
  validate(request);
  if (static_cast<int64_t>(waiting_.size()) >= queue_capacity())
    throw QueueFullError(fmt::format("the queue is full ({} requests waiting for {} slots)",
                                     waiting_.size(), cfg_.max_concurrent_decodes));
  if (id <= 0) id = next_id_++;
  waiting_.push_back(std::make_unique<Sequence>(id, std::move(request), std::move(callback), tok_));
  return id;
}

void Engine::cancel(int64_t id) {
  cancelled_.push_back(id);
}

int64_t Engine::pages_needed(const Sequence& s) const {
  const int64_t total = s.prompt_len() + s.req.max_tokens;
  return (total + cfg_.kv_page_tokens - 1) / cfg_.kv_page_tokens;
}

const int32_t* Engine::page_table(const Sequence& s) const {
  if (cfg_.padded_attention) return static_tables_.data() + s.slot * pages_per_slot_;
  return s.pages.pages().data();
}

int64_t Engine::kv_slot(const Sequence& s, int64_t pos) const {
  const int64_t pt = cfg_.kv_page_tokens;
  return static_cast<int64_t>(page_table(s)[pos / pt]) * pt + pos % pt;
}

int64_t Engine::pages_to_reserve(const Sequence& s) const {
  const int64_t future = pages_needed(s) - static_cast<int64_t>(s.pages.pages().size());
  if (window_ == 0) return future;
  return std::clamp<int64_t>(window_pages_ - s.pages.pages_held(), 0, future);
}

void Engine::trim_to_window(Sequence& s) {
  // Without a window this only restates the reservation (the pages s will still take).
  // The next step's first query is at s.computed and sees keys (s.computed - W, ...].
  if (window_ > 0)
    s.pages.drop_before(pool_, std::max<int64_t>(0, s.computed - window_ + 1) / cfg_.kv_page_tokens);
  const int64_t r = pages_to_reserve(s);
  reserved_pages_ += r - s.reserved;
  s.reserved = r;
}

bool Engine::take_pages(Sequence& s, const int32_t* tokens, int64_t n) {
  if (cfg_.padded_attention) return true;
  const int64_t before = static_cast<int64_t>(s.pages.pages().size());
  if (!s.pages.append(pool_, tokens, n)) return false;
  const int64_t got = static_cast<int64_t>(s.pages.pages().size()) - before;
  s.reserved -= got;
  reserved_pages_ -= got;
  return true;
}

void Engine::release(Sequence& s) {
  if (!cfg_.padded_attention) {
    s.pages.release(pool_);
    reserved_pages_ -= s.reserved;
    s.reserved = 0;
  }
  if (s.slot >= 0) {
    --live_;
    s.slot = -1;
  }
}

void Engine::finish(Sequence& s, FinishReason reason, TokenEvent ev) {
  ev.finish = reason;
  ev.prompt_tokens = s.prompt_len();
  ev.completion_tokens = static_cast<int64_t>(s.output.size());
  ev.cached_tokens = s.cached;
  if (reason == FinishReason::kLength || reason == FinishReason::kStop) {
    if (reason == FinishReason::kLength) ev.text += s.text.flush();
  }
  if (s.callback) s.callback(ev);
  const int slot = s.slot;
  release(s);
  if (slot >= 0) slots_[static_cast<size_t>(slot)].reset();
}

void Engine::process_cancellations() {
  if (cancelled_.empty()) return;
  std::vector<int64_t> ids;
  ids.swap(cancelled_);
  for (int64_t id : ids) {
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if ((*it)->id != id) continue;
      std::unique_ptr<Sequence> s = std::move(*it);
      waiting_.erase(it);
      finish(*s, FinishReason::kAbort, TokenEvent{});
      break;
    }
    for (auto& slot : slots_)
      if (slot && slot->id == id) {
        finish(*slot, FinishReason::kAbort, TokenEvent{});
        break;
      }
  }
}

void Engine::admit() {
  for (size_t i = 0; i < slots_.size() && !waiting_.empty(); ++i) {
    if (slots_[i]) continue;
    Sequence& s = *waiting_.front();
    if (!cfg_.padded_attention) {
      const int64_t need = window_ > 0 ? std::min(pages_needed(s), window_pages_) : pages_needed(s);
      if (need > pool_.pages_available() - reserved_pages_) return;  // FIFO: wait for pages
      if (s.req.adapter) s.pages.set_root(s.req.adapter->cache_root);  // its own KV
      if (cfg_.prefix_caching) s.cached = s.pages.acquire_prefix(pool_, s.req.prompt);
      s.computed = s.cached;
      s.reserved = 0;
      trim_to_window(s);  // reserves (a cached prefix longer than a window keeps its tail)
    }
    s.slot = static_cast<int>(i);
    s.order = admitted_seq_++;
    prompt_tokens_ += s.prompt_len();
    slots_[i] = std::move(waiting_.front());
    waiting_.pop_front();
    ++live_;
  }
}

bool Engine::is_end(int32_t token) const {
  return std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end();
}

// Each constrained row's logits with its grammar's mask applied (Sequence::masked), the
// rows in parallel: at batch 16 the masks would otherwise take one core while the other
// waits.
void Engine::mask_rows(const std::vector<Sequence*>& rows, const float* logits, int64_t vocab) {
  std::vector<std::pair<Sequence*, int64_t>> todo;
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i]->matcher) todo.emplace_back(rows[i], static_cast<int64_t>(i));
  if (todo.empty()) return;
  const Timer timer;
  const auto n = static_cast<int64_t>(todo.size());
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
  for (int64_t k = 0; k < n; ++k) {
    Sequence& s = *todo[static_cast<size_t>(k)].first;
    const float* row = logits + todo[static_cast<size_t>(k)].second * vocab;
    s.mask.resize(s.matcher->compiled().vocab().mask_words());
    s.allowed = s.matcher->fill_mask(s.mask.data());
    s.masked.assign(row, row + vocab);
    text::GrammarMatcher::apply_mask(s.mask.data(), s.masked.data(), vocab);
  }
  grammar_seconds_ += timer.seconds();
}

void Engine::emit_token(Sequence& s, int32_t token, float logprob) {
  s.output.push_back(token);
  ++generated_tokens_;
  TokenEvent ev;
  ev.token = token;
  ev.logprob = logprob;
  const bool eos = is_end(token) && (!s.req.ignore_eos || s.matcher);
  bool stopped = false;
  if (!eos) ev.text = s.text.push(token, &stopped);
  if (eos || stopped) return finish(s, FinishReason::kStop, std::move(ev));
  if (s.matcher && s.matcher->finished()) {  // the grammar has ended: nothing may follow
    ev.text += s.text.flush();
    return finish(s, FinishReason::kStop, std::move(ev));
  }
  const int64_t length = s.prompt_len() + static_cast<int64_t>(s.output.size());
  if (static_cast<int64_t>(s.output.size()) >= s.req.max_tokens || length >= cfg_.max_seq_len)
    return finish(s, FinishReason::kLength, std::move(ev));
  if (s.callback) s.callback(ev);
}

void Engine::step() {
  adapt_threads_to_contention();  // a busy neighbour: the team it actually gets
  process_cancellations();
  admit();
  if (live_ == 0) return;
  const Timer step_timer;
  batch_.clear();
  // Rows: first every decoding slot's last token, then prefill chunks (oldest first).
  std::vector<Sequence*> logit_seqs, decoding;
  for (auto& slot : slots_)
    if (slot && !slot->prefilling()) decoding.push_back(slot.get());
  // Decode rows by LoRA adapter (the base's first): each adapter's rows are then one run
  // of the batch, and the step applies the adapters without gathering rows.
  if (bank_)
    std::stable_sort(decoding.begin(), decoding.end(),
                     [](const Sequence* a, const Sequence* b) { return a->lora_slot() < b->lora_slot(); });
  for (Sequence* seq : decoding) {
    Sequence& s = *seq;
    const int32_t tok = s.output.back();
    const int64_t pos = s.computed;
    trim_to_window(s);
    HYP_CHECK(take_pages(s, &tok, 1), "serve: KV pool exhausted despite the reservation");
    batch_.tokens.push_back(tok);
    batch_.positions.push_back(static_cast<int32_t>(pos));
    batch_.slots.push_back(kv_slot(s, pos));
    batch_.attn.push_back(PagedAttentionRow{nullptr, pos + 1});
    batch_.logit_rows.push_back(static_cast<int32_t>(batch_.tokens.size() - 1));
    logit_seqs.push_back(&s);
  }
  const size_t decode_rows = batch_.tokens.size();
  batch_.decode_rows = static_cast<int64_t>(decode_rows);
  std::vector<Sequence*> prefill;
  for (auto& slot : slots_)
    if (slot && slot->prefilling()) prefill.push_back(slot.get());
  std::sort(prefill.begin(), prefill.end(),
            [](const Sequence* a, const Sequence* b) { return a->order < b->order; });
  int64_t budget = cfg_.prefill_chunk;
  std::vector<std::pair<Sequence*, int64_t>> chunks;
  for (Sequence* s : prefill) {
    if (budget == 0) break;
    const int64_t c = std::min(budget, s->prompt_len() - s->computed);
    trim_to_window(*s);
    HYP_CHECK(take_pages(*s, s->req.prompt.data() + s->computed, c),
              "serve: KV pool exhausted despite the reservation");
    for (int64_t j = 0; j < c; ++j) {
      const int64_t pos = s->computed + j;
      batch_.tokens.push_back(s->req.prompt[static_cast<size_t>(pos)]);
      batch_.positions.push_back(static_cast<int32_t>(pos));
      batch_.slots.push_back(kv_slot(*s, pos));
      batch_.attn.push_back(PagedAttentionRow{nullptr, pos + 1});
    }
    batch_.segments.emplace_back(static_cast<int64_t>(batch_.tokens.size()) - c, c);
    if (s->computed + c == s->prompt_len()) {
      batch_.logit_rows.push_back(static_cast<int32_t>(batch_.tokens.size() - 1));
      logit_seqs.push_back(s);
    }
    chunks.emplace_back(s, c);
    budget -= c;
  }
  // Page tables are final now (appends may have moved them): point the rows at them.
  size_t row = 0;
  for (size_t i = 0; i < decode_rows; ++i, ++row)
    batch_.attn[row].pages = page_table(*logit_seqs[i]);
  for (const auto& [s, c] : chunks)
    for (int64_t j = 0; j < c; ++j, ++row) batch_.attn[row].pages = page_table(*s);
  // Each row's adapter, when any row has one.
  bool adapted = false;
  for (size_t i = 0; i < decode_rows; ++i) adapted = adapted || logit_seqs[i]->lora_slot() != 0;
  for (const auto& [s, c] : chunks) adapted = adapted || s->lora_slot() != 0;
  if (adapted) {
    for (size_t i = 0; i < decode_rows; ++i) batch_.lora_slots.push_back(logit_seqs[i]->lora_slot());
    for (const auto& [s, c] : chunks) batch_.lora_slots.insert(batch_.lora_slots.end(), static_cast<size_t>(c), s->lora_slot());
  }

  // A step whose sampling rows are all greedy without logprobs takes back only their
  // tokens (argmax where the logits are: on a GPU, 4 bytes per row instead of the
  // vocabulary's logits); any other step samples on the host from the logits.
  bool greedy = true;
  for (const Sequence* s : logit_seqs)
    greedy = greedy && s->req.sampling.temperature == 0.0f && !s->req.logprobs && !s->matcher;
  const Timer forward_timer;
  const float* logits = nullptr;
  const int32_t* greedy_ids = nullptr;
  if (greedy)
    greedy_ids = runner_->forward_greedy(batch_);
  else
    logits = runner_->forward(batch_);
  forward_seconds_ += forward_timer.seconds();
  ++steps_;
  ++(chunks.empty() ? decode_steps_ : prefill_steps_);
  for (size_t i = 0; i < decode_rows; ++i) ++logit_seqs[i]->computed;
  for (const auto& [s, c] : chunks) s->computed += c;
  if (cfg_.prefix_caching && !cfg_.padded_attention)
    for (auto& slot : slots_)
      if (slot) slot->pages.publish_full_pages(pool_);
  const int64_t vocab = runner_->config().vocab_size;
  if (greedy_ids == nullptr) mask_rows(logit_seqs, logits, vocab);
  for (size_t i = 0; i < logit_seqs.size(); ++i) {
    Sequence& s = *logit_seqs[i];
    float lp = 0.0f;
    int32_t tok = 0;
    if (greedy_ids != nullptr) {
      tok = greedy_ids[i];
      HYP_CHECK(tok >= 0, "sampler: the {} logits hold a NaN or are all -inf; no token can be "
                          "chosen", vocab);
    } else if (s.matcher) {
      if (!s.allowed) {  // the grammar allows no token of this vocabulary: end here
        TokenEvent ev;
        ev.text = s.text.flush();
        finish(s, FinishReason::kStop, std::move(ev));
        continue;
      }
      // The log probability is the model's own, as for an unconstrained request.
      tok = s.sampler.sample(s.masked.data(), vocab);
      if (s.req.logprobs) lp = s.sampler.logprob(logits + static_cast<int64_t>(i) * vocab, vocab, tok);
      const Timer accept_timer;
      HYP_CHECK(s.matcher->accept(tok), "serve: the grammar refused token {}, which its mask allowed", tok);
      grammar_seconds_ += accept_timer.seconds();
    } else {
      tok = s.sampler.sample(logits + static_cast<int64_t>(i) * vocab, vocab,
                             s.req.logprobs ? &lp : nullptr);
    }
    emit_token(s, tok, lp);
  }
  (chunks.empty() ? decode_step_seconds_ : prefill_step_seconds_) += step_timer.seconds();
}

LoraRef Engine::load_adapter(const std::string& name, const std::string& path, const LoraAdapter& adapter) {
  if (name.empty()) throw RequestError("lora_name", "the LoRA adapter's name must not be empty");
  if (cfg_.max_loras == 0)
    throw RequestError("lora_name", "this server serves no LoRA adapters (max_loras=0)");
  if (name == cfg_.model_name)
    throw RequestError("lora_name", fmt::format("'{}' is the base model's name", name));
  if (adapters_.find(name))
    throw RequestError("lora_name", fmt::format("the LoRA adapter '{}' is already loaded", name));
  if (adapter.rank() > cfg_.max_lora_rank)
    throw RequestError("lora_name", fmt::format("the LoRA adapter '{}' has rank {}, over max_lora_rank={}", name,
                                                adapter.rank(), cfg_.max_lora_rank));
  const int slot = adapters_.free_slot();
  if (slot == 0)
    throw RequestError(
        "lora_name",
        fmt::format("every one of the max_loras={} adapter slots is held (an unloaded adapter keeps its slot until "
                    "its last request ends); unload one first",
                    cfg_.max_loras));
  if (!bank_) {
    bank_ = std::make_unique<LoraBank>(params_, static_cast<int>(cfg_.max_loras), cfg_.max_lora_rank,
                                       runner_->act_dtype());
    runner_->set_lora_bank(bank_.get());
    log_info("serve: LoRA bank for {} adapters of rank <= {}: {}", cfg_.max_loras, cfg_.max_lora_rank,
             format_bytes(bank_->bytes()));
  }
  bank_->install(slot, adapter);
  return adapters_.add(name, path, slot, adapter.rank());
}

bool Engine::unload_adapter(const std::string& name) {
  return adapters_.remove(name);
}

void Engine::fail_all(const std::string& message) {
  TokenEvent ev;
  ev.error = message;
  while (!waiting_.empty()) {
    std::unique_ptr<Sequence> s = std::move(waiting_.front());
    waiting_.pop_front();
    finish(*s, FinishReason::kError, ev);
  }
  for (auto& slot : slots_)
    if (slot) finish(*slot, FinishReason::kError, ev);
}

double Engine::warmup() {
  HYP_CHECK(!has_work(), "serve: warmup must run before any request");
  const Timer timer;
  const int32_t page0 = 0;
  const int64_t max_rows = std::min(cfg_.max_concurrent_decodes + cfg_.prefill_chunk,
                                    cfg_.kv_pages * cfg_.kv_page_tokens);
  int64_t last = 0;
  for (int64_t r = 1; r <= max_rows; ++r) {
    const int64_t b = padded_rows(r);
    if (b == last) continue;
    if (b > cfg_.kv_pages * cfg_.kv_page_tokens) break;
    last = b;
    batch_.clear();
    for (int64_t i = 0; i < b; ++i) {
      batch_.tokens.push_back(0);
      batch_.positions.push_back(0);
      batch_.slots.push_back(i);  // distinct cache slots, overwritten before any use
      batch_.attn.push_back(PagedAttentionRow{&page0, 1});
      batch_.logit_rows.push_back(static_cast<int32_t>(i));
    }
    batch_.decode_rows = b;
    // Greedy: the step as a server's greedy decode runs it, and on a GPU no download of
    // every row's logits.
    runner_->forward_greedy(batch_);
  }
  batch_.clear();
  return timer.seconds();
}

void Engine::run_until_idle() {
  while (has_work()) step();
}

EngineStats Engine::stats() const {
  EngineStats st;
  st.running = live_;
  st.waiting = static_cast<int64_t>(waiting_.size());
  st.slots_total = cfg_.max_concurrent_decodes;
  st.pages_total = pool_.num_pages();
  if (cfg_.padded_attention) {
    st.pages_used = live_ * pages_per_slot_;
    st.pages_free = st.pages_total - st.pages_used;
  } else {
    st.pages_used = pool_.pages_used();
    st.pages_free = pool_.pages_free();
    st.pages_cached = pool_.pages_cached();
  }
  st.prefix_queries = pool_.prefix_lookups();
  st.prefix_hits = pool_.prefix_hits();
  st.prompt_tokens = prompt_tokens_;
  st.generated_tokens = generated_tokens_;
  st.steps = steps_;
  st.decode_steps = decode_steps_;
  st.prefill_steps = prefill_steps_;
  st.decode_step_seconds = decode_step_seconds_;
  st.prefill_step_seconds = prefill_step_seconds_;
  st.forward_seconds = forward_seconds_;
  st.grammar_seconds = grammar_seconds_;
  st.kv_bytes_per_token = runner_->kv_bytes_per_token();
  return st;
}

}  // namespace hyperion::serve
