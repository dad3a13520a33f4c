// RMSNorm forward and backward with Highway dynamic dispatch. One row of x is the unit
// of work: the forward pass reads it twice (sum of squares, then scale) while it is hot
// in L1/L2, so memory is streamed once.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/rmsnorm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include <cmath>
#include <cstdint>

#include "kernels/rmsnorm.h"
#include "tensor/convert.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

template <typename T, typename TY>
void ForwardRows(const T* x, const float* w, TY* y, float* rstd, int64_t rows, int64_t h,
                 float eps, float woff) {
  const DF df;
  const VF vwoff = hn::Set(df, woff);
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * h;
    TY* yr = y + r * h;
    // Four accumulators hide the FMA latency.
    VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    int64_t i = 0;
    for (; i + 4 * n <= h; i += 4 * n) {
      const VF v0 = LoadF(df, xr + i), v1 = LoadF(df, xr + i + n);
      const VF v2 = LoadF(df, xr + i + 2 * n), v3 = LoadF(df, xr + i + 3 * n);
      a0 = hn::MulAdd(v0, v0, a0);
      a1 = hn::MulAdd(v1, v1, a1);
      a2 = hn::MulAdd(v2, v2, a2);
      a3 = hn::MulAdd(v3, v3, a3);
    }
    for (; i + n <= h; i += n) {
      const VF v = LoadF(df, xr + i);
      a0 = hn::MulAdd(v, v, a0);
    }
    float ss = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
    for (; i < h; ++i) {
      const float v = ToF32(xr[i]);
      ss += v * v;
    }
    const float rs = 1.0f / std::sqrt(ss / static_cast<float>(h) + eps);
    rstd[r] = rs;
    const VF vr = hn::Set(df, rs);
    // The first pass waits on DRAM and this one on the stores, so this one prefetches
    // the next row of x (and of y, for writing): the next row's reads then overlap this
    // row's work instead of stalling. The last row prefetches itself (harmless).
    const char* xn = reinterpret_cast<const char*>(r + 1 < rows ? xr + h : xr);
    const char* yn = reinterpret_cast<const char*>(r + 1 < rows ? yr + h : yr);
    i = 0;
    for (; i + n <= h; i += n) {
      if ((i * sizeof(T)) % 64 < n * sizeof(T)) {
        __builtin_prefetch(xn + i * sizeof(T));
        __builtin_prefetch(yn + i * sizeof(TY), 1);
      }
      StoreF(df, hn::Mul(hn::Mul(LoadF(df, xr + i), vr), hn::Add(hn::LoadU(df, w + i), vwoff)),
             yr + i);
    }
    for (; i < h; ++i) yr[i] = FromF32<TY>(ToF32(xr[i]) * rs * (w[i] + woff));
  }
}

// dx[j] = r*w[j]*dy[j] - x[j] * r^3/H * sum_k dy[k]*w[k]*x[k];  dw[j] += dy[j]*x[j]*r.
template <typename T, bool kAccumulate>
void BackwardRows(const T* dy, const T* x, const float* w, const float* rstd, T* dx,
                  float* dw_partial, int64_t rows, int64_t h, float woff) {
  const DF df;
  const VF vwoff = hn::Set(df, woff);
  // The effective weight w + woff (Gemma's 1 + w); the weight's own gradient is the same.
  const auto weff = [&](int64_t i) { return hn::Add(hn::LoadU(df, w + i), vwoff); };
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = 0; r < rows; ++r) {
    const T* dyr = dy + r * h;
    const T* xr = x + r * h;
    T* dxr = dx + r * h;
    const float rs = rstd[r];
    VF a0 = hn::Zero(df), a1 = hn::Zero(df);
    int64_t i = 0;
    for (; i + 2 * n <= h; i += 2 * n) {
      a0 = hn::MulAdd(hn::Mul(LoadF(df, dyr + i), weff(i)), LoadF(df, xr + i), a0);
      a1 = hn::MulAdd(hn::Mul(LoadF(df, dyr + i + n), weff(i + n)), LoadF(df, xr + i + n), a1);
    }
    for (; i + n <= h; i += n)
      a0 = hn::MulAdd(hn::Mul(LoadF(df, dyr + i), weff(i)), LoadF(df, xr + i), a0);
    float dot = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1)));
    for (; i < h; ++i) dot += ToF32(dyr[i]) * (w[i] + woff) * ToF32(xr[i]);
    const float c = rs * rs * rs * dot / static_cast<float>(h);
    const VF vr = hn::Set(df, rs), vnc = hn::Set(df, -c);
    // Prefetch the next row (as in the forward pass) so its DRAM reads overlap this pass.
    const bool more = r + 1 < rows;
    const char* dyn = reinterpret_cast<const char*>(more ? dyr + h : dyr);
    const char* xn = reinterpret_cast<const char*>(more ? xr + h : xr);
    const char* dxn = reinterpret_cast<const char*>(more ? dxr + h : dxr);
    i = 0;
    for (; i + n <= h; i += n) {
      if ((i * sizeof(T)) % 64 < n * sizeof(T)) {
        __builtin_prefetch(dyn + i * sizeof(T));
        __builtin_prefetch(xn + i * sizeof(T));
        __builtin_prefetch(dxn + i * sizeof(T), 1);
      }
      const VF g = LoadF(df, dyr + i), xv = LoadF(df, xr + i);
      // dw before dx: dx may alias dy.
      const VF gr = hn::Mul(g, vr);
      hn::StoreU(hn::MulAdd(gr, xv, hn::LoadU(df, dw_partial + i)), df, dw_partial + i);
      VF d = hn::MulAdd(vnc, xv, hn::Mul(gr, weff(i)));
      if constexpr (kAccumulate) d = hn::Add(d, LoadF(df, dxr + i));
      StoreF(df, d, dxr + i);
    }
    for (; i < h; ++i) {
      const float g = ToF32(dyr[i]), xv = ToF32(xr[i]);
      dw_partial[i] += g * rs * xv;
      const float d = g * rs * (w[i] + woff) - c * xv;
      dxr[i] = FromF32<T>(kAccumulate ? ToF32(dxr[i]) + d : d);
    }
  }
}

void ForwardF32(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t h,
                float eps, float woff) {
  ForwardRows(x, w, y, rstd, rows, h, eps, woff);
}
void ForwardBF16(const bf16* x, const float* w, bf16* y, float* rstd, int64_t rows, int64_t h,
                 float eps, float woff) {
  ForwardRows(x, w, y, rstd, rows, h, eps, woff);
}
void ForwardF32ToBF16(const float* x, const float* w, bf16* y, float* rstd, int64_t rows, int64_t h,
                      float eps, float woff) {
  ForwardRows(x, w, y, rstd, rows, h, eps, woff);
}
void BackwardF32(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                 float* dw_partial, int64_t rows, int64_t h, bool accumulate, float woff) {
  if (accumulate)
    BackwardRows<float, true>(dy, x, w, rstd, dx, dw_partial, rows, h, woff);
  else
    BackwardRows<float, false>(dy, x, w, rstd, dx, dw_partial, rows, h, woff);
}
void BackwardBF16(const bf16* dy, const bf16* x, const float* w, const float* rstd, bf16* dx,
                  float* dw_partial, int64_t rows, int64_t h, bool accumulate, float woff) {
  if (accumulate)
    BackwardRows<bf16, true>(dy, x, w, rstd, dx, dw_partial, rows, h, woff);
  else
    BackwardRows<bf16, false>(dy, x, w, rstd, dx, dw_partial, rows, h, woff);
}

// dweight[j] += sum_g partials[g][j] for j in [begin, end), g in a fixed order.
void SumPartials(const float* partials, int64_t groups, int64_t h, float* dweight, int64_t begin,
                 int64_t end) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  int64_t j = begin;
  for (; j + n <= end; j += n) {
    VF s = hn::LoadU(df, partials + j);
    for (int64_t g = 1; g < groups; ++g) s = hn::Add(s, hn::LoadU(df, partials + g * h + j));
    hn::StoreU(hn::Add(hn::LoadU(df, dweight + j), s), df, dweight + j);
  }
  for (; j < end; ++j) {
    float s = partials[j];
    for (int64_t g = 1; g < groups; ++g) s += partials[g * h + j];
    dweight[j] += s;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cstring>
#include <vector>

#include "base/aligned.h"
#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(ForwardF32);
HWY_EXPORT(ForwardBF16);
HWY_EXPORT(ForwardF32ToBF16);
HWY_EXPORT(BackwardF32);
HWY_EXPORT(BackwardBF16);
HWY_EXPORT(SumPartials);

namespace {

// Rows per parallel chunk: enough elements that a chunk amortises the fork.
int64_t row_grain(int64_t h) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(h, 1));
}

void check_activation(const char* op, const char* name, const TensorView& t) {
  check_rank(op, name, t, 2);
  HYP_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16, "{}: {} must be f32 or bf16, got {}",
            op, name, t.str());
  check_contiguous(op, name, t);
}

void check_weight(const char* op, const char* name, const TensorView& x, const TensorView& w) {
  check_rank(op, name, w, 1);
  w.check_dtype(DType::kF32, op);
  check_contiguous(op, name, w);
  HYP_CHECK(w.shape[0] == x.shape[1], "{}: x {} and {} {} disagree on the hidden size", op, x.str(),
            name, w.str());
}

void check_rstd(const char* op, const TensorView& x, const TensorView& rstd) {
  check_rank(op, "rstd", rstd, 1);
  rstd.check_dtype(DType::kF32, op);
  check_contiguous(op, "rstd", rstd);
  HYP_CHECK(rstd.shape[0] == x.shape[0], "{}: x {} and rstd {} disagree on the row count", op,
            x.str(), rstd.str());
}

void check_like_x(const char* op, const char* name, const TensorView& x, const TensorView& t) {
  check_contiguous(op, name, t);
  HYP_CHECK(t.shape == x.shape && t.dtype == x.dtype, "{}: {} {} must match x {}", op, name,
            t.str(), x.str());
}

void check_forward(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
                   const TensorView& rstd) {
  const char* op = "rmsnorm_forward";
  check_activation(op, "x", x);
  check_weight(op, "weight", x, weight);
  // y has x's shape; its dtype is x's, or bf16 for an f32 x (f32 residual stream feeding
  // bf16 matmuls).
  check_contiguous(op, "y", y);
  HYP_CHECK(y.shape == x.shape &&
                (y.dtype == x.dtype || (x.dtype == DType::kF32 && y.dtype == DType::kBF16)),
            "{}: y {} must have x's shape and dtype (or bf16 for an f32 x), x is {}", op, y.str(),
            x.str());
  check_rstd(op, x, rstd);
  HYP_CHECK(eps >= 0.0f && std::isfinite(eps), "{}: eps must be finite and >= 0, got {}", op, eps);
}

void check_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                    const TensorView& rstd, const TensorView& dx, const TensorView& dweight) {
  const char* op = "rmsnorm_backward";
  check_activation(op, "x", x);
  check_like_x(op, "dy", x, dy);
  check_like_x(op, "dx", x, dx);
  check_weight(op, "weight", x, weight);
  check_weight(op, "dweight", x, dweight);
  check_rstd(op, x, rstd);
}

double load(const TensorView& t, int64_t i) {
  return load_as_f32(t.data, t.dtype, static_cast<size_t>(i));
}
void store(const TensorView& t, int64_t i, double v) {
  if (t.dtype == DType::kF32)
    static_cast<float*>(t.data)[i] = static_cast<float>(v);
  else
    static_cast<bf16*>(t.data)[i] = f32_to_bf16(static_cast<float>(v));
}

}  // namespace

void rmsnorm_forward(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
                     const TensorView& rstd, float weight_offset) {
  check_forward(x, weight, eps, y, rstd);
  const int64_t rows = x.shape[0], h = x.shape[1];
  if (rows == 0) return;
  const float* w = weight.as<float>();
  float* rs = rstd.as<float>();
  if (h == 0) {  // mean of nothing: define rstd as 1/sqrt(eps), y is empty
    std::fill(rs, rs + rows, 1.0f / std::sqrt(eps));
    return;
  }
  parallel_chunks(rows, row_grain(h), [&](int64_t begin, int64_t end) {
    if (x.dtype == DType::kF32 && y.dtype == DType::kBF16) {
      HWY_DYNAMIC_DISPATCH(ForwardF32ToBF16)
      (x.as<float>() + begin * h, w, y.as<bf16>() + begin * h, rs + begin, end - begin, h, eps, weight_offset);
    } else if (x.dtype == DType::kF32) {
      HWY_DYNAMIC_DISPATCH(ForwardF32)
      (x.as<float>() + begin * h, w, y.as<float>() + begin * h, rs + begin, end - begin, h, eps, weight_offset);
    } else {
      HWY_DYNAMIC_DISPATCH(ForwardBF16)
      (x.as<bf16>() + begin * h, w, y.as<bf16>() + begin * h, rs + begin, end - begin, h, eps, weight_offset);
    }
  });
}

void rmsnorm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                      const TensorView& rstd, const TensorView& dx, const TensorView& dweight,
                      bool accumulate_dx, float weight_offset) {
  HYP_CHECK(!accumulate_dx || dx.data != dy.data,
            "rmsnorm_backward: dx may not alias dy when accumulating into dx");
  check_backward(dy, x, weight, rstd, dx, dweight);
  const int64_t rows = x.shape[0], h = x.shape[1];
  if (rows == 0 || h == 0) return;
  // The row groups depend only on the shape (not on the thread count), each group sums
  // its rows in order into its own partial, and the partials are added in group order:
  // dweight is reproducible bit for bit on any number of threads.
  constexpr int64_t kMaxGroups = 64;
  const int64_t groups = std::clamp<int64_t>(rows * h / 16384, 1, std::min(rows, kMaxGroups));
  AlignedBuffer<float> partials(static_cast<size_t>(groups * h));
  const float* w = weight.as<float>();
  const float* rs = rstd.as<float>();
  parallel_for_dynamic(groups, [&](int64_t g) {
    const int64_t begin = rows * g / groups, end = rows * (g + 1) / groups;
    float* part = partials.data() + g * h;
    std::memset(part, 0, static_cast<size_t>(h) * sizeof(float));
    if (x.dtype == DType::kF32) {
      HWY_DYNAMIC_DISPATCH(BackwardF32)
      (dy.as<float>() + begin * h, x.as<float>() + begin * h, w, rs + begin,
       dx.as<float>() + begin * h, part, end - begin, h, accumulate_dx, weight_offset);
    } else {
      HWY_DYNAMIC_DISPATCH(BackwardBF16)
      (dy.as<bf16>() + begin * h, x.as<bf16>() + begin * h, w, rs + begin,
       dx.as<bf16>() + begin * h, part, end - begin, h, accumulate_dx, weight_offset);
    }
  });
  parallel_chunks(h, 4096, [&](int64_t begin, int64_t end) {
    HWY_DYNAMIC_DISPATCH(SumPartials)
    (partials.data(), groups, h, dweight.as<float>(), begin, end);
  });
}

namespace ref {

void rmsnorm_forward(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
                     const TensorView& rstd, float weight_offset) {
  check_forward(x, weight, eps, y, rstd);
  const int64_t rows = x.shape[0], h = x.shape[1];
  const float* w = weight.as<float>();
  const double off = weight_offset;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < h; ++j) ss += load(x, r * h + j) * load(x, r * h + j);
    const double rs = 1.0 / std::sqrt((h > 0 ? ss / double(h) : 0.0) + double(eps));
    rstd.as<float>()[r] = static_cast<float>(rs);
    for (int64_t j = 0; j < h; ++j) store(y, r * h + j, load(x, r * h + j) * rs * (w[j] + off));
  }
}

void rmsnorm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                      const TensorView& rstd, const TensorView& dx, const TensorView& dweight,
                      bool accumulate_dx, float weight_offset) {
  HYP_CHECK(!accumulate_dx || dx.data != dy.data,
            "rmsnorm_backward: dx may not alias dy when accumulating into dx");
  check_backward(dy, x, weight, rstd, dx, dweight);
  const int64_t rows = x.shape[0], h = x.shape[1];
  const float* w = weight.as<float>();
  const double off = weight_offset;
  std::vector<double> dw(static_cast<size_t>(h), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double rs = rstd.as<float>()[r];
    double dot = 0;
    for (int64_t j = 0; j < h; ++j) dot += load(dy, r * h + j) * (w[j] + off) * load(x, r * h + j);
    const double c = rs * rs * rs * dot / double(h);
    for (int64_t j = 0; j < h; ++j) {
      const double g = load(dy, r * h + j), xv = load(x, r * h + j);
      dw[j] += g * xv * rs;
      const double d = g * rs * (w[j] + off) - c * xv;
      store(dx, r * h + j, accumulate_dx ? load(dx, r * h + j) + d : d);
    }
  }
  for (int64_t j = 0; j < h; ++j)
    dweight.as<float>()[j] = static_cast<float>(dweight.as<float>()[j] + dw[j]);
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
