// first_nonfinite with Highway dynamic dispatch: each vector is tested with IsFinite and
// the first chunk holding a bad lane is rescanned element by element for its index.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/finite.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>
#include <cstdint>

#include "kernels/finite.h"
#include "tensor/convert.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// True when x[0, count) are all finite (f32).
bool AllFiniteF32(const float* x, int64_t count) {
  const hn::ScalableTag<float> df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  auto bad = hn::FirstN(df, 0);  // all false
  int64_t i = 0;
  for (; i + n <= count; i += n) bad = hn::Or(bad, hn::Not(hn::IsFinite(hn::LoadU(df, x + i))));
  if (!hn::AllFalse(df, bad)) return false;
  for (; i < count; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// bf16: the exponent bits all set means NaN or infinity (16-bit lanes, no conversion).
bool AllFiniteBF16(const bf16* x, int64_t count) {
  const hn::ScalableTag<uint16_t> du;
  const int64_t n = static_cast<int64_t>(hn::Lanes(du));
  const auto exponent = hn::Set(du, uint16_t{0x7f80});
  const auto* p = reinterpret_cast<const uint16_t*>(x);
  auto bad = hn::FirstN(du, 0);  // all false
  int64_t i = 0;
  for (; i + n <= count; i += n)
    bad = hn::Or(bad, hn::Eq(hn::And(hn::LoadU(du, p + i), exponent), exponent));
  if (!hn::AllFalse(du, bad)) return false;
  for (; i < count; ++i)
    if ((p[i] & 0x7f80u) == 0x7f80u) return false;
  return true;
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <atomic>

#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(AllFiniteF32);
HWY_EXPORT(AllFiniteBF16);

namespace {

constexpr int64_t kChunk = int64_t{1} << 16;

void check_input(const char* op, const TensorView& x) {
  HYP_CHECK(x.dtype == DType::kF32 || x.dtype == DType::kBF16, "{}: x must be f32 or bf16, got {}",
            op, x.str());
  check_contiguous(op, "x", x);
}

bool finite_at(const TensorView& x, int64_t i) {
  return x.dtype == DType::kF32 ? std::isfinite(x.as<float>()[i])
                                : std::isfinite(bf16_to_f32(x.as<bf16>()[i]));
}

}  // namespace

int64_t first_nonfinite(const TensorView& x) {
  check_input("first_nonfinite", x);
  const int64_t n = x.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // The lowest chunk with a bad value; chunks above it need not be scanned.
  std::atomic<int64_t> first_bad{chunks};
  parallel_chunks(chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce && c < first_bad.load(std::memory_order_relaxed); ++c) {
      const int64_t begin = c * kChunk, count = std::min(kChunk, n - begin);
      const bool ok = x.dtype == DType::kF32
                          ? HWY_DYNAMIC_DISPATCH(AllFiniteF32)(x.as<float>() + begin, count)
                          : HWY_DYNAMIC_DISPATCH(AllFiniteBF16)(x.as<bf16>() + begin, count);
      if (ok) continue;
      int64_t seen = first_bad.load();
      while (c < seen && !first_bad.compare_exchange_weak(seen, c)) {
      }
      return;
    }
  });
  if (first_bad.load() == chunks) return -1;
  const int64_t begin = first_bad.load() * kChunk, end = std::min(n, begin + kChunk);
  for (int64_t i = begin; i < end; ++i)
    if (!finite_at(x, i)) return i;
  return -1;  // unreachable: the chunk held a non-finite value
}

namespace ref {
int64_t first_nonfinite(const TensorView& x) {
  check_input("first_nonfinite", x);
  for (int64_t i = 0; i < x.numel(); ++i)
    if (!finite_at(x, i)) return i;
  return -1;
}
}  // namespace ref

}  // namespace hyperion
#endif  // HWY_ONCE
