// Prometheus metrics for the inference server (`GET /metrics`, text exposition format
// 0.0.4). A MetricsRegistry owns metric families (one name, help text and type each) and
// their children (one per label set). The HTTP threads and the engine thread update
// children concurrently, so updates are lock-free atomics (counters, gauges) or a short
// per-histogram mutex; the registry's own mutex guards only registration and render().
//
// Exposition details (what render() prints):
//   # HELP <name> <help, with \ and newline escaped>
//   # TYPE <name> counter|gauge|histogram
//   <name>{<label>="<value, with \ " and newline escaped>",...} <value>
// Histograms print cumulative <name>_bucket{...,le="<bound>"} lines ending with
// le="+Inf", then <name>_sum and <name>_count. Numbers are the shortest decimal that
// round-trips (integers without exponent up to 1e16), and +Inf, -Inf, NaN as spelled by
// Prometheus. Labels of a child are printed sorted by label name.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hyperion::serve {

using Labels = std::vector<std::pair<std::string, std::string>>;

// A monotonically increasing value (requests served, tokens generated).
class Counter {
 public:
  // Throws hyperion::Error for a negative or NaN increment: counters never go down.
  void inc(double v = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (requests running, pages free).
class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into buckets `v <= upper_bound` (Prometheus `le` semantics).
class Histogram {
 public:
  // `upper_bounds` must be strictly increasing and not NaN; a trailing +Inf is dropped
  // (the +Inf bucket is always implicit). Throws hyperion::Error otherwise.
  explicit Histogram(std::vector<double> upper_bounds);

  // NaN observations land in the +Inf bucket only (and make the sum NaN), as in the
  // Prometheus client libraries.
  void observe(double v);

  const std::vector<double>& upper_bounds() const { return bounds_; }
  // Snapshot: cumulative counts, one per upper bound plus the final +Inf bucket (whose
  // count equals count()).
  std::vector<uint64_t> bucket_counts() const;
  double sum() const;
  uint64_t count() const;

 private:
  friend class MetricsRegistry;
  std::vector<double> bounds_;
  mutable std::mutex mutex_;      // keeps buckets, sum and count consistent with each other
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), bounds_.size() + 1
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// `count` bounds start, start*factor, start*factor^2, ... (start > 0, factor > 1,
// count >= 1, else hyperion::Error).
std::vector<double> exponential_buckets(double start, double factor, int count);
// `count` bounds start, start+width, ... (width > 0, count >= 1).
std::vector<double> linear_buckets(double start, double width, int count);

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Returns the child of family `name` with `labels`, registering the family and/or the
  // child on first use; asking again for the same name and label set (in any order)
  // returns the same object. References stay valid for the registry's lifetime.
  // Throws hyperion::Error naming the metric when: the name does not match
  // [a-zA-Z_:][a-zA-Z0-9_:]*; a label name does not match [a-zA-Z_][a-zA-Z0-9_]*, starts
  // with "__", repeats, or is "le" on a histogram; the family exists with another type,
  // help text, bucket layout or set of label names; or the name collides with a
  // histogram's _bucket/_sum/_count series.
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help,
                       const std::vector<double>& buckets, const Labels& labels = {});

  // The whole exposition, families in registration order, children in registration
  // order within a family.
  std::string render() const;

  struct Family;  // defined in metrics.cc

 private:
  Family& family(const std::string& name, const std::string& help, int type,
                 const std::vector<double>* buckets, const Labels& labels);

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Family>> families_;
};

// The sample value of the line in exposition `text` whose metric name is exactly `name`
// and whose label set equals `labels` (order-insensitive; a `le` label, if any, must be
// given too); nullopt when no line matches. Comment lines are skipped and a trailing
// timestamp ignored. Throws hyperion::Error if a line with that name is malformed.
std::optional<double> parse_prometheus_value(const std::string& text, const std::string& name,
                                             const Labels& labels = {});

// Formats a sample value the way render() does ("12", "0.25", "+Inf", "NaN").
std::string format_prometheus_value(double v);

// hyperion's server metric set (vLLM-like names under `hyperion_`), registered in the
// constructor; members refer to children of `r` and are updated directly, e.g.
// `m.prompt_tokens.inc(n); m.ttft.observe(seconds); m.requests_running.set(k);`.
struct ServerMetrics {
  explicit ServerMetrics(MetricsRegistry& r);

  // Scheduler state (gauges, set by the engine thread each step).
  Gauge& requests_running;       // hyperion_requests_running: requests decoding/prefilling
  Gauge& requests_waiting;       // hyperion_requests_waiting: queued, not yet admitted
  Gauge& slots_used;             // hyperion_slots_used: batch slots occupied
  Gauge& slots_total;            // hyperion_slots_total: batch slots configured
  Gauge& kv_pages_used;          // hyperion_kv_pages_used: KV pages referenced by requests
  Gauge& kv_pages_free;          // hyperion_kv_pages_free: KV pages on the free list
  Gauge& kv_pages_cached;        // hyperion_kv_pages_cached: unreferenced prefix-cache pages
  Gauge& kv_pages_total;         // hyperion_kv_pages_total: pool size
  Gauge& prefix_cache_hit_rate;  // hyperion_prefix_cache_hit_rate: hits / queries, 0..1

  // Totals since start (counters).
  Counter& prefix_cache_queries;  // hyperion_prefix_cache_queries_total: page lookups
  Counter& prefix_cache_hits;     // hyperion_prefix_cache_hits_total: lookups that hit
  Counter& prompt_tokens;         // hyperion_prompt_tokens_total: prefilled prompt tokens
  Counter& generation_tokens;     // hyperion_generation_tokens_total: sampled tokens

  // hyperion_requests_total{finish_reason=...}: finished requests by reason.
  Counter& finished_stop;    // stop sequence / EOS
  Counter& finished_length;  // max_tokens or context limit
  Counter& finished_abort;   // client went away or cancelled
  Counter& finished_error;   // internal failure
  // hyperion_requests_rejected_total{reason=...}: requests refused before admission.
  Counter& rejected_invalid;     // bad request (HTTP 400)
  Counter& rejected_queue_full;  // queue at capacity (HTTP 429)
  Counter& rejected_draining;    // arrived while the server drains for shutdown (HTTP 503)

  // The HTTP front end.
  Gauge& http_connections;              // hyperion_http_connections: open connections
  Counter& http_connections_rejected;   // hyperion_http_connections_rejected_total: over the cap
  Counter& http_timeouts;               // hyperion_http_timeouts_total: slow or idle clients cut
  Counter& http_bad_requests;           // hyperion_http_bad_requests_total: malformed HTTP

  // Latency histograms, seconds.
  Histogram& ttft;  // hyperion_time_to_first_token_seconds: arrival -> first token
  Histogram& tpot;  // hyperion_time_per_output_token_seconds: gap between later tokens
  Histogram& e2e;   // hyperion_e2e_request_latency_seconds: arrival -> finish

  // The finish-reason counter for "stop", "length", "abort" or "error" (else Error).
  Counter& finished(std::string_view reason);
};

}  // namespace hyperion::serve
