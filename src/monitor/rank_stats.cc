#include "monitor/rank_stats.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

namespace hyperion::monitor {

const char* rank_metric_name(int metric) {
  static const char* const names[kNumRankMetrics] = {
      "step_s",       "compute_s",   "data_wait_s", "comm_exposed_s",
      "tokens_per_s", "process_cpu", "rss_bytes"};
  return metric >= 0 && metric < kNumRankMetrics ? names[metric] : "?";
}

void RankWindowAccumulator::add_step(double step_s, double data_wait_s, double comm_exposed_s,
                                     double tokens_per_s) {
  const double compute_s = std::max(0.0, step_s - data_wait_s - comm_exposed_s);
  const double v[] = {step_s, compute_s, data_wait_s, comm_exposed_s, tokens_per_s};
  for (int m = 0; m < 5; ++m) {
    sum_[m] += v[m];
    w_.max[m] = w_.steps == 0 ? v[m] : std::max(w_.max[m], v[m]);
  }
  w_.steps += 1;
  for (int m = 0; m < 5; ++m) w_.mean[m] = sum_[m] / w_.steps;
}

void RankWindowAccumulator::set_host(double process_cpu, double rss_bytes) {
  w_.mean[kProcessCpu] = w_.max[kProcessCpu] = process_cpu;
  w_.mean[kRssBytes] = w_.max[kRssBytes] = rss_bytes;
}

RankWindow RankWindowAccumulator::take() {
  RankWindow out = w_;
  w_ = {};
  sum_ = {};
  return out;
}

namespace {

std::vector<int> top_ranks(std::span<const RankWindow> ranks, int metric, bool by_max, int n) {
  std::vector<int> order(ranks.size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int r) { return by_max ? ranks[r].max[metric] : ranks[r].mean[metric]; };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) > key(b); });
  order.resize(std::min<size_t>(order.size(), static_cast<size_t>(std::max(n, 0))));
  return order;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t h = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
  const double hi = v[h];
  if (v.size() % 2 == 1) return hi;
  const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h));
  return 0.5 * (lo + hi);
}

}  // namespace

std::vector<MetricSummary> summarize(std::span<const RankWindow> ranks, int top_n) {
  std::vector<MetricSummary> out(kNumRankMetrics);
  if (ranks.empty()) return out;
  for (int m = 0; m < kNumRankMetrics; ++m) {
    MetricSummary& s = out[m];
    double sum = 0;
    s.max = ranks[0].max[m];
    for (const RankWindow& w : ranks) {
      sum += w.mean[m];
      s.max = std::max(s.max, w.max[m]);
    }
    s.mean = sum / static_cast<double>(ranks.size());
    s.top_by_mean = top_ranks(ranks, m, false, top_n);
    s.top_by_max = top_ranks(ranks, m, true, top_n);
  }
  return out;
}

double straggler_threshold(std::vector<double> others, double min_excess, double* median_out) {
  const double med = median_of(others);
  for (double& x : others) x = std::fabs(x - med);
  const double mad = median_of(std::move(others));
  if (median_out) *median_out = med;
  return med + std::max(3.0 * mad, min_excess * std::fabs(med));
}

std::vector<Straggler> StragglerDetector::update(std::span<const RankWindow> ranks) {
  std::vector<Straggler> flagged;
  const size_t n = ranks.size();
  if (above_.size() != n) above_.assign(n, {});
  if (n < 2) return flagged;
  for (int metric : {kComputeSeconds, kStepSeconds}) {
    for (size_t r = 0; r < n; ++r) {
      std::vector<double> others;
      others.reserve(n - 1);
      for (size_t o = 0; o < n; ++o)
        if (o != r) others.push_back(ranks[o].mean[metric]);
      double median = 0;
      const double threshold = straggler_threshold(std::move(others), min_excess_, &median);
      const double value = ranks[r].mean[metric];
      int& count = above_[r][metric];
      count = value > threshold ? count + 1 : 0;
      if (count >= periods_)
        flagged.push_back({static_cast<int>(r), metric, value, median, threshold, count});
    }
  }
  // One entry per rank: its compute-time entry when both flag it (listed first).
  std::vector<Straggler> unique;
  for (const Straggler& s : flagged)
    if (std::none_of(unique.begin(), unique.end(),
                     [&](const Straggler& u) { return u.rank == s.rank; }))
      unique.push_back(s);
  return unique;
}

std::string rank_stats_json(int64_t step, double time, std::span<const RankWindow> ranks,
                            std::span<const std::string> hosts,
                            std::span<const MetricSummary> summary,
                            std::span<const Straggler> stragglers) {
  nlohmann::ordered_json j;
  j["step"] = step;
  j["time"] = time;
  j["steps"] = ranks.empty() ? 0.0 : ranks[0].steps;
  nlohmann::ordered_json rs = nlohmann::ordered_json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    nlohmann::ordered_json o;
    o["rank"] = r;
    o["host"] = r < hosts.size() ? hosts[r] : "";
    for (int m = 0; m < kNumRankMetrics; ++m) {
      o[std::string(rank_metric_name(m)) + "_mean"] = ranks[r].mean[m];
      o[std::string(rank_metric_name(m)) + "_max"] = ranks[r].max[m];
    }
    rs.push_back(std::move(o));
  }
  j["ranks"] = std::move(rs);
  nlohmann::ordered_json sm = nlohmann::ordered_json::object();
  for (size_t m = 0; m < summary.size(); ++m)
    sm[rank_metric_name(static_cast<int>(m))] = {{"mean", summary[m].mean},
                                                 {"max", summary[m].max},
                                                 {"top_by_mean", summary[m].top_by_mean},
                                                 {"top_by_max", summary[m].top_by_max}};
  j["summary"] = std::move(sm);
  nlohmann::ordered_json st = nlohmann::ordered_json::array();
  for (const Straggler& s : stragglers)
    st.push_back({{"rank", s.rank},
                  {"metric", rank_metric_name(s.metric)},
                  {"value", s.value},
                  {"median", s.median},
                  {"threshold", s.threshold},
                  {"periods", s.periods}});
  j["stragglers"] = std::move(st);
  return j.dump();
}

}  // namespace hyperion::monitor
