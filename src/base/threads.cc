#include "base/threads.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "base/error.h"

namespace hyperion {
namespace {
std::atomic<int> g_threads{0};
}

int hardware_cores() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
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
