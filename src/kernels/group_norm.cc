// GroupNorm on channels-last activations. Every pass is a loop over pixels whose body is
// a Highway loop over the C channels of one pixel with per-channel coefficient vectors
// (the per-group mean/rstd expanded to channels), so the layout needs no transpose.
// Statistics: per-channel partial sums over fixed blocks of kPixelBlock pixels (f32 in
// a block, double across blocks), then per-group sums in channel order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/group_norm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include "kernels/group_norm.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

// acc[c] += sum_p (x[p, c] - shift[c])^kPower for p in [0, pixels), kPower 1 or 2.
template <int kPower>
void ChannelMoments(const float* x, int64_t pixels, int64_t channels, const float* shift,
                    float* acc) {
  const DF d;
  const size_t L = hn::Lanes(d), C = size_t(channels);
  size_t c = 0;
  for (; c + L <= C; c += L) {
    VF a = hn::Zero(d);
    const VF m = hn::LoadU(d, shift + c);
    for (int64_t p = 0; p < pixels; ++p) {
      const VF v = hn::Sub(hn::LoadU(d, x + size_t(p) * C + c), m);
      a = kPower == 1 ? hn::Add(a, v) : hn::MulAdd(v, v, a);
    }
    hn::StoreU(hn::Add(a, hn::LoadU(d, acc + c)), d, acc + c);
  }
  for (; c < C; ++c) {
    float a = 0.0f;
    for (int64_t p = 0; p < pixels; ++p) {
      const float v = x[size_t(p) * C + c] - shift[c];
      a += kPower == 1 ? v : v * v;
    }
    acc[c] += a;
  }
}

void ChannelSums(const float* x, int64_t pixels, int64_t channels, const float* shift, float* acc) {
  ChannelMoments<1>(x, pixels, channels, shift, acc);
}
void ChannelSquaredDeviations(const float* x, int64_t pixels, int64_t channels,
                              const float* shift, float* acc) {
  ChannelMoments<2>(x, pixels, channels, shift, acc);
}

// sum_dy[c] += sum_p dy,  sum_dyx[c] += sum_p dy * (x - shift[c]).
void ChannelGradSums(const float* dy, const float* x, int64_t pixels, int64_t channels,
                     const float* shift, float* sum_dy, float* sum_dyx) {
  const DF d;
  const size_t L = hn::Lanes(d), C = size_t(channels);
  size_t c = 0;
  for (; c + L <= C; c += L) {
    VF a = hn::Zero(d), b = hn::Zero(d);
    const VF m = hn::LoadU(d, shift + c);
    for (int64_t p = 0; p < pixels; ++p) {
      const VF g = hn::LoadU(d, dy + size_t(p) * C + c);
      a = hn::Add(a, g);
      b = hn::MulAdd(g, hn::Sub(hn::LoadU(d, x + size_t(p) * C + c), m), b);
    }
    hn::StoreU(hn::Add(a, hn::LoadU(d, sum_dy + c)), d, sum_dy + c);
    hn::StoreU(hn::Add(b, hn::LoadU(d, sum_dyx + c)), d, sum_dyx + c);
  }
  for (; c < C; ++c) {
    float a = 0.0f, b = 0.0f;
    for (int64_t p = 0; p < pixels; ++p) {
      a += dy[size_t(p) * C + c];
      b += dy[size_t(p) * C + c] * (x[size_t(p) * C + c] - shift[c]);
    }
    sum_dy[c] += a;
    sum_dyx[c] += b;
  }
}

// out[p, c] = (u ? u[p, c] * a[c] : 0) + (v[p, c] - shift[c]) * b[c] + k[c]: the forward
// (x - mean) * rstd gamma + beta (u null) and the backward's
// dx = dy * alpha + (x - mean) * beta + k. Subtracting the mean first keeps the result
// accurate when rstd is large (a group of nearly equal values).
void ChannelAffine(const float* u, const float* v, int64_t pixels, int64_t channels,
                   const float* a, const float* shift, const float* b, const float* k,
                   float* out) {
  const DF d;
  const size_t L = hn::Lanes(d), C = size_t(channels);
  for (int64_t p = 0; p < pixels; ++p) {
    const size_t row = size_t(p) * C;
    size_t c = 0;
    for (; c + L <= C; c += L) {
      const VF centred = hn::Sub(hn::LoadU(d, v + row + c), hn::LoadU(d, shift + c));
      VF r = hn::MulAdd(centred, hn::LoadU(d, b + c), hn::LoadU(d, k + c));
      if (u) r = hn::MulAdd(hn::LoadU(d, u + row + c), hn::LoadU(d, a + c), r);
      hn::StoreU(r, d, out + row + c);
    }
    for (; c < C; ++c)
      out[row + c] = (u ? u[row + c] * a[c] : 0.0f) + (v[row + c] - shift[c]) * b[c] + k[c];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(ChannelSums);
HWY_EXPORT(ChannelSquaredDeviations);
HWY_EXPORT(ChannelGradSums);
HWY_EXPORT(ChannelAffine);

void check_group_norm_shape(const GroupNormShape& s) {
  HYP_CHECK(s.batch > 0 && s.pixels > 0 && s.channels > 0 && s.groups > 0,
            "group_norm: batch {}, pixels {}, channels {}, groups {} must be positive", s.batch,
            s.pixels, s.channels, s.groups);
  HYP_CHECK(s.channels % s.groups == 0, "group_norm: {} channels do not split into {} groups",
            s.channels, s.groups);
}

namespace {

constexpr int64_t kPixelBlock = 64;

int64_t blocks_of(int64_t pixels) {
  return (pixels + kPixelBlock - 1) / kPixelBlock;
}

// Per-channel sums over the pixels of each image, f32 within a fixed block, double across
// blocks in block order: sums [N, C]. fn(n, block_begin, block_pixels, partial[C]) adds a
// block's sums into partial (zeroed).
template <typename Fn>
void blocked_channel_sums(const GroupNormShape& s, int outputs, std::vector<double>* sums,
                          Fn&& fn) {
  const int64_t blocks = blocks_of(s.pixels), C = s.channels;
  std::vector<float> partial(size_t(s.batch * blocks * C * outputs), 0.0f);
  parallel_for_dynamic(s.batch * blocks, [&](int64_t job) {
    const int64_t n = job / blocks, b = job % blocks;
    const int64_t begin = b * kPixelBlock, count = std::min(kPixelBlock, s.pixels - begin);
    fn(n, begin, count, partial.data() + size_t(job * C * outputs));
  });
  for (int o = 0; o < outputs; ++o) sums[o].assign(size_t(s.batch * C), 0.0);
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t b = 0; b < blocks; ++b)
      for (int o = 0; o < outputs; ++o) {
        const float* p = partial.data() + size_t(((n * blocks + b) * outputs + o) * C);
        double* dst = sums[o].data() + size_t(n * C);
        for (int64_t c = 0; c < C; ++c) dst[c] += p[c];
      }
}

// Per-group sum of per-channel values v [C] of image n.
double group_sum(const std::vector<double>& v, int64_t n, int64_t g, int64_t channels,
                 int64_t cpg) {
  double s = 0.0;
  for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) s += v[size_t(n * channels + c)];
  return s;
}

}  // namespace

void group_norm_forward(const GroupNormShape& s, const float* x, const float* gamma,
                        const float* beta, float eps, float* y, float* mean, float* rstd) {
  check_group_norm_shape(s);
  const int64_t C = s.channels, G = s.groups, cpg = C / G, P = s.pixels;
  const double count = double(P * cpg);
  const std::vector<float> zeros(size_t(C), 0.0f);
  // Pass 1: means.
  std::vector<double> sums[1];
  blocked_channel_sums(s, 1, sums, [&](int64_t n, int64_t begin, int64_t pixels, float* out) {
    HWY_DYNAMIC_DISPATCH(ChannelSums)(x + (n * P + begin) * C, pixels, C, zeros.data(), out);
  });
  std::vector<float> channel_mean(size_t(s.batch * C));
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t g = 0; g < G; ++g) {
      mean[n * G + g] = float(group_sum(sums[0], n, g, C, cpg) / count);
      for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c)
        channel_mean[size_t(n * C + c)] = mean[n * G + g];
    }
  // Pass 2: variances about those means.
  blocked_channel_sums(s, 1, sums, [&](int64_t n, int64_t begin, int64_t pixels, float* out) {
    HWY_DYNAMIC_DISPATCH(ChannelSquaredDeviations)(x + (n * P + begin) * C, pixels, C,
                                                     channel_mean.data() + n * C, out);
  });
  // Pass 3: y = x * a + b per channel.
  std::vector<float> a(size_t(s.batch * C));
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const double var = group_sum(sums[0], n, g, C, cpg) / count;
      rstd[n * G + g] = float(1.0 / std::sqrt(var + double(eps)));
      for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
        a[size_t(n * C + c)] = rstd[n * G + g] * gamma[c];
      }
    }
  const int64_t blocks = blocks_of(P);
  parallel_for_dynamic(s.batch * blocks, [&](int64_t job) {
    const int64_t n = job / blocks, begin = (job % blocks) * kPixelBlock;
    const int64_t off = (n * P + begin) * C;
    HWY_DYNAMIC_DISPATCH(ChannelAffine)(nullptr, x + off, std::min(kPixelBlock, P - begin), C,
                                        nullptr, channel_mean.data() + n * C, a.data() + n * C,
                                        beta, y + off);
  });
}

void group_norm_backward(const GroupNormShape& s, const float* dy, const float* x,
                         const float* gamma, const float* mean, const float* rstd, float* dx,
                         float* dgamma, float* dbeta) {
  check_group_norm_shape(s);
  const int64_t C = s.channels, G = s.groups, cpg = C / G, P = s.pixels;
  const double count = double(P * cpg);
  std::vector<float> channel_mean(size_t(s.batch * C));
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t c = 0; c < C; ++c) channel_mean[size_t(n * C + c)] = mean[n * G + c / cpg];
  std::vector<double> sums[2];  // sum dy, sum dy * (x - mean) per (n, c)
  blocked_channel_sums(s, 2, sums, [&](int64_t n, int64_t begin, int64_t pixels, float* out) {
    const int64_t off = (n * P + begin) * C;
    HWY_DYNAMIC_DISPATCH(ChannelGradSums)(dy + off, x + off, pixels, C,
                                          channel_mean.data() + n * C, out, out + C);
  });
  // dx = dy * alpha[c] + (x - mean) * beta_g + k_g (the header's formula, expanded).
  std::vector<float> alpha(size_t(s.batch * C)), beta_x(size_t(s.batch * C)),
      k(size_t(s.batch * C));
  std::vector<double> dgamma_acc(size_t(C), 0.0), dbeta_acc(size_t(C), 0.0);
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const double r = rstd[n * G + g];
      double s1 = 0.0, s2 = 0.0;  // sum gamma dy, sum gamma dy xhat over the group
      for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
        const double a = sums[0][size_t(n * C + c)];
        const double dyxhat = r * sums[1][size_t(n * C + c)];
        s1 += gamma[c] * a;
        s2 += gamma[c] * dyxhat;
        dgamma_acc[size_t(c)] += dyxhat;
        dbeta_acc[size_t(c)] += a;
      }
      const double bx = -r * r * s2 / count;
      const double kk = -r * s1 / count;
      for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
        alpha[size_t(n * C + c)] = float(r * gamma[c]);
        beta_x[size_t(n * C + c)] = float(bx);
        k[size_t(n * C + c)] = float(kk);
      }
    }
  const int64_t blocks = blocks_of(P);
  parallel_for_dynamic(s.batch * blocks, [&](int64_t job) {
    const int64_t n = job / blocks, begin = (job % blocks) * kPixelBlock;
    const int64_t off = (n * P + begin) * C;
    HWY_DYNAMIC_DISPATCH(ChannelAffine)(dy + off, x + off, std::min(kPixelBlock, P - begin), C,
                                        alpha.data() + n * C, channel_mean.data() + n * C,
                                        beta_x.data() + n * C, k.data() + n * C, dx + off);
  });
  for (int64_t c = 0; c < C; ++c) {
    if (dgamma) dgamma[c] += float(dgamma_acc[size_t(c)]);
    if (dbeta) dbeta[c] += float(dbeta_acc[size_t(c)]);
  }
}

namespace ref {

void group_norm_forward(const GroupNormShape& s, const float* x, const float* gamma,
                        const float* beta, float eps, float* y, float* mean, float* rstd) {
  check_group_norm_shape(s);
  const int64_t C = s.channels, G = s.groups, cpg = C / G, P = s.pixels;
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t g = 0; g < G; ++g) {
      double sum = 0.0, sq = 0.0;
      for (int64_t p = 0; p < P; ++p)
        for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) sum += x[(n * P + p) * C + c];
      const double m = sum / double(P * cpg);
      for (int64_t p = 0; p < P; ++p)
        for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
          const double v = x[(n * P + p) * C + c] - m;
          sq += v * v;
        }
      const double r = 1.0 / std::sqrt(sq / double(P * cpg) + double(eps));
      mean[n * G + g] = float(m);
      rstd[n * G + g] = float(r);
      for (int64_t p = 0; p < P; ++p)
        for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
          const int64_t i = (n * P + p) * C + c;
          y[i] = float((x[i] - m) * r * gamma[c] + beta[c]);
        }
    }
}

void group_norm_backward(const GroupNormShape& s, const float* dy, const float* x,
                         const float* gamma, const float* mean, const float* rstd, float* dx,
                         float* dgamma, float* dbeta) {
  check_group_norm_shape(s);
  const int64_t C = s.channels, G = s.groups, cpg = C / G, P = s.pixels;
  const double M = double(P * cpg);
  std::vector<double> dg(size_t(C), 0.0), db(size_t(C), 0.0);
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const double m = mean[n * G + g], r = rstd[n * G + g];
      double mean_gdy = 0.0, mean_gdy_xhat = 0.0;
      for (int64_t p = 0; p < P; ++p)
        for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
          const int64_t i = (n * P + p) * C + c;
          const double xhat = (x[i] - m) * r;
          mean_gdy += gamma[c] * double(dy[i]) / M;
          mean_gdy_xhat += gamma[c] * double(dy[i]) * xhat / M;
          dg[size_t(c)] += double(dy[i]) * xhat;
          db[size_t(c)] += dy[i];
        }
      for (int64_t p = 0; p < P; ++p)
        for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
          const int64_t i = (n * P + p) * C + c;
          const double xhat = (x[i] - m) * r;
          dx[i] = float(r * (gamma[c] * double(dy[i]) - mean_gdy - xhat * mean_gdy_xhat));
        }
    }
  for (int64_t c = 0; c < C; ++c) {
    if (dgamma) dgamma[c] += float(dg[size_t(c)]);
    if (dbeta) dbeta[c] += float(db[size_t(c)]);
  }
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
