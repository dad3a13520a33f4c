#include "monitor/metrics_registry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"

namespace hyperion::monitor {
namespace {

// Runs `fn` and returns the hyperion::Error message it throws ("" if none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Metrics, CounterAndGaugeRender) {
  MetricsRegistry r;
  Counter& c = r.counter("req_total", "Requests served.");
  c.inc();
  c.inc(2);
  Gauge& g = r.gauge("temp", "Temperature.", {{"room", "a"}});
  g.set(1.5);
  g.add(-2);
  r.gauge("temp", "Temperature.", {{"room", "b"}}).set(1e20);
  EXPECT_EQ(c.value(), 3);
  EXPECT_EQ(g.value(), -0.5);
  EXPECT_EQ(r.render(),
            "# HELP req_total Requests served.\n"
            "# TYPE req_total counter\n"
            "req_total 3\n"
            "# HELP temp Temperature.\n"
            "# TYPE temp gauge\n"
            "temp{room=\"a\"} -0.5\n"
            "temp{room=\"b\"} 1e+20\n");
}

TEST(Metrics, SameNameAndLabelsReturnSameChild) {
  MetricsRegistry r;
  Counter& a = r.counter("x_total", "h", {{"a", "1"}, {"b", "2"}});
  Counter& b = r.counter("x_total", "h", {{"b", "2"}, {"a", "1"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &r.counter("x_total", "h", {{"a", "1"}, {"b", "3"}}));
  // Labels print sorted by name.
  EXPECT_NE(r.render().find("x_total{a=\"1\",b=\"2\"} 0\n"), std::string::npos);
}

TEST(Metrics, NumberFormatting) {
  EXPECT_EQ(format_prometheus_value(0), "0");
  EXPECT_EQ(format_prometheus_value(-0.0), "0");
  EXPECT_EQ(format_prometheus_value(12), "12");
  EXPECT_EQ(format_prometheus_value(123456789012.0), "123456789012");
  EXPECT_EQ(format_prometheus_value(0.1), "0.1");
  EXPECT_EQ(format_prometheus_value(0.0025), "0.0025");
  EXPECT_EQ(format_prometheus_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_prometheus_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_prometheus_value(std::nan("")), "NaN");
  // Shortest round trip.
  const double v = 0.1 + 0.2;
  EXPECT_EQ(std::stod(format_prometheus_value(v)), v);
}

TEST(Metrics, HistogramRenderIsCumulativeWithInf) {
  MetricsRegistry r;
  Histogram& h = r.histogram("lat_seconds", "Latency.", {0.005, 0.1, 1}, {{"model", "a"}});
  for (double v : {0.001, 0.005, 0.05, 0.5, 0.7, 3.0}) h.observe(v);
  EXPECT_EQ(h.bucket_counts(), (std::vector<uint64_t>{2, 3, 5, 6}));
  EXPECT_EQ(h.count(), 6u);
  EXPECT_DOUBLE_EQ(h.sum(), 4.256);
  r.histogram("lat_seconds", "Latency.", {0.005, 0.1, 1}, {{"model", "m"}}).observe(2);
  EXPECT_EQ(r.render(),
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{model=\"a\",le=\"0.005\"} 2\n"
            "lat_seconds_bucket{model=\"a\",le=\"0.1\"} 3\n"
            "lat_seconds_bucket{model=\"a\",le=\"1\"} 5\n"
            "lat_seconds_bucket{model=\"a\",le=\"+Inf\"} 6\n"
            "lat_seconds_sum{model=\"a\"} " +
                format_prometheus_value(h.sum()) +
                "\n"
                "lat_seconds_count{model=\"a\"} 6\n"
                "lat_seconds_bucket{model=\"m\",le=\"0.005\"} 0\n"
                "lat_seconds_bucket{model=\"m\",le=\"0.1\"} 0\n"
                "lat_seconds_bucket{model=\"m\",le=\"1\"} 0\n"
                "lat_seconds_bucket{model=\"m\",le=\"+Inf\"} 1\n"
                "lat_seconds_sum{model=\"m\"} 2\n"
                "lat_seconds_count{model=\"m\"} 1\n");
}

TEST(Metrics, HistogramEdgeCases) {
  // A trailing +Inf bound is implicit; NaN goes to +Inf only.
  Histogram h({1, 2, std::numeric_limits<double>::infinity()});
  EXPECT_EQ(h.upper_bounds(), (std::vector<double>{1, 2}));
  h.observe(std::nan(""));
  h.observe(-5);
  EXPECT_EQ(h.bucket_counts(), (std::vector<uint64_t>{1, 1, 2}));
  EXPECT_TRUE(std::isnan(h.sum()));
  Histogram empty({});
  empty.observe(1);
  EXPECT_EQ(empty.bucket_counts(), (std::vector<uint64_t>{1}));
  MetricsRegistry r;
  r.histogram("only_inf", "", {}).observe(0.5);
  EXPECT_EQ(r.render(),
            "# HELP only_inf\n"
            "# TYPE only_inf histogram\n"
            "only_inf_bucket{le=\"+Inf\"} 1\n"
            "only_inf_sum 0.5\n"
            "only_inf_count 1\n");
  EXPECT_NE(error_of([] { Histogram({1, 1}); }).find("strictly increasing"), std::string::npos);
  EXPECT_NE(error_of([] { Histogram({std::nan("")}); }).find("NaN"), std::string::npos);
}

TEST(Metrics, BucketHelpers) {
  EXPECT_EQ(exponential_buckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(linear_buckets(0.5, 0.5, 3), (std::vector<double>{0.5, 1, 1.5}));
  EXPECT_NE(error_of([] { exponential_buckets(0, 2, 3); }).find("exponential_buckets"),
            std::string::npos);
  EXPECT_NE(error_of([] { exponential_buckets(1, 1, 3); }).find("exponential_buckets"),
            std::string::npos);
  EXPECT_NE(error_of([] { linear_buckets(0, 1, 0); }).find("linear_buckets"), std::string::npos);
}

TEST(Metrics, Escaping) {
  MetricsRegistry r;
  r.counter("esc_total", "Back\\slash and\nnewline \"quotes\" kept.", {{"path", "a\\b\"c\"\nd"}})
      .inc(7);
  const std::string text = r.render();
  EXPECT_EQ(text,
            "# HELP esc_total Back\\\\slash and\\nnewline \"quotes\" kept.\n"
            "# TYPE esc_total counter\n"
            "esc_total{path=\"a\\\\b\\\"c\\\"\\nd\"} 7\n");
  EXPECT_EQ(parse_prometheus_value(text, "esc_total", {{"path", "a\\b\"c\"\nd"}}), 7.0);
}

TEST(Metrics, InvalidNamesAndConflictsThrow) {
  MetricsRegistry r;
  EXPECT_NE(error_of([&] { r.counter("9bad", "h"); }).find("'9bad'"), std::string::npos);
  EXPECT_NE(error_of([&] { r.gauge("has-dash", "h"); }).find("'has-dash'"), std::string::npos);
  EXPECT_NE(error_of([&] { r.gauge("", "h"); }).find("''"), std::string::npos);
  EXPECT_NO_THROW(r.gauge("ok:name_1", "h"));
  EXPECT_NE(error_of([&] {
              r.counter("c_total", "h", {{"1x", "v"}});
            }).find("'1x'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              r.counter("c_total", "h", {{"__x", "v"}});
            }).find("'__x'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              r.counter("c_total", "h", {{"a", "1"}, {"a", "2"}});
            }).find("twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              r.histogram("h_seconds", "h", {1}, {{"le", "1"}});
            }).find("'le'"),
            std::string::npos);

  r.counter("dup", "h");
  const std::string type_msg = error_of([&] { r.gauge("dup", "h"); });
  EXPECT_NE(type_msg.find("dup"), std::string::npos);
  EXPECT_NE(type_msg.find("counter"), std::string::npos);
  EXPECT_NE(error_of([&] { r.counter("dup", "other help"); }).find("help"), std::string::npos);
  EXPECT_NE(error_of([&] {
              r.counter("dup", "h", {{"a", "1"}});
            }).find("label names"),
            std::string::npos);

  r.histogram("lat", "h", {1, 2});
  EXPECT_NE(error_of([&] {
              r.histogram("lat", "h", {1, 3});
            }).find("other buckets"),
            std::string::npos);
  EXPECT_NE(error_of([&] { r.histogram("bad_b", "h", {2, 1}); }).find("bad_b"), std::string::npos);
  EXPECT_NE(error_of([&] { r.counter("lat_count", "h"); }).find("collides"), std::string::npos);
  r.gauge("g_sum", "h");
  EXPECT_NE(error_of([&] { r.histogram("g", "h", {1}); }).find("collides"), std::string::npos);

  Counter& c = r.counter("mono_total", "h");
  EXPECT_NE(error_of([&] { c.inc(-1); }).find("negative"), std::string::npos);
  EXPECT_EQ(c.value(), 0);
}

TEST(Metrics, ConcurrentUpdatesSumExactly) {
  MetricsRegistry r;
  Counter& c = r.counter("n_total", "h");
  Gauge& g = r.gauge("g", "h");
  Histogram& h = r.histogram("h", "h", {10, 100});
  constexpr int kN = 20000;
#pragma omp parallel for num_threads(4)
  for (int i = 0; i < kN; ++i) {
    c.inc();
    c.inc(2);
    g.add(i % 2 == 0 ? 3 : -1);
    h.observe(i % 200);
    // Registration and render race with the updates too.
    if (i % 1000 == 0) {
      r.counter("n_total", "h").inc(0);
      EXPECT_FALSE(r.render().empty());
    }
  }
  EXPECT_EQ(c.value(), 3.0 * kN);
  EXPECT_EQ(g.value(), kN);  // kN/2 * 3 - kN/2
  EXPECT_EQ(h.count(), static_cast<uint64_t>(kN));
  EXPECT_EQ(h.bucket_counts(), (std::vector<uint64_t>{11 * 100, 101 * 100, kN}));
  double want_sum = 0;
  for (int i = 0; i < kN; ++i) want_sum += i % 200;
  EXPECT_EQ(h.sum(), want_sum);  // integers: exact in any order
}

TEST(Metrics, ParseRoundTrip) {
  MetricsRegistry r;
  r.counter("a_total", "h").inc(42);
  r.counter("a_total_more", "h").inc(5);  // a prefix of another name must not match
  r.gauge("g", "h", {{"k", "x y"}, {"j", "1"}}).set(0.125);
  r.gauge("g", "h", {{"k", "z"}, {"j", "1"}}).set(-3);
  r.gauge("inf", "h").set(std::numeric_limits<double>::infinity());
  Histogram& h = r.histogram("lat", "h", {0.5, 1});
  h.observe(0.25);
  h.observe(0.75);
  const std::string text = r.render();
  EXPECT_EQ(parse_prometheus_value(text, "a_total"), 42.0);
  EXPECT_EQ(parse_prometheus_value(text, "a_total_more"), 5.0);
  EXPECT_EQ(parse_prometheus_value(text, "g", {{"j", "1"}, {"k", "x y"}}), 0.125);
  EXPECT_EQ(parse_prometheus_value(text, "g", {{"k", "z"}, {"j", "1"}}), -3.0);
  EXPECT_EQ(parse_prometheus_value(text, "g", {{"k", "z"}}), std::nullopt);
  EXPECT_EQ(parse_prometheus_value(text, "g"), std::nullopt);
  EXPECT_EQ(parse_prometheus_value(text, "inf"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(parse_prometheus_value(text, "lat_bucket", {{"le", "0.5"}}), 1.0);
  EXPECT_EQ(parse_prometheus_value(text, "lat_bucket", {{"le", "+Inf"}}), 2.0);
  EXPECT_EQ(parse_prometheus_value(text, "lat_sum"), 1.0);
  EXPECT_EQ(parse_prometheus_value(text, "lat_count"), 2.0);
  EXPECT_EQ(parse_prometheus_value(text, "missing"), std::nullopt);

  // Foreign but valid text: timestamps, empty braces, NaN.
  EXPECT_EQ(parse_prometheus_value("x{} 3 1700000000\n", "x"), 3.0);
  EXPECT_TRUE(std::isnan(*parse_prometheus_value("# c\nx NaN", "x")));
  // Malformed lines with the asked name throw, naming it.
  EXPECT_NE(error_of([] { parse_prometheus_value("x abc\n", "x"); }).find("x"), std::string::npos);
  EXPECT_NE(error_of([] { parse_prometheus_value("x{a=\"1} 2\n", "x"); }).find("malformed"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_prometheus_value("x\n", "x"); }).find("malformed"),
            std::string::npos);
}

}  // namespace
}  // namespace hyperion::monitor
