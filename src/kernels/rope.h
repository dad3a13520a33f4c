// Rotary position embedding, Hugging Face "rotate half" convention
// (LlamaRotaryEmbedding + apply_rotary_pos_emb):
//
//   inv_freq[i] = theta^(-2i/D),  angle = pos * inv_freq[i],  i < D/2
//   out[..., i]       = x[..., i] * cos(angle) - x[..., i + D/2] * sin(angle)
//   out[..., i + D/2] = x[..., i + D/2] * cos(angle) + x[..., i] * sin(angle)
//
// Shapes: x, out, dy, dx [B, T, H, D] (f32 or bf16, same dtype, contiguous), D even;
// positions [T] or [B, T] int32 (or a start offset: position of token t is start + t).
// Angles are computed once in double in the table (Hugging Face computes them in f32,
// which loses ~1e-4 rad at position 4096), the rotation in f32, and bf16 outputs are
// rounded once.
#pragma once

#include <cstdint>

#include "base/aligned.h"
#include "tensor/tensor.h"

namespace hyperion {

// cos/sin of pos * inv_freq[i] for pos < max_positions and i < head_dim / 2, f32,
// row-major [max_positions, head_dim / 2]. Built once; the hot path only reads it.
struct RopeTable {
  RopeTable(int64_t max_positions, int64_t head_dim, double theta = 10000.0);

  int64_t max_positions = 0;
  int64_t head_dim = 0;
  double theta = 0;
  AlignedBuffer<float> cos;
  AlignedBuffer<float> sin;

  const float* cos_row(int64_t pos) const { return cos.data() + pos * (head_dim / 2); }
  const float* sin_row(int64_t pos) const { return sin.data() + pos * (head_dim / 2); }
};

// out = rope(x). out may be x (in place); other overlaps are not allowed.
void rope_forward(const TensorView& x, const TensorView& out, const TensorView& positions,
                  const RopeTable& table);
void rope_forward(const TensorView& x, const TensorView& out, int64_t start_pos,
                  const RopeTable& table);

// dx = rotation of dy by -angle (the transpose of the forward rotation). dx may be dy.
void rope_backward(const TensorView& dy, const TensorView& dx, const TensorView& positions,
                   const RopeTable& table);
void rope_backward(const TensorView& dy, const TensorView& dx, int64_t start_pos,
                   const RopeTable& table);

namespace ref {
// Scalar reference: computes angles and cos/sin in double directly (no table); the
// table argument only supplies theta, head_dim and the position limit.
void rope_forward(const TensorView& x, const TensorView& out, const TensorView& positions,
                  const RopeTable& table);
void rope_backward(const TensorView& dy, const TensorView& dx, const TensorView& positions,
                   const RopeTable& table);
}  // namespace ref

}  // namespace hyperion
