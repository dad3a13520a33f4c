// Fused softmax cross-entropy with Highway dynamic dispatch (AVX-512, AVX2, SSE4, scalar).
//
// Per row: pass 1 finds the max, pass 2 sums exp(x - max) (keeping it in f32 for the
// gradient), pass 3 (fused call only) writes (p - onehot) * scale over the gradient
// row. One exp per element, the compute cost; the row comes from DRAM once (passes 2-3
// hit L1/L2) and pass 2 prefetches the next row so memory and exp work overlap. No
// full probability buffer is ever materialised (one f32 row per thread for bf16).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cross_entropy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cross_entropy.h"
#include "tensor/convert.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

// Per row: pass 1 finds the max (memory-bound, one DRAM read of the row), pass 2 sums
// e = exp(x - max) and, for the gradient, keeps e in f32 (in the f32 gradient row itself,
// else in a per-chunk scratch row: bf16 is then rounded once), pass 3 writes e * scale /
// sum. One exp per element, the compute cost; passes 2-3 hit L1/L2 for any realistic
// vocabulary. Pass 2 also prefetches the next row so its DRAM traffic overlaps the exp
// work rather than stalling the next pass 1.
template <typename T>
void CrossEntropyT(const T* x, const int32_t* targets, int32_t ignore_index, size_t rows,
                   size_t cols, T* grad, float scale, double* row_loss, float* scratch) {
  const DF d;
  const size_t n = hn::Lanes(d);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  constexpr bool kPairs = std::is_same_v<T, bf16>;
  for (size_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* gr = grad ? grad + r * cols : nullptr;
    const int32_t t = targets[r];
    if (t == ignore_index) {
      row_loss[r] = 0;
      if (gr) std::memset(static_cast<void*>(gr), 0, cols * sizeof(T));
      continue;
    }
    // Read before pass 2 overwrites it when the gradient aliases the logits.
    const float xt = ToF32(xr[t]);

    // Pass 1.
    const float m = RowMax<kPairs>(d, xr, cols);
    const VF vm = hn::Set(d, m);

    // Pass 2. e may alias xr (f32 in place): index i is read before it is written.
    float* e = nullptr;
    if (gr) {
      if constexpr (std::is_same_v<T, float>) {
        e = gr;
      } else {
        e = scratch;
      }
    }
    const bool more = r + 1 < rows;
    const char* xn = reinterpret_cast<const char*>(more ? xr + cols : xr);
    const char* gn = gr ? reinterpret_cast<const char*>(more ? gr + cols : gr) : nullptr;
    VF s0 = hn::Zero(d), s1 = hn::Zero(d);
    size_t i = 0;
    for (; i + 2 * n <= cols; i += 2 * n) {
      for (size_t b = 0; b < 2 * n * sizeof(T); b += 64) {
        __builtin_prefetch(xn + i * sizeof(T) + b);
        if (gn && gn != xn) __builtin_prefetch(gn + i * sizeof(T) + b, 1);
      }
      VF v0, v1;
      Load2<kPairs>(d, xr + i, v0, v1);
      const VF e0 = FastExp(d, hn::Sub(v0, vm));
      const VF e1 = FastExp(d, hn::Sub(v1, vm));
      if (e) {
        hn::StoreU(e0, d, e + i);
        hn::StoreU(e1, d, e + i + n);
      }
      s0 = hn::Add(s0, e0);
      s1 = hn::Add(s1, e1);
    }
    for (; i + n <= cols; i += n) {
      const VF e0 = FastExp(d, hn::Sub(LoadF(d, xr + i), vm));
      if (e) hn::StoreU(e0, d, e + i);
      s0 = hn::Add(s0, e0);
    }
    if (i < cols) {
      const VF e0 = FastExp(d, hn::Sub(LoadTail(d, xr + i, cols - i, neg_inf), vm));
      if (e) StoreTail(d, e0, e + i, cols - i);
      s0 = hn::Add(s0, e0);
    }
    const float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));

    // s == 0 only when every logit is -inf.
    row_loss[r] = s == 0.0f ? std::numeric_limits<double>::infinity()
                            : (double(m) - double(xt)) + std::log(double(s));
    if (!gr) continue;

    // Pass 3: p * scale everywhere, then the target entry is fixed up.
    const VF vinv = hn::Set(d, s == 0.0f ? 0.0f : scale / s);
    i = 0;
    if constexpr (kPairs) {
      // Same 2n blocks as pass 2, so the pair order in e matches.
      for (; i + 2 * n <= cols; i += 2 * n)
        StorePairs(d, hn::Mul(hn::LoadU(d, e + i), vinv), hn::Mul(hn::LoadU(d, e + i + n), vinv),
                   gr + i);
    }
    for (; i + n <= cols; i += n) StoreF(d, hn::Mul(hn::LoadU(d, e + i), vinv), gr + i);
    if (i < cols) StoreTail(d, hn::Mul(LoadTail(d, e + i, cols - i, 0.0f), vinv), gr + i, cols - i);
    // (p_t - 1) * scale rounded once, computed in double to limit the cancellation.
    const double pt = s == 0.0f ? 0.0 : std::exp(double(xt) - double(m)) / double(s);
    gr[t] = FromF32<T>(static_cast<float>((pt - 1.0) * double(scale)));
  }
}

// Exported entry point: `grad` may be null (forward only); `grad` may equal `logits`.
void CrossEntropyRows(const void* logits, DType dtype, const int32_t* targets, int32_t ignore_index,
                      size_t rows, size_t cols, void* grad, float scale, double* row_loss,
                      float* scratch) {
  if (dtype == DType::kF32) {
    CrossEntropyT(static_cast<const float*>(logits), targets, ignore_index, rows, cols,
                  static_cast<float*>(grad), scale, row_loss, scratch);
  } else {
    CrossEntropyT(static_cast<const bf16*>(logits), targets, ignore_index, rows, cols,
                  static_cast<bf16*>(grad), scale, row_loss, scratch);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <vector>

#include "base/aligned.h"
#include "base/error.h"
#include "base/threads.h"
#include "kernels/softcap.h"

namespace hyperion {

HWY_EXPORT(CrossEntropyRows);

namespace {

// Validates the arguments and the targets; returns the number of non-ignored rows.
int64_t check_arguments(const char* op, const TensorView& logits, const TensorView& targets,
                        const TensorView& row_loss, int32_t ignore_index, float softcap) {
  HYP_CHECK(softcap == 0.0f || (std::isfinite(softcap) && softcap > 0.0f),
            "{}: softcap must be 0 (off) or finite and > 0, got {}", op, softcap);
  HYP_CHECK(logits.dtype == DType::kF32 || logits.dtype == DType::kBF16,
            "{}: logits must be f32 or bf16, got {}", op, logits.str());
  check_rank(op, "logits", logits, 2);
  check_contiguous(op, "logits", logits);
  targets.check_dtype(DType::kI32, op);
  check_rank(op, "targets", targets, 1);
  check_contiguous(op, "targets", targets);
  HYP_CHECK(targets.shape[0] == logits.shape[0],
            "{}: logits {} and targets {} disagree on the number of rows", op, logits.str(),
            targets.str());
  if (row_loss.data != nullptr) {
    HYP_CHECK(row_loss.dtype == DType::kF32 && row_loss.shape == Shape{logits.shape[0]},
              "{}: row_loss must be f32[{}], got {}", op, logits.shape[0], row_loss.str());
    check_contiguous(op, "row_loss", row_loss);
  }
  const int64_t rows = logits.shape[0], cols = logits.shape[1];
  const int32_t* t = static_cast<const int32_t*>(targets.data);
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] == ignore_index) continue;
    HYP_CHECK(t[r] >= 0 && t[r] < cols,
              "{}: target {} at row {} is out of range for logits {} (ignore_index is {})", op,
              t[r], r, logits.str(), ignore_index);
    ++count;
  }
  return count;
}

// Soft-capped rows: each row is capped into an f32 copy (with the cap's derivative beside
// it), the plain kernel runs on the copy in place, and the gradient is multiplied by the
// derivative on its way back. Two f32 rows per thread; only Gemma 2's head pays for it.
void capped_rows(const TensorView& logits, const int32_t* t, int32_t ignore_index, int64_t begin,
                 int64_t end, void* grad, float scale, float cap, double* losses) {
  const int64_t cols = logits.shape[1];
  const size_t es = dtype_size(logits.dtype);
  AlignedBuffer<float> y(static_cast<size_t>(cols)), dt(grad ? static_cast<size_t>(cols) : 0);
  for (int64_t r = begin; r < end; ++r) {
    const size_t off = static_cast<size_t>(r * cols);
    convert_any(static_cast<const unsigned char*>(logits.data) + off * es, logits.dtype, y.data(),
                DType::kF32, static_cast<size_t>(cols));
    softcap_scaled(y.data(), cols, 1.0f / cap, cap, grad ? dt.data() : nullptr);
    HWY_DYNAMIC_DISPATCH(CrossEntropyRows)
    (y.data(), DType::kF32, t + r, ignore_index, 1, size_t(cols), grad ? y.data() : nullptr, scale,
     losses + r, nullptr);
    if (grad == nullptr) continue;
    for (int64_t j = 0; j < cols; ++j) y[j] *= dt[j];
    convert_any(y.data(), DType::kF32, static_cast<unsigned char*>(grad) + off * es, logits.dtype,
                static_cast<size_t>(cols));
  }
}

CrossEntropyResult run(const TensorView& logits, const TensorView& targets, void* grad, float dloss,
                       const TensorView& row_loss, int32_t ignore_index, int64_t count,
                       float softcap) {
  const int64_t rows = logits.shape[0], cols = logits.shape[1];
  CrossEntropyResult result;
  result.count = count;
  if (rows == 0) return result;
  const float scale = count > 0 ? static_cast<float>(double(dloss) / double(count)) : 0.0f;
  std::vector<double> losses(static_cast<size_t>(rows));
  const size_t es = dtype_size(logits.dtype);
  const int32_t* t = static_cast<const int32_t*>(targets.data);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
  parallel_chunks(rows, grain, [&](int64_t begin, int64_t end) {
    if (softcap > 0.0f)
      return capped_rows(logits, t, ignore_index, begin, end, grad, scale, softcap, losses.data());
    const int64_t off = begin * cols;
    // f32 staging of exp(x - max) for a bf16 gradient row (see CrossEntropyT).
    AlignedBuffer<float> scratch(grad && logits.dtype == DType::kBF16 ? size_t(cols) : 0);
    HWY_DYNAMIC_DISPATCH(CrossEntropyRows)
    (static_cast<const unsigned char*>(logits.data) + off * es, logits.dtype, t + begin,
     ignore_index, size_t(end - begin), size_t(cols),
     grad ? static_cast<unsigned char*>(grad) + off * es : nullptr, scale, losses.data() + begin,
     scratch.data());
  });
  // Row order, one thread: the sum is the same for any thread count.
  double total = 0;
  for (double l : losses) total += l;
  if (row_loss.data != nullptr) {
    float* out = static_cast<float*>(row_loss.data);
    for (int64_t r = 0; r < rows; ++r) out[r] = static_cast<float>(losses[r]);
  }
  result.loss = count > 0 ? total / double(count) : 0.0;
  return result;
}

void check_gradient(const char* op, const TensorView& logits, const TensorView& dlogits) {
  HYP_CHECK(dlogits.dtype == logits.dtype && dlogits.shape == logits.shape,
            "{}: dlogits {} must match logits {} in dtype and shape", op, dlogits.str(),
            logits.str());
  check_contiguous(op, "dlogits", dlogits);
  const auto* a = static_cast<const unsigned char*>(logits.data);
  const auto* b = static_cast<const unsigned char*>(dlogits.data);
  HYP_CHECK(a == b || a + logits.nbytes() <= b || b + dlogits.nbytes() <= a || logits.numel() == 0,
            "{}: dlogits {} partially overlaps logits {} (only exact in-place aliasing is "
            "supported)",
            op, dlogits.str(), logits.str());
}

}  // namespace

CrossEntropyResult cross_entropy_forward(const TensorView& logits, const TensorView& targets,
                                         const TensorView& row_loss, int32_t ignore_index,
                                         float softcap) {
  const char* op = "cross_entropy_forward";
  const int64_t count = check_arguments(op, logits, targets, row_loss, ignore_index, softcap);
  return run(logits, targets, nullptr, 0.0f, row_loss, ignore_index, count, softcap);
}

CrossEntropyResult cross_entropy_fused(const TensorView& logits, const TensorView& targets,
                                       const TensorView& dlogits, float dloss,
                                       const TensorView& row_loss, int32_t ignore_index,
                                       float softcap) {
  const char* op = "cross_entropy_fused";
  const int64_t count = check_arguments(op, logits, targets, row_loss, ignore_index, softcap);
  check_gradient(op, logits, dlogits);
  return run(logits, targets, dlogits.data, dloss, row_loss, ignore_index, count, softcap);
}

namespace ref {

CrossEntropyResult cross_entropy(const TensorView& logits, const TensorView& targets,
                                 const TensorView& dlogits, float dloss, const TensorView& row_loss,
                                 int32_t ignore_index, float softcap) {
  const char* op = "ref::cross_entropy";
  const int64_t count = check_arguments(op, logits, targets, row_loss, ignore_index, softcap);
  const bool want_grad = dlogits.data != nullptr;
  if (want_grad) check_gradient(op, logits, dlogits);
  const int64_t rows = logits.shape[0], cols = logits.shape[1];
  const int32_t* t = static_cast<const int32_t*>(targets.data);
  const double inf = std::numeric_limits<double>::infinity();
  const double scale = count > 0 ? double(dloss) / double(count) : 0.0;
  std::vector<double> x(static_cast<size_t>(cols));
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const size_t base = static_cast<size_t>(r * cols);
    double loss = 0;
    std::vector<double> g(static_cast<size_t>(cols), 0.0);
    if (t[r] != ignore_index) {
      double m = -inf;
      for (int64_t j = 0; j < cols; ++j) {
        x[j] = load_as_f32(logits.data, logits.dtype, base + j);
        if (softcap > 0) x[j] = double(softcap) * std::tanh(x[j] / double(softcap));
        m = std::max(m, x[j]);
      }
      double sum = 0;
      if (m != -inf)
        for (int64_t j = 0; j < cols; ++j) sum += std::exp(x[j] - m);
      const double lse = m + std::log(sum);
      loss = sum == 0 ? inf : lse - x[t[r]];
      for (int64_t j = 0; j < cols; ++j) {
        const double p = sum == 0 ? 0.0 : std::exp(x[j] - lse);
        g[j] = (p - (j == t[r] ? 1.0 : 0.0)) * scale;
        // d/dz of cap * tanh(z / cap) = 1 - (x / cap)^2, x the capped logit.
        if (softcap > 0) g[j] *= 1.0 - (x[j] / softcap) * (x[j] / softcap);
      }
      total += loss;
    }
    if (row_loss.data != nullptr) static_cast<float*>(row_loss.data)[r] = static_cast<float>(loss);
    if (want_grad) {
      for (int64_t j = 0; j < cols; ++j) {
        if (dlogits.dtype == DType::kF32) {
          static_cast<float*>(dlogits.data)[base + j] = static_cast<float>(g[j]);
        } else {
          static_cast<bf16*>(dlogits.data)[base + j] = f32_to_bf16(static_cast<float>(g[j]));
        }
      }
    }
  }
  return CrossEntropyResult{count > 0 ? total / double(count) : 0.0, count};
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
