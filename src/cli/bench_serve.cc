// `hyperion bench serve`: load generator against an OpenAI-compatible completion server
// (hyperion's own, or vLLM / JetStream / llama.cpp), in the style of vLLM's
// benchmark_serving.py. Sends --num-prompts streaming requests at --request-rate (Poisson;
// inf = all at once) with at most --max-concurrency in flight, and reports throughput and
// TTFT / TPOT / ITL / end-to-end latency (definitions in src/serve/load_generator.h).
//
// Prompts, in order of precedence:
//   --dataset-path F.jsonl   one {"prompt": "text" | [ids], "max_tokens"|"output_len": N}
//                            per line (missing output lengths drawn like below)
//   --tokenizer T            windows of --corpus (default: the bundled data/corpus/*.txt)
//                            tokenized with T (a .model file, or a checkpoint directory
//                            holding tokenizer.model): BOS + input_len - 1 corpus tokens
//   --vocab-size V           no tokenizer: BOS + uniform random ids in [3, V)
// with input_len uniform in [--min-input-len, --max-input-len] and max_tokens uniform in
// [--min-output-len, --max-output-len], all from --seed. With ignore_eos (default; turn off
// with --no-ignore-eos) the server generates exactly max_tokens. Input and output lengths
// shrink to fit the server's max_model_len (GET /v1/models) when they would not.
//
// --json prints one object with the stable keys
//   request_throughput, output_tokens_per_s, input_tokens_per_s, completed, failed,
//   duration_s, total_input_tokens, total_output_tokens, num_prompts,
//   request_rate (number or "inf"), max_concurrency (null when unlimited),
//   ttft_ms, tpot_ms, itl_ms, e2e_latency_ms (each {mean, p50, p90, p99, std, min, max,
//   count}), errors (up to 5 strings)
// plus concurrency, model, url, ignore_eos, temperature. Exit code 1 when any request
// failed (the first errors go to stderr).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/tokenizer_path.h"
#include "io/atomic_file.h"
#include "serve/load_generator.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"

namespace hyperion::cli {

namespace {

int64_t positive(const Flags& f, const char* name, int64_t fallback) {
  const int64_t v = f.integer(name, fallback);
  HYP_USAGE_CHECK(v >= 1, "bench serve: --{} must be >= 1, got {}", name, v);
  return v;
}

}  // namespace

const CommandSpec kBenchServeSpec = {
    "bench serve",
    "",
    "load-test a running OpenAI-compatible server (throughput, TTFT, TPOT, ITL)",
    {{"url", "URL", "server (default http://127.0.0.1:8000)"},
     {"model", "NAME", "model id (default: the server's first in /v1/models)"},
     {"endpoint", "PATH", "/v1/completions (default) or /v1/chat/completions"},
     {"dataset-path", "FILE", "prompts, one JSON object per line"},
     {"tokenizer", "PATH", "tokenize --corpus windows with this .model or checkpoint/run dir"},
     {"corpus", "FILE", "text for --tokenizer prompts (default: the bundled corpus)"},
     {"vocab-size", "V", "random token-id prompts in [3, V) instead"},
     {"num-prompts", "N", "requests to send (default 64)"},
     {"request-rate", "R", "requests per second, Poisson arrivals (default inf: all at once)"},
     {"max-concurrency", "N", "requests in flight at most (default unlimited)"},
     {"min-input-len", "N", "shortest prompt, tokens (default 32)"},
     {"max-input-len", "N", "longest prompt, tokens (default 512, capped to fit the model)"},
     {"min-output-len", "N", "fewest tokens to generate (default 16)"},
     {"max-output-len", "N", "most tokens to generate (default 256, capped to fit the model)"},
     {"temperature", "T", "sampling temperature (default 0)"},
     {"seed", "S", "seed of the prompt sample (default 0)"},
     {"timeout", "S", "per-request timeout in seconds (default 600)"},
     {"no-ignore-eos", "", "let requests stop at end-of-sequence (default: exact lengths)"},
     {"json-schema", "FILE", "structured output: every request asks for JSON valid against this schema (response_format json_schema)"},
     {"json", "", "print the figures as one JSON object"}},
    "Prompt lengths and outputs are sized to the server's max_model_len (/v1/models). Any\n"
    "failed request makes the exit status 1 and prints the first errors.",
    "bench serve --url http://127.0.0.1:8000 --tokenizer runs/tiny --num-prompts 32 --json"};

int cmd_bench_serve(const Args& args) {
  const Flags f(kBenchServeSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "bench serve: unexpected argument '{}'",
                  f.positional()[0]);

  serve::LoadOptions opts;
  const std::string url = f.get("url", "http://127.0.0.1:8000");
  try {
    opts.server = serve::parse_url(url);
  } catch (const Error& e) {
    usage_fail("bench serve: --url: {}", e.what());
  }
  opts.endpoint = f.get("endpoint", "/v1/completions");
  HYP_USAGE_CHECK(!opts.endpoint.empty() && opts.endpoint.front() == '/',
                  "bench serve: --endpoint must start with '/', got '{}'", opts.endpoint);
  opts.model = f.nonempty("model");
  opts.request_rate = f.number("request-rate", INFINITY);
  HYP_USAGE_CHECK(opts.request_rate > 0, "bench serve: --request-rate must be > 0 or inf, got '{}'",
                  f.get("request-rate"));
  opts.max_concurrency = f.has("max-concurrency") ? positive(f, "max-concurrency", 1) : 0;
  opts.temperature = f.number("temperature", 0.0);
  HYP_USAGE_CHECK(opts.temperature >= 0 && std::isfinite(opts.temperature),
                  "bench serve: --temperature must be >= 0, got '{}'", f.get("temperature"));
  const int64_t seed = f.integer("seed", 0);
  HYP_USAGE_CHECK(seed >= 0, "bench serve: --seed must be >= 0, got {}", seed);
  opts.seed = static_cast<uint64_t>(seed);
  opts.ignore_eos = !f.has("no-ignore-eos");
  opts.timeout_s = f.number("timeout", 600);
  HYP_USAGE_CHECK(opts.timeout_s > 0 && std::isfinite(opts.timeout_s),
                  "bench serve: --timeout must be > 0 seconds, got '{}'", f.get("timeout"));
  const bool as_json = f.has("json");
  if (f.has("json-schema")) {
    const std::string path = f.get("json-schema");
    try {
      opts.response_format = {{"type", "json_schema"},
                              {"json_schema", {{"name", "bench"}, {"schema", nlohmann::json::parse(io::read_file(path))}}}};
    } catch (const std::exception& e) {
      usage_fail("bench serve: --json-schema {}: {}", path, e.what());
    }
  }

  serve::PromptShape asked;
  asked.num_prompts = positive(f, "num-prompts", 64);
  asked.min_input_len = positive(f, "min-input-len", 32);
  asked.max_input_len = positive(f, "max-input-len", 512);
  asked.min_output_len = positive(f, "min-output-len", 16);
  asked.max_output_len = positive(f, "max-output-len", 256);
  HYP_USAGE_CHECK(asked.min_input_len <= asked.max_input_len,
                  "bench serve: --min-input-len ({}) exceeds --max-input-len ({})",
                  asked.min_input_len, asked.max_input_len);
  HYP_USAGE_CHECK(asked.min_output_len <= asked.max_output_len,
                  "bench serve: --min-output-len ({}) exceeds --max-output-len ({})",
                  asked.min_output_len, asked.max_output_len);
  asked.seed = opts.seed;
  const bool dataset = f.has("dataset-path"), tokenized = f.has("tokenizer");
  if (dataset)
    HYP_USAGE_CHECK(!tokenized && !f.has("corpus") && !f.has("vocab-size"),
                    "bench serve: --dataset-path excludes --tokenizer, --corpus and --vocab-size");
  else if (tokenized)
    HYP_USAGE_CHECK(!f.has("vocab-size"), "bench serve: --tokenizer excludes --vocab-size");
  else if (f.has("vocab-size"))
    HYP_USAGE_CHECK(!f.has("corpus"), "bench serve: --corpus needs --tokenizer");
  else
    usage_fail(
        "bench serve: no prompts: give --dataset-path FILE.jsonl, --tokenizer PATH (with "
        "--corpus, default the bundled corpus) or --vocab-size N (random ids)");

  // The server's context sizes the prompts and outputs, so that every request can be
  // served (a benchmark of requests the server must refuse measures nothing).
  const serve::ServerModel model = serve::fetch_model(opts.server, opts.model, 10);
  opts.model = model.id;
  const serve::PromptShape shape = serve::fit_shape(asked, model.max_model_len);
  if (shape.max_input_len != asked.max_input_len || shape.max_output_len != asked.max_output_len)
    std::fprintf(
        stderr,
        "bench serve: the server's max_model_len is %lld: inputs %lld..%lld and outputs "
        "%lld..%lld tokens (asked %lld..%lld and %lld..%lld)\n",
        static_cast<long long>(model.max_model_len), static_cast<long long>(shape.min_input_len),
        static_cast<long long>(shape.max_input_len), static_cast<long long>(shape.min_output_len),
        static_cast<long long>(shape.max_output_len), static_cast<long long>(asked.min_input_len),
        static_cast<long long>(asked.max_input_len), static_cast<long long>(asked.min_output_len),
        static_cast<long long>(asked.max_output_len));

  std::vector<serve::BenchRequest> requests;
  std::string source;
  if (dataset) {
    requests = serve::load_jsonl_prompts(f.get("dataset-path"), shape);
    source = f.get("dataset-path");
  } else if (tokenized) {
    const text::Tokenizer tok =
        text::Tokenizer::load(tokenizer_path(f.get("tokenizer"), "bench serve"));
    const std::string corpus = f.has("corpus") ? f.get("corpus") : serve::bundled_corpus_path();
    requests = serve::corpus_prompts(tok, corpus, shape);
    source = fmt::format("{} tokenized with {}", corpus, tok.origin());
    // A chat endpoint takes text: each prompt as the text its ids decode to (the chat
    // template adds a few tokens to each).
    if (serve::is_chat_endpoint(opts.endpoint))
      for (serve::BenchRequest& r : requests) {
        r.text = tok.decode(r.ids);
        r.is_text = true;
      }
  } else {
    const int64_t vocab = f.integer("vocab-size", 0);
    HYP_USAGE_CHECK(vocab > 3, "bench serve: --vocab-size must be > 3, got {}", vocab);
    HYP_USAGE_CHECK(!serve::is_chat_endpoint(opts.endpoint),
                    "bench serve: {} takes text prompts: give --tokenizer (corpus text) or "
                    "--dataset-path, not --vocab-size (random token ids)",
                    opts.endpoint);
    requests = serve::random_prompts(vocab, shape);
    source = fmt::format("random token ids in [3, {})", vocab);
  }
  if (const int64_t dropped = serve::fit_requests(requests, model.max_model_len); dropped > 0)
    std::fprintf(stderr, "bench serve: %lld prompts of %s fill the context (%lld) alone: skipped\n",
                 static_cast<long long>(dropped), source.c_str(),
                 static_cast<long long>(model.max_model_len));
  HYP_CHECK(!requests.empty(), "bench serve: no request of {} fits the server's context ({})",
            source, model.max_model_len);

  if (!as_json)
    std::printf("bench serve: %zu requests from %s -> %s%s (model %s)\n", requests.size(),
                source.c_str(), url.c_str(), opts.endpoint.c_str(), opts.model.c_str());
  const serve::BenchResult r = serve::run_benchmark(requests, opts);
  if (as_json)
    std::printf("%s\n", serve::result_json(r, opts).c_str());
  else
    std::printf("%s", serve::result_table(r, opts).c_str());
  if (r.failed == 0) return 0;
  // Any failure fails the run (a script must not record figures of a partial run).
  std::fprintf(stderr, "bench serve: %lld of %lld requests failed; first errors:\n",
               static_cast<long long>(r.failed), static_cast<long long>(r.num_prompts));
  for (const std::string& e : r.errors) std::fprintf(stderr, "  %s\n", e.c_str());
  return 1;
}

}  // namespace hyperion::cli
