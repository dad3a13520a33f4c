// Prometheus metrics (text exposition format 0.0.4), shared by the inference server
// (`GET /metrics`) and the training ranks. A MetricsRegistry owns metric families (one
// name, help text and type each) and their children (one per label set). Several threads
// update children concurrently (a server's HTTP and engine threads), so updates are lock-free
// atomics (counters, gauges) or a short per-histogram mutex; the registry's own mutex guards only
// registration and render().
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

namespace hyperion::monitor {

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
// timestamp ignored. Throws hyperion::Error naming the line when a sample line is
// malformed (monitor/prometheus_text.h reads the text).
std::optional<double> parse_prometheus_value(const std::string& text, const std::string& name,
                                             const Labels& labels = {});

// Formats a sample value the way render() does ("12", "0.25", "+Inf", "NaN").
std::string format_prometheus_value(double v);

}  // namespace hyperion::monitor
