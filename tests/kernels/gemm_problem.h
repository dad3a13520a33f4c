// A random decode-shaped GEMM problem (C = alpha * a_scale * b_scale * A B^T + bias +
// beta * C, B transposed) with its reference result from ref::gemm, for the tests of
// the GEMV (kernels/gemv.h) and the batch GEMM (kernels/batch_gemm.h). Scalars, scales,
// bias, padding and int8 row sums vary with `variant`; expect_close checks a result
// against the reference and that the padding of C stays untouched.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/gemm.h"
#include "tensor/convert.h"

namespace hyperion::testing_util {

struct Combo {
  DType a, b, c;
};

inline std::vector<unsigned char> random_bytes(DType d, size_t n, std::mt19937& rng) {
  std::vector<unsigned char> out(n * dtype_size(d));
  std::uniform_real_distribution<float> uf(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ui(-128, 127), uu(0, 255);
  for (size_t i = 0; i < n; ++i) {
    float v = d == DType::kI8 ? float(ui(rng)) : d == DType::kU8 ? float(uu(rng)) : uf(rng);
    convert_any(&v, DType::kF32, out.data() + i * dtype_size(d), d, 1);
  }
  return out;
}

// One problem with its inputs, initial C and reference result.
struct Problem {
  GemmArgs g;
  std::vector<unsigned char> a, b, c_init, c_ref;
  std::vector<float> bias, as, bs;
  std::vector<int32_t> sums;  // int8 B's row sums, given to half the signed-A problems

  Problem(const Combo& combo, int64_t m, int64_t n, int64_t k, int variant) {
    std::mt19937 rng(unsigned(m * 7919 + n * 131 + k * 17 + variant));
    const int64_t pad = variant % 3 == 0 ? 0 : variant % 3 == 1 ? 3 : 17;
    g.trans_a = Trans::kN;
    g.trans_b = Trans::kT;
    g.m = m;
    g.n = n;
    g.k = k;
    g.lda = k + pad;
    g.ldb = k + (pad ? pad + 2 : 0);
    g.ldc = n + pad;
    g.a_dtype = combo.a;
    g.b_dtype = combo.b;
    g.c_dtype = combo.c;
    a = random_bytes(combo.a, size_t(m * g.lda), rng);
    b = random_bytes(combo.b, size_t(n * g.ldb), rng);
    const bool raw = combo.c == DType::kI32;
    if (combo.a == DType::kI8 && combo.b == DType::kI8 && variant % 2 == 1) {
      sums.assign(size_t(n), 0);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t p = 0; p < k; ++p) sums[size_t(j)] += int8_t(b[size_t(j * g.ldb + p)]);
      g.b_sums = sums.data();
    }
    // Scalars vary with the variant; int32 output takes raw sums only.
    g.alpha = raw || variant % 2 == 0 ? 1.0f : 0.75f;
    g.beta = raw || variant % 4 < 2 ? 0.0f : -0.5f;
    std::uniform_real_distribution<float> u(0.01f, 0.1f);
    bias.resize(size_t(n));
    as.resize(size_t(m));
    bs.resize(size_t(n));
    for (auto& x : bias) x = u(rng);
    for (auto& x : as) x = u(rng);
    for (auto& x : bs) x = u(rng);
    if (!raw && variant % 3 != 0) g.bias = bias.data();
    if (!raw && (variant % 5 >= 2 || combo.b == DType::kI8)) {
      g.a_scale = as.data();
      g.b_scale = bs.data();
    }
    // C: random values where beta reads them, NaN where it must not, 7 in the padding
    // (which must survive untouched).
    const size_t esize = dtype_size(combo.c);
    c_init.resize(size_t(m * g.ldc) * esize);
    std::uniform_real_distribution<float> uc(-1.0f, 1.0f);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < g.ldc; ++j) {
        float v = j >= n           ? 7.0f
                  : g.beta != 0.0f ? uc(rng)
                                   : std::numeric_limits<float>::quiet_NaN();
        if (raw) v = j >= n ? 7.0f : -3.0f;
        convert_any(&v, DType::kF32, c_init.data() + size_t(i * g.ldc + j) * esize, combo.c, 1);
      }
    }
    c_ref = c_init;
    g.a = a.data();
    g.b = b.data();
    g.c = c_ref.data();
    ref::gemm(g);
  }

  // Runs `fn` on a fresh copy of C and returns it.
  template <typename Fn>
  std::vector<unsigned char> run(Fn&& fn) {
    std::vector<unsigned char> c = c_init;
    GemmArgs args = g;
    args.c = c.data();
    fn(args);
    return c;
  }

  void expect_close(const std::vector<unsigned char>& got, const char* what) const {
    const DType cd = g.c_dtype;
    const size_t esize = dtype_size(cd);
    double max_ref = 0;
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j)
        max_ref = std::max(max_ref,
                           std::fabs(double(load_as_f32(c_ref.data(), cd, size_t(i * g.ldc + j)))));
    const bool lowp = cd == DType::kBF16;
    const double tol = cd == DType::kI32 ? 0.0 : (lowp ? 8e-3 : 1e-5) * std::max(max_ref, 1e-3);
    int bad = 0;
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.ldc; ++j) {
        const size_t idx = size_t(i * g.ldc + j);
        if (j >= g.n) {  // padding: bitwise untouched
          EXPECT_EQ(std::memcmp(got.data() + idx * esize, c_init.data() + idx * esize, esize), 0)
              << what << " wrote padding at " << i << "," << j;
          continue;
        }
        double diff;
        if (cd == DType::kI32) {
          int32_t x, y;
          std::memcpy(&x, got.data() + idx * 4, 4);
          std::memcpy(&y, c_ref.data() + idx * 4, 4);
          diff = x == y ? 0.0 : 1.0;
        } else {
          diff = std::fabs(double(load_as_f32(got.data(), cd, idx)) -
                           double(load_as_f32(c_ref.data(), cd, idx)));
          if (std::isnan(diff)) diff = 1e30;
        }
        if (diff > tol && bad++ < 5) {
          ADD_FAILURE() << what << " " << dtype_name(g.a_dtype) << "x" << dtype_name(g.b_dtype)
                        << "->" << dtype_name(cd) << " m=" << g.m << " n=" << g.n << " k=" << g.k
                        << " alpha=" << g.alpha << " beta=" << g.beta << " at (" << i << "," << j
                        << "): got " << load_as_f32(got.data(), cd, idx) << " ref "
                        << load_as_f32(c_ref.data(), cd, idx) << " tol " << tol;
        }
      }
    }
  }
};

}  // namespace hyperion::testing_util
