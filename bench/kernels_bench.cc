// Google Benchmark front end for every case of `hyperion bench kernels` (the same
// registry), reporting FLOP/s or bytes/s counters. Use --benchmark_filter to pick.
#include <benchmark/benchmark.h>

#include "cases/bench_registry.h"

namespace {

int register_all() {
  using hyperion::bench::Bound;
  static std::vector<hyperion::bench::KernelBench> cases = hyperion::bench::all_kernel_benches();
  for (const auto& c : cases) {
    if (c.name.rfind("gemm_", 0) == 0) continue;  // covered with more shapes in gemm_bench.cc
    benchmark::RegisterBenchmark(("kernel/" + c.name).c_str(),
                                 [&c](benchmark::State& state) {
                                   auto s = c.setup();
                                   if (!s) {
                                     state.SkipWithError("this CPU lacks what the case needs");
                                     return;
                                   }
                                   for (auto _ : state) s->run();
                                   if (c.bound == Bound::kMemory) {
                                     state.counters["bytes/s"] = benchmark::Counter(
                                         c.bytes, benchmark::Counter::kIsIterationInvariantRate);
                                   } else {
                                     state.counters["FLOP/s"] = benchmark::Counter(
                                         c.flops, benchmark::Counter::kIsIterationInvariantRate);
                                   }
                                 })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  return 0;
}

const int registered = register_all();

}  // namespace
