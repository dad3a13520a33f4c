// CPU feature detection. Kernels dispatch on these at run time, so one binary runs on
// any x86-64 and uses AVX-512, AVX512-BF16, VNNI or AMX where the machine has them.
#pragma once

#include <string>

namespace hyperion {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
  bool avx512_fp16 = false;
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_int8 = false;
  std::string model_name;
};

const CpuFeatures& cpu_features();

// Asks the kernel for permission to use AMX tile data (Linux >= 5.16). Returns true if
// AMX may be used by this process.
bool request_amx();

// One-line summary, e.g. "Intel(R) Xeon(R) ... avx512f avx512_bf16 amx_bf16".
std::string cpu_summary();

}  // namespace hyperion
