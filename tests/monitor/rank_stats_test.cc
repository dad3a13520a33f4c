#include "monitor/rank_stats.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <vector>

namespace hyperion::monitor {
namespace {

RankWindow window(double compute, double step = -1) {
  RankWindowAccumulator a;
  a.add_step(step < 0 ? compute : step, 0, step < 0 ? 0 : step - compute, 100);
  return a.take();
}

TEST(RankStats, WindowMeanMaxAndComputeTime) {
  RankWindowAccumulator a;
  a.add_step(1.0, 0.1, 0.2, 100);  // compute 0.7
  a.add_step(2.0, 0.3, 0.5, 50);   // compute 1.2
  a.set_host(1.5, 1e9);
  const RankWindow w = a.take();
  EXPECT_EQ(w.steps, 2);
  EXPECT_DOUBLE_EQ(w.mean[kStepSeconds], 1.5);
  EXPECT_DOUBLE_EQ(w.max[kStepSeconds], 2.0);
  EXPECT_DOUBLE_EQ(w.mean[kComputeSeconds], 0.95);
  EXPECT_DOUBLE_EQ(w.max[kComputeSeconds], 1.2);
  EXPECT_DOUBLE_EQ(w.mean[kTokensPerSecond], 75);
  EXPECT_DOUBLE_EQ(w.max[kRssBytes], 1e9);
  EXPECT_EQ(a.take().steps, 0);  // a fresh window
}

TEST(RankStats, SummaryListsTopRanksByMeanAndByMax) {
  std::vector<RankWindow> ranks(4);
  const double means[] = {1, 4, 2, 3}, maxes[] = {9, 4, 2, 5};
  for (int r = 0; r < 4; ++r) {
    ranks[r].mean[kStepSeconds] = means[r];
    ranks[r].max[kStepSeconds] = maxes[r];
  }
  const auto s = summarize(ranks, 2);
  EXPECT_DOUBLE_EQ(s[kStepSeconds].mean, 2.5);
  EXPECT_DOUBLE_EQ(s[kStepSeconds].max, 9);
  EXPECT_EQ(s[kStepSeconds].top_by_mean, (std::vector<int>{1, 3}));
  EXPECT_EQ(s[kStepSeconds].top_by_max, (std::vector<int>{0, 3}));
}

TEST(RankStats, ThresholdIsMedianPlusThreeMadWithAFloor) {
  double med = 0;
  // others 1, 2, 3, 4, 10: median 3, deviations 2 1 0 1 7 -> MAD 1 -> 3 + 3.
  EXPECT_DOUBLE_EQ(straggler_threshold({1, 2, 3, 4, 10}, 0.1, &med), 6);
  EXPECT_DOUBLE_EQ(med, 3);
  // Identical ranks (MAD 0): the floor, 25% above the median.
  EXPECT_DOUBLE_EQ(straggler_threshold({2, 2, 2}, 0.25, nullptr), 2.5);
}

// A rank must stay above the threshold for `periods` windows; one slow window is noise.
TEST(RankStats, StragglerNamedAfterConsecutivePeriods) {
  StragglerDetector d(2);
  std::vector<RankWindow> even = {window(1.0), window(1.02), window(0.98), window(1.01)};
  std::vector<RankWindow> slow = {window(1.0), window(2.5), window(0.98), window(1.01)};
  EXPECT_TRUE(d.update(even).empty());
  EXPECT_TRUE(d.update(slow).empty());  // first slow window
  EXPECT_TRUE(d.update(even).empty());  // back: the count restarts
  EXPECT_TRUE(d.update(slow).empty());
  const auto s = d.update(slow);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 1);
  EXPECT_EQ(s[0].metric, kComputeSeconds);
  EXPECT_EQ(s[0].periods, 2);
  EXPECT_DOUBLE_EQ(s[0].value, 2.5);
  EXPECT_DOUBLE_EQ(s[0].median, 1.0);
}

// Two ranks in a synchronous job: equal step times, but the slow rank computes longer
// while the fast one waits in the all-reduce (exposed communication).
TEST(RankStats, TwoRanksFlagTheSlowComputeNotTheWaitingRank) {
  StragglerDetector d(2);
  std::vector<RankWindow> w = {window(0.4, 1.0), window(1.0, 1.0)};
  d.update(w);
  const auto s = d.update(w);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 1);
  std::vector<RankWindow> close = {window(1.0), window(1.2)};
  StragglerDetector quiet(2);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(quiet.update(close).empty());
}

TEST(RankStats, JsonLineHasRanksSummaryAndStragglers) {
  std::vector<RankWindow> w = {window(0.5), window(1.5)};
  const std::vector<std::string> hosts = {"a", "b"};
  const auto summary = summarize(w, 3);
  const std::vector<Straggler> st = {{1, kComputeSeconds, 1.5, 0.5, 0.55, 2}};
  const auto j = nlohmann::json::parse(rank_stats_json(20, 123.5, w, hosts, summary, st));
  EXPECT_EQ(j["step"], 20);
  EXPECT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][1]["host"], "b");
  EXPECT_DOUBLE_EQ(j["ranks"][1]["compute_s_mean"].get<double>(), 1.5);
  EXPECT_EQ(j["summary"]["compute_s"]["top_by_mean"][0], 1);
  EXPECT_EQ(j["stragglers"][0]["rank"], 1);
  EXPECT_EQ(j["stragglers"][0]["metric"], "compute_s");
}

}  // namespace
}  // namespace hyperion::monitor
