#include "base/threads.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/error.h"

namespace hyperion {
namespace {

std::atomic<int> g_threads{0};

// The CPU quota of this process's cgroup in whole CPUs (v2 cpu.max, v1
// cpu.cfs_quota_us / cpu.cfs_period_us), or 0 when there is none.
int cgroup_cpu_quota() {
  double quota = 0, period = 0;
  if (FILE* f = std::fopen("/sys/fs/cgroup/cpu.max", "r")) {
    char q[32] = {0};
    if (std::fscanf(f, "%31s %lf", q, &period) == 2 && std::strcmp(q, "max") != 0)
      quota = std::atof(q);
    std::fclose(f);
  } else if (FILE* fq = std::fopen("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "r")) {
    if (std::fscanf(fq, "%lf", &quota) != 1) quota = 0;
    std::fclose(fq);
    if (FILE* fp = std::fopen("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "r")) {
      if (std::fscanf(fp, "%lf", &period) != 1) period = 0;
      std::fclose(fp);
    }
  }
  if (quota <= 0 || period <= 0) return 0;
  return std::max(1, static_cast<int>(quota / period));
}

}  // namespace

int hardware_cores() {
  // The CPUs this process may run on (its affinity mask, then its cgroup's quota), not
  // the machine's: a spinning OpenMP team larger than that is preempted at every barrier
  // and runs several times slower than a smaller one.
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) n = CPU_COUNT(&set);
  if (const int quota = cgroup_cpu_quota(); quota > 0 && quota < n) n = quota;
  return n > 0 ? static_cast<int>(n) : 1;
}

void set_num_threads(int n) {
  HYP_CHECK(n >= 1 && n <= 4096, "threads: thread count must be between 1 and 4096, got {}", n);
  g_threads.store(n);
  omp_set_num_threads(n);
}

void init_threads() {
  if (g_threads.load() != 0) return;
  int n = hardware_cores();
  if (const char* env = std::getenv("HYPERION_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    HYP_CHECK(end != env && *end == '\0' && v >= 1 && v <= 4096,
              "HYPERION_THREADS: expected an integer between 1 and 4096, got '{}'", env);
    n = static_cast<int>(v);
  }
  set_num_threads(n);
}

void release_thread_pool() {
  if (omp_in_parallel()) return;
  omp_pause_resource_all(omp_pause_soft);
}

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n == 0) {
    init_threads();
    n = g_threads.load();
  }
  return n;
}

}  // namespace hyperion
