#include "kernels/timestep_embedding.h"

#include <cmath>
#include <vector>

#include "base/error.h"

namespace hyperion {

void check_timestep_embedding_params(const TimestepEmbeddingParams& p) {
  HYP_CHECK(p.dim >= 2, "timestep_embedding: dim {} must be at least 2", p.dim);
  HYP_CHECK(float(p.dim / 2) != p.freq_shift,
            "timestep_embedding: freq_shift {} equals half the dim {} (division by zero)",
            p.freq_shift, p.dim);
}

void timestep_embedding(const float* t, int64_t n, const TimestepEmbeddingParams& p, float* out) {
  check_timestep_embedding_params(p);
  const int64_t half = p.dim / 2;
  std::vector<float> freq(static_cast<size_t>(half));
  const float log_period = std::log(p.max_period);
  for (int64_t i = 0; i < half; ++i)
    freq[size_t(i)] = std::exp(-log_period * float(i) / (float(half) - p.freq_shift));
  const int64_t sin_at = p.flip_sin_to_cos ? half : 0, cos_at = p.flip_sin_to_cos ? 0 : half;
  for (int64_t r = 0; r < n; ++r) {
    float* o = out + r * p.dim;
    for (int64_t i = 0; i < half; ++i) {
      const float e = p.scale * (t[r] * freq[size_t(i)]);
      o[sin_at + i] = std::sin(e);
      o[cos_at + i] = std::cos(e);
    }
    if (p.dim % 2) o[p.dim - 1] = 0.0f;
  }
}

namespace ref {

void timestep_embedding(const float* t, int64_t n, const TimestepEmbeddingParams& p, float* out) {
  check_timestep_embedding_params(p);
  const int64_t half = p.dim / 2;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < half; ++i) {
      const double freq =
          std::exp(-std::log(double(p.max_period)) * double(i) / (double(half) - p.freq_shift));
      const double e = double(p.scale) * double(t[r]) * freq;
      out[r * p.dim + (p.flip_sin_to_cos ? half : 0) + i] = float(std::sin(e));
      out[r * p.dim + (p.flip_sin_to_cos ? 0 : half) + i] = float(std::cos(e));
      if (p.dim % 2) out[r * p.dim + p.dim - 1] = 0.0f;
    }
}

}  // namespace ref
}  // namespace hyperion
