// Host statistics a training rank exports (issue 17): the process's and the machine's
// CPU use, resident memory, memory available, network and disk bytes, open files; read
// from /proc, the way node_exporter and the reference dashboards' per-host panels do.
//
// A HostStatsSampler turns two readings into rates: CPU use is the fraction of one core
// (process) or of all cores (machine) busy between samples; bytes are counters (the
// Prometheus way: rates are taken at query time).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace hyperion::monitor {

// One reading. Counters are cumulative since boot (machine) or process start (process);
// a field /proc does not offer here (a missing file, a container without /proc/net) is
// left at -1.
struct HostReading {
  double process_cpu_seconds = -1;      // utime + stime of this process
  double machine_busy_seconds = -1;     // all CPUs, non-idle jiffies
  double machine_total_seconds = -1;    // all CPUs, all jiffies
  int64_t rss_bytes = -1;               // VmRSS
  int64_t memory_available_bytes = -1;  // MemAvailable
  int64_t network_receive_bytes = -1;   // every interface but lo
  int64_t network_transmit_bytes = -1;
  int64_t disk_read_bytes = -1;   // this process (/proc/self/io read_bytes)
  int64_t disk_write_bytes = -1;  // this process (write_bytes)
  int64_t open_files = -1;        // entries of /proc/self/fd
  int cpus = 0;                   // online CPUs
};

// Reads every field it can; never throws (monitoring must not stop a job).
HostReading read_host(const std::string& proc_root = "/proc");

// Rates between consecutive samples.
struct HostStats {
  HostReading now;
  double process_cpu_fraction = 0;  // of one core (2.0 = two cores busy)
  double machine_cpu_fraction = 0;  // of all cores, 0..1
};

class HostStatsSampler {
 public:
  explicit HostStatsSampler(std::string proc_root = "/proc") : root_(std::move(proc_root)) {}
  // A new reading, with rates against the previous one (0 on the first call).
  HostStats sample();

 private:
  std::string root_;
  std::optional<HostReading> last_;
  std::chrono::steady_clock::time_point last_time_;
};

}  // namespace hyperion::monitor
