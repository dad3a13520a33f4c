// Softmax forward/backward with Highway dynamic dispatch (AVX-512, AVX2, SSE4, scalar).
//
// Forward per row: pass 1 finds the max, pass 2 writes e = exp(x - max) into the f32
// output row (or a per-chunk f32 scratch row when the output is bf16, so bf16 is
// rounded once) while summing it, pass 3 scales by 1 / sum. One exp per element (the
// compute cost, hence the lean FastExp of simd-inl.h); the row is read from memory once,
// passes 2-3 hit L1/L2 for any realistic vocabulary.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/softmax.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/softmax.h"
#include "tensor/convert.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

template <typename TX, typename TY>
void SoftmaxForwardT(const TX* x, TY* y, size_t rows, size_t cols, float* scratch) {
  const DF d;
  const size_t n = hn::Lanes(d);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  constexpr bool kPairs = std::is_same_v<TX, bf16> && std::is_same_v<TY, bf16>;
  for (size_t r = 0; r < rows; ++r) {
    const TX* xr = x + r * cols;
    TY* yr = y + r * cols;
    float* e;
    if constexpr (std::is_same_v<TY, float>) {
      e = yr;  // may alias xr: every pass reads index i before writing it
    } else {
      e = scratch;
    }

    const VF vmax = hn::Set(d, RowMax<kPairs>(d, xr, cols));

    // Pass 2 is compute-bound (the exp) while passes 1 and 3 wait on memory, so pass 2
    // prefetches the next row of x (and of y, for writing) at the same offset: the
    // DRAM traffic then overlaps the exp work instead of stalling pass 1 of the next
    // row. The last row prefetches itself (harmless, already cached).
    const bool more = r + 1 < rows;
    const char* xn = reinterpret_cast<const char*>(more ? xr + cols : xr);
    const char* yn = reinterpret_cast<const char*>(more ? yr + cols : yr);
    VF s0 = hn::Zero(d), s1 = hn::Zero(d);
    size_t i = 0;
    for (; i + 2 * n <= cols; i += 2 * n) {
      for (size_t b = 0; b < 2 * n * sizeof(TX); b += 64)
        __builtin_prefetch(xn + i * sizeof(TX) + b);
      for (size_t b = 0; b < 2 * n * sizeof(TY); b += 64)
        __builtin_prefetch(yn + i * sizeof(TY) + b, 1);
      VF v0, v1;
      Load2<kPairs>(d, xr + i, v0, v1);
      const VF e0 = FastExp(d, hn::Sub(v0, vmax));
      const VF e1 = FastExp(d, hn::Sub(v1, vmax));
      hn::StoreU(e0, d, e + i);
      hn::StoreU(e1, d, e + i + n);
      s0 = hn::Add(s0, e0);
      s1 = hn::Add(s1, e1);
    }
    for (; i + n <= cols; i += n) {
      const VF e0 = FastExp(d, hn::Sub(LoadF(d, xr + i), vmax));
      hn::StoreU(e0, d, e + i);
      s0 = hn::Add(s0, e0);
    }
    if (i < cols) {
      const VF e0 = FastExp(d, hn::Sub(LoadTail(d, xr + i, cols - i, neg_inf), vmax));
      StoreTail(d, e0, e + i, cols - i);
      s0 = hn::Add(s0, e0);
    }
    const float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
    // sum == 0 only for an all -inf row: output zeros. A NaN sum stays NaN.
    const VF vinv = hn::Set(d, sum == 0.0f ? 0.0f : 1.0f / sum);

    i = 0;
    if constexpr (kPairs) {
      // Same 2n blocks as pass 2, so the pair order in e matches.
      for (; i + 2 * n <= cols; i += 2 * n)
        StorePairs(d, hn::Mul(hn::LoadU(d, e + i), vinv), hn::Mul(hn::LoadU(d, e + i + n), vinv),
                   yr + i);
    }
    for (; i + n <= cols; i += n) StoreF(d, hn::Mul(hn::LoadU(d, e + i), vinv), yr + i);
    if (i < cols) StoreTail(d, hn::Mul(LoadTail(d, e + i, cols - i, 0.0f), vinv), yr + i, cols - i);
  }
}

template <typename TY, typename TG, typename TO>
void SoftmaxBackwardT(const TY* y, const TG* dy, TO* dx, size_t rows, size_t cols) {
  const DF d;
  const size_t n = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    const TY* yr = y + r * cols;
    const TG* gr = dy + r * cols;
    TO* outr = dx + r * cols;
    VF a0 = hn::Zero(d), a1 = hn::Zero(d);
    size_t i = 0;
    for (; i + 2 * n <= cols; i += 2 * n) {
      a0 = hn::MulAdd(LoadF(d, yr + i), LoadF(d, gr + i), a0);
      a1 = hn::MulAdd(LoadF(d, yr + i + n), LoadF(d, gr + i + n), a1);
    }
    for (; i + n <= cols; i += n) a0 = hn::MulAdd(LoadF(d, yr + i), LoadF(d, gr + i), a0);
    if (i < cols) {
      a0 = hn::MulAdd(LoadTail(d, yr + i, cols - i, 0.0f), LoadTail(d, gr + i, cols - i, 0.0f), a0);
    }
    const VF dot = hn::Set(d, hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1))));
    // dx may alias y or dy: each index is read before it is written.
    for (i = 0; i + n <= cols; i += n)
      StoreF(d, hn::Mul(LoadF(d, yr + i), hn::Sub(LoadF(d, gr + i), dot)), outr + i);
    if (i < cols) {
      const VF yv = LoadTail(d, yr + i, cols - i, 0.0f);
      const VF gv = LoadTail(d, gr + i, cols - i, 0.0f);
      StoreTail(d, hn::Mul(yv, hn::Sub(gv, dot)), outr + i, cols - i);
    }
  }
}

// Exported entry points: one per target, dtype switch outside the row loops.
void SoftmaxForwardRows(const void* x, DType xt, void* y, DType yt, size_t rows, size_t cols,
                        float* scratch) {
  if (xt == DType::kF32) {
    if (yt == DType::kF32) {
      SoftmaxForwardT(static_cast<const float*>(x), static_cast<float*>(y), rows, cols, scratch);
    } else {
      SoftmaxForwardT(static_cast<const float*>(x), static_cast<bf16*>(y), rows, cols, scratch);
    }
  } else {
    if (yt == DType::kF32) {
      SoftmaxForwardT(static_cast<const bf16*>(x), static_cast<float*>(y), rows, cols, scratch);
    } else {
      SoftmaxForwardT(static_cast<const bf16*>(x), static_cast<bf16*>(y), rows, cols, scratch);
    }
  }
}

template <typename TY, typename TG>
void BackwardOut(const TY* y, const TG* dy, void* dx, DType dxt, size_t rows, size_t cols) {
  if (dxt == DType::kF32) {
    SoftmaxBackwardT(y, dy, static_cast<float*>(dx), rows, cols);
  } else {
    SoftmaxBackwardT(y, dy, static_cast<bf16*>(dx), rows, cols);
  }
}
template <typename TY>
void BackwardGrad(const TY* y, const void* dy, DType dyt, void* dx, DType dxt, size_t rows,
                  size_t cols) {
  if (dyt == DType::kF32) {
    BackwardOut(y, static_cast<const float*>(dy), dx, dxt, rows, cols);
  } else {
    BackwardOut(y, static_cast<const bf16*>(dy), dx, dxt, rows, cols);
  }
}
void SoftmaxBackwardRows(const void* y, DType yt, const void* dy, DType dyt, void* dx, DType dxt,
                         size_t rows, size_t cols) {
  if (yt == DType::kF32) {
    BackwardGrad(static_cast<const float*>(y), dy, dyt, dx, dxt, rows, cols);
  } else {
    BackwardGrad(static_cast<const bf16*>(y), dy, dyt, dx, dxt, rows, cols);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cstdint>
#include <vector>

#include "base/aligned.h"
#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(SoftmaxForwardRows);
HWY_EXPORT(SoftmaxBackwardRows);

namespace {

void check_activation(const char* op, const char* name, const TensorView& t) {
  HYP_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16, "{}: {} must be f32 or bf16, got {}",
            op, name, t.str());
  HYP_CHECK(t.rank() >= 1, "{}: {} must have rank >= 1, got {}", op, name, t.str());
  check_contiguous(op, name, t);
}

// Exact aliasing (in place) is fine; a partial overlap would read already-written values.
void check_overlap(const char* op, const char* na, const TensorView& a, const char* nb,
                   const TensorView& b) {
  const auto* pa = static_cast<const unsigned char*>(a.data);
  const auto* pb = static_cast<const unsigned char*>(b.data);
  if (a.numel() == 0 || b.numel() == 0) return;
  if (pa == pb) {
    HYP_CHECK(a.dtype == b.dtype, "{}: {} {} and {} {} share memory but differ in dtype", op, na,
              a.str(), nb, b.str());
    return;
  }
  HYP_CHECK(pa + a.nbytes() <= pb || pb + b.nbytes() <= pa,
            "{}: {} {} partially overlaps {} {} (only exact in-place aliasing is supported)", op,
            na, a.str(), nb, b.str());
}

// Rows per parallel chunk: enough elements that the fork/join is amortised.
int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
}

}  // namespace

void softmax_forward(const TensorView& x, const TensorView& y) {
  const char* op = "softmax_forward";
  check_activation(op, "x", x);
  check_activation(op, "y", y);
  HYP_CHECK(x.shape == y.shape, "{}: x {} and y {} differ in shape", op, x.str(), y.str());
  check_overlap(op, "x", x, "y", y);
  const int64_t cols = x.shape.dim(-1);
  if (x.numel() == 0) return;
  const int64_t rows = x.numel() / cols;
  const size_t xs = dtype_size(x.dtype), ys = dtype_size(y.dtype);
  parallel_chunks(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
    AlignedBuffer<float> scratch(y.dtype == DType::kF32 ? 0 : static_cast<size_t>(cols));
    HWY_DYNAMIC_DISPATCH(SoftmaxForwardRows)
    (static_cast<const unsigned char*>(x.data) + begin * cols * xs, x.dtype,
     static_cast<unsigned char*>(y.data) + begin * cols * ys, y.dtype, size_t(end - begin),
     size_t(cols), scratch.data());
  });
}

void softmax_backward(const TensorView& y, const TensorView& dy, const TensorView& dx) {
  const char* op = "softmax_backward";
  check_activation(op, "y", y);
  check_activation(op, "dy", dy);
  check_activation(op, "dx", dx);
  HYP_CHECK(y.shape == dy.shape && y.shape == dx.shape, "{}: y {}, dy {} and dx {} differ in shape",
            op, y.str(), dy.str(), dx.str());
  check_overlap(op, "dx", dx, "y", y);
  check_overlap(op, "dx", dx, "dy", dy);
  const int64_t cols = y.shape.dim(-1);
  if (y.numel() == 0) return;
  const int64_t rows = y.numel() / cols;
  const size_t ys = dtype_size(y.dtype), gs = dtype_size(dy.dtype), os = dtype_size(dx.dtype);
  parallel_chunks(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
    const int64_t off = begin * cols;
    HWY_DYNAMIC_DISPATCH(SoftmaxBackwardRows)
    (static_cast<const unsigned char*>(y.data) + off * ys, y.dtype,
     static_cast<const unsigned char*>(dy.data) + off * gs, dy.dtype,
     static_cast<unsigned char*>(dx.data) + off * os, dx.dtype, size_t(end - begin), size_t(cols));
  });
}

namespace ref {

namespace {
void store_f32(const TensorView& t, size_t i, double v) {
  if (t.dtype == DType::kF32) {
    static_cast<float*>(t.data)[i] = static_cast<float>(v);
  } else {
    static_cast<bf16*>(t.data)[i] = f32_to_bf16(static_cast<float>(v));
  }
}
}  // namespace

void softmax_forward(const TensorView& x, const TensorView& y) {
  const char* op = "ref::softmax_forward";
  check_activation(op, "x", x);
  check_activation(op, "y", y);
  HYP_CHECK(x.shape == y.shape, "{}: x {} and y {} differ in shape", op, x.str(), y.str());
  const int64_t cols = x.shape.dim(-1);
  if (x.numel() == 0) return;
  const int64_t rows = x.numel() / cols;
  std::vector<double> e(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const size_t base = static_cast<size_t>(r * cols);
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < cols; ++j)
      m = std::max<double>(m, load_as_f32(x.data, x.dtype, base + j));
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double v = load_as_f32(x.data, x.dtype, base + j);
      e[j] = v == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(v - m);
      sum += e[j];
    }
    for (int64_t j = 0; j < cols; ++j) store_f32(y, base + j, sum == 0 ? 0.0 : e[j] / sum);
  }
}

void softmax_backward(const TensorView& y, const TensorView& dy, const TensorView& dx) {
  const char* op = "ref::softmax_backward";
  check_activation(op, "y", y);
  check_activation(op, "dy", dy);
  check_activation(op, "dx", dx);
  HYP_CHECK(y.shape == dy.shape && y.shape == dx.shape, "{}: y {}, dy {} and dx {} differ in shape",
            op, y.str(), dy.str(), dx.str());
  const int64_t cols = y.shape.dim(-1);
  if (y.numel() == 0) return;
  const int64_t rows = y.numel() / cols;
  for (int64_t r = 0; r < rows; ++r) {
    const size_t base = static_cast<size_t>(r * cols);
    double dot = 0;
    for (int64_t j = 0; j < cols; ++j)
      dot +=
          double(load_as_f32(y.data, y.dtype, base + j)) * load_as_f32(dy.data, dy.dtype, base + j);
    for (int64_t j = 0; j < cols; ++j) {
      const double yv = load_as_f32(y.data, y.dtype, base + j);
      const double gv = load_as_f32(dy.data, dy.dtype, base + j);
      store_f32(dx, base + j, yv * (gv - dot));
    }
  }
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
