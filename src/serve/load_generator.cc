#include "serve/load_generator.h"

// Debian builds cpp-httplib as a library with OpenSSL/zlib/brotli: its CPPHTTPLIB_*
// defines (they change class layouts) come from pkg-config through CMake.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "base/error.h"
#include "base/timer.h"
#include "io/atomic_file.h"
#include "text/text_input.h"
#include "text/tokenizer.h"

namespace hyperion::serve {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Portable draws from mt19937_64 (the std distributions differ between libraries, and the
// requests must be the same for a seed everywhere).
int64_t uniform_int(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}
double uniform01(std::mt19937_64& rng) {  // [0, 1)
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Separate streams per purpose, so e.g. changing the rate does not change the prompts.
std::mt19937_64 stream_rng(uint64_t seed, uint64_t purpose) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(purpose)};
  return std::mt19937_64(seq);
}
constexpr uint64_t kLengths = 1, kCorpusStart = 2, kRandomIds = 3, kArrivals = 4;

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isspace(uint8_t(c)) != 0; });
}

std::string truncated(std::string s, size_t n = 300) {
  if (s.size() > n) s = s.substr(0, n) + "...";
  return s;
}

// "message" of an OpenAI error object ({"error": {"message", "type", ...}}), else the text.
std::string error_message(const std::string& body) {
  try {
    const json j = json::parse(body);
    if (j.is_object() && j.contains("error")) {
      const json& e = j["error"];
      if (e.is_object()) {
        std::string msg = e.contains("message") && e["message"].is_string()
                              ? e["message"].get<std::string>()
                              : e.dump();
        if (e.contains("type") && e["type"].is_string())
          msg = e["type"].get<std::string>() + ": " + msg;
        return truncated(msg);
      }
      if (e.is_string()) return truncated(e.get<std::string>());
    }
  } catch (const json::exception&) {
  }
  return truncated(body);
}

void set_timeouts(httplib::Client& cli, double connect_s, double read_s) {
  auto split = [](double s, auto set) {
    const double whole = std::floor(s);
    set(static_cast<time_t>(whole), static_cast<time_t>((s - whole) * 1e6));
  };
  split(connect_s, [&](time_t a, time_t b) { cli.set_connection_timeout(a, b); });
  split(read_s, [&](time_t a, time_t b) { cli.set_read_timeout(a, b); });
  split(read_s, [&](time_t a, time_t b) { cli.set_write_timeout(a, b); });
}

std::string url_of(const ServerAddress& s) {
  return fmt::format("http://{}:{}", s.host, s.port);
}

}  // namespace

void check_prompt_shape(const PromptShape& s, const char* who) {
  HYP_CHECK(s.num_prompts >= 1, "{}: num_prompts must be >= 1, got {}", who, s.num_prompts);
  HYP_CHECK(s.min_input_len >= 1 && s.min_input_len <= s.max_input_len,
            "{}: input lengths must satisfy 1 <= min_input_len ({}) <= max_input_len ({})", who,
            s.min_input_len, s.max_input_len);
  HYP_CHECK(s.min_output_len >= 1 && s.min_output_len <= s.max_output_len,
            "{}: output lengths must satisfy 1 <= min_output_len ({}) <= max_output_len ({})", who,
            s.min_output_len, s.max_output_len);
}

// ---- prompt sources ----

std::vector<BenchRequest> load_jsonl_prompts(const std::string& path, const PromptShape& shape) {
  check_prompt_shape(shape, "load_jsonl_prompts");
  const std::string content = io::read_file(path);
  std::mt19937_64 rng = stream_rng(shape.seed, kLengths);
  std::vector<BenchRequest> out;
  size_t start = 0;
  int64_t lineno = 0;
  while (start < content.size() && static_cast<int64_t>(out.size()) < shape.num_prompts) {
    size_t end = content.find('\n', start);
    if (end == std::string::npos) end = content.size();
    const std::string_view line(content.data() + start, end - start);
    start = end + 1;
    ++lineno;
    if (is_blank(line)) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      fail("{}:{}: invalid JSON: {}", path, lineno, e.what());
    }
    HYP_CHECK(j.is_object(), "{}:{}: expected a JSON object with a field 'prompt', got {}", path,
              lineno, j.type_name());
    for (const auto& [key, value] : j.items())
      HYP_CHECK(key == "prompt" || key == "max_tokens" || key == "output_len",
                "{}:{}: unknown field '{}' (expected prompt, max_tokens, output_len)", path, lineno,
                key);
    BenchRequest r;
    auto p = j.find("prompt");
    HYP_CHECK(p != j.end(), "{}:{}: missing field 'prompt'", path, lineno);
    if (p->is_string()) {
      r.is_text = true;
      r.text = p->get<std::string>();
      HYP_CHECK(!r.text.empty(), "{}:{}: field 'prompt' is an empty string", path, lineno);
    } else if (p->is_array()) {
      HYP_CHECK(!p->empty(), "{}:{}: field 'prompt' is an empty array", path, lineno);
      for (size_t k = 0; k < p->size(); ++k) {
        const json& v = (*p)[k];
        HYP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 &&
                      v.get<int64_t>() <= std::numeric_limits<int32_t>::max(),
                  "{}:{}: field 'prompt'[{}] must be a non-negative token id, got {}", path, lineno,
                  k, v.dump());
        r.ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
      }
      r.input_len = static_cast<int64_t>(r.ids.size());
    } else {
      fail("{}:{}: field 'prompt' must be a string or an array of token ids, got {}", path, lineno,
           p->type_name());
    }
    const bool has_max = j.contains("max_tokens"), has_out = j.contains("output_len");
    HYP_CHECK(!(has_max && has_out), "{}:{}: give either 'max_tokens' or 'output_len', not both",
              path, lineno);
    if (has_max || has_out) {
      const char* field = has_max ? "max_tokens" : "output_len";
      const json& v = j[field];
      HYP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1,
                "{}:{}: field '{}' must be a positive integer, got {}", path, lineno, field,
                v.dump());
      r.max_tokens = v.get<int64_t>();
    } else {
      r.max_tokens = uniform_int(rng, shape.min_output_len, shape.max_output_len);
    }
    out.push_back(std::move(r));
  }
  HYP_CHECK(!out.empty(), "{}: no prompts (the file has no non-blank lines)", path);
  return out;
}

std::string bundled_corpus_path() {
  return text::require_bundled_corpus("give a text file with --corpus");
}

namespace {

// Input and output lengths of every prompt, drawn in prompt order.
void draw_lengths(const PromptShape& shape, std::vector<int64_t>& in, std::vector<int64_t>& out) {
  std::mt19937_64 rng = stream_rng(shape.seed, kLengths);
  for (int64_t i = 0; i < shape.num_prompts; ++i) {
    in.push_back(uniform_int(rng, shape.min_input_len, shape.max_input_len));
    out.push_back(uniform_int(rng, shape.min_output_len, shape.max_output_len));
  }
}

}  // namespace

std::vector<BenchRequest> corpus_prompts(const text::Tokenizer& tok, const std::string& corpus_path,
                                         const PromptShape& shape) {
  check_prompt_shape(shape, "corpus_prompts");
  std::vector<int64_t> in_len, out_len;
  draw_lengths(shape, in_len, out_len);
  size_t needed = 0;
  const int64_t bos_len = tok.bos_id() >= 0 ? 1 : 0;
  for (int64_t l : in_len) needed += static_cast<size_t>(l - bos_len);

  const std::vector<std::string> docs = text::read_documents(corpus_path);
  HYP_CHECK(!docs.empty(), "corpus_prompts: '{}' holds no documents", corpus_path);
  // Only as much of the corpus as the prompts need is tokenized, starting at a seeded
  // document and wrapping around.
  std::mt19937_64 rng = stream_rng(shape.seed, kCorpusStart);
  const size_t first = static_cast<size_t>(rng() % docs.size());
  std::vector<int32_t> stream;
  for (size_t k = 0; stream.size() < needed; ++k) {
    HYP_CHECK(k < docs.size() || !stream.empty(),
              "corpus_prompts: '{}' tokenizes to no tokens with '{}'", corpus_path, tok.origin());
    const std::vector<int32_t> ids = tok.encode(docs[(first + k) % docs.size()]);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  std::vector<BenchRequest> out;
  size_t pos = 0;
  for (int64_t i = 0; i < shape.num_prompts; ++i) {
    BenchRequest r;
    r.ids.reserve(static_cast<size_t>(in_len[size_t(i)]));
    // BOS first where the tokenizer has one; otherwise the prompt is all corpus tokens.
    if (bos_len > 0) r.ids.push_back(tok.bos_id());
    const size_t take = static_cast<size_t>(in_len[size_t(i)] - bos_len);
    r.ids.insert(r.ids.end(), stream.begin() + std::ptrdiff_t(pos),
                 stream.begin() + std::ptrdiff_t(pos + take));
    pos += take;
    r.input_len = in_len[size_t(i)];
    r.max_tokens = out_len[size_t(i)];
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<BenchRequest> random_prompts(int64_t vocab_size, const PromptShape& shape) {
  check_prompt_shape(shape, "random_prompts");
  HYP_CHECK(vocab_size > 3 && vocab_size <= std::numeric_limits<int32_t>::max(),
            "random_prompts: vocab_size must be in (3, 2^31), got {}", vocab_size);
  std::vector<int64_t> in_len, out_len;
  draw_lengths(shape, in_len, out_len);
  std::mt19937_64 rng = stream_rng(shape.seed, kRandomIds);
  std::vector<BenchRequest> out;
  for (int64_t i = 0; i < shape.num_prompts; ++i) {
    BenchRequest r;
    r.ids.push_back(1);  // BOS (Llama convention)
    for (int64_t k = 1; k < in_len[size_t(i)]; ++k)
      r.ids.push_back(static_cast<int32_t>(uniform_int(rng, 3, vocab_size - 1)));
    r.input_len = in_len[size_t(i)];
    r.max_tokens = out_len[size_t(i)];
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<double> arrival_offsets(int64_t n, double rate, uint64_t seed) {
  HYP_CHECK(n >= 0, "arrival_offsets: negative request count {}", n);
  HYP_CHECK(rate > 0, "arrival_offsets: request rate must be > 0 (or inf), got {}", rate);
  std::vector<double> t(static_cast<size_t>(n), 0.0);
  if (std::isinf(rate)) return t;
  std::mt19937_64 rng = stream_rng(seed, kArrivals);
  for (size_t i = 1; i < t.size(); ++i)
    t[i] = t[i - 1] - std::log1p(-uniform01(rng)) / rate;  // exponential, mean 1 / rate
  return t;
}

// ---- statistics ----

double percentile_sorted(const std::vector<double>& a, double q) {
  if (a.empty()) return 0;
  const double pos = q / 100.0 * double(a.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, a.size() - 1);
  return a[lo] + (a[hi] - a[lo]) * (pos - double(lo));
}

Distribution summarize(std::vector<double> v) {
  Distribution d;
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  d.count = static_cast<int64_t>(v.size());
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / double(v.size());
  double ss = 0;
  for (double x : v) ss += (x - d.mean) * (x - d.mean);
  d.std = std::sqrt(ss / double(v.size()));
  d.p50 = percentile_sorted(v, 50);
  d.p90 = percentile_sorted(v, 90);
  d.p99 = percentile_sorted(v, 99);
  d.min = v.front();
  d.max = v.back();
  return d;
}

RequestTiming request_timing(const std::vector<double>& t, double done_s,
                             int64_t usage_completion_tokens) {
  RequestTiming r;
  r.latency_s = done_s;
  r.output_tokens =
      usage_completion_tokens >= 0 ? usage_completion_tokens : static_cast<int64_t>(t.size());
  if (!t.empty()) {
    r.ttft_s = t.front();
    for (size_t i = 1; i < t.size(); ++i) r.itl_s.push_back(t[i] - t[i - 1]);
  }
  if (r.output_tokens >= 2) r.tpot_s = (r.latency_s - r.ttft_s) / double(r.output_tokens - 1);
  return r;
}

// ---- the event stream ----

bool CompletionStream::feed(const char* data, size_t len, double t_s) {
  if (done_ || failed()) return false;
  buf_.append(data, len);
  // Complete lines only; an event ends at a blank line. Multi-line data fields join with
  // '\n' (the SSE rule); comments (":...") and other fields are ignored.
  size_t start = 0;
  std::string pending;
  bool have_data = false;
  size_t consumed = 0;
  while (true) {
    const size_t nl = buf_.find('\n', start);
    if (nl == std::string::npos) break;
    std::string_view line(buf_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    start = nl + 1;
    if (line.empty()) {
      if (have_data) event(pending, t_s);
      pending.clear();
      have_data = false;
      consumed = start;
      if (done_ || failed()) break;
      continue;
    }
    if (line.substr(0, 5) == "data:") {
      std::string_view v = line.substr(5);
      if (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      if (have_data) pending += '\n';
      pending.append(v);
      have_data = true;
    }
  }
  buf_.erase(0, consumed);  // keep the unfinished event for the next piece
  return !done_ && !failed();
}

void CompletionStream::event(const std::string& data, double t_s) {
  if (data == "[DONE]") {
    done_ = true;
    done_time_ = t_s;
    return;
  }
  json j;
  try {
    j = json::parse(data);
  } catch (const json::exception&) {
    error_ = "invalid JSON in the event stream: " + truncated(data, 200);
    return;
  }
  if (!j.is_object()) {
    error_ = "event is not a JSON object: " + truncated(data, 200);
    return;
  }
  if (j.contains("error")) {
    error_ = "error event: " + error_message(data);
    if (error_.empty()) error_ = "error event";
    return;
  }
  auto c = j.find("choices");
  if (c != j.end() && c->is_array() && !c->empty()) {
    token_times_.push_back(t_s);  // one event per generated token
    const json& choice = c->front();
    if (choice.is_object() && choice.contains("finish_reason") &&
        choice["finish_reason"].is_string())
      finish_reason_ = choice["finish_reason"].get<std::string>();
  }
  auto u = j.find("usage");
  if (u != j.end() && u->is_object()) {
    if (u->contains("prompt_tokens") && (*u)["prompt_tokens"].is_number_integer())
      usage_prompt_ = (*u)["prompt_tokens"].get<int64_t>();
    if (u->contains("completion_tokens") && (*u)["completion_tokens"].is_number_integer())
      usage_completion_ = (*u)["completion_tokens"].get<int64_t>();
  }
}

// ---- aggregation ----

BenchResult aggregate(std::vector<RequestOutcome> outcomes, double duration_s) {
  BenchResult r;
  r.num_prompts = static_cast<int64_t>(outcomes.size());
  r.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  double latency_sum = 0;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    RequestOutcome& o = outcomes[i];
    if (!o.success) {
      ++r.failed;
      if (r.errors.size() < kMaxErrors)
        r.errors.push_back(fmt::format("request {}: {}", i, o.error));
      continue;
    }
    ++r.completed;
    o.timing = request_timing(o.token_times_s, o.done_s, o.usage_completion_tokens);
    r.total_input_tokens +=
        o.usage_prompt_tokens >= 0 ? o.usage_prompt_tokens : std::max<int64_t>(o.input_len, 0);
    r.total_output_tokens += o.timing.output_tokens;
    ttft.push_back(o.timing.ttft_s * 1e3);
    e2e.push_back(o.timing.latency_s * 1e3);
    if (o.timing.tpot_s >= 0) tpot.push_back(o.timing.tpot_s * 1e3);
    for (double g : o.timing.itl_s) itl.push_back(g * 1e3);
    latency_sum += o.timing.latency_s;
  }
  if (duration_s > 0) {
    r.request_throughput = double(r.completed) / duration_s;
    r.output_tokens_per_s = double(r.total_output_tokens) / duration_s;
    r.input_tokens_per_s = double(r.total_input_tokens) / duration_s;
    r.concurrency = latency_sum / duration_s;
  }
  r.ttft_ms = summarize(std::move(ttft));
  r.tpot_ms = summarize(std::move(tpot));
  r.itl_ms = summarize(std::move(itl));
  r.e2e_latency_ms = summarize(std::move(e2e));
  r.requests = std::move(outcomes);
  return r;
}

// ---- talking to the server ----

ServerAddress parse_url(const std::string& url) {
  HYP_CHECK(url.rfind("https://", 0) != 0,
            "server URL '{}': https is not supported (plain http://host:port only)", url);
  HYP_CHECK(url.rfind("http://", 0) == 0, "server URL '{}': expected http://host:port", url);
  std::string rest = url.substr(7);
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  HYP_CHECK(rest.find('/') == std::string::npos,
            "server URL '{}': has a path; give only http://host:port (the path is --endpoint)",
            url);
  HYP_CHECK(rest.find_first_of("@[]?# ") == std::string::npos,
            "server URL '{}': expected http://host:port", url);
  ServerAddress a;
  const size_t colon = rest.find(':');
  a.host = rest.substr(0, colon);
  HYP_CHECK(!a.host.empty(), "server URL '{}': missing host", url);
  if (colon != std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    HYP_CHECK(
        !port.empty() && port.size() <= 5 &&
            std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }),
        "server URL '{}': bad port '{}'", url, port);
    a.port = std::stoi(port);
    HYP_CHECK(a.port >= 1 && a.port <= 65535, "server URL '{}': port {} out of range", url, a.port);
  }
  return a;
}

ServerModel fetch_model(const ServerAddress& server, const std::string& id, double timeout_s) {
  httplib::Client cli(server.host, server.port);
  set_timeouts(cli, timeout_s, timeout_s);
  const std::string where = url_of(server) + "/v1/models";
  auto res = cli.Get("/v1/models");
  HYP_CHECK(res, "GET {} failed: {}", where, httplib::to_string(res.error()));
  HYP_CHECK(res->status == 200, "GET {}: HTTP {}: {}", where, res->status,
            error_message(res->body));
  try {
    const json j = json::parse(res->body);
    const json& data = j.at("data");
    HYP_CHECK(data.is_array() && !data.empty(), "GET {}: the model list is empty", where);
    const json* chosen = &data.at(0);
    if (!id.empty()) {
      chosen = nullptr;
      for (const json& m : data)
        if (m.at("id") == id) chosen = &m;
      if (chosen == nullptr) return ServerModel{id, 0};  // not listed: nothing known
    }
    ServerModel m;
    m.id = chosen->at("id").get<std::string>();
    // vLLM's and hyperion's field; other servers may not report it (0: unknown).
    if (chosen->contains("max_model_len") && chosen->at("max_model_len").is_number_integer())
      m.max_model_len = chosen->at("max_model_len").get<int64_t>();
    return m;
  } catch (const json::exception& e) {
    fail("GET {}: expected {{\"data\": [{{\"id\": ...}}]}}: {}", where, e.what());
  }
}

std::string fetch_model_name(const ServerAddress& server, double timeout_s) {
  return fetch_model(server, "", timeout_s).id;
}

PromptShape fit_shape(PromptShape shape, int64_t max_model_len) {
  if (max_model_len <= 1 || shape.max_input_len + shape.max_output_len <= max_model_len)
    return shape;
  // Keep the asked proportion of input to output; every pair then fits.
  const double in_share =
      double(shape.max_input_len) / double(shape.max_input_len + shape.max_output_len);
  const int64_t in = std::clamp<int64_t>(static_cast<int64_t>(double(max_model_len) * in_share), 1,
                                         max_model_len - 1);
  shape.max_input_len = in;
  shape.max_output_len = max_model_len - in;
  shape.min_input_len = std::min(shape.min_input_len, shape.max_input_len);
  shape.min_output_len = std::min(shape.min_output_len, shape.max_output_len);
  return shape;
}

bool is_chat_endpoint(const std::string& endpoint) {
  return endpoint.find("/chat/") != std::string::npos;
}

int64_t fit_requests(std::vector<BenchRequest>& requests, int64_t max_model_len) {
  if (max_model_len <= 1) return 0;
  int64_t dropped = 0;
  std::vector<BenchRequest> kept;
  kept.reserve(requests.size());
  for (BenchRequest& r : requests) {
    if (r.input_len >= max_model_len) {
      ++dropped;  // cannot fit at all
      continue;
    }
    if (r.input_len > 0) r.max_tokens = std::min(r.max_tokens, max_model_len - r.input_len);
    kept.push_back(std::move(r));
  }
  requests = std::move(kept);
  return dropped;
}

std::string request_body(const BenchRequest& r, const LoadOptions& opts) {
  json j;
  j["model"] = opts.model;
  if (is_chat_endpoint(opts.endpoint)) {
    HYP_CHECK(r.is_text, "bench serve: {} takes text prompts, not token ids", opts.endpoint);
    j["messages"] = json::array({{{"role", "user"}, {"content", r.text}}});
  } else if (r.is_text) {
    j["prompt"] = r.text;
  } else {
    j["prompt"] = r.ids;
  }
  j["max_tokens"] = r.max_tokens;
  j["temperature"] = opts.temperature;
  j["stream"] = true;
  j["stream_options"] = {{"include_usage", true}};
  if (opts.ignore_eos) j["ignore_eos"] = true;
  if (!opts.response_format.is_null()) j["response_format"] = opts.response_format;
  return j.dump();
}

namespace {

using Clock = std::chrono::steady_clock;

RequestOutcome send_one(const BenchRequest& r, const LoadOptions& opts, Clock::time_point run0) {
  RequestOutcome o;
  o.input_len = r.input_len;
  httplib::Client cli(opts.server.host, opts.server.port);
  set_timeouts(cli, opts.connect_timeout_s, opts.timeout_s);
  httplib::Request req;
  req.method = "POST";
  req.path = opts.endpoint;
  req.body = request_body(r, opts);
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  CompletionStream stream;
  std::string error_body;
  int status = 0;
  const Clock::time_point t0 = Clock::now();
  auto since_t0 = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    const double t = since_t0();
    if (status < 200 || status >= 300) {
      if (error_body.size() < 4096) error_body.append(data, std::min<size_t>(len, 4096));
      return true;
    }
    stream.feed(data, len, t);
    return !stream.failed();  // read to the end after [DONE]: the connection closes cleanly
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = cli.send(req, res, err);
  const double end = since_t0();
  o.start_s = std::chrono::duration<double>(t0 - run0).count();
  o.http_status = status;
  o.token_times_s = stream.token_times();
  o.usage_prompt_tokens = stream.usage_prompt_tokens();
  o.usage_completion_tokens = stream.usage_completion_tokens();
  o.done_s = stream.done() ? stream.done_time() : end;
  if (status != 0 && (status < 200 || status >= 300)) {
    o.error = fmt::format("HTTP {}: {}", status, error_message(error_body));
  } else if (stream.failed()) {
    o.error = stream.error();
  } else if (!stream.done()) {
    o.error = ok ? std::string("the stream ended without data: [DONE]")
                 : fmt::format("request failed: {} (after {:.3f} s, {} tokens)",
                               httplib::to_string(err), end, stream.token_times().size());
  } else if (stream.token_times().empty()) {
    o.error = "no token events before [DONE]";
  } else {
    o.success = true;
  }
  return o;
}

}  // namespace

BenchResult run_benchmark(const std::vector<BenchRequest>& requests, const LoadOptions& options) {
  HYP_CHECK(!requests.empty(), "run_benchmark: no requests");
  HYP_CHECK(options.max_concurrency >= 0, "run_benchmark: max_concurrency must be >= 0, got {}",
            options.max_concurrency);
  HYP_CHECK(!options.endpoint.empty() && options.endpoint.front() == '/',
            "run_benchmark: endpoint must start with '/', got '{}'", options.endpoint);
  HYP_CHECK(options.timeout_s > 0 && options.connect_timeout_s > 0,
            "run_benchmark: timeouts must be > 0");
  LoadOptions opts = options;
  if (opts.model.empty()) opts.model = fetch_model_name(opts.server, opts.connect_timeout_s);
  const int64_t n = static_cast<int64_t>(requests.size());
  const std::vector<double> offsets = arrival_offsets(n, opts.request_rate, opts.seed);
  // A worker per allowed in-flight request: a worker takes the next request in order,
  // waits for its arrival time and sends it, so with every worker busy the next request
  // waits for a free one (max_concurrency acts as a semaphore taken after arrival).
  int64_t workers = opts.max_concurrency > 0 ? std::min(n, opts.max_concurrency) : n;
  workers = std::min(workers, kMaxWorkers);
  std::vector<RequestOutcome> outcomes(static_cast<size_t>(n));
  std::atomic<int64_t> next{0};
  const Clock::time_point run0 = Clock::now();
  auto work = [&] {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      const size_t k = static_cast<size_t>(i);
      std::this_thread::sleep_until(run0 + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(offsets[k])));
      try {
        outcomes[k] = send_one(requests[k], opts, run0);
      } catch (const std::exception& e) {
        outcomes[k] = RequestOutcome{};
        outcomes[k].error = std::string("client error: ") + e.what();
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers));
  for (int64_t w = 0; w < workers; ++w) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - run0).count();
  BenchResult result = aggregate(std::move(outcomes), duration);
  result.model = opts.model;
  return result;
}

// ---- reports ----

std::string result_table(const BenchResult& r, const LoadOptions& opts) {
  std::string s;
  auto line = [&](const std::string& k, const std::string& v) {
    s += fmt::format("{:<40} {:<10}\n", k, v);
  };
  auto num = [](double v, int prec = 2) { return fmt::format("{:.{}f}", v, prec); };
  auto header = [&](const std::string& title, char fill) {
    const size_t w = 50, pad = title.size() + 2 < w ? (w - title.size()) / 2 : 0;
    std::string t = std::string(pad, fill) + title;
    t += std::string(w > t.size() ? w - t.size() : 0, fill);
    s += t + "\n";
  };
  header(" Serving Benchmark Result ", '=');
  line("Successful requests:", std::to_string(r.completed));
  line("Failed requests:", std::to_string(r.failed));
  line("Request rate (req/s):",
       std::isinf(opts.request_rate) ? std::string("inf") : num(opts.request_rate));
  line("Maximum request concurrency:",
       opts.max_concurrency > 0 ? std::to_string(opts.max_concurrency) : std::string("unlimited"));
  line("Benchmark duration (s):", num(r.duration_s));
  line("Total input tokens:", std::to_string(r.total_input_tokens));
  line("Total generated tokens:", std::to_string(r.total_output_tokens));
  line("Request throughput (req/s):", num(r.request_throughput));
  line("Output token throughput (tok/s):", num(r.output_tokens_per_s));
  line("Total token throughput (tok/s):", num(r.output_tokens_per_s + r.input_tokens_per_s));
  line("Mean concurrency:", num(r.concurrency));
  auto block = [&](const std::string& title, const std::string& name, const Distribution& d) {
    header(title, '-');
    line("Mean " + name + " (ms):", num(d.mean));
    line("Median " + name + " (ms):", num(d.p50));
    line("P90 " + name + " (ms):", num(d.p90));
    line("P99 " + name + " (ms):", num(d.p99));
  };
  block("Time to First Token", "TTFT", r.ttft_ms);
  block("Time per Output Token (excl. 1st token)", "TPOT", r.tpot_ms);
  block("Inter-token Latency", "ITL", r.itl_ms);
  block("End-to-end Latency", "E2EL", r.e2e_latency_ms);
  s += std::string(50, '=') + "\n";
  if (!r.errors.empty()) {
    s += fmt::format("First errors ({} of {} failed requests):\n", r.errors.size(), r.failed);
    for (const auto& e : r.errors) s += "  " + e + "\n";
  }
  return s;
}

std::string result_json(const BenchResult& r, const LoadOptions& opts) {
  auto dist = [](const Distribution& d) {
    nlohmann::ordered_json j;
    j["mean"] = d.mean;
    j["p50"] = d.p50;
    j["p90"] = d.p90;
    j["p99"] = d.p99;
    j["std"] = d.std;
    j["min"] = d.min;
    j["max"] = d.max;
    j["count"] = d.count;
    return j;
  };
  nlohmann::ordered_json j;
  j["request_throughput"] = r.request_throughput;
  j["output_tokens_per_s"] = r.output_tokens_per_s;
  j["input_tokens_per_s"] = r.input_tokens_per_s;
  j["completed"] = r.completed;
  j["failed"] = r.failed;
  j["duration_s"] = r.duration_s;
  j["total_input_tokens"] = r.total_input_tokens;
  j["total_output_tokens"] = r.total_output_tokens;
  j["num_prompts"] = r.num_prompts;
  if (std::isinf(opts.request_rate))
    j["request_rate"] = "inf";
  else
    j["request_rate"] = opts.request_rate;
  if (opts.max_concurrency > 0)
    j["max_concurrency"] = opts.max_concurrency;
  else
    j["max_concurrency"] = nullptr;
  j["concurrency"] = r.concurrency;
  j["model"] = r.model.empty() ? opts.model : r.model;
  j["url"] = url_of(opts.server) + opts.endpoint;
  j["ignore_eos"] = opts.ignore_eos;
  j["temperature"] = opts.temperature;
  j["ttft_ms"] = dist(r.ttft_ms);
  j["tpot_ms"] = dist(r.tpot_ms);
  j["itl_ms"] = dist(r.itl_ms);
  j["e2e_latency_ms"] = dist(r.e2e_latency_ms);
  j["errors"] = r.errors;
  return j.dump(2);
}

}  // namespace hyperion::serve
