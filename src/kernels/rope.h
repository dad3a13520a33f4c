// Rotary position embedding, Hugging Face "rotate half" convention
// (LlamaRotaryEmbedding + apply_rotary_pos_emb):
//
//   inv_freq[i] = theta^(-2i/D),  angle = pos * inv_freq[i],  i < D/2
//   out[..., i]       = x[..., i] * cos(angle) - x[..., i + D/2] * sin(angle)
//   out[..., i + D/2] = x[..., i + D/2] * cos(angle) + x[..., i] * sin(angle)
//
// Scaled RoPE (RopeScaling, as Hugging Face's modeling_rope_utils computes it) changes
// only inv_freq and multiplies cos and sin by an attention factor (YaRN), so the same
// rotation kernels run every kind; the table carries what the scaling decided.
//
// Shapes: x, out, dy, dx [B, T, H, D] (f32 or bf16, same dtype, contiguous), D even;
// positions [T] or [B, T] int32 (or a start offset: position of token t is start + t).
// Angles are computed once in double in the table (Hugging Face computes them in f32,
// which loses ~1e-4 rad at position 4096), the rotation in f32, and bf16 outputs are
// rounded once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/aligned.h"
#include "tensor/tensor.h"

namespace hyperion {

// How inv_freq is scaled for a context longer than the one a model was trained on
// (Hugging Face rope_scaling / rope_parameters; rope_type names as there):
//   kLinear  inv_freq / factor (position interpolation)
//   kLlama3  Llama 3.1: low frequencies (wavelength > original / low_freq_factor) divided by
//            factor, high ones (wavelength < original / high_freq_factor) kept, a smooth
//            blend between
//   kYarn    YaRN: a ramp between interpolated and extrapolated frequencies over the
//            dimensions whose rotations at original_max_positions lie in
//            [beta_slow, beta_fast], and cos/sin scaled by attention_factor
//            (0.1 ln(factor) + 1 unless given)
struct RopeScaling {
  enum class Type : uint8_t { kNone, kLinear, kLlama3, kYarn };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;       // llama3
  double high_freq_factor = 4.0;      // llama3
  int64_t original_max_positions = 0; // llama3, yarn: the trained context
  double beta_fast = 32.0;            // yarn
  double beta_slow = 1.0;             // yarn
  double attention_factor = 0.0;     // yarn: 0 = derived from factor (and mscale)
  double mscale = 0.0;                // yarn (DeepSeek form): 0 = unset
  double mscale_all_dim = 0.0;
  bool truncate = true;               // yarn: correction range rounded to whole dims

  bool operator==(const RopeScaling&) const = default;
};
// "default", "linear", "llama3", "yarn"; parse returns false for an unknown name.
const char* rope_type_name(RopeScaling::Type t);
bool parse_rope_type(const std::string& name, RopeScaling::Type* out);
// inv_freq[i] for i < head_dim / 2 (double), and the factor cos and sin are scaled by.
std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling);
double rope_attention_factor(const RopeScaling& scaling);

// cos/sin of pos * inv_freq[i] for pos < max_positions and i < head_dim / 2, f32,
// row-major [max_positions, head_dim / 2]. Built once; the hot path only reads it.
struct RopeTable {
  RopeTable(int64_t max_positions, int64_t head_dim, double theta = 10000.0,
            const RopeScaling& scaling = {});

  int64_t max_positions = 0;
  int64_t head_dim = 0;
  double theta = 0;
  RopeScaling scaling;
  std::vector<double> inv_freq;     // [head_dim / 2]
  double attention_factor = 1.0;    // cos and sin are multiplied by it

  // Every input that changes the table's contents, exactly (a device caches its copy
  // under this key: two tables with one key hold the same values).
  std::string key() const;
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
// Scalar reference: computes angles and cos/sin in double directly (no cos/sin table);
// the table argument supplies inv_freq, the attention factor, head_dim and the limit.
void rope_forward(const TensorView& x, const TensorView& out, const TensorView& positions,
                  const RopeTable& table);
void rope_backward(const TensorView& dy, const TensorView& dx, const TensorView& positions,
                   const RopeTable& table);
}  // namespace ref

}  // namespace hyperion
