// GEMM library comparison for docs/DEPENDENCIES.md: hyperion's GEMM (oneDNN) against
// OpenBLAS's cblas_sgemm on the same buffers, one after the other in one process.
// OpenBLAS keeps its own pthread pool, which is why it is only linked here and never
// into libhyperion. Usage: hyperion_bench_blas [--threads N]
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "base/aligned.h"
#include "base/threads.h"
#include "base/timer.h"
#include "kernels/gemm.h"

extern "C" void openblas_set_num_threads(int);

namespace {

double median_seconds(const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  hyperion::Timer total;
  while (t.size() < 5 || (total.seconds() < 1.0 && t.size() < 200)) {
    hyperion::Timer one;
    fn();
    t.push_back(one.seconds());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = hyperion::hardware_cores();
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
  hyperion::set_num_threads(threads);
  openblas_set_num_threads(threads);
  std::printf("%-28s %14s %14s %8s\n", "shape (M x N x K, f32, NT)", "oneDNN GFLOP/s", "OpenBLAS",
              "ratio");
  const int64_t shapes[][3] = {{256, 256, 256},    {1024, 1024, 1024}, {2048, 2048, 2048},
                               {4096, 4096, 4096}, {1, 2048, 2048},    {8, 2048, 2048},
                               {64, 2048, 2048}};
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    hyperion::AlignedBuffer<float> a(size_t(m * k)), b(size_t(n * k)), c(size_t(m * n));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : a) x = u(rng);
    for (auto& x : b) x = u(rng);
    hyperion::GemmArgs g;
    g.trans_b = hyperion::Trans::kT;
    g.m = m, g.n = n, g.k = k, g.lda = k, g.ldb = k, g.ldc = n;
    g.a = a.data(), g.b = b.data(), g.c = c.data();
    double t_dnnl = median_seconds([&] { hyperion::gemm(g); });
    double t_blas = median_seconds([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, a.data(),
                  int(k), b.data(), int(k), 0.0f, c.data(), int(n));
    });
    const double flops = 2.0 * double(m) * n * k;
    char label[64];
    std::snprintf(label, sizeof(label), "%ld x %ld x %ld", long(m), long(n), long(k));
    std::printf("%-28s %14.1f %14.1f %8.2f\n", label, flops / t_dnnl / 1e9, flops / t_blas / 1e9,
                t_blas / t_dnnl);
  }
  return 0;
}
