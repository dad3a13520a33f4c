// Internals of the attention kernels (attention_*.cc): argument checks, tile packing and
// the tile operations that carry all the arithmetic. Not a public API.
//
// Tile layouts (f32, 64-byte aligned, Dp = D rounded up to 16):
//   natural  [rows x Dp]   row r = token r of the block, zero beyond D
//   transposed [D x kBq]   column i = query i of the block, zero beyond the valid queries
//   scores  st[j * kBq + i] key j, query i: scores are kept key-major so that one vector
//                          holds 16 queries and the softmax row statistics (max, sum,
//                          lse, rowsum(dO*O)) are lane-wise, not horizontal reductions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/attention.h"
#include "tensor/tensor.h"

namespace hyperion::attn {

inline constexpr int kBq = 64;  // queries per block: 4 AVX-512 vectors
inline constexpr int kBk = 64;  // keys per block
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

struct Dims {
  int64_t b = 0, tq = 0, tk = 0, hq = 0, hkv = 0, d = 0;
  int64_t dp = 0;      // d rounded up to 16
  int64_t group = 1;   // hq / hkv
  int64_t offset = 0;  // tk - tq: absolute position of query 0
  int64_t nqb = 0, nkb = 0;
  bool causal = true;
  int64_t window = 0;  // > 0: sliding window (see AttentionParams)
  float scale = 1.0f;
  float softcap = 0.0f;  // > 0: capped scores (see AttentionParams)
  bool empty() const { return b == 0 || tq == 0 || hq == 0; }
  // Element offset of (batch, token, head) in a token-major [B, T, H, D] tensor.
  static int64_t at(int64_t bi, int64_t t, int64_t h, int64_t tlen, int64_t heads, int64_t d) {
    return ((bi * tlen + t) * heads + h) * d;
  }
  // Key blocks query block qb has to visit: [first_key_block, key_blocks) (causal blocks
  // stop at the diagonal; a sliding window starts at its oldest position).
  int64_t key_blocks(int64_t qb) const;
  int64_t first_key_block(int64_t qb) const;
  // Query blocks that see key block kb: [first_query_block, end_query_block).
  int64_t first_query_block(int64_t kb) const;
  int64_t end_query_block(int64_t kb) const;
};

Dims check_forward(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const TensorView& lse, const AttentionParams& params);
Dims check_backward(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const TensorView& dout, const TensorView& lse,
                    const TensorView& dq, const TensorView& dk, const TensorView& dv,
                    const AttentionParams& params);

// Which (key j, query i) pairs of a block are visible. Inactive: all of them (j < kn).
// Padded queries (i >= the block's valid count) are never masked: their results are
// finite and never read.
struct BlockMask {
  bool active = false;
  int64_t diag = 0;  // causal: visible iff j - i <= diag
  // A sliding window's edge crosses the block: also visible only iff j - i > window_diag.
  // Such blocks run the portable tile steps (window_ops), the only ones that read it.
  bool windowed = false;
  int64_t window_diag = 0;
};
BlockMask block_mask(const Dims& s, int64_t q0, int64_t k0, int kn);

// Contraction ranges of the products over a causal diagonal block: the masked pairs of P
// and dS are exactly 0, so the rows of a register block need only part of the k range.
struct Skip {
  enum Kind : uint8_t { kNone, kLower, kUpper } kind = kNone;
  int64_t diag = 0;
  // kLower: row r uses k <= r + diag (rows are queries, k runs over keys: P V, dS K).
  // kUpper: row r uses k >= r - diag (rows are keys, k runs over queries: P^T dO, dS^T Q).
};

struct TileOps {
  // C[m x n] (+)= A[m x k] * B[k x n]; B, C row-major with leading dims ldb, ldc; n is a
  // multiple of 16. A(r, c) = a[r * lda + c] if a_rows, else a[c * lda + r].
  void (*gemm)(int m, int n, int k, const float* a, int64_t lda, bool a_rows, const float* b,
               int64_t ldb, float* c, int64_t ldc, bool accumulate, Skip skip);
  // Forward online-softmax step over one key block. st holds raw scores q.k for kn keys;
  // c = scale * log2(e). Updates the running max m (log2 units) and sum l of the kBq
  // queries, rescales the kBq x dp output accumulator o, and overwrites st with P^T.
  void (*softmax_step)(float* st, int kn, float c, const BlockMask& mask, float* m, float* l,
                       float* o, int dp);
  // Backward: st (scores) becomes P^T = exp2(st * c - lse2), dpt (dO.v) becomes
  // dS^T * scale = P^T * (dpt - delta) * scale; masked pairs are 0.
  void (*probs_and_grad)(float* st, float* dpt, int kn, float c, float scale, const float* lse2,
                         const float* delta, const BlockMask& mask);
  // Transposed tile from token-major rows (row_stride elements apart, f32 or bf16):
  // dst[c * kBq + r] = row r element c for c < d; zero for n <= r < kBq.
  void (*pack_cols)(const void* src, DType dtype, int64_t row_stride, int n, int64_t d, float* dst);
};

// The contraction range [begin, end) of the register block of rows [r0, r0 + rows).
inline void skip_range(const Skip& skip, int64_t r0, int rows, int k, int* begin, int* end) {
  int64_t b = 0, e = k;
  if (skip.kind == Skip::kLower) e = std::min<int64_t>(k, r0 + rows + skip.diag);
  if (skip.kind == Skip::kUpper) b = std::max<int64_t>(0, r0 - skip.diag);
  *begin = static_cast<int>(std::min<int64_t>(b, k));
  *end = static_cast<int>(std::max<int64_t>(e, *begin));
}

const TileOps& tile_ops(bool force_portable);
// The ops for a block with this mask: `ops`, or the portable ones on a window's edge.
const TileOps& window_ops(const TileOps& ops, const BlockMask& mask);
const TileOps& avx512_tile_ops();
const TileOps& portable_tile_ops();

// Per-thread scratch, grown on demand and kept: slot 0 for tiles, slot 1 for larger
// per-task accumulators. 64-byte aligned.
float* scratch(int slot, size_t floats);

// Tile packing from token-major rows (row_stride elements apart, f32 or bf16).
// pack_rows: dst[r * dp + c] = src row r, c < d; zero for d <= c < dp.
void pack_rows(const void* src, DType dtype, int64_t row_stride, int n, int64_t d, float* dst,
               int64_t dp);
// Portable pack_cols (see TileOps).
void pack_cols(const void* src, DType dtype, int64_t row_stride, int n, int64_t d, float* dst);
// Keys then values of kv head g of batch b as f32 tiles [nkb * kBk x Dp] each (zero
// padded), packed once and cached per thread: consecutive tasks of one kernel call (`call`,
// from next_call_id) on the same head reuse them. Packed rows are contiguous, unlike the
// token-major inputs, whose row stride (H * D elements, e.g. 2 KiB) maps all rows of a
// tile onto a few L1 sets.
const float* kv_head(const Dims& s, const TensorView& k, const TensorView& v, int64_t b, int64_t g,
                     uint64_t call);
uint64_t next_call_id();
// dst[c] = src[c] * mul for c < d, converted to dtype.
void store_row(const float* src, int64_t d, float mul, void* dst, DType dtype);

// Scores S^T[kn x kBq] = A[kn x d] (rows lda apart) * Bt[d x kBq] into st. On a causal
// diagonal block, each group of 16 keys starts at the first 16-query vector any of them
// sees; the skipped entries keep stale values, which the masked steps never use.
void scores_gemm(const TileOps& ops, int kn, int64_t d, const float* a, int64_t lda,
                 const float* bt, float* st, const BlockMask& mask);

// Soft-capping of a score tile of kn keys (raw dot products, the units the softmax steps
// take): st <- (cap / scale) tanh(scale st / cap), so that scale * st is the capped score;
// dcap (the backward's) <- 1 - tanh^2 when not null. A no-op without a cap.
void cap_scores(const Dims& s, float* st, int kn, float* dcap);

// Address of element `offset` of t, whatever its dtype.
inline const void* element(const TensorView& t, int64_t offset) {
  return static_cast<const char*>(t.data) + offset * int64_t(dtype_size(t.dtype));
}
inline void* element_mut(const TensorView& t, int64_t offset) {
  return static_cast<char*>(t.data) + offset * int64_t(dtype_size(t.dtype));
}

inline size_t round_up16(size_t n) {
  return (n + 15) / 16 * 16;
}

}  // namespace hyperion::attn
