#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdio>

#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "cli/build_info.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "kernels/cuda/cuda_backend.h"

namespace hyperion::cli {

const CommandSpec kInfoSpec = {"info",
                               "",
                               "CPU features, threads, build and library versions",
                               {{"json", "", "print everything as one JSON object"}},
                               "",
                               "info --json"};

int cmd_info(const Args& args) {
  const Flags flags(kInfoSpec, args);
  HYP_USAGE_CHECK(flags.positional().empty(), "info: unexpected argument '{}'",
                  flags.positional()[0]);
  const bool json = flags.has("json");
  const CpuFeatures& f = cpu_features();
  const dnnl_version_t* v = dnnl_version();
  nlohmann::json j = {
      {"cpu", f.model_name},
      {"threads", num_threads()},
      {"cores", hardware_cores()},
      {"avx512f", f.avx512f},
      {"avx512_bf16", f.avx512_bf16},
      {"avx512_vnni", f.avx512_vnni},
      {"amx_bf16", f.amx_bf16},
      {"amx_int8", f.amx_int8},
      {"onednn_version", fmt::format("{}.{}.{}", v->major, v->minor, v->patch)},
  };
  const BuildInfo& b = build_info();
  j["version"] = b.version;
  j["git_commit"] = b.git_commit;
  j["build_type"] = b.build_type;
  j["compiler"] = b.compiler;
  j["simd_compiled"] = b.simd_compiled;
  j["simd_active"] = b.simd_active;
  for (const auto& [name, version] : b.libraries) j["libraries"][name] = version;
  const CudaStatus& cuda = cuda_status();
  j["cuda_built"] = cuda.built;
  j["gpu_available"] = cuda.available;
  j["gpu"] = cuda.summary;
  if (cuda.available) {
    j["gpu_name"] = cuda.device;
    j["gpu_compute_capability"] = cuda.compute_capability;
    j["gpu_memory_bytes"] = cuda.memory_bytes;
  }
  if (json) {
    print_json(j, -1);
  } else {
    std::printf("cpu:       %s\nthreads:   %d of %d cores\ngpu:       %s\n%s",
                cpu_summary().c_str(), num_threads(), hardware_cores(), cuda.summary.c_str(),
                build_info_text().c_str());
  }
  return 0;
}

}  // namespace hyperion::cli
