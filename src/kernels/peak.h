// Machine peak measurement: sustained multiply-accumulate rate per dtype on the best
// instruction set this CPU has, and STREAM-style memory bandwidth. These are the
// denominators of every MFU and bandwidth ratio hyperion prints.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.h"

namespace hyperion {

struct PeakResult {
  int threads = 0;
  double f32_gflops = 0;   // AVX-512 (or AVX2) FMA
  double bf16_gflops = 0;  // best of AMX / AVX512-BF16 / f32 FMA
  std::string bf16_isa;
  double bf16_avx512_gflops = 0;  // AVX512-BF16 dot product rate (0 if absent)
  double int8_gops = 0;           // best of AMX / VNNI / f32 FMA (int8 widened)
  std::string int8_isa;
  double int8_vnni_gops = 0;  // AVX512-VNNI rate (0 if absent)
  double copy_gbps = 0;       // STREAM copy (2 x 8 bytes counted per element)
  double triad_gbps = 0;      // STREAM triad (3 x 8 bytes)
  double read_gbps = 0;       // read-only sum (8 bytes)
  double update_gbps = 0;     // in-place a = s*a + b (3 x 8 bytes, no write-allocate)
  double mem_gbps = 0;        // best of copy / triad / read / update: ratios use it
};

// Runs every measurement with the current thread count; `seconds` per measurement.
PeakResult measure_peak(double seconds = 0.5);

// Cached result of measure_peak for ratio reporting within one process.
const PeakResult& cached_peak();

// A device's measured matmul peak: square `size`^3 GEMMs of `dtype` (f32 accumulation)
// on `backend`, in its memory, repeated for about `seconds` after a warm-up; GFLOP/s.
// On a GPU this is the cuBLASLt rate its MFU is reported against (not measured here yet;
// a bf16 8192^3 cuBLASLt GEMM was measured at 892 TFLOP/s on an H100 outside this code).
double measure_backend_gemm_gflops(KernelBackend& backend, DType dtype, int64_t size,
                                   double seconds = 0.3);

// A device's memory bandwidth: copies of `bytes` between two buffers in `backend`'s
// memory, repeated for about `seconds` after a warm-up; GB/s of traffic (each copy reads
// and writes `bytes`). What a decode step's bandwidth bound is taken against on a GPU.
double measure_backend_copy_gbps(KernelBackend& backend, size_t bytes, double seconds = 0.3);

}  // namespace hyperion
