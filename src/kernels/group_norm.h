// Group normalisation (PyTorch's nn.GroupNorm, affine) on channels-last activations, as
// every ResNet block and attention block of a UNet and a VAE applies it:
//
//   x [N, P, C] (P = H * W pixels), C split into G groups of C/G consecutive channels;
//   mean[n, g], rstd[n, g] = 1 / sqrt(var[n, g] + eps) over the P * C/G values of a group
//   (biased variance, as PyTorch);
//   y[n, p, c] = (x[n, p, c] - mean[n, g(c)]) * rstd[n, g(c)] * gamma[c] + beta[c]
//
// Backward, with xhat = (x - mean) * rstd and M = P * C/G:
//   dx = rstd * (gamma dy - mean_g(gamma dy) - xhat * mean_g(gamma dy xhat))
//   dgamma[c] += sum_{n,p} dy xhat,   dbeta[c] += sum_{n,p} dy
//
// All f32, contiguous. The statistics are summed over fixed blocks of pixels (the blocks
// depend on the shape only) in double, so results are bitwise identical for any thread
// count, and the mean is taken before the variance (two passes: no cancellation when
// |mean| >> std, as after a residual add).
#pragma once

#include <cstdint>

namespace hyperion {

struct GroupNormShape {
  int64_t batch = 1, pixels = 1, channels = 1, groups = 1;
};

// Throws naming the field when channels is not a multiple of groups or a size is not
// positive.
void check_group_norm_shape(const GroupNormShape& s);

// Writes y (may alias x) and mean, rstd [N, G] (saved for the backward pass).
void group_norm_forward(const GroupNormShape& s, const float* x, const float* gamma,
                        const float* beta, float eps, float* y, float* mean, float* rstd);

// Writes dx (may alias dy) and ACCUMULATES dgamma, dbeta [C].
void group_norm_backward(const GroupNormShape& s, const float* dy, const float* x,
                         const float* gamma, const float* mean, const float* rstd, float* dx,
                         float* dgamma, float* dbeta);

namespace ref {
void group_norm_forward(const GroupNormShape& s, const float* x, const float* gamma,
                        const float* beta, float eps, float* y, float* mean, float* rstd);
void group_norm_backward(const GroupNormShape& s, const float* dy, const float* x,
                         const float* gamma, const float* mean, const float* rstd, float* dx,
                         float* dgamma, float* dbeta);
}  // namespace ref

}  // namespace hyperion
