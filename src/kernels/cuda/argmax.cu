// argmax_rows (kernels/argmax.h semantics): each row in chunks of kChunk columns, a block
// per (chunk, row): each thread keeps its best (value, index) over a strided pass, the
// block merges them, then one warp per row merges the chunks' bests; ties to the lower
// index, -1 for a row holding a NaN or nothing above -inf. Chunks put a decode step's
// one row (a vocabulary of 32k to 256k logits) on many multiprocessors: one block per row
// took 32 us of a 1.2 ms step.
#include "kernels/cuda/device_util.cuh"

namespace hyperion::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 4096;

__device__ __forceinline__ bool better(float v, int32_t i, float bv, int32_t bi) {
  return bi < 0 || v > bv || (v == bv && i < bi);
}

// Grid (chunks, rows): the best of columns [chunk * kChunk, ...) of each row into
// pv / pi [rows, chunks], and whether the chunk holds a NaN into pnan.
__global__ void argmax_chunk_kernel(const float* x, int64_t n, int64_t chunks, float* pv,
                                    int32_t* pi, int32_t* pnan) {
  __shared__ float sv[kThreads];
  __shared__ int32_t si[kThreads];
  __shared__ int nan;
  if (threadIdx.x == 0) nan = 0;
  __syncthreads();
  const float* row = x + int64_t(blockIdx.y) * n;
  const int64_t begin = int64_t(blockIdx.x) * kChunk;
  const int64_t end = begin + kChunk < n ? begin + kChunk : n;
  float bv = -INFINITY;
  int32_t bi = -1;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const float v = row[j];
    if (v != v) nan = 1;  // any thread's store of 1 is the same
    if (v > -INFINITY && better(v, static_cast<int32_t>(j), bv, bi)) {
      bv = v;
      bi = static_cast<int32_t>(j);
    }
  }
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) {
      const float v = sv[threadIdx.x + w];
      const int32_t i = si[threadIdx.x + w];
      if (i >= 0 && better(v, i, sv[threadIdx.x], si[threadIdx.x])) {
        sv[threadIdx.x] = v;
        si[threadIdx.x] = i;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int64_t at = int64_t(blockIdx.y) * chunks + blockIdx.x;
    pv[at] = sv[0];
    pi[at] = si[0];
    pnan[at] = nan;
  }
}

// One warp per row: the chunks' bests, in any order (the rule picks the same one).
__global__ void argmax_merge_kernel(const float* pv, const int32_t* pi, const int32_t* pnan,
                                    int64_t rows, int64_t chunks, int32_t* out) {
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= rows) return;
  float bv = -INFINITY;
  int32_t bi = -1;
  int nan = 0;
  for (int64_t c = lane; c < chunks; c += 32) {
    const int64_t at = r * chunks + c;
    nan |= pnan[at];
    if (pi[at] >= 0 && better(pv[at], pi[at], bv, bi)) {
      bv = pv[at];
      bi = pi[at];
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t i = __shfl_xor_sync(0xffffffffu, bi, o);
    nan |= __shfl_xor_sync(0xffffffffu, nan, o);
    if (i >= 0 && better(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  if (lane == 0) out[r] = nan ? -1 : bi;
}

}  // namespace

int64_t argmax_scratch_bytes(int64_t rows, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  return rows * (chunks > 0 ? chunks : 1) * 12;
}

void argmax_rows(cudaStream_t s, const float* x, int64_t rows, int64_t n, int32_t* out,
                 void* scratch) {
  if (rows == 0) return;
  const int64_t chunks = n > 0 ? (n + kChunk - 1) / kChunk : 1;
  auto* pv = static_cast<float*>(scratch);
  auto* pi = reinterpret_cast<int32_t*>(pv + rows * chunks);
  int32_t* pnan = pi + rows * chunks;
  for (int64_t r0 = 0; r0 < rows; r0 += 65535) {  // rows go on the grid's y
    const int64_t rn = rows - r0 < 65535 ? rows - r0 : 65535;
    argmax_chunk_kernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(rn)),
                          kThreads, 0, s>>>(x + r0 * n, n, chunks, pv + r0 * chunks,
                                            pi + r0 * chunks, pnan + r0 * chunks);
  }
  argmax_merge_kernel<<<static_cast<unsigned>((rows + 3) / 4), 128, 0, s>>>(pv, pi, pnan, rows,
                                                                           chunks, out);
}

}  // namespace hyperion::cuda
