#include "kernels/fill.h"

#include <cmath>
#include <numbers>

#include "base/error.h"
#include "base/threads.h"
#include "tensor/convert.h"

namespace hyperion {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t hash_string(const char* s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 0x100000001b3ull;
  return h;
}

namespace {

void check_fill(const char* op, const TensorView& x) {
  HYP_CHECK(x.dtype == DType::kF32 || x.dtype == DType::kBF16, "{}: x must be f32 or bf16, got {}",
            op, x.str());
  check_contiguous(op, "x", x);
}

// One standard normal sample for index i (Box-Muller, u1 in (0, 1]).
inline float normal_at(uint64_t seed, uint64_t i) {
  const uint64_t r = splitmix64(seed ^ splitmix64(i));
  const double u1 = (double((r >> 32) & 0xFFFFFFFFu) + 1.0) / 4294967296.0;
  const double u2 = double(r & 0xFFFFFFFFu) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace

void fill_constant(const TensorView& x, float value) {
  check_fill("fill_constant", x);
  const int64_t n = x.numel();
  parallel_chunks(n, 1 << 16, [&](int64_t b, int64_t e) {
    if (x.dtype == DType::kF32) {
      float* p = x.as<float>();
      for (int64_t i = b; i < e; ++i) p[i] = value;
    } else {
      bf16* p = x.as<bf16>();
      const bf16 v = f32_to_bf16(value);
      for (int64_t i = b; i < e; ++i) p[i] = v;
    }
  });
}

void fill_normal(const TensorView& x, uint64_t seed, float mean, float stddev) {
  check_fill("fill_normal", x);
  const int64_t n = x.numel();
  parallel_chunks(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = mean + stddev * normal_at(seed, static_cast<uint64_t>(i));
      if (x.dtype == DType::kF32)
        x.as<float>()[i] = v;
      else
        x.as<bf16>()[i] = f32_to_bf16(v);
    }
  });
}

void fill_uniform(const TensorView& x, uint64_t seed, float lo, float hi) {
  check_fill("fill_uniform", x);
  const int64_t n = x.numel();
  parallel_chunks(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint64_t r = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
      const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
      const float v = lo + (hi - lo) * u;
      if (x.dtype == DType::kF32)
        x.as<float>()[i] = v;
      else
        x.as<bf16>()[i] = f32_to_bf16(v);
    }
  });
}

namespace ref {
void fill_normal(const TensorView& x, uint64_t seed, float mean, float stddev) {
  check_fill("fill_normal", x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = mean + stddev * normal_at(seed, static_cast<uint64_t>(i));
    if (x.dtype == DType::kF32)
      x.as<float>()[i] = v;
    else
      x.as<bf16>()[i] = f32_to_bf16(v);
  }
}
}  // namespace ref

}  // namespace hyperion
