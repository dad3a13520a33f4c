// The block dot products on AVX2 (vpmaddubsw + vpmaddwd): see kernels/block_dot-inl.h.
#include <immintrin.h>

#include "kernels/block_dot.h"

#define HYP_BLOCK_TARGET __attribute__((target("avx2,fma,f16c")))
#define HYP_BLOCK_VNNI 0
#define HYP_BLOCK_NS avx2
#include "kernels/block_dot-inl.h"  // NOLINT(bugprone-suspicious-include)

namespace hyperion::block_impl {
DotKernels avx2_kernels() {
  return avx2::kernels();
}
}  // namespace hyperion::block_impl
