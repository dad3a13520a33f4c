// MoE routing kernels. The per-row float work (router softmax + top-k, router backward,
// z-loss logsumexp, the row scatter-add / combine / combine backward) is vectorised with
// Highway dynamic dispatch; the dispatch plan (integer counting sort) and the load
// balance counts are plain serial loops. Row ops are memory bound and stream each row
// once; all reductions have a fixed order, so every result is bitwise independent of the
// thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/moe_routing.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/moe_routing.h"
#include "tensor/convert.h"

// Scalar helpers shared by every target (compiled once: foreach_target.h re-includes
// this file per target).
#ifndef HYPERION_KERNELS_MOE_ROUTING_SCALAR_
#define HYPERION_KERNELS_MOE_ROUTING_SCALAR_
namespace hyperion::moe_detail {

// Top-k of one probability row: descending probability, ties to the lower index. One
// pass keeping a sorted buffer: an element enters only if strictly larger than the
// current k-th (equal later indices rank lower), so typical cost is O(e). The buffer
// always holds k distinct valid ids, even for NaN probabilities.
inline void select_topk(const float* p, int64_t e, int64_t k, int32_t* idx, float* val) {
  int64_t size = 0;
  for (int64_t x = 0; x < e; ++x) {
    const float v = p[x];
    if (size == k && !(v > val[k - 1])) continue;
    int64_t pos = size < k ? size : k - 1;
    while (pos > 0 && v > val[pos - 1]) {
      val[pos] = val[pos - 1];
      idx[pos] = idx[pos - 1];
      --pos;
    }
    val[pos] = v;
    idx[pos] = static_cast<int32_t>(x);
    if (size < k) ++size;
  }
}

}  // namespace hyperion::moe_detail
#endif  // HYPERION_KERNELS_MOE_ROUTING_SCALAR_

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

// Top-k by k passes of a vector argmax over a scratch copy of the row: the max, then the
// first lane equal to it (ties -> lower index), which is then knocked out with -inf.
// Branch-free per element, unlike an insertion scan whose compares mispredict on random
// probabilities (it took most of the router time). Returns false when no lane equals
// the max (NaN in the row); the caller then uses the scalar selection.
HWY_INLINE bool TopKVector(DF d, const float* p, size_t e, size_t k, int32_t* idx, float* val,
                           float* scratch) {
  const size_t n = hn::Lanes(d);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::memcpy(scratch, p, e * sizeof(float));
  for (size_t j = 0; j < k; ++j) {
    // The max is >= -FLT_MAX (the start value) or NaN, so it never equals a knocked-out
    // -inf: the chosen ids are distinct.
    const VF vm = hn::Set(d, RowMax<false>(d, scratch, e));
    intptr_t pos = -1;
    size_t i = 0;
    for (; pos < 0 && i + n <= e; i += n) {
      const intptr_t f = hn::FindFirstTrue(d, hn::Eq(hn::LoadU(d, scratch + i), vm));
      if (f >= 0) pos = static_cast<intptr_t>(i) + f;
    }
    if (pos < 0 && i < e) {
      const intptr_t f =
          hn::FindFirstTrue(d, hn::Eq(LoadTailF(d, scratch + i, e - i, neg_inf), vm));
      if (f >= 0) pos = static_cast<intptr_t>(i) + f;
    }
    if (pos < 0) return false;
    idx[j] = static_cast<int32_t>(pos);
    val[j] = scratch[pos];
    scratch[pos] = neg_inf;
  }
  return true;
}

// Largest k handled by TopKVector (k vector passes); above it (k close to e, rare) the
// scalar insertion selection is cheaper.
constexpr size_t kVectorTopK = 8;

// Softmax and top-k of a row that fits one vector (e <= Lanes: Mixtral's 8 experts on
// AVX-512), kept in registers: going through memory would put a store-to-load
// forwarding stall (masked or scalar store, then a vector load of the same bytes) into
// every pass. Same results as SoftmaxRow + TopKVector. Returns false as TopKVector does.
HWY_INLINE bool RouterRowOneVector(DF d, const float* x, float* p, size_t e, size_t k, int32_t* idx,
                                   float* val) {
  const hn::RebindToSigned<DF> di;
  const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const auto valid = hn::FirstN(d, e);
  const VF xv = LoadTailF(d, x, e, -std::numeric_limits<float>::infinity());
  const VF m = hn::MaxOfLanes(d, hn::Max(xv, hn::Set(d, -FLT_MAX)));
  const VF ev = FastExp(d, hn::Sub(xv, m));  // 0 in the padding lanes
  const float sum = hn::GetLane(hn::SumOfLanes(d, ev));
  const VF pv = hn::Mul(ev, hn::Set(d, sum == 0.0f ? 0.0f : 1.0f / sum));
  StoreTailF(d, pv, p, e);
  VF v = hn::IfThenElse(valid, pv, neg_inf);
  const auto iota = hn::Iota(di, 0);
  for (size_t j = 0; j < k; ++j) {
    const VF vm = hn::MaxOfLanes(d, hn::Max(v, hn::Set(d, -FLT_MAX)));
    const intptr_t f = hn::FindFirstTrue(d, hn::Eq(v, vm));
    if (f < 0) return false;
    idx[j] = static_cast<int32_t>(f);
    val[j] = hn::GetLane(vm);
    v = hn::IfThenElse(hn::RebindMask(d, hn::Eq(iota, hn::Set(di, int32_t(f)))), neg_inf, v);
  }
  return true;
}

// Router forward for `rows` rows: softmax, top-k, combine weights. scratch: e floats.
void RouterForwardRows(const float* x, float* p, int32_t* ex, float* w, size_t rows, size_t e,
                       size_t k, bool normalize, float* scratch) {
  const DF d;
  const bool one_vector = e <= hn::Lanes(d) && k <= kVectorTopK;
  for (size_t r = 0; r < rows; ++r) {
    const float* pr = p + r * e;
    int32_t* er = ex + r * k;
    float* wr = w + r * k;  // holds the chosen probs first
    bool done;
    if (one_vector) {
      done = RouterRowOneVector(d, x + r * e, p + r * e, e, k, er, wr);
    } else {
      SoftmaxRow(d, x + r * e, p + r * e, e);
      done = k <= kVectorTopK && TopKVector(d, pr, e, k, er, wr, scratch);
    }
    if (!done) moe_detail::select_topk(pr, int64_t(e), int64_t(k), er, wr);
    if (!normalize) continue;
    float s = 0.0f;
    for (size_t j = 0; j < k; ++j) s += wr[j];
    for (size_t j = 0; j < k; ++j) wr[j] /= s;
  }
}

// Router backward for `rows` rows (see router_topk_backward). dp is built in the dlogits
// row, then turned into dlogits in place by the vectorised softmax backward.
void RouterBackwardRows(const float* probs, const int32_t* experts, const float* weights,
                        const float* dweights, const float* dprobs, size_t rows, size_t e, size_t k,
                        bool normalize, float* dlogits) {
  const DF d;
  const size_t n = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    const float* p = probs + r * e;
    const int32_t* c = experts + r * k;
    const float* w = weights + r * k;
    const float* dw = dweights + r * k;
    float* dp = dlogits + r * e;
    if (dprobs != nullptr) {
      std::memcpy(dp, dprobs + r * e, e * sizeof(float));
    } else {
      std::memset(dp, 0, e * sizeof(float));
    }
    if (normalize) {
      float s = 0.0f, g = 0.0f;
      for (size_t j = 0; j < k; ++j) {
        s += p[c[j]];
        g += dw[j] * w[j];
      }
      for (size_t j = 0; j < k; ++j) dp[c[j]] += (dw[j] - g) / s;
    } else {
      for (size_t j = 0; j < k; ++j) dp[c[j]] += dw[j];
    }
    VF a0 = hn::Zero(d);
    size_t i = 0;
    for (; i + n <= e; i += n) a0 = hn::MulAdd(hn::LoadU(d, p + i), hn::LoadU(d, dp + i), a0);
    if (i < e)
      a0 = hn::MulAdd(LoadTailF(d, p + i, e - i, 0.0f), LoadTailF(d, dp + i, e - i, 0.0f), a0);
    const VF dot = hn::Set(d, hn::GetLane(hn::SumOfLanes(d, a0)));
    for (i = 0; i + n <= e; i += n)
      hn::StoreU(hn::Mul(hn::LoadU(d, p + i), hn::Sub(hn::LoadU(d, dp + i), dot)), d, dp + i);
    if (i < e) {
      const VF pv = LoadTailF(d, p + i, e - i, 0.0f), gv = LoadTailF(d, dp + i, e - i, 0.0f);
      StoreTailF(d, hn::Mul(pv, hn::Sub(gv, dot)), dp + i, e - i);
    }
  }
}

// Sum over rows of lse^2 (in double); with dl != nullptr also dl += gcoef * lse * softmax.
double ZLossRows(const float* x, size_t rows, size_t cols, float gcoef, float* dl) {
  const DF d;
  const size_t n = hn::Lanes(d);
  double acc = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    const float m = RowMax<false>(d, xr, cols);
    const float sum = ExpRow<false>(d, xr, cols, m, nullptr);
    const float lse = m + std::log(sum);
    acc += double(lse) * lse;
    if (dl == nullptr) continue;
    // Second exp pass instead of a scratch row: e is small, the row is in L1.
    float* g = dl + r * cols;
    const VF vm = hn::Set(d, m), c = hn::Set(d, gcoef * lse / sum);
    size_t i = 0;
    for (; i + n <= cols; i += n) {
      const VF e0 = FastExp(d, hn::Sub(hn::LoadU(d, xr + i), vm));
      hn::StoreU(hn::MulAdd(c, e0, hn::LoadU(d, g + i)), d, g + i);
    }
    if (i < cols) {
      const VF e0 = FastExp(
          d, hn::Sub(LoadTailF(d, xr + i, cols - i, -std::numeric_limits<float>::infinity()), vm));
      StoreTailF(d, hn::MulAdd(c, e0, LoadTailF(d, g + i, cols - i, 0.0f)), g + i, cols - i);
    }
  }
  return acc;
}

// Tokens [t0, t1): dsrc[t] += rows of its kept pairs, in slot order. The tail goes
// through the same vector ops (padded lanes), so a column's result never depends on
// whether it falls in the vector body or the tail.
template <typename T>
void ScatterAddT(const T* y, const int32_t* pair_row, size_t t0, size_t t1, size_t k, size_t d,
                 float* dsrc) {
  const DF df;
  const size_t n = hn::Lanes(df);
  for (size_t t = t0; t < t1; ++t) {
    const int32_t* pr = pair_row + t * k;
    float* o = dsrc + t * d;
    size_t i = 0;
    for (; i + n <= d; i += n) {
      VF v = hn::LoadU(df, o + i);
      for (size_t j = 0; j < k; ++j)
        if (pr[j] >= 0) v = hn::Add(v, LoadF(df, y + size_t(pr[j]) * d + i));
      hn::StoreU(v, df, o + i);
    }
    if (i < d) {
      const size_t c = d - i;
      VF v = LoadTail(df, o + i, c, 0.0f);
      for (size_t j = 0; j < k; ++j)
        if (pr[j] >= 0) v = hn::Add(v, LoadTail(df, y + size_t(pr[j]) * d + i, c, 0.0f));
      StoreTail(df, v, o + i, c);
    }
  }
}

// Tokens [t0, t1): out[t] += (sum_j w_j * y[row_j]), the sum formed in slot order.
template <typename T>
void CombineT(const T* y, const int32_t* pair_row, const float* w, size_t t0, size_t t1, size_t k,
              size_t d, float* out) {
  const DF df;
  const size_t n = hn::Lanes(df);
  for (size_t t = t0; t < t1; ++t) {
    const int32_t* pr = pair_row + t * k;
    const float* wt = w + t * k;
    float* o = out + t * d;
    size_t i = 0;
    for (; i + n <= d; i += n) {
      VF acc = hn::Zero(df);
      for (size_t j = 0; j < k; ++j)
        if (pr[j] >= 0)
          acc = hn::MulAdd(hn::Set(df, wt[j]), LoadF(df, y + size_t(pr[j]) * d + i), acc);
      hn::StoreU(hn::Add(hn::LoadU(df, o + i), acc), df, o + i);
    }
    if (i < d) {
      const size_t c = d - i;
      VF acc = hn::Zero(df);
      for (size_t j = 0; j < k; ++j)
        if (pr[j] >= 0)
          acc =
              hn::MulAdd(hn::Set(df, wt[j]), LoadTail(df, y + size_t(pr[j]) * d + i, c, 0.0f), acc);
      StoreTail(df, hn::Add(LoadTail(df, o + i, c, 0.0f), acc), o + i, c);
    }
  }
}

// Tokens [t0, t1): for each kept pair, dy[row] = w * dout[t] and dw = <dout[t], y[row]>
// in one pass over the two rows; dw = 0 for a dropped pair.
template <typename T>
void CombineBackwardT(const float* dout, const T* y, const int32_t* pair_row, const float* w,
                      size_t t0, size_t t1, size_t k, size_t d, T* dy, float* dw) {
  const DF df;
  const size_t n = hn::Lanes(df);
  for (size_t t = t0; t < t1; ++t) {
    const float* g = dout + t * d;
    for (size_t j = 0; j < k; ++j) {
      const size_t p = t * k + j;
      if (pair_row[p] < 0) {
        dw[p] = 0.0f;
        continue;
      }
      const T* yr = y + size_t(pair_row[p]) * d;
      T* dyr = dy + size_t(pair_row[p]) * d;
      const VF vw = hn::Set(df, w[p]);
      VF a0 = hn::Zero(df), a1 = hn::Zero(df);
      size_t i = 0;
      for (; i + 2 * n <= d; i += 2 * n) {
        const VF g0 = hn::LoadU(df, g + i), g1 = hn::LoadU(df, g + i + n);
        a0 = hn::MulAdd(g0, LoadF(df, yr + i), a0);
        a1 = hn::MulAdd(g1, LoadF(df, yr + i + n), a1);
        StoreF(df, hn::Mul(vw, g0), dyr + i);
        StoreF(df, hn::Mul(vw, g1), dyr + i + n);
      }
      for (; i + n <= d; i += n) {
        const VF g0 = hn::LoadU(df, g + i);
        a0 = hn::MulAdd(g0, LoadF(df, yr + i), a0);
        StoreF(df, hn::Mul(vw, g0), dyr + i);
      }
      if (i < d) {
        const size_t c = d - i;
        const VF g0 = LoadTail(df, g + i, c, 0.0f);
        a0 = hn::MulAdd(g0, LoadTail(df, yr + i, c, 0.0f), a0);
        StoreTail(df, hn::Mul(vw, g0), dyr + i, c);
      }
      dw[p] = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1)));
    }
  }
}

// Exported entry points: the dtype switch outside the row loops.
void ScatterAddRows(const void* y, DType dt, const int32_t* pair_row, size_t t0, size_t t1,
                    size_t k, size_t d, float* dsrc) {
  if (dt == DType::kF32) {
    ScatterAddT(static_cast<const float*>(y), pair_row, t0, t1, k, d, dsrc);
  } else {
    ScatterAddT(static_cast<const bf16*>(y), pair_row, t0, t1, k, d, dsrc);
  }
}
void CombineRows(const void* y, DType dt, const int32_t* pair_row, const float* w, size_t t0,
                 size_t t1, size_t k, size_t d, float* out) {
  if (dt == DType::kF32) {
    CombineT(static_cast<const float*>(y), pair_row, w, t0, t1, k, d, out);
  } else {
    CombineT(static_cast<const bf16*>(y), pair_row, w, t0, t1, k, d, out);
  }
}
void CombineBackwardRows(const float* dout, const void* y, DType dt, const int32_t* pair_row,
                         const float* w, size_t t0, size_t t1, size_t k, size_t d, void* dy,
                         float* dw) {
  if (dt == DType::kF32) {
    CombineBackwardT(dout, static_cast<const float*>(y), pair_row, w, t0, t1, k, d,
                     static_cast<float*>(dy), dw);
  } else {
    CombineBackwardT(dout, static_cast<const bf16*>(y), pair_row, w, t0, t1, k, d,
                     static_cast<bf16*>(dy), dw);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(RouterForwardRows);
HWY_EXPORT(RouterBackwardRows);
HWY_EXPORT(ZLossRows);
HWY_EXPORT(ScatterAddRows);
HWY_EXPORT(CombineRows);
HWY_EXPORT(CombineBackwardRows);

namespace {

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

void check_router_dims(const char* op, int64_t n, int64_t e, int64_t k) {
  HYP_CHECK(n >= 0, "{}: n = {} must be >= 0", op, n);
  HYP_CHECK(e >= 1, "{}: e = {} must be >= 1", op, e);
  HYP_CHECK(k >= 1 && k <= e, "{}: k = {} must be in [1, e = {}]", op, k, e);
}

void check_ptr(const char* op, const char* name, const void* p, int64_t count) {
  HYP_CHECK(count == 0 || p != nullptr, "{}: {} is null but must hold {} elements", op, name,
            count);
}

void check_row_op(const char* op, DType dt, int64_t n, int64_t k, int64_t d) {
  HYP_CHECK(dt == DType::kF32 || dt == DType::kBF16, "{}: rows must be f32 or bf16, got {}", op,
            dtype_name(dt));
  HYP_CHECK(n >= 0 && d >= 0, "{}: n = {} and d = {} must be >= 0", op, n, d);
  HYP_CHECK(k >= 1, "{}: k = {} must be >= 1", op, k);
}

// Expert ids index memory (dp rows, counts): checked serially before any parallel work.
void check_experts(const char* op, const int32_t* experts, int64_t n, int64_t k, int64_t e) {
  for (int64_t p = 0; p < n * k; ++p) {
    HYP_CHECK(experts[p] >= 0 && experts[p] < e,
              "{}: experts[{}, {}] = {} is out of range for e = {}", op, p / k, p % k, experts[p],
              e);
  }
}

// Tokens per parallel chunk for row work of `width` elements per token.
int64_t token_grain(int64_t width) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1));
}

// Fixed-size row blocks for the loss reductions: per-block partial sums combined in
// block order make the loss independent of the thread count.
constexpr int64_t kLossBlock = 64;

}  // namespace

void router_topk_forward(const float* logits, int64_t n, int64_t e, int64_t k, bool normalize,
                         float* probs, int32_t* experts, float* weights) {
  const char* op = "router_topk_forward";
  check_router_dims(op, n, e, k);
  check_ptr(op, "logits", logits, n * e);
  check_ptr(op, "probs", probs, n * e);
  check_ptr(op, "experts", experts, n * k);
  check_ptr(op, "weights", weights, n * k);
  parallel_chunks(n, token_grain(e * 4), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(static_cast<size_t>(e));
    HWY_DYNAMIC_DISPATCH(RouterForwardRows)
    (logits + begin * e, probs + begin * e, experts + begin * k, weights + begin * k,
     size_t(end - begin), size_t(e), size_t(k), normalize, scratch.data());
  });
}

void router_topk_backward(const float* probs, const int32_t* experts, const float* weights,
                          const float* dweights, const float* dprobs, int64_t n, int64_t e,
                          int64_t k, bool normalize, float* dlogits) {
  const char* op = "router_topk_backward";
  check_router_dims(op, n, e, k);
  check_ptr(op, "probs", probs, n * e);
  check_ptr(op, "experts", experts, n * k);
  check_ptr(op, "weights", weights, n * k);
  check_ptr(op, "dweights", dweights, n * k);
  check_ptr(op, "dlogits", dlogits, n * e);
  check_experts(op, experts, n, k, e);
  parallel_chunks(n, token_grain(e * 3), [&](int64_t begin, int64_t end) {
    HWY_DYNAMIC_DISPATCH(RouterBackwardRows)
    (probs + begin * e, experts + begin * k, weights + begin * k, dweights + begin * k,
     dprobs == nullptr ? nullptr : dprobs + begin * e, size_t(end - begin), size_t(e), size_t(k),
     normalize, dlogits + begin * e);
  });
}

float load_balance_loss(const float* probs, const int32_t* experts, int64_t b, int64_t t, int64_t e,
                        int64_t k, float weight, float* dprobs, float dscale) {
  const char* op = "load_balance_loss";
  HYP_CHECK(b >= 0 && t >= 0, "{}: b = {} and t = {} must be >= 0", op, b, t);
  const int64_t n = b * t;
  check_router_dims(op, n, e, k);
  check_ptr(op, "probs", probs, n * e);
  check_ptr(op, "experts", experts, n * k);
  if (n == 0) return 0.0f;
  // counts[s*e + x]: pairs of sequence s routed to x (serial, validates the ids).
  std::vector<int64_t> counts(size_t(b * e), 0);
  for (int64_t p = 0; p < n * k; ++p) {
    const int32_t x = experts[p];
    HYP_CHECK(x >= 0 && x < e, "{}: experts[{}, {}] = {} is out of range for e = {}", op, p / k,
              p % k, x, e);
    ++counts[size_t((p / k / t) * e + x)];
  }
  // Per sequence: sum_x count[x] * (sum over tokens of probs[., x]), in double.
  std::vector<double> partial(size_t(b), 0.0);
  parallel_chunks(b, std::max<int64_t>(1, 65536 / std::max<int64_t>(t * e, 1)),
                  [&](int64_t begin, int64_t end) {
                    std::vector<double> col(static_cast<size_t>(e));
                    for (int64_t s = begin; s < end; ++s) {
                      std::fill(col.begin(), col.end(), 0.0);
                      for (int64_t r = s * t; r < (s + 1) * t; ++r) {
                        const float* p = probs + r * e;
                        for (int64_t x = 0; x < e; ++x) col[x] += p[x];
                      }
                      double acc = 0;
                      for (int64_t x = 0; x < e; ++x) acc += double(counts[s * e + x]) * col[x];
                      partial[s] = acc;
                    }
                  });
  double total = 0;
  for (double v : partial) total += v;
  // loss = weight * e^2 / (b e) * sum_{s,x} (c/t) (P/t) = weight * e / (b t^2) * total.
  const double scale = double(weight) * double(e) / (double(b) * double(t) * double(t));
  if (dprobs != nullptr) {
    // d loss / d probs[r][x] = scale * counts[s][x]: one f32 row per sequence, added to
    // each of its tokens' rows (a plain vectorisable add).
    const double g = double(dscale) * scale;
    std::vector<float> grad(counts.size());
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(g * double(counts[i]));
    parallel_chunks(n, token_grain(e), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* gr = grad.data() + (r / t) * e;
        float* dp = dprobs + r * e;
        for (int64_t x = 0; x < e; ++x) dp[x] += gr[x];
      }
    });
  }
  return static_cast<float>(scale * total);
}

float router_z_loss(const float* logits, int64_t n, int64_t e, float weight, float* dlogits,
                    float dscale) {
  const char* op = "router_z_loss";
  HYP_CHECK(n >= 0, "{}: n = {} must be >= 0", op, n);
  HYP_CHECK(e >= 1, "{}: e = {} must be >= 1", op, e);
  check_ptr(op, "logits", logits, n * e);
  if (n == 0) return 0.0f;
  const int64_t blocks = (n + kLossBlock - 1) / kLossBlock;
  std::vector<double> partial(size_t(blocks), 0.0);
  const float gcoef = static_cast<float>(2.0 * double(weight) * double(dscale) / double(n));
  parallel_chunks(blocks, std::max<int64_t>(1, token_grain(e * 4) / kLossBlock),
                  [&](int64_t begin, int64_t end) {
                    for (int64_t bl = begin; bl < end; ++bl) {
                      const int64_t r0 = bl * kLossBlock, r1 = std::min(n, r0 + kLossBlock);
                      partial[bl] = HWY_DYNAMIC_DISPATCH(ZLossRows)(
                          logits + r0 * e, size_t(r1 - r0), size_t(e), gcoef,
                          dlogits == nullptr ? nullptr : dlogits + r0 * e);
                    }
                  });
  double total = 0;
  for (double v : partial) total += v;
  return static_cast<float>(double(weight) * total / double(n));
}

int64_t moe_capacity(int64_t t, int64_t k, int64_t e, double capacity_factor) {
  const char* op = "moe_capacity";
  HYP_CHECK(t >= 0, "{}: t = {} must be >= 0", op, t);
  HYP_CHECK(e >= 1, "{}: e = {} must be >= 1", op, e);
  HYP_CHECK(k >= 1 && k <= e, "{}: k = {} must be in [1, e = {}]", op, k, e);
  HYP_CHECK(capacity_factor > 0 && std::isfinite(capacity_factor),
            "{}: capacity factor {} must be finite and > 0", op, capacity_factor);
  const int64_t per_expert = (t * k + e - 1) / e;  // ceil(t * k / e)
  const double cap = std::max(double(per_expert) * capacity_factor, capacity_factor);
  HYP_CHECK(cap < double(kI32Max), "{}: capacity {} (t = {}, k = {}, e = {}, cf = {}) is too large",
            op, cap, t, k, e, capacity_factor);
  return static_cast<int64_t>(std::floor(cap));
}

void moe_dispatch_plan(const int32_t* experts, int64_t b, int64_t t, int64_t k, int64_t e,
                       int64_t capacity, MoeDispatch* out, int64_t row_align) {
  const char* op = "moe_dispatch_plan";
  HYP_CHECK(b >= 0 && t >= 0, "{}: b = {} and t = {} must be >= 0", op, b, t);
  const int64_t n = b * t, pairs = n * k;
  check_router_dims(op, n, e, k);
  HYP_CHECK(out != nullptr, "{}: out is null", op);
  HYP_CHECK(row_align >= 1, "{}: row_align = {} must be >= 1", op, row_align);
  check_ptr(op, "experts", experts, pairs);
  HYP_CHECK(pairs <= kI32Max, "{}: {} pairs (n = {}, k = {}) exceed the int32 row ids", op, pairs,
            n, k);
  MoeDispatch& plan = *out;
  plan.expert_load.assign(size_t(e), 0);
  plan.pair_row.resize(size_t(pairs));
  plan.dropped = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t x = experts[p];
    HYP_CHECK(x >= 0 && x < e, "{}: experts[{}, {}] = {} is out of range for e = {}", op, p / k,
              p % k, x, e);
    ++plan.expert_load[x];
  }

  if (capacity < 0) {
    // Dropless: counting sort by expert; pairs visited in index order keep it stable.
    plan.group_sizes.resize(size_t(e));
    std::vector<int64_t> next(static_cast<size_t>(e));
    int64_t start = 0;
    for (int64_t x = 0; x < e; ++x) {
      plan.group_sizes[x] = (plan.expert_load[x] + row_align - 1) / row_align * row_align;
      next[x] = start;
      start += plan.group_sizes[x];
    }
    HYP_CHECK(start <= kI32Max, "{}: {} padded rows exceed the int32 row ids", op, start);
    plan.rows = start;
    plan.row_token.assign(size_t(start), -1);
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t row = next[experts[p]]++;
      plan.pair_row[p] = static_cast<int32_t>(row);
      plan.row_token[row] = static_cast<int32_t>(p / k);
    }
    return;
  }

  // Capped: every expert owns b * capacity rows; sequence s of expert x is the block of
  // `capacity` rows at x*b*capacity + s*capacity.
  HYP_CHECK(capacity <= kI32Max && (b == 0 || capacity <= kI32Max / b) &&
                (b * capacity == 0 || e <= kI32Max / (b * capacity)),
            "{}: e * b * capacity = {} * {} * {} rows exceed the int32 row ids", op, e, b,
            capacity);
  const int64_t per_expert = b * capacity;
  plan.rows = e * per_expert;
  plan.group_sizes.assign(size_t(e), per_expert);
  plan.row_token.assign(size_t(plan.rows), -1);
  std::vector<int64_t> count(static_cast<size_t>(e));
  for (int64_t s = 0; s < b; ++s) {
    std::fill(count.begin(), count.end(), 0);  // counts restart per sequence
    for (int64_t p = s * t * k; p < (s + 1) * t * k; ++p) {
      const int32_t x = experts[p];
      const int64_t c = count[x]++;
      if (c >= capacity) {
        plan.pair_row[p] = -1;
        ++plan.dropped;
        continue;
      }
      const int64_t row = x * per_expert + s * capacity + c;
      plan.pair_row[p] = static_cast<int32_t>(row);
      plan.row_token[row] = static_cast<int32_t>(p / k);
    }
  }
}

void moe_gather_rows(const void* src, DType dt, const int32_t* row_token, int64_t rows, int64_t d,
                     void* dst) {
  const char* op = "moe_gather_rows";
  check_row_op(op, dt, rows, 1, d);
  check_ptr(op, "row_token", row_token, rows);
  check_ptr(op, "dst", dst, rows * d);
  if (rows == 0 || d == 0) return;
  const size_t bytes = size_t(d) * dtype_size(dt);
  const auto* s = static_cast<const unsigned char*>(src);
  auto* o = static_cast<unsigned char*>(dst);
  // A row copy: memcpy is already at memory speed.
  parallel_chunks(rows, token_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int32_t tok = row_token[r];
      if (tok >= 0) {
        std::memcpy(o + size_t(r) * bytes, s + size_t(tok) * bytes, bytes);
      } else {
        std::memset(o + size_t(r) * bytes, 0, bytes);
      }
    }
  });
}

void moe_scatter_add_rows(const void* drows, DType dt, const int32_t* pair_row, int64_t n,
                          int64_t k, int64_t d, float* dsrc) {
  const char* op = "moe_scatter_add_rows";
  check_row_op(op, dt, n, k, d);
  check_ptr(op, "pair_row", pair_row, n * k);
  check_ptr(op, "dsrc", dsrc, n * d);
  if (n == 0 || d == 0) return;
  parallel_chunks(n, token_grain(k * d), [&](int64_t begin, int64_t end) {
    HWY_DYNAMIC_DISPATCH(ScatterAddRows)
    (drows, dt, pair_row, size_t(begin), size_t(end), size_t(k), size_t(d), dsrc);
  });
}

void moe_combine(const void* y, DType dt, const int32_t* pair_row, const float* weights, int64_t n,
                 int64_t k, int64_t d, float* out) {
  const char* op = "moe_combine";
  check_row_op(op, dt, n, k, d);
  check_ptr(op, "pair_row", pair_row, n * k);
  check_ptr(op, "weights", weights, n * k);
  check_ptr(op, "out", out, n * d);
  if (n == 0 || d == 0) return;
  parallel_chunks(n, token_grain(k * d), [&](int64_t begin, int64_t end) {
    HWY_DYNAMIC_DISPATCH(CombineRows)
    (y, dt, pair_row, weights, size_t(begin), size_t(end), size_t(k), size_t(d), out);
  });
}

void moe_combine_backward(const float* dout, const void* y, DType dt, const int32_t* pair_row,
                          const int32_t* row_token, const float* weights, int64_t n, int64_t k,
                          int64_t d, int64_t rows, void* dy, float* dweights) {
  const char* op = "moe_combine_backward";
  check_row_op(op, dt, n, k, d);
  HYP_CHECK(rows >= 0, "{}: rows = {} must be >= 0", op, rows);
  check_ptr(op, "dout", dout, n * d);
  check_ptr(op, "pair_row", pair_row, n * k);
  check_ptr(op, "row_token", row_token, rows);
  check_ptr(op, "weights", weights, n * k);
  check_ptr(op, "dy", dy, rows * d);
  check_ptr(op, "dweights", dweights, n * k);
  parallel_chunks(n, token_grain(k * d), [&](int64_t begin, int64_t end) {
    HWY_DYNAMIC_DISPATCH(CombineBackwardRows)
    (dout, y, dt, pair_row, weights, size_t(begin), size_t(end), size_t(k), size_t(d), dy,
     dweights);
  });
  // Padding rows (capped plans) get no pair: zero them so the grouped GEMM backward
  // sees exact zeros there.
  if (d == 0) return;
  const size_t bytes = size_t(d) * dtype_size(dt);
  auto* o = static_cast<unsigned char*>(dy);
  parallel_chunks(rows, token_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      if (row_token[r] < 0) std::memset(o + size_t(r) * bytes, 0, bytes);
  });
}

// ---- Scalar references.
namespace ref {

namespace {
double load(const void* p, DType dt, int64_t i) {
  return load_as_f32(p, dt, size_t(i));
}
void store(void* p, DType dt, int64_t i, double v) {
  if (dt == DType::kF32) {
    static_cast<float*>(p)[i] = static_cast<float>(v);
  } else {
    static_cast<bf16*>(p)[i] = f32_to_bf16(static_cast<float>(v));
  }
}
}  // namespace

void router_topk_forward(const float* logits, int64_t n, int64_t e, int64_t k, bool normalize,
                         float* probs, int32_t* experts, float* weights) {
  check_router_dims("ref::router_topk_forward", n, e, k);
  std::vector<double> p(static_cast<size_t>(e));
  std::vector<bool> taken(static_cast<size_t>(e));
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits + r * e;
    double m = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t j = 0; j < e; ++j) m = std::max<double>(m, x[j]);
    for (int64_t j = 0; j < e; ++j) sum += p[j] = std::exp(double(x[j]) - m);
    for (int64_t j = 0; j < e; ++j) {
      p[j] /= sum;
      probs[r * e + j] = static_cast<float>(p[j]);
    }
    // k passes of argmax; strict > keeps the lower index on ties.
    std::fill(taken.begin(), taken.end(), false);
    double s = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t x2 = 0; x2 < e; ++x2)
        if (!taken[x2] && (best < 0 || p[x2] > p[best])) best = x2;
      taken[best] = true;
      experts[r * k + j] = static_cast<int32_t>(best);
      s += p[best];
    }
    for (int64_t j = 0; j < k; ++j)
      weights[r * k + j] = static_cast<float>(p[experts[r * k + j]] / (normalize ? s : 1.0));
  }
}

void router_topk_backward(const float* probs, const int32_t* experts, const float* weights,
                          const float* dweights, const float* dprobs, int64_t n, int64_t e,
                          int64_t k, bool normalize, float* dlogits) {
  const char* op = "ref::router_topk_backward";
  check_router_dims(op, n, e, k);
  check_experts(op, experts, n, k, e);
  std::vector<double> dp(static_cast<size_t>(e));
  for (int64_t r = 0; r < n; ++r) {
    const float* p = probs + r * e;
    for (int64_t x = 0; x < e; ++x) dp[x] = dprobs ? dprobs[r * e + x] : 0.0;
    double s = 0, g = 0;
    for (int64_t j = 0; j < k; ++j) {
      s += p[experts[r * k + j]];
      g += double(dweights[r * k + j]) * weights[r * k + j];
    }
    for (int64_t j = 0; j < k; ++j) {
      const double dw = dweights[r * k + j];
      dp[experts[r * k + j]] += normalize ? (dw - g) / s : dw;
    }
    double dot = 0;
    for (int64_t x = 0; x < e; ++x) dot += p[x] * dp[x];
    for (int64_t x = 0; x < e; ++x) dlogits[r * e + x] = static_cast<float>(p[x] * (dp[x] - dot));
  }
}

float load_balance_loss(const float* probs, const int32_t* experts, int64_t b, int64_t t, int64_t e,
                        int64_t k, float weight, float* dprobs, float dscale) {
  const char* op = "ref::load_balance_loss";
  check_router_dims(op, b * t, e, k);
  check_experts(op, experts, b * t, k, e);
  if (b * t == 0) return 0.0f;
  double loss = 0;
  std::vector<double> f(static_cast<size_t>(e)), P(static_cast<size_t>(e));
  for (int64_t s = 0; s < b; ++s) {
    std::fill(f.begin(), f.end(), 0.0);
    std::fill(P.begin(), P.end(), 0.0);
    for (int64_t r = s * t; r < (s + 1) * t; ++r) {
      for (int64_t j = 0; j < k; ++j) f[experts[r * k + j]] += 1.0 / double(t);
      for (int64_t x = 0; x < e; ++x) P[x] += probs[r * e + x] / double(t);
    }
    const double c = double(weight) * double(e) * double(e) / double(b * e);
    for (int64_t x = 0; x < e; ++x) loss += c * f[x] * P[x];
    if (dprobs == nullptr) continue;
    for (int64_t r = s * t; r < (s + 1) * t; ++r)
      for (int64_t x = 0; x < e; ++x)
        dprobs[r * e + x] += static_cast<float>(double(dscale) * c * f[x] / double(t));
  }
  return static_cast<float>(loss);
}

float router_z_loss(const float* logits, int64_t n, int64_t e, float weight, float* dlogits,
                    float dscale) {
  check_router_dims("ref::router_z_loss", n, e, 1);
  if (n == 0) return 0.0f;
  double loss = 0;
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits + r * e;
    double m = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t j = 0; j < e; ++j) m = std::max<double>(m, x[j]);
    for (int64_t j = 0; j < e; ++j) sum += std::exp(double(x[j]) - m);
    const double lse = m + std::log(sum);
    loss += double(weight) * lse * lse / double(n);
    if (dlogits == nullptr) continue;
    for (int64_t j = 0; j < e; ++j)
      dlogits[r * e + j] += static_cast<float>(double(dscale) * 2.0 * double(weight) * lse *
                                               std::exp(double(x[j]) - m) / sum / double(n));
  }
  return static_cast<float>(loss);
}

void moe_gather_rows(const void* src, DType dt, const int32_t* row_token, int64_t rows, int64_t d,
                     void* dst) {
  check_row_op("ref::moe_gather_rows", dt, rows, 1, d);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < d; ++i)
      store(dst, dt, r * d + i, row_token[r] < 0 ? 0.0 : load(src, dt, row_token[r] * d + i));
}

void moe_scatter_add_rows(const void* drows, DType dt, const int32_t* pair_row, int64_t n,
                          int64_t k, int64_t d, float* dsrc) {
  check_row_op("ref::moe_scatter_add_rows", dt, n, k, d);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < d; ++i) {
      double acc = dsrc[t * d + i];
      for (int64_t j = 0; j < k; ++j)
        if (pair_row[t * k + j] >= 0) acc += load(drows, dt, pair_row[t * k + j] * d + i);
      dsrc[t * d + i] = static_cast<float>(acc);
    }
  }
}

void moe_combine(const void* y, DType dt, const int32_t* pair_row, const float* weights, int64_t n,
                 int64_t k, int64_t d, float* out) {
  check_row_op("ref::moe_combine", dt, n, k, d);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < d; ++i) {
      double acc = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = pair_row[t * k + j];
        if (row >= 0) acc += double(weights[t * k + j]) * load(y, dt, row * d + i);
      }
      out[t * d + i] = static_cast<float>(out[t * d + i] + acc);
    }
  }
}

void moe_combine_backward(const float* dout, const void* y, DType dt, const int32_t* pair_row,
                          const int32_t* row_token, const float* weights, int64_t n, int64_t k,
                          int64_t d, int64_t rows, void* dy, float* dweights) {
  check_row_op("ref::moe_combine_backward", dt, n, k, d);
  for (int64_t r = 0; r < rows; ++r)
    if (row_token[r] < 0)
      for (int64_t i = 0; i < d; ++i) store(dy, dt, r * d + i, 0.0);
  for (int64_t p = 0; p < n * k; ++p) {
    const int64_t row = pair_row[p], t = p / k;
    double dot = 0;
    if (row >= 0) {
      for (int64_t i = 0; i < d; ++i) {
        dot += double(dout[t * d + i]) * load(y, dt, row * d + i);
        store(dy, dt, row * d + i, double(weights[p]) * dout[t * d + i]);
      }
    }
    dweights[p] = static_cast<float>(dot);
  }
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
