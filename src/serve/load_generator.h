// Load generator behind `hyperion bench serve`, in the style of vLLM's and JetStream's
// benchmark_serving.py: sends streaming completion requests to an OpenAI-compatible server
// (POST /v1/completions with "stream": true) at a Poisson request rate, optionally capped
// in concurrency, and measures per request
//
//   TTFT     time from sending the request to the first token event
//   ITL      gaps between consecutive token events (all requests pooled)
//   TPOT     (latency - TTFT) / (output_tokens - 1), requests with >= 2 output tokens
//   latency  time from sending the request to `data: [DONE]`
//
// The server sends one SSE event per generated token, so each choice chunk is one token;
// output_tokens is usage.completion_tokens when the server reports it (stream_options
// include_usage), else the number of token events. Events that arrive in the same socket
// read get the same timestamp (an ITL of 0), as in vLLM's client.
//
// Prompts come from a JSONL file, from windows of a tokenized text corpus, or (without a
// tokenizer) from uniform random token ids. Everything random (lengths, corpus offset,
// arrival gaps) derives from one seed, so two runs send the same requests at the same
// offsets.
//
// Threads: one std::thread per concurrently in-flight request (a pool of at most
// max_concurrency workers, or one per prompt when unlimited, up to kMaxWorkers); they only
// wait on sockets. The HTTP client is cpp-httplib, included only by load_generator.cc.
#pragma once

#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hyperion::text {
class Tokenizer;
}

namespace hyperion::serve {

// One request to send: a text prompt or a token-id prompt, and its max_tokens.
struct BenchRequest {
  bool is_text = false;
  std::string text;          // when is_text
  std::vector<int32_t> ids;  // otherwise
  int64_t input_len = -1;    // prompt tokens when known (ids.size()), -1 for text
  int64_t max_tokens = 0;    // output length asked for (exact with ignore_eos)
};

// Lengths of generated prompts; all bounds inclusive and >= 1. The input length counts
// the BOS token that starts every generated prompt.
struct PromptShape {
  int64_t num_prompts = 64;
  int64_t min_input_len = 32, max_input_len = 512;
  int64_t min_output_len = 16, max_output_len = 256;
  uint64_t seed = 0;
};
// Throws hyperion::Error naming the field (`who` prefixes the message) when out of range.
void check_prompt_shape(const PromptShape& shape, const char* who);

// Reads up to shape.num_prompts requests from a JSONL file: one object per line with
// "prompt" (a string, or a non-empty array of non-negative token ids) and optionally
// "max_tokens" or "output_len" (a positive integer; when absent the output length is
// drawn uniformly in [min_output_len, max_output_len] from the seed). Blank lines are
// skipped; other keys, bad JSON and wrong types throw hyperion::Error naming file:line
// and the field. A file with no requests is an error.
std::vector<BenchRequest> load_jsonl_prompts(const std::string& path, const PromptShape& shape);

// The bundled corpus (the first data/corpus/*.txt, looked up in the working directory and
// then in the source tree, as `hyperion train` does); throws when neither has it.
std::string bundled_corpus_path();

// Token-id prompts cut from consecutive windows of the corpus (read with
// text::read_documents, tokenized document by document from a seeded starting document,
// wrapping around when the corpus is short): each is BOS (id 1) followed by
// input_len - 1 corpus tokens, input_len uniform in [min_input_len, max_input_len],
// max_tokens uniform in [min_output_len, max_output_len].
std::vector<BenchRequest> corpus_prompts(const text::Tokenizer& tok, const std::string& corpus_path,
                                         const PromptShape& shape);

// Fallback without a tokenizer: BOS then uniform random ids in [3, vocab_size) (skipping
// unk/bos/eos), same length rules as corpus_prompts. vocab_size must be > 3.
std::vector<BenchRequest> random_prompts(int64_t vocab_size, const PromptShape& shape);

// Send offsets in seconds from the start of the run: 0 for the first request, then
// exponential gaps of mean 1 / rate (a Poisson process) drawn from the seed; all zeros
// when rate is infinite. rate must be > 0.
std::vector<double> arrival_offsets(int64_t n, double rate, uint64_t seed);

// ---- statistics (pure, testable on hand-made timestamps) ----

// numpy.percentile's default ("linear") on sorted values; q in [0, 100]. Empty -> 0.
double percentile_sorted(const std::vector<double>& sorted, double q);

struct Distribution {
  int64_t count = 0;
  double mean = 0, std = 0, p50 = 0, p90 = 0, p99 = 0;  // std: population (numpy default)
  double min = 0, max = 0;
};
// All zeros for an empty sample.
Distribution summarize(std::vector<double> values);

// Per-request figures from the arrival times of its token events and of [DONE], all in
// seconds since the request was sent. usage_completion_tokens < 0 means the server sent no
// usage, so the events are counted. tpot_s is < 0 when output_tokens < 2 (not defined).
struct RequestTiming {
  double ttft_s = 0, latency_s = 0, tpot_s = -1;
  int64_t output_tokens = 0;
  std::vector<double> itl_s;
};
RequestTiming request_timing(const std::vector<double>& token_times_s, double done_s,
                             int64_t usage_completion_tokens);

// Incremental parser of one streamed completion (server-sent events: `data: <json>` lines,
// events separated by a blank line, "\n" or "\r\n" line ends), fed the response body in
// whatever pieces the socket delivers. Choice chunks are token events; a usage chunk gives
// the token counts; `data: {"error": ...}` fails the stream; `data: [DONE]` ends it.
class CompletionStream {
 public:
  // Feeds bytes that arrived at `t_s` (seconds since the request was sent). Returns false
  // once the stream has ended or failed (the caller may stop reading).
  bool feed(const char* data, size_t len, double t_s);
  bool done() const { return done_; }
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  const std::vector<double>& token_times() const { return token_times_; }
  int64_t usage_prompt_tokens() const { return usage_prompt_; }
  int64_t usage_completion_tokens() const { return usage_completion_; }
  const std::string& finish_reason() const { return finish_reason_; }
  double done_time() const { return done_time_; }  // arrival of [DONE]

 private:
  void event(const std::string& data, double t_s);
  std::string buf_, error_, finish_reason_;
  std::vector<double> token_times_;
  int64_t usage_prompt_ = -1, usage_completion_ = -1;
  double done_time_ = 0;
  bool done_ = false;
};

// What happened to one request.
struct RequestOutcome {
  bool success = false;
  int http_status = 0;                // 0: no HTTP response (connection failure)
  std::string error;                  // empty on success
  double start_s = 0;                 // send time, seconds since the start of the run
  std::vector<double> token_times_s;  // since start_s, one per token event
  double done_s = 0;                  // [DONE] (or failure) since start_s
  int64_t usage_prompt_tokens = -1, usage_completion_tokens = -1;
  int64_t input_len = -1;  // from the request (ids), -1 for text prompts
  RequestTiming timing;    // filled for successful requests
};

struct BenchResult {
  std::string model;  // as sent (set by run_benchmark)
  int64_t num_prompts = 0, completed = 0, failed = 0;
  double duration_s = 0;
  double request_throughput = 0;   // completed / duration
  double output_tokens_per_s = 0;  // total_output_tokens / duration
  double input_tokens_per_s = 0;   // total_input_tokens / duration
  double concurrency = 0;          // sum of successful latencies / duration
  int64_t total_input_tokens = 0, total_output_tokens = 0;  // successful requests only
  Distribution ttft_ms, tpot_ms, itl_ms, e2e_latency_ms;
  std::vector<std::string> errors;       // the first kMaxErrors, in request order
  std::vector<RequestOutcome> requests;  // in request order
};
inline constexpr size_t kMaxErrors = 5;

// Aggregates outcomes (in request order) over a run of `duration_s` seconds. Input tokens
// of a request: usage.prompt_tokens when reported, else its known input_len.
BenchResult aggregate(std::vector<RequestOutcome> outcomes, double duration_s);

// ---- running against a server ----

struct ServerAddress {
  std::string host;
  int port = 80;
};
// "http://host[:port][/]"; https and paths are errors naming the URL.
ServerAddress parse_url(const std::string& url);

inline constexpr int64_t kMaxWorkers = 4096;

struct LoadOptions {
  ServerAddress server{"127.0.0.1", 8000};
  std::string endpoint = "/v1/completions";
  std::string model;  // empty: run_benchmark asks GET /v1/models
  double request_rate = std::numeric_limits<double>::infinity();  // requests per second
  int64_t max_concurrency = 0;                                    // 0: unlimited
  double temperature = 0.0;
  bool ignore_eos = true;
  uint64_t seed = 0;       // arrival gaps
  double timeout_s = 600;  // socket read timeout (a silent server fails after this)
  double connect_timeout_s = 10;
  // Structured output: every request carries this `response_format` (null: none).
  nlohmann::json response_format;
};

// A model the server lists under GET /v1/models, with its context (vLLM's and hyperion's
// max_model_len; 0 when the server does not say).
struct ServerModel {
  std::string id;
  int64_t max_model_len = 0;
};
// The model `id` (empty: the first listed); throws naming the URL when the server is
// unreachable or the answer is not an OpenAI model list. An id the list lacks comes back
// with max_model_len 0.
ServerModel fetch_model(const ServerAddress& server, const std::string& id,
                        double timeout_s = 10);
std::string fetch_model_name(const ServerAddress& server, double timeout_s = 10);

// A shape whose every prompt + output fits `max_model_len` (0: unchanged): when the
// longest input plus the longest output do not fit, both maxima shrink in their asked
// proportion (and the minima to at most the maxima).
PromptShape fit_shape(PromptShape shape, int64_t max_model_len);
// Requests of known input length (token ids) made to fit: max_tokens is capped to the
// room left, and prompts that alone fill the context are dropped (returns how many).
int64_t fit_requests(std::vector<BenchRequest>& requests, int64_t max_model_len);

// Whether `endpoint` is a chat one (/v1/chat/completions): its requests carry `messages`
// (the prompt text as one user message), not `prompt`, so they need text prompts.
bool is_chat_endpoint(const std::string& endpoint);

// The JSON body of one completion request (exposed for tests): `prompt` for completions,
// `messages` for a chat endpoint.
std::string request_body(const BenchRequest& r, const LoadOptions& opts);

// Sends every request (arrival offsets from opts.request_rate and opts.seed, at most
// opts.max_concurrency in flight) and aggregates. Failed requests are counted, not thrown;
// bad options throw hyperion::Error.
BenchResult run_benchmark(const std::vector<BenchRequest>& requests, const LoadOptions& opts);

// Reports: a vLLM-style table, and one JSON object with the stable keys documented in
// src/cli/bench_serve.cc.
std::string result_table(const BenchResult& r, const LoadOptions& opts);
std::string result_json(const BenchResult& r, const LoadOptions& opts);

}  // namespace hyperion::serve
