// The block dot products on AVX512-VL VNNI (vpdpbusd on 256-bit registers): see
// kernels/block_dot-inl.h.
#include <immintrin.h>

#include "kernels/block_dot.h"

#define HYP_BLOCK_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define HYP_BLOCK_VNNI 1
#define HYP_BLOCK_NS avx512_vnni
#include "kernels/block_dot-inl.h"  // NOLINT(bugprone-suspicious-include)

namespace hyperion::block_impl {
DotKernels avx512_vnni_kernels() {
  return avx512_vnni::kernels();
}
}  // namespace hyperion::block_impl
