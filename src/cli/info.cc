#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdio>

#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "cli/commands.h"

namespace hyperion::cli {

int cmd_info(const Args& args) {
  bool json = false;
  for (const auto& a : args) {
    if (a == "--json")
      json = true;
    else
      fail("info: unknown argument '{}'", a);
  }
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
  if (json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("cpu:      %s\nthreads:  %d of %d cores\noneDNN:   %s\n", cpu_summary().c_str(),
                num_threads(), hardware_cores(), j["onednn_version"].get<std::string>().c_str());
  }
  return 0;
}

}  // namespace hyperion::cli
