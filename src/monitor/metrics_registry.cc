#include "monitor/metrics_registry.h"

#include "monitor/prometheus_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace hyperion::monitor {
namespace {

enum Type : int { kCounter = 0, kGauge = 1, kHistogram = 2 };
const char* type_name(int t) {
  return t == kCounter ? "counter" : t == kGauge ? "gauge" : "histogram";
}

// std::atomic<double>::fetch_add exists in C++20, but a CAS loop makes no assumption
// about library support and compiles to the same lock cmpxchg loop.
void atomic_add(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

bool valid_metric_name(const std::string& s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool valid_label_name(const std::string& s) {
  if (s.empty() || s.rfind("__", 0) == 0) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

void escape_into(std::string& out, std::string_view s, bool quote) {
  for (const char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

Labels sorted_labels(Labels labels) {
  std::sort(labels.begin(), labels.end());
  return labels;
}

// `{a="x",b="y"}` (with `extra` appended, for `le`), or nothing when there are no labels.
void labels_into(std::string& out, const Labels& labels, const char* extra_name = nullptr,
                 const std::string& extra_value = {}) {
  if (labels.empty() && extra_name == nullptr) return;
  out += '{';
  bool first = true;
  auto one = [&](std::string_view k, std::string_view v) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    escape_into(out, v, true);
    out += '"';
  };
  for (const auto& [k, v] : labels) one(k, v);
  if (extra_name != nullptr) one(extra_name, extra_value);
  out += '}';
}

std::vector<double> checked_bounds(std::vector<double> b, const std::string& what) {
  if (!b.empty() && std::isinf(b.back()) && b.back() > 0) b.pop_back();
  for (size_t i = 0; i < b.size(); ++i) {
    HYP_CHECK(!std::isnan(b[i]), "{}: bucket bound {} is NaN", what, i);
    HYP_CHECK(i == 0 || b[i] > b[i - 1],
              "{}: bucket bounds must be strictly increasing, got {} after {}", what,
              format_prometheus_value(b[i]), format_prometheus_value(b[i - 1]));
  }
  return b;
}

}  // namespace

// ---- metric types ---------------------------------------------------------------

void Counter::inc(double v) {
  HYP_CHECK(v >= 0, "Counter::inc: increment {} is negative or NaN (counters only go up)",
            format_prometheus_value(v));
  atomic_add(value_, v);
}

void Gauge::add(double v) {
  atomic_add(value_, v);
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(checked_bounds(std::move(upper_bounds), "Histogram")),
      counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  // First bound >= v; NaN compares false everywhere and goes to +Inf explicitly.
  const size_t i = std::isnan(v)
                       ? bounds_.size()
                       : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                                             bounds_.begin());
  std::lock_guard<std::mutex> lock(mutex_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::vector<uint64_t> Histogram::bucket_counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint64_t> c(counts_.size());
  uint64_t acc = 0;
  for (size_t i = 0; i < c.size(); ++i) c[i] = acc += counts_[i];
  return c;
}

double Histogram::sum() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sum_;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return count_;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  HYP_CHECK(start > 0 && factor > 1 && count >= 1,
            "exponential_buckets: need start > 0, factor > 1, count >= 1 (got {}, {}, {})", start,
            factor, count);
  std::vector<double> b(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) b[static_cast<size_t>(i)] = start * std::pow(factor, i);
  return b;
}

std::vector<double> linear_buckets(double start, double width, int count) {
  HYP_CHECK(width > 0 && count >= 1, "linear_buckets: need width > 0, count >= 1 (got {}, {}, {})",
            start, width, count);
  std::vector<double> b(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) b[static_cast<size_t>(i)] = start + width * i;
  return b;
}

std::string format_prometheus_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == 0) return "0";  // no "-0"
  // fmt prints the shortest round-trip decimal, integers plainly up to 1e16.
  return fmt::format("{}", v);
}

// ---- registry -------------------------------------------------------------------

struct MetricsRegistry::Family {
  std::string name, help;
  int type;
  std::vector<double> bounds;  // histograms only
  struct Child {
    Labels labels;  // sorted by name
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  std::vector<Child> children;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, const std::string& help,
                                                 int type, const std::vector<double>* buckets,
                                                 const Labels& labels) {
  HYP_CHECK(valid_metric_name(name),
            "metrics: invalid metric name '{}' (must match [a-zA-Z_:][a-zA-Z0-9_:]*)", name);
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string& k = labels[i].first;
    HYP_CHECK(valid_label_name(k),
              "metrics: {}: invalid label name '{}' (must match [a-zA-Z_][a-zA-Z0-9_]* and "
              "not start with __)",
              name, k);
    HYP_CHECK(!(type == kHistogram && k == "le"),
              "metrics: {}: label 'le' is reserved for histogram buckets", name);
    for (size_t j = 0; j < i; ++j) {
      HYP_CHECK(labels[j].first != k, "metrics: {}: label '{}' given twice", name, k);
    }
  }
  for (const auto& f : families_) {
    if (f->name == name) {
      HYP_CHECK(f->type == type, "metrics: {} is already registered as a {}, not a {}", name,
                type_name(f->type), type_name(type));
      HYP_CHECK(f->help == help, "metrics: {} is already registered with help '{}', not '{}'", name,
                f->help, help);
      HYP_CHECK(buckets == nullptr || checked_bounds(*buckets, "metrics: " + name) == f->bounds,
                "metrics: histogram {} is already registered with other buckets", name);
      return *f;
    }
    // A histogram owns name_bucket, name_sum and name_count.
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      HYP_CHECK(!(f->type == kHistogram && name == f->name + suffix) &&
                    !(type == kHistogram && f->name == name + suffix),
                "metrics: {} collides with the series of histogram {}", name,
                type == kHistogram ? name : f->name);
    }
  }
  auto f = std::make_unique<Family>();
  f->name = name;
  f->help = help;
  f->type = type;
  if (buckets != nullptr) f->bounds = checked_bounds(*buckets, "metrics: " + name);
  families_.push_back(std::move(f));
  return *families_.back();
}

namespace {

// Finds or creates the child for `labels` (sorted, so order does not matter); the three
// typed registrations share it. Called with the registry mutex held.
template <typename T, typename Make>
T& child(MetricsRegistry::Family& f, const Labels& labels,
         std::unique_ptr<T> MetricsRegistry::Family::Child::*member, Make make) {
  Labels key = sorted_labels(labels);
  for (auto& c : f.children) {
    if (c.labels == key) return *(c.*member);
  }
  if (!f.children.empty()) {
    const Labels& first = f.children.front().labels;
    bool same = first.size() == key.size();
    for (size_t i = 0; same && i < key.size(); ++i) same = first[i].first == key[i].first;
    HYP_CHECK(same, "metrics: {}: every child needs the same label names", f.name);
  }
  MetricsRegistry::Family::Child c;
  c.labels = std::move(key);
  c.*member = make();
  f.children.push_back(std::move(c));
  return *(f.children.back().*member);
}

}  // namespace

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help,
                                  const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  return child(family(name, help, kCounter, nullptr, labels), labels, &Family::Child::counter,
               [] { return std::make_unique<Counter>(); });
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help,
                              const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  return child(family(name, help, kGauge, nullptr, labels), labels, &Family::Child::gauge,
               [] { return std::make_unique<Gauge>(); });
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      const std::vector<double>& buckets, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  Family& f = family(name, help, kHistogram, &buckets, labels);
  return child(f, labels, &Family::Child::histogram,
               [&] { return std::make_unique<Histogram>(f.bounds); });
}

std::string MetricsRegistry::render() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  out.reserve(families_.size() * 256);
  for (const auto& f : families_) {
    out += "# HELP ";
    out += f->name;
    if (!f->help.empty()) {
      out += ' ';
      escape_into(out, f->help, false);
    }
    out += "\n# TYPE ";
    out += f->name;
    out += ' ';
    out += type_name(f->type);
    out += '\n';
    for (const auto& c : f->children) {
      if (f->type != kHistogram) {
        out += f->name;
        labels_into(out, c.labels);
        out += ' ';
        out += format_prometheus_value(f->type == kCounter ? c.counter->value() : c.gauge->value());
        out += '\n';
        continue;
      }
      // One locked copy so buckets, sum and count are mutually consistent.
      std::vector<uint64_t> counts;
      double sum;
      uint64_t count;
      {
        const Histogram& h = *c.histogram;
        std::lock_guard<std::mutex> hl(h.mutex_);
        counts = h.counts_;
        sum = h.sum_;
        count = h.count_;
      }
      uint64_t acc = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        acc += counts[i];
        out += f->name;
        out += "_bucket";
        labels_into(out, c.labels, "le",
                    i < f->bounds.size() ? format_prometheus_value(f->bounds[i]) : "+Inf");
        out += fmt::format(" {}\n", acc);
      }
      out += f->name;
      out += "_sum";
      labels_into(out, c.labels);
      out += ' ';
      out += format_prometheus_value(sum);
      out += '\n';
      out += f->name;
      out += "_count";
      labels_into(out, c.labels);
      out += fmt::format(" {}\n", count);
    }
  }
  return out;
}

// ---- lookup ---------------------------------------------------------------------

// One reader of the format for the project: monitor/prometheus_text.h.
std::optional<double> parse_prometheus_value(const std::string& text, const std::string& name,
                                             const Labels& labels) {
  std::vector<PrometheusSample> samples;
  try {
    samples = parse_prometheus_text(text);
  } catch (const Error& e) {
    fail("parse_prometheus_value: malformed sample line while looking for {}: {}", name, e.what());
  }
  const Labels want = sorted_labels(labels);
  for (PrometheusSample& sample : samples)
    if (sample.name == name && sorted_labels(std::move(sample.labels)) == want) return sample.value;
  return std::nullopt;
}

}  // namespace hyperion::monitor
