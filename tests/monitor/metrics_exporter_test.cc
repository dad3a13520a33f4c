#include "monitor/metrics_exporter.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <string>

#include "base/error.h"

namespace hyperion::monitor {
namespace {

// Scraped over HTTP: the registry's current text, updated between scrapes.
TEST(MetricsExporter, ServesTheRegistry) {
  MetricsRegistry r;
  Gauge& g = r.gauge("hyperion_train_step_seconds", "Seconds per step.", {{"rank", "0"}});
  g.set(0.25);
  MetricsExporter e(r, "127.0.0.1", 0, "rank 0");
  ASSERT_GT(e.port(), 0);
  httplib::Client c("127.0.0.1", e.port());
  auto res = c.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(parse_prometheus_value(res->body, "hyperion_train_step_seconds", {{"rank", "0"}}),
            0.25);
  g.set(0.5);
  res = c.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(parse_prometheus_value(res->body, "hyperion_train_step_seconds", {{"rank", "0"}}), 0.5);
  res = c.Get("/other");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
}

// A port in use names the port and the rank.
TEST(MetricsExporter, PortInUseNamesPortAndRank) {
  MetricsRegistry r;
  MetricsExporter first(r, "127.0.0.1", 0, "rank 0");
  std::string msg;
  try {
    MetricsExporter second(r, "127.0.0.1", first.port(), "rank 1");
  } catch (const Error& err) {
    msg = err.what();
  }
  EXPECT_NE(msg.find(std::to_string(first.port())), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
}

}  // namespace
}  // namespace hyperion::monitor
