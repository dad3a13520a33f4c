// The one threading model of a hyperion process: OpenMP. oneDNN (the GEMM library)
// is built on the same OpenMP runtime, so kernels, GEMM and everything else share one
// pool of `num_threads()` workers and never oversubscribe the cores.
//
// Thread count: --threads on the CLI, else HYPERION_THREADS, else the CPUs this process
// may use (hardware_cores(): online CPUs, narrowed by the affinity mask and the cgroup's
// CPU quota).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace hyperion {

// Reads HYPERION_THREADS (or uses the core count) and configures the pool. Idempotent;
// called by the CLI at start-up and lazily by num_threads().
void init_threads();
void set_num_threads(int n);
int num_threads();
int hardware_cores();
// Ends the calling thread's OpenMP team (its idle workers exit). OpenMP keeps one team
// per thread that starts parallel regions, and libgomp counts the workers of every team:
// once they outnumber the cores it stops spin-waiting at barriers, so every parallel
// region then costs a futex sleep and wake-up per worker (130 per decode step of a small
// model). A thread that hands all parallel work to another (serve: the main thread after
// loading the model, before the engine thread steps) calls this so one team remains.
// Must not be called inside a parallel region; a later region builds a new team.
void release_thread_pool();

// Every parallel region asks for the whole pool (num_threads()), whatever its work: a
// region with fewer chunks than workers leaves the rest idle rather than asking for a
// smaller team. When a region asks for fewer workers than the last, libgomp ends the
// surplus threads, and the next larger region creates them again: a decode step of a small
// model opens ~130 regions whose natural sizes differ (8 heads, a few rows, 16 GEMV
// slices), which at 16 threads made 64 thread creations per step (docs/PERFORMANCE.md,
// issue 20, "Threads"). PyTorch's at::parallel_for works around the same libgomp
// behaviour the same way.

// Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `grain`
// items, one chunk per worker. Runs inline when there is one chunk or we are already
// inside a parallel region (no nested pools).
template <typename Fn>
void parallel_chunks(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  // floor(n / grain) chunks, so each chunk holds at least `grain` items.
  const int64_t max_chunks = std::max<int64_t>(n / grain, 1);
  const int pool = num_threads();
  if (std::min<int64_t>(pool, max_chunks) <= 1 || omp_in_parallel()) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(pool)
  {
    // Split by the team OpenMP actually granted (it may give fewer threads than asked,
    // e.g. under OMP_THREAD_LIMIT or OMP_DYNAMIC), so no range is ever skipped.
    const int64_t chunks = std::min<int64_t>(omp_get_num_threads(), max_chunks);
    const int64_t t = omp_get_thread_num();
    if (t < chunks) {
      const int64_t begin = n * t / chunks, end = n * (t + 1) / chunks;
      if (begin < end) fn(begin, end);
    }
  }
}

// Runs fn(i) for each i in [0, n), dynamically scheduled: for uneven work items
// (attention rows of different causal length, experts of different size).
template <typename Fn>
void parallel_for_dynamic(int64_t n, Fn&& fn) {
  if (n <= 0) return;
  const int pool = num_threads();
  if (std::min<int64_t>(pool, n) <= 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(pool)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace hyperion
