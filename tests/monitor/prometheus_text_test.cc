#include "monitor/prometheus_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "base/error.h"
#include "monitor/metrics_registry.h"

namespace hyperion::monitor {
namespace {

// What a training rank's registry renders reads back: names, labels, values, types.
TEST(PrometheusText, ReadsBackWhatTheRegistryRenders) {
  MetricsRegistry r;
  const Labels rank1 = {{"job", "j"}, {"rank", "1"}, {"host", "h\"x\\y\nz"}};
  r.gauge("hyperion_train_step", "Last step.", rank1).set(42);
  r.gauge("hyperion_train_loss", "Loss.", rank1).set(2.5);
  r.counter("process_cpu_seconds_total", "CPU.").inc(3);
  r.histogram("hyperion_step_hist", "Hist.", {0.1, 1}, rank1).observe(0.5);
  const std::vector<PrometheusSample> s = parse_prometheus_text(r.render());
  ASSERT_EQ(s.size(), 3u + 5u);  // two gauges, a counter, 3 buckets + sum + count
  EXPECT_EQ(s[0].name, "hyperion_train_step");
  EXPECT_EQ(s[0].type, "gauge");
  EXPECT_EQ(s[0].value, 42);
  EXPECT_EQ(label_value(s[0], "rank"), "1");
  EXPECT_EQ(label_value(s[0], "host"), "h\"x\\y\nz");
  EXPECT_EQ(label_value(s[0], "device"), "");
  EXPECT_EQ(s[1].value, 2.5);
  EXPECT_EQ(s[2].name, "process_cpu_seconds_total");
  EXPECT_EQ(s[2].type, "counter");
  EXPECT_TRUE(s[2].labels.empty());
  EXPECT_EQ(s[3].name, "hyperion_step_hist_bucket");
  EXPECT_EQ(s[3].type, "histogram");
  EXPECT_EQ(s[7].name, "hyperion_step_hist_count");
  EXPECT_EQ(s[7].type, "histogram");
}

// Other writers' spellings: no TYPE (untyped), timestamps, special values, blank lines,
// CRLF line ends.
TEST(PrometheusText, AcceptsTimestampsSpecialValuesAndUntyped) {
  const std::string text =
      "# HELP a Some help.\r\n\n"
      "a{x=\"1\"} +Inf 1700000000000\r\n"
      "b -Inf\n"
      "c{} NaN\n"
      "  d 1e-3\n";
  const std::vector<PrometheusSample> s = parse_prometheus_text(text);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].type, "untyped");
  EXPECT_TRUE(std::isinf(s[0].value) && s[0].value > 0);
  EXPECT_TRUE(std::isinf(s[1].value) && s[1].value < 0);
  EXPECT_TRUE(std::isnan(s[2].value));
  EXPECT_EQ(s[3].name, "d");
  EXPECT_DOUBLE_EQ(s[3].value, 1e-3);
}

// A malformed sample line is named with its number.
TEST(PrometheusText, MalformedLinesAreNamed) {
  for (const char* bad : {"ok 1\nx{a=\"1\" 2\n", "ok 1\nx{a=1} 2\n", "ok 1\nx\n", "ok 1\nx abc\n",
                          "ok 1\n{a=\"1\"} 2\n"}) {
    try {
      parse_prometheus_text(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace hyperion::monitor
