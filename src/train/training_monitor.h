// Monitoring of a training rank (issue 17; docs/MONITORING.md): everything the trainer
// reports beyond metrics.jsonl, behind one object the step loop calls at fixed points.
//   - Prometheus metrics on metrics_port + rank (labels job, rank, host): the step's
//     times, throughput, loss, collectives, checkpoints, and host statistics from /proc.
//   - The event log (events.jsonl) that `hyperion goodput` accounts.
//   - Every log_period, rank 0 gathers each rank's window statistics over the
//     communicator, writes ranks.jsonl (mean, max, top-N per metric) and names stragglers.
//   - Stack dumps on fatal signals and when no step finishes for hang_timeout_s.
// Every rank constructs it at the same point of set-up and calls step_done for every
// step: the gathers are collectives.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "monitor/event_log.h"
#include "monitor/hang_watchdog.h"
#include "monitor/host_stats.h"
#include "monitor/metrics_exporter.h"
#include "monitor/metrics_registry.h"
#include "monitor/rank_stats.h"
#include "train/metrics_writer.h"
#include "train/train_config.h"

namespace hyperion {

class TrainingMonitor {
 public:
  // `process_start`: when the trainer began (unix time), after the launcher and MPI.
  TrainingMonitor(const TrainConfig& t, dist::Communicator& comm, const std::string& run_dir,
                  double process_start);
  ~TrainingMonitor();

  void restore_started();
  void restore_done(int64_t step, double seconds);
  void init_done();
  void step_started(int64_t step);
  // After the step's metrics are final (every rank; gathers on log periods).
  void step_done(const StepMetrics& m);
  void save_started(int64_t step);
  void save_done(int64_t step, double seconds);
  void eval_started();
  void eval_done();
  // The process ends normally; job_end when the run's last step is done.
  void finished(int64_t step, bool job_end);

  // 0 when the exporter is off.
  int metrics_port() const { return exporter_ ? exporter_->port() : 0; }
  // Ranks flagged at the latest gather (rank 0).
  const std::vector<monitor::Straggler>& stragglers() const { return stragglers_; }
  const monitor::MetricsRegistry& registry() const { return registry_; }

 private:
  monitor::Gauge& gauge(const std::string& name, const std::string& help);
  monitor::Counter& counter(const std::string& name, const std::string& help,
                            const monitor::Labels& extra = {});
  void sample_host();
  void update_collectives();
  void gather(int64_t step);

  const TrainConfig& t_;
  dist::Communicator& comm_;
  int rank_ = 0, world_ = 1;
  bool enabled_ = true;
  std::string run_dir_, host_;
  monitor::Labels labels_;
  monitor::MetricsRegistry registry_;
  std::unique_ptr<monitor::MetricsExporter> exporter_;
  std::unique_ptr<monitor::EventLog> events_;
  bool crash_handlers_ = false;
  // Declared after events_: its thread may write a hang event until it is joined.
  std::unique_ptr<monitor::HangWatchdog> watchdog_;
  monitor::HostStatsSampler host_sampler_;
  monitor::HostReading last_host_;
  dist::CollectiveStats last_collectives_[dist::kNumCollectives];
  monitor::RankWindowAccumulator window_;
  monitor::StragglerDetector detector_;
  std::vector<std::string> hosts_;
  std::vector<monitor::Straggler> stragglers_;
  std::ofstream ranks_out_;
  bool first_attempt_ = true;
};

}  // namespace hyperion
