// Symmetric absmax quantisation to int8 or fp8 E4M3 with one f32 scale per row (per
// output channel for weights, per token for activations, per token per kv head for the
// KV cache).
//
//   scale = max|x| / qmax        qmax = 127 for int8, 448 for E4M3 (f32 division)
//   q     = x / scale            rounded to nearest even; int8 clamped to [-127, 127],
//                                E4M3 saturating (f32_to_e4m3(.., saturate = true))
//   dequantised value = q * scale
//
// Edge cases, identical in every path:
//   - an all-zero row gets scale 0 and q 0; so does a row whose max|x| is so small (f32
//     subnormal) that max|x| / qmax underflows to 0;
//   - a row holding inf or NaN gets a non-finite scale (inf, or NaN if any element is NaN)
//     and q 0, so it dequantises to NaN rather than to silently plausible values.
// Round trip: int8 |x - q * scale| <= scale / 2 (+ f32 rounding of the division); E4M3
// is relative, |x - q * scale| <= |x| / 16 for |x| >= 2^-6 * scale, scale * 2^-10 below.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace hyperion {

// Raw row form, the hot path: x holds n values of xd (kF32 or kBF16), q receives n values
// of qd (kI8 or kE4M3). Returns the scale. AVX-512 when available (int8 fully, E4M3 for
// the absmax pass), a portable scalar path otherwise. Throws on other dtypes or n < 0.
float quantize_row(const void* x, DType xd, int64_t n, void* q, DType qd);

// Tensor form: x [rows, cols] f32|bf16 contiguous -> q [rows, cols] i8|e4m3 contiguous,
// scales[rows]. Rows run in parallel (base/threads.h) when the tensor is large.
void quantize_rows(const TensorView& x, const TensorView& q, float* scales);

// q [rows, cols] i8|e4m3 with scales[rows] -> out [rows, cols] f32|bf16 (bf16 rounded to
// nearest even), all contiguous. Parallel over rows when large.
void dequantize_rows(const TensorView& q, const float* scales, const TensorView& out);

// Row sums of an int8 matrix q [rows, cols] (contiguous): sums[r] = sum_c q[r, c], exact
// (|sum| <= 127 * cols < 2^31). A weight's sums are the correction the int8 decode GEMV
// takes as GemmArgs::b_sums; taken once at load. Parallel over rows when large.
void int8_row_sums(const TensorView& q, int32_t* sums);

// Largest representable |q|: 127 for kI8, 448 for kE4M3 (throws for other dtypes).
float quantize_qmax(DType qd);

namespace detail {
// The portable scalar path quantize_row falls back to without AVX-512 (exposed so tests
// check it on machines that have AVX-512 too).
float quantize_row_portable(const void* x, DType xd, int64_t n, void* q, DType qd);
}  // namespace detail

namespace ref {
// Scalar reference: the definition above as plain loops.
float quantize_row(const void* x, DType xd, int64_t n, void* q, DType qd);
}  // namespace ref

}  // namespace hyperion
