#include "serve/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"

namespace hyperion::serve {
namespace {

TEST(Metrics, ServerMetricsRendersAllNames) {
  MetricsRegistry r;
  ServerMetrics m(r);
  m.slots_total.set(8);
  m.prompt_tokens.inc(100);
  m.finished("length").inc();
  m.ttft.observe(0.02);
  EXPECT_THROW(m.finished("timeout"), Error);
  const std::string text = r.render();
  for (const char* name :
       {"hyperion_requests_running", "hyperion_requests_waiting", "hyperion_slots_used",
        "hyperion_slots_total", "hyperion_kv_pages_used", "hyperion_kv_pages_free",
        "hyperion_kv_pages_cached", "hyperion_kv_pages_total", "hyperion_prefix_cache_hit_rate",
        "hyperion_prefix_cache_queries_total", "hyperion_prefix_cache_hits_total",
        "hyperion_prompt_tokens_total", "hyperion_generation_tokens_total",
        "hyperion_engine_forward_seconds_total"}) {
    EXPECT_TRUE(monitor::parse_prometheus_value(text, name).has_value()) << name;
  }
  for (const char* kind : {"decode", "prefill"}) {
    for (const char* name : {"hyperion_engine_steps_total", "hyperion_engine_step_seconds_total"})
      EXPECT_EQ(monitor::parse_prometheus_value(text, name, {{"kind", kind}}), 0.0)
          << name << " " << kind;
  }
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    EXPECT_EQ(monitor::parse_prometheus_value(text, "hyperion_requests_total",
                                              {{"finish_reason", reason}}),
              std::string(reason) == "length" ? 1.0 : 0.0)
        << reason;
  }
  for (const char* reason : {"invalid", "queue_full"}) {
    EXPECT_EQ(monitor::parse_prometheus_value(text, "hyperion_requests_rejected_total",
                                              {{"reason", reason}}),
              0.0)
        << reason;
  }
  for (const char* name :
       {"hyperion_time_to_first_token_seconds", "hyperion_time_per_output_token_seconds",
        "hyperion_e2e_request_latency_seconds"}) {
    const std::string n(name);
    EXPECT_NE(text.find("# TYPE " + n + " histogram\n"), std::string::npos) << name;
    EXPECT_TRUE(monitor::parse_prometheus_value(text, n + "_bucket", {{"le", "+Inf"}}).has_value());
    EXPECT_TRUE(monitor::parse_prometheus_value(text, n + "_count").has_value());
  }
  EXPECT_EQ(monitor::parse_prometheus_value(text, "hyperion_slots_total"), 8.0);
  EXPECT_EQ(monitor::parse_prometheus_value(text, "hyperion_prompt_tokens_total"), 100.0);
  EXPECT_EQ(monitor::parse_prometheus_value(text, "hyperion_time_to_first_token_seconds_bucket",
                                            {{"le", "0.01"}}),
            0.0);
  EXPECT_EQ(monitor::parse_prometheus_value(text, "hyperion_time_to_first_token_seconds_bucket",
                                            {{"le", "0.025"}}),
            1.0);
  EXPECT_EQ(m.ttft.upper_bounds().back(), 60);
  EXPECT_EQ(m.e2e.upper_bounds().back(), 300);
  // Each family's HELP and TYPE appear exactly once.
  size_t n = 0;
  for (size_t p = text.find("# TYPE hyperion_requests_total "); p != std::string::npos;
       p = text.find("# TYPE hyperion_requests_total ", p + 1)) {
    ++n;
  }
  EXPECT_EQ(n, 1u);
}

}  // namespace
}  // namespace hyperion::serve
