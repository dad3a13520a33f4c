#include "train/training_monitor.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/log.h"
#include "monitor/run_files.h"
#include "monitor/stack_dump.h"

namespace hyperion {

namespace {

std::string this_host() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host[0] ? host : "unknown";
}

// Step-duration buckets: 1 ms to ~2 h.
const std::vector<double>& step_buckets() {
  static const std::vector<double> b = monitor::exponential_buckets(0.001, 2.0, 23);
  return b;
}

}  // namespace

TrainingMonitor::TrainingMonitor(const TrainConfig& t, dist::Communicator& comm,
                                 const std::string& run_dir, double process_start)
    : t_(t),
      comm_(comm),
      rank_(comm.rank()),
      world_(comm.world_size()),
      enabled_(t.monitor.enabled),
      run_dir_(run_dir),
      host_(this_host()),
      detector_(t.monitor.straggler_periods) {
  if (!enabled_) return;
  const std::string job =
      t.run_name.empty() ? std::filesystem::path(run_dir).filename().string() : t.run_name;
  labels_ = {{"job", job}, {"rank", std::to_string(rank_)}, {"host", host_}};
  events_ = std::make_unique<monitor::EventLog>(run_dir, rank_ == 0);
  first_attempt_ = events_->previous_attempts() == 0;
  if (events_->was_empty()) events_->write_at(process_start, "job_start");
  events_->write_at(
      process_start, "process_start",
      fmt::format("\"attempt\":{},\"launch_time\":{:.6f},\"ranks\":{}",
                  events_->previous_attempts() + 1, monitor::process_launch_time(), world_));
  // Every rank's host name, once: ranks.jsonl and the straggler lines name hosts.
  hosts_.assign(static_cast<size_t>(world_), host_);
  if (world_ > 1) {
    constexpr size_t kHostBytes = 64;
    std::vector<char> mine(kHostBytes, '\0'), all(kHostBytes * static_cast<size_t>(world_));
    host_.copy(mine.data(), kHostBytes - 1);
    comm_.all_gather(mine.data(), all.data(), kHostBytes);
    for (int r = 0; r < world_; ++r)
      hosts_[static_cast<size_t>(r)] =
          std::string(all.data() + static_cast<size_t>(r) * kHostBytes);
  }
  if (rank_ == 0) ranks_out_.open(run_dir + "/" + monitor::kRanksFile, std::ios::app);
  if (t.monitor.metrics_port > 0) {
    const int port = t.monitor.metrics_port + rank_;
    HYP_CHECK(port <= 65535, "config key metrics_port={}: rank {} would serve on port {} > 65535",
              t.monitor.metrics_port, rank_, port);
    exporter_ = std::make_unique<monitor::MetricsExporter>(registry_, t.monitor.metrics_host, port,
                                                           fmt::format("rank {}", rank_));
    log_info("monitor: rank {} serves Prometheus metrics on http://{}:{}/metrics", rank_, host_,
             port);
  }
  // Stack dumps: on fatal signals (with a crash event in the log) and when no step
  // finishes for hang_timeout_s.
  const std::string stacks = run_dir + "/" + monitor::kStacksDir;
  monitor::install_crash_handlers(stacks, rank_, events_->fd());
  crash_handlers_ = true;
  watchdog_ = std::make_unique<monitor::HangWatchdog>(
      t.monitor.hang_timeout_s, stacks, rank_, t.monitor.abort_on_hang,
      [this](const std::string& path, int64_t step) {
        events_->write_any_rank("hang", fmt::format("\"rank\":{},\"step\":{},\"path\":{}", rank_,
                                                    step, nlohmann::json(path).dump()));
      });
  sample_host();
}

TrainingMonitor::~TrainingMonitor() {
  watchdog_.reset();
  // The handlers hold events_'s descriptor, closed with it.
  if (crash_handlers_) monitor::uninstall_crash_handlers();
}

monitor::Gauge& TrainingMonitor::gauge(const std::string& name, const std::string& help) {
  return registry_.gauge(name, help, labels_);
}

monitor::Counter& TrainingMonitor::counter(const std::string& name, const std::string& help,
                                           const monitor::Labels& extra) {
  monitor::Labels l = labels_;
  l.insert(l.end(), extra.begin(), extra.end());
  return registry_.counter(name, help, l);
}

void TrainingMonitor::restore_started() {
  if (enabled_) events_->write("restore_start");
}

void TrainingMonitor::restore_done(int64_t step, double seconds) {
  if (!enabled_) return;
  events_->write("restore_end", fmt::format("\"step\":{}", step));
  watchdog_->heartbeat(step);
  gauge("hyperion_train_checkpoint_restore_seconds", "seconds the last checkpoint restore took")
      .set(seconds);
}

void TrainingMonitor::init_done() {
  if (!enabled_) return;
  events_->write("init_done");
  watchdog_->heartbeat(watchdog_->last_step());
}

void TrainingMonitor::step_started(int64_t step) {
  if (enabled_) events_->write("step_start", fmt::format("\"step\":{}", step));
}

void TrainingMonitor::step_done(const StepMetrics& m) {
  if (!enabled_) return;
  watchdog_->heartbeat(m.step);
  events_->write("step_end",
                 fmt::format("\"step\":{},\"data_wait_s\":{:.6f}", m.step, m.data_wait_s));
  const double compute_s = std::max(0.0, m.step_s - m.data_wait_s - m.comm_wait_s);
  gauge("hyperion_train_step", "optimizer steps completed").set(double(m.step));
  gauge("hyperion_train_step_seconds", "wall time of the last step").set(m.step_s);
  registry_
      .histogram("hyperion_train_step_duration_seconds", "wall time of each step", step_buckets(),
                 labels_)
      .observe(m.step_s);
  gauge("hyperion_train_compute_seconds",
        "last step's time less data wait and exposed communication")
      .set(compute_s);
  gauge("hyperion_train_data_wait_seconds", "last step's time waiting for input")
      .set(m.data_wait_s);
  counter("hyperion_train_data_wait_seconds_total", "time waiting for input").inc(m.data_wait_s);
  gauge("hyperion_train_exposed_communication_seconds",
        "last step's time blocked on collectives (not hidden behind compute)")
      .set(m.comm_wait_s);
  counter("hyperion_train_exposed_communication_seconds_total",
          "time blocked on collectives (not hidden behind compute)")
      .inc(m.comm_wait_s);
  gauge("hyperion_train_tokens_per_second", "the job's tokens per second, last step")
      .set(m.tokens_per_s);
  gauge("hyperion_train_mfu", "model FLOPs utilisation of the last step (0..1)").set(m.mfu);
  gauge("hyperion_train_loss", "training loss of the last step (mean over ranks)").set(m.loss);
  gauge("hyperion_train_grad_norm", "global gradient norm before clipping").set(m.grad_norm);
  gauge("hyperion_train_learning_rate", "learning rate of the last step").set(m.lr);
  if (m.skipped)
    counter("hyperion_train_skipped_steps_total", "updates skipped (non-finite)").inc();
  update_collectives();
  window_.add_step(m.step_s, m.data_wait_s, m.comm_wait_s, m.tokens_per_s);
  if (m.step % t_.log_period == 0) {
    sample_host();
    gather(m.step);
  }
  if (t_.monitor.crash_at_step > 0 && m.step == t_.monitor.crash_at_step && first_attempt_) {
    log_error("crash_at_step={}: rank {} aborts now (fault injection)", m.step, rank_);
    std::abort();
  }
}

void TrainingMonitor::update_collectives() {
  for (int c = 0; c < dist::kNumCollectives; ++c) {
    const dist::CollectiveStats s = comm_.stats(static_cast<dist::Collective>(c));
    dist::CollectiveStats& last = last_collectives_[c];
    if (s.calls == last.calls) continue;
    const monitor::Labels kind = {
        {"collective", dist::collective_name(static_cast<dist::Collective>(c))}};
    counter("hyperion_train_collective_calls_total", "collective calls", kind)
        .inc(double(s.calls - last.calls));
    counter("hyperion_train_collective_seconds_total",
            "time collectives ran (on the communication thread)", kind)
        .inc(std::max(0.0, s.seconds - last.seconds));
    counter("hyperion_train_collective_sent_bytes_total", "payload bytes handed to collectives",
            kind)
        .inc(double(s.bytes_sent - last.bytes_sent));
    counter("hyperion_train_collective_received_bytes_total",
            "payload bytes received from collectives", kind)
        .inc(double(s.bytes_received - last.bytes_received));
    last = s;
  }
}

void TrainingMonitor::sample_host() {
  const monitor::HostStats s = host_sampler_.sample();
  const monitor::HostReading& h = s.now;
  auto set = [&](const char* name, const char* help, double v) {
    if (v >= 0) gauge(name, help).set(v);
  };
  // Counters follow /proc's cumulative values by their increments.
  auto advance = [&](const char* name, const char* help, double now, double last) {
    if (now >= 0 && now >= std::max(last, 0.0)) counter(name, help).inc(now - std::max(last, 0.0));
  };
  advance("process_cpu_seconds_total", "user and system CPU time of this process",
          h.process_cpu_seconds, last_host_.process_cpu_seconds);
  set("hyperion_process_cpu_cores", "cores this process kept busy since the last sample",
      s.process_cpu_fraction);
  set("hyperion_host_cpu_utilization", "fraction of the machine's CPU time busy (0..1)",
      s.machine_cpu_fraction);
  set("process_resident_memory_bytes", "resident set size", double(h.rss_bytes));
  set("hyperion_host_memory_available_bytes", "MemAvailable", double(h.memory_available_bytes));
  advance("hyperion_host_network_receive_bytes_total", "bytes received, every interface but lo",
          double(h.network_receive_bytes), double(last_host_.network_receive_bytes));
  advance("hyperion_host_network_transmit_bytes_total", "bytes sent, every interface but lo",
          double(h.network_transmit_bytes), double(last_host_.network_transmit_bytes));
  advance("hyperion_process_disk_read_bytes_total", "bytes this process read from storage",
          double(h.disk_read_bytes), double(last_host_.disk_read_bytes));
  advance("hyperion_process_disk_write_bytes_total", "bytes this process wrote to storage",
          double(h.disk_write_bytes), double(last_host_.disk_write_bytes));
  set("process_open_fds", "open file descriptors", double(h.open_files));
  last_host_ = h;
  window_.set_host(s.process_cpu_fraction, double(std::max<int64_t>(h.rss_bytes, 0)));
}

void TrainingMonitor::gather(int64_t step) {
  const monitor::RankWindow mine = window_.take();
  std::vector<monitor::RankWindow> all(static_cast<size_t>(world_));
  static_assert(std::is_trivially_copyable_v<monitor::RankWindow>);
  if (world_ > 1)
    comm_.all_gather(&mine, all.data(), sizeof mine);
  else
    all[0] = mine;
  if (rank_ != 0) return;
  const std::vector<monitor::MetricSummary> summary = monitor::summarize(all, t_.monitor.top_n);
  std::vector<monitor::Straggler> now = detector_.update(all);
  for (const monitor::Straggler& s : now) {
    const bool new_one =
        std::none_of(stragglers_.begin(), stragglers_.end(),
                     [&](const monitor::Straggler& o) { return o.rank == s.rank; });
    if (new_one)
      log_warn(
          "straggler: rank {} on {}: {} {:.4f} s/step over the last {} log periods, above "
          "median {:.4f} + 3 MAD (threshold {:.4f}) of the other ranks",
          s.rank, hosts_[static_cast<size_t>(s.rank)], monitor::rank_metric_name(s.metric), s.value,
          s.periods, s.median, s.threshold);
  }
  for (const monitor::Straggler& o : stragglers_)
    if (std::none_of(now.begin(), now.end(),
                     [&](const monitor::Straggler& s) { return s.rank == o.rank; }))
      log_info("straggler: rank {} is back within median + 3 MAD", o.rank);
  for (int r = 0; r < world_; ++r) {
    const bool flagged = std::any_of(now.begin(), now.end(),
                                     [&](const monitor::Straggler& s) { return s.rank == r; });
    monitor::Labels l = labels_;
    l.emplace_back("straggler_rank", std::to_string(r));
    registry_.gauge("hyperion_train_straggler", "1 while rank straggler_rank is a straggler", l)
        .set(flagged ? 1.0 : 0.0);
  }
  gauge("hyperion_train_stragglers", "ranks currently flagged as stragglers")
      .set(double(now.size()));
  stragglers_ = std::move(now);
  if (ranks_out_.is_open()) {
    ranks_out_ << monitor::rank_stats_json(step, monitor::unix_time(), all, hosts_, summary,
                                           stragglers_)
               << '\n';
    ranks_out_.flush();
  }
}

void TrainingMonitor::save_started(int64_t step) {
  if (enabled_) events_->write("checkpoint_save_start", fmt::format("\"step\":{}", step));
}

void TrainingMonitor::save_done(int64_t step, double seconds) {
  if (!enabled_) return;
  events_->write("checkpoint_save_end", fmt::format("\"step\":{}", step));
  watchdog_->heartbeat(step);  // a slow save is progress, not a hang
  gauge("hyperion_train_checkpoint_save_seconds",
        "training-thread seconds blocked by the last checkpoint save")
      .set(seconds);
  counter("hyperion_train_checkpoint_save_seconds_total",
          "training-thread seconds blocked by checkpoint saves")
      .inc(seconds);
  counter("hyperion_train_checkpoints_saved_total", "checkpoints saved").inc();
}

void TrainingMonitor::eval_started() {
  if (enabled_) events_->write("eval_start");
}

void TrainingMonitor::eval_done() {
  if (!enabled_) return;
  events_->write("eval_end");
  watchdog_->heartbeat(watchdog_->last_step());
}

void TrainingMonitor::finished(int64_t step, bool job_end) {
  if (enabled_)
    events_->write(job_end ? "job_end" : "process_end", fmt::format("\"step\":{}", step));
}

}  // namespace hyperion
