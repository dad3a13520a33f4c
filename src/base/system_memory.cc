#include "base/system_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

#include "base/error.h"

namespace hyperion {

namespace {

// A number of bytes with an optional K/M/G/T (binary) suffix; -1 when malformed.
int64_t parse_size(const std::string& text) {
  if (text.empty()) return -1;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return -1;
  }
  double scale = 1;
  if (used < text.size()) {
    if (used + 1 != text.size()) return -1;
    switch (text[used]) {
      case 'K':
      case 'k':
        scale = 1024.0;
        break;
      case 'M':
      case 'm':
        scale = 1024.0 * 1024;
        break;
      case 'G':
      case 'g':
        scale = 1024.0 * 1024 * 1024;
        break;
      case 'T':
      case 't':
        scale = 1024.0 * 1024 * 1024 * 1024;
        break;
      default:
        return -1;
    }
  }
  if (!(v > 0)) return -1;
  // Clamped: converting a double past int64's range is undefined.
  return v * scale >= 9.0e18 ? int64_t{9000000000000000000} : static_cast<int64_t>(v * scale);
}

// The first line of a file as a byte count; -1 when absent or "max".
int64_t read_limit(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line) || line == "max") return -1;
  return parse_size(line);
}

}  // namespace

int64_t machine_memory_bytes() {
  if (const char* env = std::getenv("HYPERION_MEMORY_LIMIT")) {
    const int64_t v = parse_size(env);
    HYP_CHECK(v > 0, "HYPERION_MEMORY_LIMIT: expected bytes (or with a K/M/G/T suffix), got '{}'",
              env);
    return v;
  }
  int64_t bytes = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  for (const char* cgroup :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const int64_t limit = read_limit(cgroup);
    if (limit > 0) bytes = std::min(bytes, limit);  // v1's "no limit" is a huge number
  }
  return bytes;
}

int64_t available_memory_bytes() {
  int64_t bytes = -1;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") {
      bytes = kib * 1024;
      break;
    }
  }
  const struct {
    const char* limit;
    const char* usage;
  } cgroups[] = {{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                 {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                  "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (const auto& cg : cgroups) {
    const int64_t limit = read_limit(cg.limit), usage = read_limit(cg.usage);
    if (limit > 0 && usage >= 0 && limit < (int64_t{1} << 60)) {
      const int64_t left = std::max<int64_t>(0, limit - usage);
      bytes = bytes < 0 ? left : std::min(bytes, left);
    }
  }
  const int64_t machine = machine_memory_bytes();
  return bytes < 0 ? -1 : std::min(bytes, machine);
}

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.1f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

void check_fits_in_memory(int64_t bytes, const std::string& what, const std::string& hint) {
  check_fits_in_memory(bytes, machine_memory_bytes(), "this machine", what, hint);
}

void check_fits_in_memory(int64_t bytes, int64_t have, const std::string& where,
                          const std::string& what, const std::string& hint) {
  if (bytes >= 0 && bytes < kSaturatedBytes && bytes <= have) return;
  if (bytes < 0 || bytes == kSaturatedBytes)
    fail("{} needs more bytes than a 64-bit count holds but {} has {}{}{}", what, where,
         format_bytes(have), hint.empty() ? "" : "; ", hint);
  fail("{} needs {} ({} bytes) but {} has {}{}{}", what, format_bytes(bytes), bytes, where,
       format_bytes(have), hint.empty() ? "" : "; ", hint);
}

}  // namespace hyperion
