#include "kernels/peak.h"

#include "kernels/amx_tiles.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "base/aligned.h"
#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "base/timer.h"

namespace hyperion {
namespace {

// Each loop body keeps enough independent accumulators in registers to cover the FMA
// latency on both FMA ports; nothing touches memory, so this is the compute ceiling.
__attribute__((target("avx512f"))) double fma_f32_avx512(int64_t iters) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  volatile float sink = lanes[0];
  (void)sink;
  return double(iters) * 16 * 16 * 2;
}

__attribute__((target("avx2,fma"))) double fma_f32_avx2(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(0.001f * i);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  volatile float sink = out[0];
  (void)sink;
  return double(iters) * 12 * 8 * 2;
}

__attribute__((target("avx512f,avx512bf16"))) double dot_bf16_avx512(int64_t iters) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x0001);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  volatile float sink = lanes[0];
  (void)sink;
  return double(iters) * 16 * 32 * 2;  // 16 lanes x 2 pairs x (mul + add)
}

__attribute__((target("avx512f,avx512vnni"))) double dot_int8_vnni(int64_t iters) {
  __m512i acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_si512();
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(1);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  __m512i s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_epi32(s, acc[i]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, s);
  volatile int32_t sink = lanes[0];
  (void)sink;
  return double(iters) * 16 * 64 * 2;  // 16 lanes x 4 pairs x (mul + add)
}

// AMX: four accumulator tiles (16x16 f32 / int32), two A and two B tiles, all register
// resident. Tile shapes are the maximum: 16 rows x 64 bytes.
__attribute__((target("amx-tile,amx-bf16"))) double amx_bf16(int64_t iters) {
  amx_configure_full_tiles();
  alignas(64) static thread_local uint16_t buf[16 * 32];
  for (auto& v : buf) v = 0x3c00;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, buf, 64);
  _tile_loadd(5, buf, 64);
  _tile_loadd(6, buf, 64);
  _tile_loadd(7, buf, 64);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) static thread_local float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  volatile float sink = out[0];
  (void)sink;
  return double(iters) * 4 * 16 * 16 * 32 * 2;
}

__attribute__((target("amx-tile,amx-int8"))) double amx_int8(int64_t iters) {
  amx_configure_full_tiles();
  alignas(64) static thread_local int8_t buf[16 * 64];
  for (auto& v : buf) v = 1;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, buf, 64);
  _tile_loadd(5, buf, 64);
  _tile_loadd(6, buf, 64);
  _tile_loadd(7, buf, 64);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  alignas(64) static thread_local int32_t out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  volatile int32_t sink = out[0];
  (void)sink;
  return double(iters) * 4 * 16 * 16 * 64 * 2;
}

// Runs `kernel(iters)` on every thread at once in short bursts (~10 ms) for `seconds`
// and returns the best burst's aggregate rate (ops/s). On a shared or virtualised host
// a long run averages in other tenants' interference; the best short burst is the
// machine's capability, which is what a peak denominator must be.
template <typename Kernel>
double measure_rate(Kernel kernel, double seconds) {
  const int threads = num_threads();
  // Size the bursts from a single-threaded run outside any parallel region: a parallel
  // calibration on a loaded host can include the time a descheduled thread takes to
  // join, which would shrink every burst until fork/join overhead is all that is timed.
  int64_t iters = 256;
  double elapsed = 0;
  for (;;) {
    Timer t;
    kernel(iters);
    elapsed = t.seconds();
    if (elapsed > 0.002 || iters > (int64_t(1) << 40)) break;
    iters *= 4;
  }
  for (int i = 0; i < 2; ++i) {  // interference only ever slows a run: keep the fastest
    Timer t;
    kernel(iters);
    elapsed = std::min(elapsed, t.seconds());
  }
  iters = std::max<int64_t>(iters, int64_t(double(iters) * 0.01 / std::max(elapsed, 1e-9)));
  double best = 0;
  Timer total;
  for (int rep = 0; rep < 5 || (total.seconds() < seconds && rep < 10000); ++rep) {
    double ops_total = 0;
    Timer t;
#pragma omp parallel num_threads(threads) reduction(+ : ops_total)
    ops_total += kernel(iters);
    best = std::max(best, ops_total / t.seconds());
  }
  return best;
}

struct Bandwidth {
  double copy, triad, read, update;
};

// Sums x[i] + y[i] + z[i] over two halves at once (six concurrent streams); memory-bound
// by construction.
__attribute__((target("avx512f"))) double read_sum_avx512(const double* x, const double* y,
                                                          const double* z, int64_t n) {
  const int64_t half = n / 2;
  const double* x2 = x + half;
  const double* y2 = y + half;
  const double* z2 = z + half;
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd(), s2 = _mm512_setzero_pd(),
          s3 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    s0 = _mm512_add_pd(s0, _mm512_loadu_pd(x + i));
    s1 = _mm512_add_pd(s1, _mm512_loadu_pd(y + i));
    s2 = _mm512_add_pd(s2, _mm512_loadu_pd(z + i));
    s3 = _mm512_add_pd(s3, _mm512_loadu_pd(x2 + i));
    s0 = _mm512_add_pd(s0, _mm512_loadu_pd(y2 + i));
    s1 = _mm512_add_pd(s1, _mm512_loadu_pd(z2 + i));
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, _mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3)));
  double s = 0;
  for (double v : lanes) s += v;
  for (; i < half; ++i) s += x[i] + y[i] + z[i] + x2[i] + y2[i] + z2[i];
  for (int64_t j = 2 * half; j < n; ++j) s += x[j] + y[j] + z[j];
  return s;
}

double read_sum(const double* x, const double* y, const double* z, int64_t n) {
  if (cpu_features().avx512f) return read_sum_avx512(x, y, z, n);
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i] + y[i] + z[i];
  return s;
}

Bandwidth measure_bandwidth(double seconds) {
  // Arrays well beyond any last-level cache.
  const size_t n = size_t(64) << 20;  // 64 Mi doubles = 512 MiB each
  AlignedBuffer<double> a(n), b(n), c(n);
  parallel_chunks(int64_t(n), 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      a[i] = 1.0;
      b[i] = 2.0;
      c[i] = 0.5;
    }
  });
  auto time_best = [&](auto&& body, double bytes) {
    double best = 0;
    double spent = 0;
    for (int rep = 0; rep < 40 && (rep < 3 || spent < seconds); ++rep) {
      Timer t;
      parallel_chunks(int64_t(n), 1 << 16, body);
      double s = t.seconds();
      spent += s;
      best = std::max(best, bytes / s / 1e9);
    }
    return best;
  };
  Bandwidth bw{};
  bw.copy = time_best(
      [&](int64_t lo, int64_t hi) {
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) c[i] = a[i];
      },
      2.0 * 8 * double(n));
  bw.triad = time_best(
      [&](int64_t lo, int64_t hi) {
        const double s = 3.0;
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
      },
      3.0 * 8 * double(n));
  // In-place update a = s * a + b: the written lines were just read, so there is no
  // write-allocate read and the counted bytes are the real traffic (copy and triad move
  // one more line per store than STREAM counts).
  bw.update = time_best(
      [&](int64_t lo, int64_t hi) {
        const double s = 0.999;
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) a[i] = s * a[i] + b[i];
      },
      3.0 * 8 * double(n));
  // The same over four quarters at once: eight streams, four of them written back, the
  // shape of an optimizer step. Per-core memory parallelism grows with the number of
  // streams the prefetchers track, so this is the pattern that reaches the highest rate.
  bw.update = std::max(bw.update, time_best(
                                      [&](int64_t lo, int64_t hi) {
                                        const double s = 0.999;
                                        const int64_t q = int64_t(n / 4);
                                        double* a0 = a.data();
                                        const double* b0 = b.data();
#pragma omp simd
                                        for (int64_t i = lo / 4; i < hi / 4; ++i) {
                                          a0[i] = s * a0[i] + b0[i];
                                          a0[q + i] = s * a0[q + i] + b0[q + i];
                                          a0[2 * q + i] = s * a0[2 * q + i] + b0[2 * q + i];
                                          a0[3 * q + i] = s * a0[3 * q + i] + b0[3 * q + i];
                                        }
                                      },
                                      3.0 * 8 * double(n / 4 * 4)));
  // Read-only over three arrays at once (more concurrent streams keep more prefetches in
  // flight), with several vector accumulators so the adds never limit the loads.
  double sink = 0;
  bw.read = time_best(
      [&](int64_t lo, int64_t hi) {
        double s = read_sum(a.data() + lo, b.data() + lo, c.data() + lo, hi - lo);
#pragma omp atomic
        sink += s;
      },
      3.0 * 8 * double(n));
  volatile double keep = sink;
  (void)keep;
  return bw;
}

}  // namespace

PeakResult measure_peak(double seconds) {
  const CpuFeatures& f = cpu_features();
  PeakResult r;
  r.threads = num_threads();
  if (f.avx512f) {
    r.f32_gflops = measure_rate(fma_f32_avx512, seconds) / 1e9;
  } else if (f.avx2 && f.fma) {
    r.f32_gflops = measure_rate(fma_f32_avx2, seconds) / 1e9;
  }
  r.bf16_gflops = r.f32_gflops;
  r.bf16_isa = f.avx512f ? "avx512f (f32 fma)" : "avx2 (f32 fma)";
  if (f.avx512_bf16) {
    r.bf16_avx512_gflops = measure_rate(dot_bf16_avx512, seconds) / 1e9;
    if (r.bf16_avx512_gflops > r.bf16_gflops) {
      r.bf16_gflops = r.bf16_avx512_gflops;
      r.bf16_isa = "avx512_bf16";
    }
  }
  // Without VNNI or AMX, int8 GEMMs run widened to f32 (kernels/gemm_widened.h): their
  // ceiling is the f32 FMA rate, not zero (a ratio to zero would read as nothing done).
  r.int8_gops = r.f32_gflops;
  r.int8_isa = f.avx512f ? "avx512f (f32 fma)" : "avx2 (f32 fma)";
  if (f.avx512_vnni) {
    r.int8_vnni_gops = measure_rate(dot_int8_vnni, seconds) / 1e9;
    if (r.int8_vnni_gops > r.int8_gops) {
      r.int8_gops = r.int8_vnni_gops;
      r.int8_isa = "avx512_vnni";
    }
  }
  if (f.amx_bf16 && request_amx()) {
    double amx = measure_rate(amx_bf16, seconds) / 1e9;
    if (amx > r.bf16_gflops) {
      r.bf16_gflops = amx;
      r.bf16_isa = "amx_bf16";
    }
  }
  if (f.amx_int8 && request_amx()) {
    double amx = measure_rate(amx_int8, seconds) / 1e9;
    if (amx > r.int8_gops) {
      r.int8_gops = amx;
      r.int8_isa = "amx_int8";
    }
  }
  Bandwidth bw = measure_bandwidth(seconds);
  r.copy_gbps = bw.copy;
  r.triad_gbps = bw.triad;
  r.read_gbps = bw.read;
  // STREAM counts exclude write-allocate traffic, so copy and triad understate what the
  // memory sustains: the denominator is the best any of the four patterns reached.
  r.update_gbps = bw.update;
  r.mem_gbps = std::max({bw.copy, bw.triad, bw.read, bw.update});
  return r;
}

const PeakResult& cached_peak() {
  static const PeakResult r = measure_peak();
  return r;
}

double measure_backend_gemm_gflops(KernelBackend& backend, DType dtype, int64_t size,
                                   double seconds) {
  HYP_CHECK(size > 0 && seconds > 0,
            "measure_backend_gemm_gflops: size {} and seconds {} must be > 0", size, seconds);
  const size_t n = static_cast<size_t>(size), es = dtype_size(dtype);
  DeviceBuffer a(backend.allocator(), n * n * es), b(backend.allocator(), n * n * es),
      c(backend.allocator(), n * n * 4);
  backend.zero(a.data(), a.bytes());  // zeros: the rate does not depend on the values
  backend.zero(b.data(), b.bytes());
  auto once = [&] {
    backend.gemm_contiguous(Trans::kN, Trans::kT, size, size, size, a.data(), dtype, b.data(),
                            dtype, c.data(), DType::kF32);
  };
  once();  // warm-up: algorithm choice, clocks
  backend.synchronize();
  int64_t reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (int i = 0; i < 4; ++i) once();
    reps += 4;
    backend.synchronize();
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  return 2.0 * static_cast<double>(size) * static_cast<double>(size) * static_cast<double>(size) *
         static_cast<double>(reps) / elapsed / 1e9;
}

double measure_backend_copy_gbps(KernelBackend& backend, size_t bytes, double seconds) {
  HYP_CHECK(bytes > 0 && seconds > 0, "measure_backend_copy_gbps: bytes {} and seconds {} must be > 0",
            bytes, seconds);
  DeviceBuffer a(backend.allocator(), bytes), b(backend.allocator(), bytes);
  backend.zero(a.data(), bytes);
  backend.zero(b.data(), bytes);
  backend.copy(a.data(), b.data(), bytes);  // warm-up
  backend.synchronize();
  int64_t reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (int i = 0; i < 4; ++i) backend.copy((i & 1) ? b.data() : a.data(), (i & 1) ? a.data() : b.data(), bytes);
    reps += 4;
    backend.synchronize();
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  return 2.0 * static_cast<double>(bytes) * static_cast<double>(reps) / elapsed / 1e9;
}

}  // namespace hyperion
