#include "monitor/host_stats.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace hyperion::monitor {
namespace {

namespace fs = std::filesystem;

// This process's own /proc: every field is there and plausible.
TEST(HostStats, ReadsThisProcess) {
  const HostReading r = read_host();
  EXPECT_GT(r.cpus, 0);
  EXPECT_GE(r.process_cpu_seconds, 0);
  EXPECT_GT(r.machine_total_seconds, r.machine_busy_seconds);
  EXPECT_GT(r.rss_bytes, 1 << 20);  // the test binary alone is megabytes
  EXPECT_GT(r.memory_available_bytes, 0);
  EXPECT_GE(r.disk_read_bytes, -1);
  // stdin, stdout, stderr and the directory being listed at least.
  EXPECT_GE(r.open_files, 3);
  // Opening a file shows up.
  const int64_t before = read_host().open_files;
  std::FILE* f = std::fopen("/proc/self/stat", "r");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(read_host().open_files, before + 1);
  std::fclose(f);
}

// Busy work between samples shows in this process's CPU time and use. The loop runs
// until the process has used 100 ms of CPU (std::clock), however loaded the machine is,
// so the check does not depend on scheduling; /proc counts in clock ticks (10 ms).
TEST(HostStats, SamplerTurnsReadingsIntoRates) {
  HostStatsSampler s;
  const HostStats first = s.sample();
  EXPECT_EQ(first.process_cpu_fraction, 0.0);  // first call: no interval yet
  const std::clock_t until = std::clock() + CLOCKS_PER_SEC / 10;
  volatile double x = 0;
  while (std::clock() < until) x = x + 1.0;
  const HostStats st = s.sample();
  EXPECT_GE(st.now.process_cpu_seconds - first.now.process_cpu_seconds, 0.08);
  EXPECT_GT(st.process_cpu_fraction, 0.0);
  EXPECT_LE(st.process_cpu_fraction, st.now.cpus + 0.1);  // at most every core
  EXPECT_GE(st.machine_cpu_fraction, 0.0);
  EXPECT_LE(st.machine_cpu_fraction, 1.0);
}

// A /proc without some files (a container, another OS layout) gives -1 for those fields,
// never an exception; values are parsed from fixture files with odd process names.
TEST(HostStats, MissingAndFixtureFiles) {
  const fs::path root = fs::temp_directory_path() / ("hyperion_proc_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "self" / "fd");
  const HostReading empty = read_host(root.string());
  EXPECT_EQ(empty.rss_bytes, -1);
  EXPECT_EQ(empty.process_cpu_seconds, -1);
  EXPECT_EQ(empty.network_receive_bytes, -1);
  EXPECT_EQ(empty.open_files, 0);
  auto write = [&](const fs::path& p, const std::string& text) { std::ofstream(p) << text; };
  // A process name with spaces and a ')' (comm may hold anything).
  write(root / "self" / "stat",
        "42 (my (odd) name) R 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 100 1000 10\n");
  write(root / "self" / "status", "Name:\tx\nVmRSS:\t  2048 kB\nThreads:\t3\n");
  write(root / "meminfo", "MemTotal: 100 kB\nMemAvailable:   64 kB\n");
  write(root / "self" / "io", "rchar: 1\nread_bytes: 4096\nwrite_bytes: 8192\n");
  fs::create_directories(root / "net");
  write(root / "net" / "dev",
        "Inter-|   Receive\n face |bytes packets\n    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n"
        "  eth0: 100 1 0 0 0 0 0 0 7 1 0 0 0 0 0 0\n  eth1: 20 1 0 0 0 0 0 0 3 1 0 0 0 0 0 0\n");
  write(root / "self" / "fd" / "0", "");
  const HostReading r = read_host(root.string());
  const double tick = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  EXPECT_DOUBLE_EQ(r.process_cpu_seconds, 300 * tick);  // utime 250 + stime 50
  EXPECT_EQ(r.rss_bytes, 2048 * 1024);
  EXPECT_EQ(r.memory_available_bytes, 64 * 1024);
  EXPECT_EQ(r.disk_read_bytes, 4096);
  EXPECT_EQ(r.disk_write_bytes, 8192);
  EXPECT_EQ(r.network_receive_bytes, 120);  // lo excluded
  EXPECT_EQ(r.network_transmit_bytes, 10);
  EXPECT_EQ(r.open_files, 1);
  fs::remove_all(root);
}

}  // namespace
}  // namespace hyperion::monitor
