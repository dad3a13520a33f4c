// hyperion bench kernels: achieved FLOP/s or GB/s of every kernel, as a ratio to the
// machine peak measured in the same process (`bench peak`).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/timer.h"
#include "cases/bench_registry.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "kernels/peak.h"

namespace hyperion::cli {

using bench::all_kernel_benches;
using bench::Bound;
using bench::bound_name;
using bench::KernelBench;

struct Timing {
  double best;    // fastest call: the kernel's capability, comparable with the best-burst peak
  double median;  // typical call on this (possibly shared) machine
};

Timing time_calls(const std::function<void()>& fn, double min_seconds) {
  fn();  // warm-up: primitive creation, page faults, caches
  std::vector<double> times;
  Timer total;
  while (times.size() < 5 || (total.seconds() < min_seconds && times.size() < 1000)) {
    Timer t;
    fn();
    times.push_back(t.seconds());
  }
  std::sort(times.begin(), times.end());
  return {times.front(), times[times.size() / 2]};
}

const CommandSpec kBenchKernelsSpec = {
    "bench kernels",
    "",
    "time every kernel (best and median call) as a ratio to the machine's peak",
    {{"filter", "SUBSTRING", "only the kernels whose name contains SUBSTRING"},
     {"seconds", "S", "time per kernel, in (0, 60) (default 0.3)"},
     {"json", "", "print the figures as one JSON object"}},
    "",
    "bench kernels --filter gemm --json"};

int cmd_bench_kernels(const Args& args) {
  const Flags f(kBenchKernelsSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "bench kernels: unexpected argument '{}'",
                  f.positional()[0]);
  const bool json = f.has("json");
  const std::string filter = f.nonempty("filter");
  const double seconds = f.number("seconds", 0.3);
  HYP_USAGE_CHECK(seconds > 0 && seconds < 60, "bench kernels: --seconds must be in (0, 60)");
  // A longer peak run than the default: on a shared host the best burst needs samples.
  const PeakResult peak = measure_peak(std::min(4 * seconds, 1.0));
  std::vector<KernelBench> cases = all_kernel_benches();
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    std::printf(
        "peak: f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s (%s), int8 %.1f GOP/s (%s), memory %.1f GB/s, "
        "%d threads\n",
        peak.f32_gflops, peak.bf16_gflops, peak.bf16_isa.c_str(), peak.int8_gops,
        peak.int8_isa.c_str(), peak.mem_gbps, peak.threads);
    std::printf("%-36s %16s %8s %7s %8s %7s %12s\n", "kernel", "best", "peak", "ratio", "median",
                "ratio", "median time");
  }
  int ran = 0;
  for (auto& c : cases) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    ++ran;
    auto state = c.setup();
    if (!state) {  // needs what this CPU lacks (AMX)
      if (json) {
        out.push_back({{"name", c.name}, {"bound", bound_name(c.bound)}, {"skipped", true}});
      } else {
        std::printf("%-36s %16s\n", c.name.c_str(), "not run: this CPU lacks it");
      }
      continue;
    }
    const Timing t = time_calls([&] { state->run(); }, seconds);
    const double work = c.bound == Bound::kMemory ? c.bytes : c.flops;
    const double achieved = work / t.best / 1e9, achieved_median = work / t.median / 1e9;
    double denom = peak.int8_gops;
    const char* unit = "GOP/s";
    if (c.bound == Bound::kMemory) {
      denom = peak.mem_gbps;
      unit = "GB/s";
    } else if (c.bound == Bound::kF32) {
      denom = peak.f32_gflops;
      unit = "GFLOP/s";
    } else if (c.bound == Bound::kBF16) {
      denom = peak.bf16_gflops;
      unit = "GFLOP/s";
    }
    const double ratio = denom > 0 ? achieved / denom : 0;
    const double ratio_median = denom > 0 ? achieved_median / denom : 0;
    if (json) {
      out.push_back({{"name", c.name},
                     {"bound", bound_name(c.bound)},
                     {"unit", unit},
                     {"achieved", achieved},
                     {"achieved_median", achieved_median},
                     {"peak", denom},
                     {"ratio", ratio},
                     {"ratio_median", ratio_median},
                     {"seconds", t.best},
                     {"seconds_median", t.median},
                     {"flops", c.flops},
                     {"bytes", c.bytes}});
    } else {
      std::printf("%-36s %8.1f %-7s %8.1f %6.1f%% %8.1f %6.1f%% %9.3f ms\n", c.name.c_str(),
                  achieved, unit, denom, 100 * ratio, achieved_median, 100 * ratio_median,
                  t.median * 1e3);
      std::fflush(stdout);
    }
  }
  HYP_USAGE_CHECK(ran > 0, "bench kernels: no benchmark matches --filter '{}'", filter);
  if (json) {
    nlohmann::json j = {{"peak",
                         {{"threads", peak.threads},
                          {"f32_gflops", peak.f32_gflops},
                          {"bf16_gflops", peak.bf16_gflops},
                          {"bf16_isa", peak.bf16_isa},
                          {"int8_gops", peak.int8_gops},
                          {"int8_isa", peak.int8_isa},
                          {"mem_gbps", peak.mem_gbps}}},
                        {"kernels", out}};
    print_json(j, -1);
  }
  return 0;
}

}  // namespace hyperion::cli
