#include "base/cpu.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>

namespace hyperion {
namespace {

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (__get_cpuid_count(1, 0, &a, &b, &c, &d)) {
    f.fma = (c >> 12) & 1;
    f.f16c = (c >> 29) & 1;
  }
  // OS support for AVX / AVX-512 state (XCR0).
  bool os_avx = false, os_avx512 = false;
  if (__get_cpuid_count(1, 0, &a, &b, &c, &d) && ((c >> 27) & 1)) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    os_avx = (lo & 0x6) == 0x6;
    os_avx512 = (lo & 0xE6) == 0xE6;
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = os_avx && ((b >> 5) & 1);
    f.avx512f = os_avx512 && ((b >> 16) & 1);
    f.avx512bw = os_avx512 && ((b >> 30) & 1);
    f.avx512vl = os_avx512 && ((b >> 31) & 1);
    f.avx512_vnni = os_avx512 && ((c >> 11) & 1);
    f.avx512_fp16 = os_avx512 && ((d >> 23) & 1);
    f.amx_bf16 = (d >> 22) & 1;
    f.amx_tile = (d >> 24) & 1;
    f.amx_int8 = (d >> 25) & 1;
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avx512_bf16 = os_avx512 && ((a >> 5) & 1);
  }
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) f.model_name = line.substr(pos + 2);
      break;
    }
  }
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

bool request_amx() {
  static const bool granted = [] {
    const CpuFeatures& f = cpu_features();
    if (!f.amx_tile) return false;
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

std::string cpu_summary() {
  const CpuFeatures& f = cpu_features();
  std::string s = f.model_name.empty() ? "unknown x86-64" : f.model_name;
  auto add = [&](bool on, const char* name) {
    if (on) {
      s += ' ';
      s += name;
    }
  };
  add(f.avx2, "avx2");
  add(f.avx512f, "avx512f");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx512_vnni, "avx512_vnni");
  add(f.avx512_fp16, "avx512_fp16");
  add(f.amx_bf16, "amx_bf16");
  add(f.amx_int8, "amx_int8");
  return s;
}

}  // namespace hyperion
