// Layer normalisation over the last dimension (PyTorch's nn.LayerNorm, affine), as the
// transformer blocks of a diffusion UNet and the CLIP text encoder apply it:
//
//   mean[r], rstd[r] = 1 / sqrt(var[r] + eps) over the C values of row r (biased variance);
//   y[r, c] = (x[r, c] - mean[r]) * rstd[r] * gamma[c] + beta[c]
//
// Backward, with xhat = (x - mean) * rstd:
//   dx = rstd * (gamma dy - mean_c(gamma dy) - xhat * mean_c(gamma dy xhat))
//   dgamma[c] += sum_r dy xhat,   dbeta[c] += sum_r dy
//
// x, y, dy, dx [R, C] f32 contiguous; gamma, beta, dgamma, dbeta [C]; mean, rstd [R]. The
// mean is taken before the variance (two passes over a row held in cache). The weight
// gradients are summed over fixed blocks of rows (the blocks depend on the shape only),
// so they are bitwise identical for any thread count.
#pragma once

#include <cstdint>

namespace hyperion {

// y may alias x; mean and rstd may be null (inference keeps no statistics).
void layer_norm_forward(const float* x, int64_t rows, int64_t cols, const float* gamma,
                        const float* beta, float eps, float* y, float* mean, float* rstd);

// dx may alias dy; dgamma and dbeta (either may be null) are ACCUMULATED.
void layer_norm_backward(const float* dy, const float* x, int64_t rows, int64_t cols,
                         const float* gamma, const float* mean, const float* rstd, float* dx,
                         float* dgamma, float* dbeta);

namespace ref {
void layer_norm_forward(const float* x, int64_t rows, int64_t cols, const float* gamma,
                        const float* beta, float eps, float* y, float* mean, float* rstd);
void layer_norm_backward(const float* dy, const float* x, int64_t rows, int64_t cols,
                         const float* gamma, const float* mean, const float* rstd, float* dx,
                         float* dgamma, float* dbeta);
}  // namespace ref

}  // namespace hyperion
