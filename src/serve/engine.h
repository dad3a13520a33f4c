// The continuous-batching serving engine (JetStream's shape, one process, CPU).
//
// A fixed number of decode slots (max_concurrent_decodes). Each engine step:
//   1. cancellations: a cancelled request gives back its slot and pages at once;
//   2. admission (`insert`): waiting requests take free slots in arrival order when the
//      KV pool can reserve pages for their whole prompt + max_tokens (so a running
//      request never runs out of cache and nothing needs preempting); the longest
//      cached prefix of the prompt, in whole pages, is reused from the prefix cache;
//   3. one batched forward over every decoding slot's next token (`generate`) together
//      with up to prefill_chunk prompt tokens of the requests still prefilling
//      (`prefill`, in chunks, oldest first), so a long prompt never stalls the running
//      decodes for more than one chunk;
//   4. sampling per request (its own temperature/top-k/top-p/seed), streaming of the
//      new text through the request's callback, and finishing on EOS, a stop string,
//      max_tokens or the context limit.
//
// The KV cache lives in pages of kv_page_tokens positions (serve/kv_page_pool.h); with
// attention=padded every slot instead owns a static region of max_seq_len positions and
// attention runs over the batch's longest length (the baseline the ragged kernel is
// measured against).
//
// LoRA adapters (vLLM's multi-LoRA): up to max_loras adapters of rank <= max_lora_rank are
// installed in a LoraBank beside the base; a request names one (GenerationRequest::adapter,
// resolved through adapters()) and every step applies each row's own adapter in one
// pass (Decoder::set_lora_rows), so requests for different adapters and for the
// base share the step. A request's prefix-cache pages are its adapter's own.
//
// Single-threaded: the owner (AsyncEngine, or a test) calls add/cancel/step from one
// thread; the kernels inside use the OpenMP pool.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "model/lora.h"
#include "model/lora_bank.h"
#include "model/param_store.h"
#include "model/sampler.h"
#include "serve/engine_config.h"
#include "serve/kv_page_pool.h"
#include "serve/lora_registry.h"
#include "serve/model_runner.h"
#include "serve/request.h"
#include "serve/text_stream.h"
#include "text/tokenizer.h"

namespace hyperion::serve {

// Thrown by Engine::add when a request cannot be served as asked (maps to HTTP 400);
// `param` names the request field at fault.
struct RequestError : Error {
  RequestError(std::string param_name, const std::string& message)
      : Error(message), param(std::move(param_name)) {}
  std::string param;
};
// Thrown by Engine::add when the waiting queue is full (HTTP 429).
struct QueueFullError : Error {
  using Error::Error;
};
// Thrown by AsyncEngine::submit once the server is shutting down (HTTP 503).
struct ShuttingDownError : Error {
  using Error::Error;
};

struct EngineStats {
  int64_t running = 0;  // requests holding a slot (prefilling or decoding)
  int64_t waiting = 0;
  int64_t slots_total = 0;
  int64_t pages_total = 0, pages_used = 0, pages_free = 0, pages_cached = 0;
  int64_t prefix_queries = 0, prefix_hits = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;  // totals since start
  int64_t steps = 0;
  // Steps with decode rows only, and steps that also prefill prompt chunks; the wall
  // seconds of each kind (batch assembly, the model, sampling, queueing the token events)
  // and of the model's forward passes alone (seconds totals since start).
  int64_t decode_steps = 0, prefill_steps = 0;
  double decode_step_seconds = 0.0, prefill_step_seconds = 0.0, forward_seconds = 0.0;
  // Structured output: seconds computing grammar masks and advancing matchers.
  double grammar_seconds = 0.0;
  int64_t kv_bytes_per_token = 0;
};

class Engine {
 public:
  // `tokenizer` may be null (token ids only: no text, no stop strings).
  Engine(const ParamStore& params, const text::Tokenizer* tokenizer, EngineConfig config);
  ~Engine();

  const EngineConfig& config() const { return cfg_; }
  const ModelRunner& runner() const { return *runner_; }
  int32_t eos_id() const { return eos_id_; }
  // Whether `token` ends a generation (eos, or the tokenizer's end-of-turn tokens).
  bool is_end(int32_t token) const;

  // Throws RequestError naming the field when the request cannot be served (const: safe
  // to call from another thread than the one stepping the engine).
  void validate(const GenerationRequest& request) const;
  // Requests that may wait now: max_queue plus the free slots.
  int64_t queue_capacity() const { return cfg_.max_queue + cfg_.max_concurrent_decodes - live_; }
  // Queues a request; returns its id. Throws RequestError (bad prompt / lengths /
  // sampling) or QueueFullError. `callback` receives every TokenEvent.
  // `id` > 0 sets the request's id (the caller's own numbering; must be unique).
  int64_t add(GenerationRequest request, TokenCallback callback, int64_t id = 0);
  // Ends every request with FinishReason::kError and `message` (after a failed step).
  void fail_all(const std::string& message);
  // Ends a request (waiting or running): its slot and pages are freed on the next step
  // and its stream ends with FinishReason::kAbort. Unknown ids are ignored.
  void cancel(int64_t id);
  bool has_work() const { return !waiting_.empty() || live_ > 0 || !cancelled_.empty(); }
  // One engine iteration (see above). Does nothing when idle.
  void step();
  // One forward per bucketed batch size up to slots + prefill_chunk rows (dummy tokens
  // in page 0, before any request), so every GEMM kernel is compiled before the first
  // request instead of during it (oneDNN JIT-compiles per shape). Returns the seconds.
  double warmup();
  // Runs steps until every request has finished.
  void run_until_idle();
  EngineStats stats() const;

  // The base the adapters are built for (model/lora.h's LoraAdapter(base(), ...)).
  const ParamStore& base() const { return params_; }
  // The loaded adapters by name (thread-safe: resolve a request's adapter with it).
  const LoraRegistry& adapters() const { return adapters_; }
  // Installs `adapter` (built for base()) under `name`; its weights are copied, so it can
  // go once this returns. Between steps only (the thread stepping the engine). Throws a
  // RequestError naming lora_name for a name already loaded or when every one of the
  // max_loras slots is held (an unloaded adapter holds its slot until its last request
  // ends), and for a rank over max_lora_rank.
  LoraRef load_adapter(const std::string& name, const std::string& path, const LoraAdapter& adapter);
  // Forgets `name`: new requests cannot use it, requests that hold it finish with it.
  // False when it is not loaded. Between steps only.
  bool unload_adapter(const std::string& name);

 private:
  struct Sequence;
  void process_cancellations();
  void admit();
  void finish(Sequence& s, FinishReason reason, TokenEvent ev);
  void release(Sequence& s);
  void emit_token(Sequence& s, int32_t token, float logprob);
  void mask_rows(const std::vector<Sequence*>& rows, const float* logits, int64_t vocab);
  int64_t pages_needed(const Sequence& s) const;
  int64_t kv_slot(const Sequence& s, int64_t pos) const;
  const int32_t* page_table(const Sequence& s) const;
  bool take_pages(Sequence& s, const int32_t* tokens, int64_t n);
  // Sets s's reservation to pages_to_reserve(s), first releasing (with a sliding window on
  // every layer) the pages no later step reads: those wholly before the window of the
  // sequence's next position.
  void trim_to_window(Sequence& s);
  // The pages s will still allocate, capped (with a window on every layer) by what it can
  // hold at once less what it holds.
  int64_t pages_to_reserve(const Sequence& s) const;

  EngineConfig cfg_;
  const ParamStore& params_;
  const text::Tokenizer* tok_;
  int32_t eos_id_ = 2;
  std::vector<int32_t> end_ids_;  // eos_id_ and the tokenizer's other end tokens
  std::unique_ptr<ModelRunner> runner_;
  KvPagePool pool_;
  std::vector<int32_t> static_tables_;  // padded mode: slot s owns pages [s*P, (s+1)*P)
  int64_t pages_per_slot_ = 0;
  std::vector<std::unique_ptr<Sequence>> slots_;  // null = free
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<int64_t> cancelled_;
  int64_t live_ = 0;
  int64_t reserved_pages_ = 0;
  // A sliding window on every layer (Mistral v0.1), 0 otherwise; and then the most pages a
  // sequence holds at once (the window behind its next position plus a prefill chunk).
  int64_t window_ = 0;
  int64_t window_pages_ = 0;
  int64_t next_id_ = 1;
  int64_t admitted_seq_ = 0;  // admission order (prefill FIFO)
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0, steps_ = 0;
  int64_t decode_steps_ = 0, prefill_steps_ = 0;
  double decode_step_seconds_ = 0.0, prefill_step_seconds_ = 0.0, forward_seconds_ = 0.0;
  StepBatch batch_;
  // Structured output: the seconds spent on masks and grammar steps (stats).
  double grammar_seconds_ = 0.0;
  LoraRegistry adapters_;
  std::unique_ptr<LoraBank> bank_;  // made with the first adapter
};

}  // namespace hyperion::serve
