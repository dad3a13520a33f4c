// Per-rank step statistics over a log period, gathered on rank 0 (issue 17): the mean,
// the max and the top-N ranks of each metric, as the reference dashboards show them, and
// straggler detection (monitor/run_files.h has the ranks.jsonl line this produces).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace hyperion::monitor {

// The metrics of a rank's window, in this order (names as in ranks.jsonl).
enum RankMetric : int {
  kStepSeconds,         // step_s
  kComputeSeconds,      // compute_s: step time less data wait and exposed communication
  kDataWaitSeconds,     // data_wait_s
  kCommExposedSeconds,  // comm_exposed_s: the training thread blocked on collectives
  kTokensPerSecond,     // tokens_per_s
  kProcessCpu,          // process_cpu: cores this process kept busy
  kRssBytes,            // rss_bytes
  kNumRankMetrics
};
const char* rank_metric_name(int metric);

// One rank's window, plain doubles so that rank 0 gathers them with one all_gather.
struct RankWindow {
  std::array<double, kNumRankMetrics> mean{}, max{};
  double steps = 0;
};

// Accumulates a rank's steps between two gathers.
class RankWindowAccumulator {
 public:
  void add_step(double step_s, double data_wait_s, double comm_exposed_s, double tokens_per_s);
  // Host readings (one sample per window: mean = max).
  void set_host(double process_cpu, double rss_bytes);
  // The window so far, and a fresh one started.
  RankWindow take();

 private:
  RankWindow w_;
  std::array<double, kNumRankMetrics> sum_{};
};

struct MetricSummary {
  double mean = 0, max = 0;                  // the mean of the ranks' means; the max of their maxes
  std::vector<int> top_by_mean, top_by_max;  // at most top_n ranks, largest first
};
// Per metric, over `ranks` (index = rank).
std::vector<MetricSummary> summarize(std::span<const RankWindow> ranks, int top_n);

struct Straggler {
  int rank = 0;
  int metric = kComputeSeconds;
  double value = 0, median = 0, threshold = 0;
  int periods = 0;  // consecutive windows above the threshold
};

// A rank is a straggler when its window mean of a watched metric (step_s, compute_s)
// stays above median + 3 MAD of the *other* ranks for `periods` consecutive windows.
// Leaving the rank out keeps the rule meaningful at 2 ranks (where the median of all sits
// halfway and the MAD equals the gap); a floor of `min_excess` x median keeps identical
// ranks (MAD 0) from flagging noise: 25%, as step times of ranks sharing cores with other
// work were seen 12% apart in a 2-rank run with no straggler.
class StragglerDetector {
 public:
  explicit StragglerDetector(int periods = 2, double min_excess = 0.25)
      : periods_(periods), min_excess_(min_excess) {}
  // One window of every rank; returns the ranks flagged now (above for >= periods windows).
  std::vector<Straggler> update(std::span<const RankWindow> ranks);

 private:
  int periods_;
  double min_excess_;
  std::vector<std::array<int, kNumRankMetrics>> above_;  // per rank, consecutive windows
};

// The threshold for `value` among `others`: median + max(3 MAD, min_excess x median).
double straggler_threshold(std::vector<double> others, double min_excess, double* median_out);

// The ranks.jsonl line (without newline) for one gather.
std::string rank_stats_json(int64_t step, double time, std::span<const RankWindow> ranks,
                            std::span<const std::string> hosts,
                            std::span<const MetricSummary> summary,
                            std::span<const Straggler> stragglers);

}  // namespace hyperion::monitor
