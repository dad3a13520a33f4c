// Low-precision GEMMs on CPUs where oneDNN cannot run them as they are: bf16 needs AVX-512
// (oneDNN 2.6 has no bf16 matmul for AVX2), and int8 without VNNI goes through
// vpmaddubsw, whose 16-bit intermediate sums saturate (wrong results for full-range
// int8). There the GEMM runs widened: the operands are converted to f32 (exactly: every
// bf16 and int8 value is an f32) and multiplied by oneDNN's f32 GEMM.
//
//   bf16: one f32 GEMM; a bf16 C is rounded to nearest even once, at the end.
//   int8: K is cut into chunks of at most 512, for which every f32 partial sum is an
//         integer below 2^24 (|u8 x s8| <= 32640) and so exact; the chunks add up in
//         int32, so the sums are exactly the integer GEMM's, as the VNNI kernels give.
//
// The cost over the native kernels is the conversions (O(mk + kn), against O(mnk)) and
// f32's rate instead of bf16's or int8's. Internal to the GEMM dispatch (kernels/gemm.h).
#pragma once

#include <cstdint>

#include "kernels/gemm.h"

namespace hyperion::detail {

// Whether oneDNN runs `g`'s dtypes natively and exactly on this CPU (f32 always; bf16
// with AVX-512; int8 with AVX512-VNNI). HYPERION_GEMM_WIDEN=1 answers false for bf16 and
// int8 everywhere (tests, and comparing the two paths).
bool onednn_runs_natively(const GemmArgs& g);

// `g` (bf16 or int8 operands, already validated) through f32 as described above.
void widened_gemm(const GemmArgs& g);

// f32 on a CPU without AVX-512: oneDNN's f32 GEMM there (gemm:jit) splits K over threads
// for some shapes, so its sums change order, and its results their last bits, with the
// thread count. Such GEMMs (and the f32 GEMMs of the widened ones) run instead as tiles
// of C of a fixed size (128 x 128), each on one thread with oneDNN single-threaded:
// the tiling, and so every result bit, is the same at any thread count, as it is with
// the AVX-512 kernels. HYPERION_GEMM_WIDEN=1 tiles everywhere too; HYPERION_GEMM_TILES=0
// turns the tiles off (for measuring what they cost).
bool tiles_for_determinism(const GemmArgs& g);
void tiled_f32_gemm(const GemmArgs& f);

// The oneDNN matmul itself (cached primitive, scratchpad, scale epilogue), for validated
// arguments that oneDNN runs natively. Defined in gemm.cc.
void onednn_gemm(const GemmArgs& g);

// C = alpha * a_scale[m] * b_scale[n] * sums + bias[n] + beta * C, converted to C's dtype
// (f32 or bf16). `sums` may be C itself (f32, beta == 0). Defined in gemm.cc.
void scale_epilogue(const GemmArgs& g, const float* sums, int64_t sums_ld, int64_t sums_stride);

}  // namespace hyperion::detail
