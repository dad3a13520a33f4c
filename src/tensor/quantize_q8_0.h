// GGML's Q8_0 block format, the one GGUF files use: blocks of 32 values, each an f16
// scale d and 32 int8 quants.
#pragma once

#include <cstdint>

namespace hyperion {

// Q8_0 quantisation exactly as llama.cpp's quantize_row_q8_0_ref: per block of 32,
// d = amax / 127, id = d ? 1/d : 0, qs = roundf(x * id) (half away from zero), d stored as
// f16 (RNE). NaN inputs quantise to 0. `n` must be a multiple of 32. SIMD + threads.
void quantize_row_q8_0(const float* x, void* blocks, int64_t n);
// y = qs * f16_to_f32(d).
void dequantize_row_q8_0(const void* blocks, float* y, int64_t n);

namespace ref {
void quantize_row_q8_0(const float* x, void* blocks, int64_t n);
void dequantize_row_q8_0(const void* blocks, float* y, int64_t n);
}  // namespace ref

}  // namespace hyperion
