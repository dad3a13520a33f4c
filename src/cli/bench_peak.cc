#include <nlohmann/json.hpp>

#include <cstdio>

#include "base/cpu.h"
#include "base/error.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "kernels/peak.h"

namespace hyperion::cli {

const CommandSpec kBenchPeakSpec = {
    "bench peak",
    "",
    "measure this machine's peak f32/bf16/int8 FLOP/s and memory bandwidth",
    {{"seconds", "S", "time per measurement, in (0, 60) (default 0.5)"},
     {"json", "", "print the figures as one JSON object"}},
    "Every other benchmark reports its throughput as a ratio to these figures.",
    "bench peak --json"};

int cmd_bench_peak(const Args& args) {
  const Flags f(kBenchPeakSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "bench peak: unexpected argument '{}'",
                  f.positional()[0]);
  const bool json = f.has("json");
  const double seconds = f.number("seconds", 0.5);
  HYP_USAGE_CHECK(seconds > 0 && seconds < 60, "bench peak: --seconds must be in (0, 60)");
  PeakResult r = measure_peak(seconds);
  if (json) {
    nlohmann::json j = {{"threads", r.threads},
                        {"cpu", cpu_features().model_name},
                        {"f32_gflops", r.f32_gflops},
                        {"bf16_gflops", r.bf16_gflops},
                        {"bf16_isa", r.bf16_isa},
                        {"bf16_avx512_gflops", r.bf16_avx512_gflops},
                        {"int8_gops", r.int8_gops},
                        {"int8_isa", r.int8_isa},
                        {"int8_vnni_gops", r.int8_vnni_gops},
                        {"mem_gbps", r.mem_gbps},
                        {"copy_gbps", r.copy_gbps},
                        {"triad_gbps", r.triad_gbps},
                        {"read_gbps", r.read_gbps},
                        {"update_gbps", r.update_gbps}};
    print_json(j, -1);
    return 0;
  }
  std::printf("machine: %s, %d threads\n", cpu_summary().c_str(), r.threads);
  std::printf("f32   FMA          %10.1f GFLOP/s\n", r.f32_gflops);
  std::printf("bf16  %-12s %10.1f GFLOP/s", r.bf16_isa.c_str(), r.bf16_gflops);
  if (r.bf16_avx512_gflops > 0 && r.bf16_isa != "avx512_bf16")
    std::printf("   (avx512_bf16: %.1f)", r.bf16_avx512_gflops);
  std::printf("\nint8  %-12s %10.1f GOP/s", r.int8_isa.c_str(), r.int8_gops);
  if (r.int8_vnni_gops > 0 && r.int8_isa != "avx512_vnni")
    std::printf("   (avx512_vnni: %.1f)", r.int8_vnni_gops);
  std::printf(
      "\nmemory             %10.1f GB/s   (copy %.1f, triad %.1f, read %.1f, update %.1f)\n",
      r.mem_gbps, r.copy_gbps, r.triad_gbps, r.read_gbps, r.update_gbps);
  return 0;
}

}  // namespace hyperion::cli
