// Attention forward (flash-attention-2): one task per (batch, query head, 64-query
// block). The block's queries are packed transposed once; then for each 64-key block
//   S^T = K Q^T            (scores, key-major: 16 queries per vector)
//   online softmax step    (running max and sum per query, P^T = exp2(S^T c - m))
//   O = O * alpha + P V    (O is a 64 x D f32 tile)
// and finally out = O / l, lse = ln(2) * (m + log2 l). Only tiles are ever stored.
#include <algorithm>
#include <cmath>
#include <limits>

#include "base/threads.h"
#include "kernels/attention.h"
#include "kernels/attention_tiles.h"

namespace hyperion {
namespace {

using attn::Dims;
using attn::element;
using attn::element_mut;
using attn::kBk;
using attn::kBq;

void forward_block(const Dims& s, const attn::TileOps& ops, const TensorView& q,
                   const TensorView& k, const TensorView& v, const TensorView& out,
                   const TensorView& lse, int64_t b, int64_t h, int64_t qb, uint64_t call) {
  const int64_t g = h / s.group, dp = s.dp, d = s.d;
  const int64_t q0 = qb * kBq;
  const int qn = static_cast<int>(std::min<int64_t>(kBq, s.tq - q0));
  const float* keys = attn::kv_head(s, k, v, b, g, call);
  const float* values = keys + s.nkb * kBk * dp;
  float* qt = attn::scratch(0, size_t(d * kBq + kBk * kBq + kBq * dp + 2 * kBq));
  float* st = qt + d * kBq;
  float* o = st + kBk * kBq;
  float* m = o + kBq * dp;
  float* l = m + kBq;
  ops.pack_cols(element(q, Dims::at(b, q0, h, s.tq, s.hq, d)), q.dtype, s.hq * d, qn, d, qt);
  std::fill(o, o + kBq * dp, 0.0f);
  std::fill(m, m + kBq, -std::numeric_limits<float>::infinity());
  std::fill(l, l + kBq, 0.0f);
  const float c = s.scale * attn::kLog2e;
  const int64_t blocks = s.key_blocks(qb);
  for (int64_t kb = s.first_key_block(qb); kb < blocks; ++kb) {
    const int64_t k0 = kb * kBk;
    const int kn = static_cast<int>(std::min<int64_t>(kBk, s.tk - k0));
    const attn::BlockMask mask = attn::block_mask(s, q0, k0, kn);
    attn::scores_gemm(ops, kn, d, keys + k0 * dp, dp, qt, st, mask);
    attn::cap_scores(s, st, kn, nullptr);
    attn::window_ops(ops, mask).softmax_step(st, kn, c, mask, m, l, o, static_cast<int>(dp));
    const attn::Skip skip{mask.active ? attn::Skip::kLower : attn::Skip::kNone, mask.diag};
    ops.gemm(qn, static_cast<int>(dp), kn, st, kBq, false, values + k0 * dp, dp, o, dp, true, skip);
  }
  float* lse_row = lse.as<float>() + (b * s.hq + h) * s.tq + q0;
  for (int i = 0; i < qn; ++i) {
    // Every query sees a key (its own), so l >= 1 (the max term contributes exp2(0)).
    attn::store_row(o + i * dp, d, 1.0f / l[i],
                    element_mut(out, Dims::at(b, q0 + i, h, s.tq, s.hq, d)), out.dtype);
    lse_row[i] = (m[i] + std::log2(l[i])) * attn::kLn2;
  }
}

}  // namespace

void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& lse,
                       const AttentionParams& params) {
  const Dims s = attn::check_forward("attention_forward", q, k, v, out, lse, params);
  if (s.empty()) return;
  const attn::TileOps& ops = attn::tile_ops(params.force_portable);
  const uint64_t call = attn::next_call_id();
  parallel_for_dynamic(s.b * s.hq * s.nqb, [&](int64_t task) {
    // Consecutive tasks share a head (and its packed keys and values); within a head the
    // heaviest go first: with a causal mask the last query blocks visit the most keys.
    const int64_t bh = task / s.nqb, qb = s.nqb - 1 - task % s.nqb;
    forward_block(s, ops, q, k, v, out, lse, bh / s.hq, bh % s.hq, qb, call);
  });
}

}  // namespace hyperion
