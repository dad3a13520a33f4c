// Google Benchmark: GEMM throughput for square sizes 256..4096 and the thin shapes of
// decode (M = 1..64, N = K = 2048, weights [N, K] as Hugging Face stores them).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "base/aligned.h"
#include "kernels/gemm.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

template <typename T>
void fill(AlignedBuffer<T>& b) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : b) {
    float v = u(rng);
    if constexpr (std::is_same_v<T, float>) x = v;
    if constexpr (std::is_same_v<T, bf16>) x = f32_to_bf16(v);
    if constexpr (std::is_same_v<T, int8_t>) x = int8_t(v * 127);
  }
}

template <typename T>
void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  AlignedBuffer<T> a(size_t(m * k)), b(size_t(n * k));
  AlignedBuffer<float> c(size_t(m * n));
  std::vector<float> as(size_t(m), 0.01f), bs(size_t(n), 0.01f);
  fill(a);
  fill(b);
  GemmArgs g;
  g.trans_b = Trans::kT;
  g.m = m, g.n = n, g.k = k, g.lda = k, g.ldb = k, g.ldc = n;
  g.a = a.data(), g.a_dtype = DTypeOf<T>::value;
  g.b = b.data(), g.b_dtype = DTypeOf<T>::value;
  g.c = c.data();
  if (std::is_same_v<T, int8_t>) g.a_scale = as.data(), g.b_scale = bs.data();
  for (auto _ : state) gemm(g);
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * double(m) * n * k, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_B/s"] =
      benchmark::Counter(double(n) * k * sizeof(T), benchmark::Counter::kIsIterationInvariantRate);
}

void SquareSizes(benchmark::internal::Benchmark* b) {
  for (int64_t s : {256, 512, 1024, 2048, 4096}) b->Args({s, s, s});
}
void DecodeSizes(benchmark::internal::Benchmark* b) {
  for (int64_t m : {1, 2, 4, 8, 16, 32, 64}) b->Args({m, 2048, 2048});
}

BENCHMARK(BM_Gemm<float>)->Apply(SquareSizes)->Apply(DecodeSizes)->UseRealTime();
BENCHMARK(BM_Gemm<bf16>)->Apply(SquareSizes)->Apply(DecodeSizes)->UseRealTime();
BENCHMARK(BM_Gemm<int8_t>)->Apply(SquareSizes)->Apply(DecodeSizes)->UseRealTime();

}  // namespace
}  // namespace hyperion

BENCHMARK_MAIN();
