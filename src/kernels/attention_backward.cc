// Attention backward (flash-attention-2). With delta_i = rowsum(dO_i * O_i) precomputed,
// each (64-query, 64-key) block pair recomputes, in the key-major layout of the forward,
//   S^T = K Q^T,  dP^T = V dO^T,  P^T = exp2(S^T c - lse2),  dS^T = P^T (dP^T - delta) scale
// and accumulates dV += P^T dO, dK += dS^T Q, dQ += dS K.
//
// Determinism without atomics: every dQ block is summed over key blocks in ascending
// order; every head's share of a dK/dV block over its query blocks in ascending order,
// and the shares of a group's heads in ascending head order. Three schedules:
//   per kv head: one task per (batch, kv head) owns its dK/dV and its heads' dQ (5
//                products per pair); dK/dV accumulate in per-thread f32 scratch.
//   per head:    one task per (batch, query head) writes dQ and its f32 share of dK/dV to
//                a [B, Hq, Tk, D] buffer, then tasks per (batch, kv head, key block) sum
//                the shares: for few kv heads (MQA / GQA) and many threads.
//   split:       dK/dV tasks per (batch, kv head, key block), then dQ tasks per (batch,
//                q head, query block); S and dP are computed in both (7 products).
// All produce bitwise identical results, so the choice (which depends on the thread
// count) never changes the answer.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "base/aligned.h"
#include "base/threads.h"
#include "kernels/attention.h"
#include "kernels/attention_tiles.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using attn::Dims;
using attn::element;
using attn::element_mut;
using attn::kBk;
using attn::kBq;

struct Args {
  const TensorView &q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv;
  const float* delta;  // [B, Hq, Tq]
  uint64_t call;       // for the packed kv-head cache
};

// Tiles of one query block and one key block (scratch of the calling thread). Natural
// tiles are [rows x Dp], rows Dp apart.
struct Tiles {
  float *qt, *dot;              // transposed q, dO [D x kBq]
  float *q, *dout;              // natural q, dO [kBq x Dp]
  const float *k, *v;           // natural k, v [kBk x Dp] (in the packed kv head)
  float *st, *dpt;              // scores / probabilities, dP / dS: [kBk x kBq]
  float* dcap;                  // a soft cap's derivative per pair: [kBk x kBq]
  float *dq, *dk, *dv;          // accumulators: [kBq x Dp], [kBk x Dp]
  float *pk, *pv;               // one head's share of dk, dv: [kBk x Dp]
  float *lse2, *delta;          // [kBq]
  int64_t q0 = 0, k0 = 0;       // first query / key of the blocks
  int qn = 0, kn = 0;           // valid queries / keys
  attn::BlockMask mask;         // of the current pair
  const float* head = nullptr;  // packed k then v of the current kv head

  explicit Tiles(const Dims& s) {
    const int64_t d = s.d, dp = s.dp;
    float* p = attn::scratch(
        0, size_t(2 * d * kBq + 3 * kBq * dp + 4 * kBk * dp + 3 * kBk * kBq + 2 * kBq));
    for (float** t : {&qt, &dot}) *t = std::exchange(p, p + d * kBq);
    for (float** t : {&q, &dout, &dq}) *t = std::exchange(p, p + kBq * dp);
    for (float** t : {&dk, &dv, &pk, &pv}) *t = std::exchange(p, p + kBk * dp);
    for (float** t : {&st, &dpt, &dcap}) *t = std::exchange(p, p + kBk * kBq);
    lse2 = p;
    delta = p + kBq;
  }
};

// Loads query block qb of head h; the natural q and dO tiles only when dK/dV need them.
void load_queries(const Dims& s, const attn::TileOps& ops, const Args& a, int64_t b, int64_t h,
                  int64_t qb, bool natural, Tiles& t) {
  t.q0 = qb * kBq;
  t.qn = static_cast<int>(std::min<int64_t>(kBq, s.tq - t.q0));
  const int64_t at = Dims::at(b, t.q0, h, s.tq, s.hq, s.d), stride = s.hq * s.d;
  ops.pack_cols(element(a.q, at), a.q.dtype, stride, t.qn, s.d, t.qt);
  ops.pack_cols(element(a.dout, at), a.dout.dtype, stride, t.qn, s.d, t.dot);
  if (natural) {
    attn::pack_rows(element(a.q, at), a.q.dtype, stride, t.qn, s.d, t.q, s.dp);
    attn::pack_rows(element(a.dout, at), a.dout.dtype, stride, t.qn, s.d, t.dout, s.dp);
  }
  const int64_t row = (b * s.hq + h) * s.tq + t.q0;
  const float* lse = a.lse.as<float>() + row;
  for (int i = 0; i < kBq; ++i) {
    t.lse2[i] = i < t.qn ? lse[i] * attn::kLog2e : 0.0f;
    t.delta[i] = i < t.qn ? a.delta[row + i] : 0.0f;
  }
}

// Points the key tiles at block kb of the current kv head.
void load_keys(const Dims& s, int64_t kb, Tiles& t) {
  t.k0 = kb * kBk;
  t.kn = static_cast<int>(std::min<int64_t>(kBk, s.tk - t.k0));
  t.k = t.head + t.k0 * s.dp;
  t.v = t.head + (s.nkb * kBk + t.k0) * s.dp;
}

// st <- P^T, dpt <- dS^T * scale for the loaded block pair.
void pair_probs(const Dims& s, const attn::TileOps& ops, Tiles& t) {
  t.mask = attn::block_mask(s, t.q0, t.k0, t.kn);
  attn::scores_gemm(ops, t.kn, s.d, t.k, s.dp, t.qt, t.st, t.mask);
  attn::cap_scores(s, t.st, t.kn, t.dcap);
  attn::scores_gemm(ops, t.kn, s.d, t.v, s.dp, t.dot, t.dpt, t.mask);
  attn::window_ops(ops, t.mask)
      .probs_and_grad(t.st, t.dpt, t.kn, s.scale * attn::kLog2e, s.scale, t.lse2, t.delta, t.mask);
  // dS w.r.t. the scores before the cap (masked pairs stay 0: dcap is finite).
  if (s.softcap > 0.0f)
    for (int64_t i = 0; i < int64_t(t.kn) * kBq; ++i) t.dpt[i] *= t.dcap[i];
}

// dV[kn x Dp] += P^T dO and dK += dS^T Q (accumulators with leading dimension Dp).
void pair_dkdv(const Dims& s, const attn::TileOps& ops, const Tiles& t, float* dk, float* dv) {
  const int dp = static_cast<int>(s.dp);
  const attn::Skip skip{t.mask.active ? attn::Skip::kUpper : attn::Skip::kNone, t.mask.diag};
  ops.gemm(t.kn, dp, t.qn, t.st, kBq, true, t.dout, dp, dv, dp, true, skip);
  ops.gemm(t.kn, dp, t.qn, t.dpt, kBq, true, t.q, dp, dk, dp, true, skip);
}

// dQ[qn x Dp] += dS K.
void pair_dq(const Dims& s, const attn::TileOps& ops, const Tiles& t) {
  const int dp = static_cast<int>(s.dp);
  const attn::Skip skip{t.mask.active ? attn::Skip::kLower : attn::Skip::kNone, t.mask.diag};
  ops.gemm(t.qn, dp, t.kn, t.dpt, kBq, false, t.k, s.dp, t.dq, dp, true, skip);
}

void store_dq(const Dims& s, const Args& a, int64_t b, int64_t h, const Tiles& t) {
  for (int i = 0; i < t.qn; ++i)
    attn::store_row(t.dq + i * s.dp, s.d, 1.0f,
                    element_mut(a.dq, Dims::at(b, t.q0 + i, h, s.tq, s.hq, s.d)), a.dq.dtype);
}

// Rows [k0, k0 + n) of kv head g from accumulators with leading dimension Dp.
void store_dkdv(const Dims& s, const Args& a, int64_t b, int64_t g, int64_t k0, int64_t n,
                const float* dk, const float* dv) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t at = Dims::at(b, k0 + j, g, s.tk, s.hkv, s.d);
    attn::store_row(dk + j * s.dp, s.d, 1.0f, element_mut(a.dk, at), a.dk.dtype);
    attn::store_row(dv + j * s.dp, s.d, 1.0f, element_mut(a.dv, at), a.dv.dtype);
  }
}

// dK/dV of a kv head sum the shares p_r of the query heads r of its group; p_r sums the
// block pairs of head r over its query blocks in ascending order, from zero. Every
// schedule forms ((p_0 + p_1) + p_2) + ... elementwise in f32, so all give the same bits.
void add_into(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// Everything of query head h of batch b: its dQ, and its dK/dV share into dk, dv
// ([nkb * kBk x Dp], zeroed here).
void backward_head(const Dims& s, const attn::TileOps& ops, const Args& a, int64_t b, int64_t h,
                   Tiles& t, float* dk, float* dv) {
  t.head = attn::kv_head(s, a.k, a.v, b, h / s.group, a.call);
  const int64_t n = s.nkb * kBk * s.dp;
  std::fill(dk, dk + n, 0.0f);
  std::fill(dv, dv + n, 0.0f);
  for (int64_t qb = 0; qb < s.nqb; ++qb) {
    load_queries(s, ops, a, b, h, qb, true, t);
    std::fill(t.dq, t.dq + kBq * s.dp, 0.0f);
    const int64_t blocks = s.key_blocks(qb);
    for (int64_t kb = s.first_key_block(qb); kb < blocks; ++kb) {
      load_keys(s, kb, t);
      pair_probs(s, ops, t);
      pair_dkdv(s, ops, t, dk + t.k0 * s.dp, dv + t.k0 * s.dp);
      pair_dq(s, ops, t);
    }
    store_dq(s, a, b, h, t);
  }
}

// Schedule "per kv head": everything of (batch b, kv head g), accumulated in per-thread
// scratch.
void backward_kv_head(const Dims& s, const attn::TileOps& ops, const Args& a, int64_t b,
                      int64_t g) {
  Tiles t(s);
  const int64_t n = s.nkb * kBk * s.dp;
  float* dk = attn::scratch(1, size_t((s.group > 1 ? 4 : 2) * n));
  float *dv = dk + n, *pk = dk + 2 * n, *pv = dk + 3 * n;
  for (int64_t r = 0; r < s.group; ++r) {
    backward_head(s, ops, a, b, g * s.group + r, t, r == 0 ? dk : pk, r == 0 ? dv : pv);
    if (r > 0) {
      add_into(dk, pk, n);
      add_into(dv, pv, n);
    }
  }
  store_dkdv(s, a, b, g, 0, s.tk, dk, dv);
}

// Schedule "per head" (group > 1): every query head's share into `parts` (per (b, h):
// dk then dv, [nkb * kBk x Dp] each), then one task per (b, kv head, key block) sums them.
void backward_per_head(const Dims& s, const attn::TileOps& ops, const Args& a) {
  const int64_t n = s.nkb * kBk * s.dp;
  AlignedBuffer<float> parts(size_t(s.b * s.hq * 2 * n));
  parallel_for_dynamic(s.b * s.hq, [&](int64_t task) {
    Tiles t(s);
    float* p = parts.data() + task * 2 * n;
    backward_head(s, ops, a, task / s.hq, task % s.hq, t, p, p + n);
  });
  parallel_for_dynamic(s.b * s.hkv * s.nkb, [&](int64_t task) {
    const int64_t bg = task / s.nkb, b = bg / s.hkv, g = bg % s.hkv;
    const int64_t k0 = (task % s.nkb) * kBk, rows = std::min<int64_t>(kBk, s.tk - k0);
    float* dk = attn::scratch(0, size_t(2 * kBk * s.dp));
    float* dv = dk + kBk * s.dp;
    for (int64_t r = 0; r < s.group; ++r) {
      const float* p = parts.data() + (b * s.hq + g * s.group + r) * 2 * n + k0 * s.dp;
      if (r == 0) {
        std::copy(p, p + rows * s.dp, dk);
        std::copy(p + n, p + n + rows * s.dp, dv);
      } else {
        add_into(dk, p, rows * s.dp);
        add_into(dv, p + n, rows * s.dp);
      }
    }
    store_dkdv(s, a, b, g, k0, rows, dk, dv);
  });
}

// Schedule "split", first pass: dK/dV of key block kb of (b, g).
void backward_key_block(const Dims& s, const attn::TileOps& ops, const Args& a, int64_t b,
                        int64_t g, int64_t kb) {
  Tiles t(s);
  t.head = attn::kv_head(s, a.k, a.v, b, g, a.call);
  load_keys(s, kb, t);
  for (int64_t r = 0; r < s.group; ++r) {
    float* pk = r == 0 ? t.dk : t.pk;
    float* pv = r == 0 ? t.dv : t.pv;
    std::fill(pk, pk + kBk * s.dp, 0.0f);
    std::fill(pv, pv + kBk * s.dp, 0.0f);
    for (int64_t qb = s.first_query_block(kb); qb < s.end_query_block(kb); ++qb) {
      load_queries(s, ops, a, b, g * s.group + r, qb, true, t);
      pair_probs(s, ops, t);
      pair_dkdv(s, ops, t, pk, pv);
    }
    if (r > 0) {
      add_into(t.dk, t.pk, kBk * s.dp);
      add_into(t.dv, t.pv, kBk * s.dp);
    }
  }
  store_dkdv(s, a, b, g, t.k0, t.kn, t.dk, t.dv);
}

// Schedule "split", second pass: dQ of query block qb of (b, h).
void backward_query_block(const Dims& s, const attn::TileOps& ops, const Args& a, int64_t b,
                          int64_t h, int64_t qb) {
  Tiles t(s);
  t.head = attn::kv_head(s, a.k, a.v, b, h / s.group, a.call);
  load_queries(s, ops, a, b, h, qb, false, t);
  std::fill(t.dq, t.dq + kBq * s.dp, 0.0f);
  const int64_t blocks = s.key_blocks(qb);
  for (int64_t kb = s.first_key_block(qb); kb < blocks; ++kb) {
    load_keys(s, kb, t);
    pair_probs(s, ops, t);
    pair_dq(s, ops, t);
  }
  store_dq(s, a, b, h, t);
}

// delta[(b * Hq + h) * Tq + i] = sum_d dO * O in f32, in a fixed order.
void compute_delta(const Dims& s, const TensorView& out, const TensorView& dout, float* delta) {
  const int64_t rows = s.b * s.tq * s.hq;  // token-major row r = (b * Tq + i) * Hq + h
  parallel_chunks(rows, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> o(size_t(s.d)), g(size_t(s.d));
    for (int64_t r = begin; r < end; ++r) {
      attn::pack_rows(element(out, r * s.d), out.dtype, 0, 1, s.d, o.data(), s.d);
      attn::pack_rows(element(dout, r * s.d), dout.dtype, 0, 1, s.d, g.data(), s.d);
      float lanes[16] = {};
      int64_t c = 0;
      for (; c + 16 <= s.d; c += 16)
        for (int lane = 0; lane < 16; ++lane) lanes[lane] += o[c + lane] * g[c + lane];
      for (; c < s.d; ++c) lanes[c % 16] += o[c] * g[c];
      float sum = 0;
      for (float x : lanes) sum += x;
      const int64_t h = r % s.hq, i = (r / s.hq) % s.tq, b = r / (s.hq * s.tq);
      delta[(b * s.hq + h) * s.tq + i] = sum;
    }
  });
}

}  // namespace

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& lse,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const AttentionParams& params) {
  const Dims s =
      attn::check_backward("attention_backward", q, k, v, out, dout, lse, dq, dk, dv, params);
  if (s.empty()) {
    std::memset(dk.data, 0, dk.nbytes());  // no query attends to any key
    std::memset(dv.data, 0, dv.nbytes());
    return;
  }
  const attn::TileOps& ops = attn::tile_ops(params.force_portable);
  AlignedBuffer<float> delta(size_t(s.b * s.hq * s.tq));
  compute_delta(s, out, dout, delta.data());
  const Args a{q, k, v, out, dout, lse, dq, dk, dv, delta.data(), attn::next_call_id()};

  AttentionBackwardSchedule schedule = params.schedule;
  if (schedule == AttentionBackwardSchedule::kAuto) {
    // The per-head schedules do 5/7 of the work of the split one; use the coarsest whose
    // tasks keep at least 3/4 of the threads busy on average.
    const int64_t threads = num_threads();
    auto busy = [&](int64_t tasks) {
      const int64_t rounds = (tasks + threads - 1) / threads;
      return tasks * 4 >= rounds * threads * 3;
    };
    schedule = busy(s.b * s.hkv)  ? AttentionBackwardSchedule::kPerKvHead
               : busy(s.b * s.hq) ? AttentionBackwardSchedule::kPerHead
                                  : AttentionBackwardSchedule::kSplit;
  }
  if (schedule == AttentionBackwardSchedule::kPerHead && s.group == 1)
    schedule = AttentionBackwardSchedule::kPerKvHead;  // the same tasks
  switch (schedule) {
    case AttentionBackwardSchedule::kPerHead:
      backward_per_head(s, ops, a);
      return;
    case AttentionBackwardSchedule::kSplit:
      // Consecutive tasks share a kv head (and its packed keys and values), heaviest
      // first within it: causal key block 0 is seen by every query block, and the last
      // query block sees every key block.
      parallel_for_dynamic(s.b * s.hkv * s.nkb, [&](int64_t task) {
        const int64_t bg = task / s.nkb, kb = task % s.nkb;
        backward_key_block(s, ops, a, bg / s.hkv, bg % s.hkv, kb);
      });
      parallel_for_dynamic(s.b * s.hq * s.nqb, [&](int64_t task) {
        const int64_t bh = task / s.nqb, qb = s.nqb - 1 - task % s.nqb;
        backward_query_block(s, ops, a, bh / s.hq, bh % s.hq, qb);
      });
      return;
    default:
      parallel_for_dynamic(s.b * s.hkv, [&](int64_t task) {
        backward_kv_head(s, ops, a, task / s.hkv, task % s.hkv);
      });
      return;
  }
}

}  // namespace hyperion
