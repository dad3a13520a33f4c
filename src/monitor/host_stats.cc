#include "monitor/host_stats.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace hyperion::monitor {
namespace {

bool read_text(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

// The value after "key:" in a "key: value [kB]" file (status, meminfo, io), in bytes
// when the unit is kB; -1 when absent.
int64_t keyed_value(const std::string& text, const std::string& key) {
  size_t at = 0;
  while ((at = text.find(key, at)) != std::string::npos) {
    if ((at == 0 || text[at - 1] == '\n') && text.compare(at + key.size(), 1, ":") == 0) {
      long long v = 0;
      char unit[8] = {0};
      const int n = std::sscanf(text.c_str() + at + key.size() + 1, "%lld %7s", &v, unit);
      if (n < 1) return -1;
      return n == 2 && std::string(unit) == "kB" ? v * 1024 : v;
    }
    at += key.size();
  }
  return -1;
}

}  // namespace

HostReading read_host(const std::string& proc_root) {
  HostReading r;
  const long ticks = sysconf(_SC_CLK_TCK);
  const double tick = ticks > 0 ? 1.0 / static_cast<double>(ticks) : 0.01;
  r.cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  std::string text;
  // /proc/self/stat: fields 14 and 15 (utime, stime) after the parenthesised name, which
  // may itself hold spaces and parentheses: parse from the last ')'.
  if (read_text(proc_root + "/self/stat", &text)) {
    const size_t close = text.rfind(')');
    if (close != std::string::npos) {
      std::istringstream in(text.substr(close + 2));
      std::vector<std::string> f;
      std::string tok;
      while (in >> tok) f.push_back(tok);
      // After ')': state is field 3, so utime (14) and stime (15) are f[11] and f[12].
      if (f.size() > 12) r.process_cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) * tick;
    }
  }
  if (read_text(proc_root + "/stat", &text) && text.rfind("cpu ", 0) == 0) {
    std::istringstream in(text.substr(4));
    double v = 0, total = 0, idle = 0;
    for (int i = 0; i < 10 && in >> v; ++i) {
      total += v;
      if (i == 3 || i == 4) idle += v;  // idle, iowait
    }
    r.machine_total_seconds = total * tick;
    r.machine_busy_seconds = (total - idle) * tick;
  }
  if (read_text(proc_root + "/self/status", &text)) r.rss_bytes = keyed_value(text, "VmRSS");
  if (read_text(proc_root + "/meminfo", &text))
    r.memory_available_bytes = keyed_value(text, "MemAvailable");
  if (read_text(proc_root + "/self/io", &text)) {
    r.disk_read_bytes = keyed_value(text, "read_bytes");
    r.disk_write_bytes = keyed_value(text, "write_bytes");
  }
  if (read_text(proc_root + "/net/dev", &text)) {
    std::istringstream in(text);
    std::string line;
    int64_t rx = 0, tx = 0;
    bool any = false;
    while (std::getline(in, line)) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;  // the two header lines
      std::string name = line.substr(0, colon);
      name.erase(0, name.find_first_not_of(' '));
      if (name == "lo") continue;
      std::istringstream f(line.substr(colon + 1));
      long long v[9] = {0};
      for (long long& x : v) f >> x;
      rx += v[0];
      tx += v[8];
      any = true;
    }
    if (any) {
      r.network_receive_bytes = rx;
      r.network_transmit_bytes = tx;
    }
  }
  std::error_code ec;
  int64_t fds = 0;
  for (std::filesystem::directory_iterator it(proc_root + "/self/fd", ec), end; !ec && it != end;
       it.increment(ec))
    ++fds;
  if (!ec) r.open_files = fds;
  return r;
}

HostStats HostStatsSampler::sample() {
  HostStats s;
  s.now = read_host(root_);
  const auto t = std::chrono::steady_clock::now();
  if (last_) {
    const double wall = std::chrono::duration<double>(t - last_time_).count();
    if (wall > 0 && s.now.process_cpu_seconds >= 0 && last_->process_cpu_seconds >= 0)
      s.process_cpu_fraction = (s.now.process_cpu_seconds - last_->process_cpu_seconds) / wall;
    const double total = s.now.machine_total_seconds - last_->machine_total_seconds;
    // Clamped: busy and total are separate sums of scaled ticks, so an interval with no
    // idle tick can round to a hair above 1.
    if (total > 0)
      s.machine_cpu_fraction =
          std::clamp((s.now.machine_busy_seconds - last_->machine_busy_seconds) / total, 0.0, 1.0);
  }
  last_ = s.now;
  last_time_ = t;
  return s;
}

}  // namespace hyperion::monitor
