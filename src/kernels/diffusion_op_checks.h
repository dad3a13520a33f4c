// The shape and dtype checks of the diffusion layers' backend ops (kernels/backend.h:
// conv2d, group and layer norm, upsampling, timestep embedding, activations, GEGLU),
// shared by every backend so that each refuses the same views with the same words: the
// op, the view at fault and what was expected. An empty view (data null) stands for an
// output not asked for, where the op allows that.
#pragma once

#include "kernels/conv2d.h"
#include "kernels/group_norm.h"
#include "kernels/timestep_embedding.h"
#include "tensor/tensor.h"

namespace hyperion {

// x f32|bf16 [N*H*W*Cin elements]; w, bias, y f32.
void check_conv2d_forward_views(const Conv2dShape& s, const TensorView& x, const TensorView& w,
                                const TensorView& bias, const TensorView& y);
// dy of x's dtype; dx, dw, dbias f32 or empty.
void check_conv2d_backward_views(const Conv2dShape& s, const TensorView& dy, const TensorView& x,
                                 const TensorView& w, const TensorView& dx, const TensorView& dw,
                                 const TensorView& dbias);
void check_group_norm_forward_views(const GroupNormShape& s, const TensorView& x,
                                    const TensorView& gamma, const TensorView& beta,
                                    const TensorView& y, const TensorView& mean,
                                    const TensorView& rstd);
void check_group_norm_backward_views(const GroupNormShape& s, const TensorView& dy,
                                     const TensorView& x, const TensorView& gamma,
                                     const TensorView& mean, const TensorView& rstd,
                                     const TensorView& dx, const TensorView& dgamma,
                                     const TensorView& dbeta);
// A layer norm over x's last dimension: its rows and columns.
struct RowsCols {
  int64_t rows = 0, cols = 0;
};
// mean and rstd may be empty (inference).
RowsCols check_layer_norm_forward_views(const TensorView& x, const TensorView& gamma,
                                        const TensorView& beta, const TensorView& y,
                                        const TensorView& mean, const TensorView& rstd);
// dgamma and dbeta may be empty.
RowsCols check_layer_norm_backward_views(const TensorView& dy, const TensorView& x,
                                         const TensorView& gamma, const TensorView& mean,
                                         const TensorView& rstd, const TensorView& dx,
                                         const TensorView& dgamma, const TensorView& dbeta);
// small [N, H, W, C] and big [N, OH, OW, C], OH >= H and OW >= W.
void check_upsample_views(const char* op, const TensorView& small, const TensorView& big);
// Also the parameters (kernels/timestep_embedding.h's check).
void check_timestep_embedding_views(const TensorView& t, const TimestepEmbeddingParams& p,
                                    const TensorView& out);
void check_activation_views(const char* op, const TensorView& a, const TensorView& b);
// copy_2d: rows no wider than either pitch.
void check_copy_2d(size_t src_pitch, size_t dst_pitch, size_t row_bytes);
// x [R, 2F] and h [R, F] (h the forward's output or the backward's dh); returns {R, F}.
RowsCols check_geglu_views(const char* op, const TensorView& x, const TensorView& h);

}  // namespace hyperion
