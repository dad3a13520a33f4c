// argmax_rows with Highway dynamic dispatch: a vector max over the row (NaN lanes
// noted), then the first lane equal to it; rows split over the thread pool.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/argmax.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstdint>
#include <limits>

#include "kernels/argmax.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Index of the first largest of x[0, n), or -1 when one is NaN or none is above -inf.
int32_t ArgmaxRow(const float* x, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t l = static_cast<int64_t>(hn::Lanes(d));
  const float ninf = -std::numeric_limits<float>::infinity();
  auto best = hn::Set(d, ninf);
  auto nan = hn::FirstN(d, 0);  // all false
  int64_t i = 0;
  for (; i + l <= n; i += l) {
    const auto v = hn::LoadU(d, x + i);
    nan = hn::Or(nan, hn::IsNaN(v));
    best = hn::Max(best, v);
  }
  if (!hn::AllFalse(d, nan)) return -1;
  float m = hn::GetLane(hn::MaxOfLanes(d, best));
  for (; i < n; ++i) {
    if (x[i] != x[i]) return -1;
    if (x[i] > m) m = x[i];
  }
  if (!(m > ninf)) return -1;
  const auto mv = hn::Set(d, m);
  for (i = 0; i + l <= n; i += l) {
    const intptr_t pos = hn::FindFirstTrue(d, hn::Eq(hn::LoadU(d, x + i), mv));
    if (pos >= 0) return static_cast<int32_t>(i + pos);
  }
  for (; i < n; ++i)
    if (x[i] == m) return static_cast<int32_t>(i);
  return -1;  // unreachable
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(ArgmaxRow);

namespace {

void check(const char* op, const TensorView& x, const TensorView& out) {
  HYP_CHECK(x.rank() == 2 && x.dtype == DType::kF32 && out.dtype == DType::kI32 &&
                out.numel() == x.shape[0] && x.shape[1] <= std::numeric_limits<int32_t>::max(),
            "{}: x {} must be f32 [rows, n] and out {} i32 [rows]", op, x.str(), out.str());
}

}  // namespace

void argmax_rows(const TensorView& x, const TensorView& out) {
  check("argmax_rows", x, out);
  const int64_t rows = x.shape[0], n = x.shape[1];
  const float* px = x.as<float>();
  int32_t* po = out.as<int32_t>();
  parallel_chunks(rows, std::max<int64_t>(1, 65536 / std::max<int64_t>(n, 1)),
                  [&](int64_t b, int64_t e) {
                    for (int64_t r = b; r < e; ++r)
                      po[r] = HWY_DYNAMIC_DISPATCH(ArgmaxRow)(px + r * n, n);
                  });
}

namespace ref {

void argmax_rows(const TensorView& x, const TensorView& out) {
  check("ref::argmax_rows", x, out);
  const int64_t rows = x.shape[0], n = x.shape[1];
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.as<float>() + r * n;
    int32_t best = -1;
    bool nan = false;
    for (int64_t i = 0; i < n; ++i) {
      nan = nan || row[i] != row[i];
      if (row[i] > -std::numeric_limits<float>::infinity() && (best < 0 || row[i] > row[best]))
        best = static_cast<int32_t>(i);
    }
    out.as<int32_t>()[r] = nan ? -1 : best;
  }
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
