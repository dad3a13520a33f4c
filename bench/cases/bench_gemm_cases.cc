#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "base/aligned.h"
#include "cases/bench_registry.h"
#include "kernels/amx_int8_gemm.h"
#include "kernels/gemm.h"
#include "tensor/convert.h"

namespace hyperion::bench {
namespace {

// Random values in [-1, 1) (int8: [-127, 127]); large buffers repeat a 1 Mi-element
// random block so that setting up a 512 MiB case stays fast.
template <typename T>
std::shared_ptr<AlignedBuffer<T>> filled(size_t n, unsigned seed) {
  auto b = std::make_shared<AlignedBuffer<T>>(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t block = std::min<size_t>(n, size_t(1) << 20);
  for (size_t i = 0; i < block; ++i) {
    float v = u(rng);
    if constexpr (std::is_same_v<T, float>) (*b)[i] = v;
    if constexpr (std::is_same_v<T, bf16>) (*b)[i] = f32_to_bf16(v);
    if constexpr (std::is_same_v<T, int8_t>) (*b)[i] = int8_t(v * 127);
  }
  for (size_t i = block; i < n; i += block)
    std::memcpy(b->data() + i, b->data(), std::min(block, n - i) * sizeof(T));
  return b;
}

template <typename T>
DType dtype_of() {
  return DTypeOf<T>::value;
}

// Square GEMM C[n, n] = A[n, n] @ B[n, n]^T (the training forward form), C in f32.
template <typename T>
KernelBench square(int64_t n, Bound bound, const char* tag) {
  KernelBench kb;
  kb.name = std::string("gemm_") + tag + "_" + std::to_string(n) + "^3";
  kb.bound = bound;
  kb.flops = 2.0 * double(n) * n * n;
  kb.setup = [n] {
    auto a = filled<T>(size_t(n * n), 1), b = filled<T>(size_t(n * n), 2);
    auto c = std::make_shared<AlignedBuffer<float>>(size_t(n * n));
    auto as = std::make_shared<std::vector<float>>(size_t(n), 0.01f);
    auto bs = std::make_shared<std::vector<float>>(size_t(n), 0.02f);
    return make_state([=] {
      GemmArgs g;
      g.trans_b = Trans::kT;
      g.m = g.n = g.k = n;
      g.lda = g.ldb = g.ldc = n;
      g.a = a->data(), g.a_dtype = dtype_of<T>();
      g.b = b->data(), g.b_dtype = dtype_of<T>();
      g.c = c->data(), g.c_dtype = DType::kF32;
      if (std::is_same_v<T, int8_t>) g.a_scale = as->data(), g.b_scale = bs->data();
      gemm(g);
    });
  };
  return kb;
}

// Decode-shaped GEMM: y[m, n] = x[m, k] @ W[n, k]^T with the weights read from memory
// every call: the case rotates over enough weight copies to exceed the last-level cache.
template <typename T>
KernelBench decode(int64_t m, int64_t n, int64_t k, const char* tag) {
  KernelBench kb;
  kb.name = std::string("gemm_decode_") + tag + "_m" + std::to_string(m) + "_" + std::to_string(n) +
            "x" + std::to_string(k);
  kb.bound = Bound::kMemory;
  kb.bytes = double(n) * k * sizeof(T) + double(m) * k * sizeof(T) + double(m) * n * 4;
  kb.flops = 2.0 * m * n * k;
  kb.setup = [m, n, k] {
    const size_t copies = std::max<size_t>(2, size_t((512ull << 20) / (size_t(n * k) * sizeof(T))));
    auto w = filled<T>(copies * size_t(n * k), 3);
    auto x = filled<T>(size_t(m * k), 4);
    auto y = std::make_shared<AlignedBuffer<float>>(size_t(m * n));
    auto bs = std::make_shared<std::vector<float>>(size_t(n), 0.02f);
    auto as = std::make_shared<std::vector<float>>(size_t(m), 0.01f);
    // int8 weights carry their row sums, as serving's quantised weights do (model/linear.cc):
    // every copy repeats the same random block, so the first copy's sums serve them all.
    auto sums = std::make_shared<std::vector<int32_t>>(size_t(n), 0);
    if constexpr (std::is_same_v<T, int8_t>)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t p = 0; p < k; ++p) (*sums)[size_t(j)] += (*w)[size_t(j * k + p)];
    auto next = std::make_shared<size_t>(0);
    return make_state([=] {
      GemmArgs g;
      g.trans_b = Trans::kT;
      g.m = m, g.n = n, g.k = k;
      g.lda = k, g.ldb = k, g.ldc = n;
      g.a = x->data(), g.a_dtype = dtype_of<T>();
      g.b = w->data() + (*next) * size_t(n * k), g.b_dtype = dtype_of<T>();
      *next = (*next + 1) % copies;
      g.c = y->data();
      if (std::is_same_v<T, int8_t>)
        g.a_scale = as->data(), g.b_scale = bs->data(), g.b_sums = sums->data();
      gemm(g);
    });
  };
  return kb;
}

// A training-shaped GEMM C[m, n] (+)= op(A) @ op(B) in the layout the trainer calls:
// fwd y = x W^T (NT), dx = dy W (NN), dW += dy^T x (TN, beta 1). int8 cases carry the
// row and column scales of the quantised training path (kernels/quantize.h).
template <typename T>
KernelBench train_shape(const char* form, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k,
                        Bound bound, const char* tag) {
  KernelBench kb;
  kb.name = std::string("gemm_train_") + form + "_" + tag + "_" + std::to_string(m) + "x" +
            std::to_string(n) + "x" + std::to_string(k);
  kb.bound = bound;
  kb.flops = 2.0 * double(m) * n * k;
  const float beta = std::string(form).rfind("dw", 0) == 0 ? 1.0f : 0.0f;
  kb.setup = [=] {
    auto a = filled<T>(size_t(m * k), 1), b = filled<T>(size_t(k * n), 2);
    auto c = std::make_shared<AlignedBuffer<float>>(size_t(m * n));
    std::fill(c->data(), c->data() + m * n, 0.0f);
    auto as = std::make_shared<std::vector<float>>(size_t(m), 0.01f);
    auto bs = std::make_shared<std::vector<float>>(size_t(n), 0.02f);
    return make_state([=] {
      GemmArgs g = contiguous_gemm_args(ta, tb, m, n, k, a->data(), dtype_of<T>(), b->data(),
                                        dtype_of<T>(), c->data(), DType::kF32, beta);
      if (std::is_same_v<T, int8_t>) g.a_scale = as->data(), g.b_scale = bs->data();
      gemm(g);
    });
  };
  return kb;
}

// The same GEMM on the AMX int8 kernel (kernels/amx_int8_gemm.h) with its fused
// dequantising epilogue: forward (bf16 out) and dx (f32 out) on a pre-packed weight, and
// dW (f32 out) from the transposed gradient and the packed input.
KernelBench amx_shape(const char* form, int64_t m, int64_t n, int64_t k, DType out) {
  KernelBench kb;
  kb.name = std::string("gemm_train_") + form + "_amx_int8_" + std::to_string(m) + "x" +
            std::to_string(n) + "x" + std::to_string(k);
  kb.bound = Bound::kInt8;
  kb.flops = 2.0 * double(m) * n * k;
  kb.setup = [=]() -> std::unique_ptr<BenchState> {
    if (!amx_int8_available() || !amx_int8_gemm_applies(k))
      return nullptr;  // listed as not run on machines without AMX
    auto a = filled<int8_t>(size_t(m * k), 1), b = filled<int8_t>(size_t(n * k), 2);
    auto packed = std::make_shared<AlignedBuffer<int8_t>>(size_t(amx_packed_b_bytes(k, n)));
    // dW's B is the forward's int8 input [k = tokens, n], packed as stored ([k, n]).
    if (std::string(form) == "dw")
      amx_pack_b_kn(b->data(), k, n, packed->data());
    else
      amx_pack_b_nk(b->data(), n, k, packed->data());
    auto c = std::make_shared<AlignedBuffer<float>>(size_t(m * n));
    auto as = std::make_shared<std::vector<float>>(size_t(m), 0.01f);
    auto bs = std::make_shared<std::vector<float>>(size_t(n), 0.02f);
    return make_state([=] {
      amx_int8_gemm(m, n, k, a->data(), k, packed->data(), as->data(), bs->data(), c->data(), out,
                    n, 0.0f);
    });
  };
  return kb;
}

// The three matmuls of a Linear [out, in] over `rows` tokens, bf16 and int8, plus the
// int8 weight gradient with its left operand stored transposed (NN), the layout the
// quantised backward writes.
void add_train_shapes(std::vector<KernelBench>& v, int64_t rows, int64_t out, int64_t in) {
  v.push_back(train_shape<bf16>("fwd", Trans::kN, Trans::kT, rows, out, in, Bound::kBF16, "bf16"));
  v.push_back(
      train_shape<int8_t>("fwd", Trans::kN, Trans::kT, rows, out, in, Bound::kInt8, "int8"));
  v.push_back(train_shape<bf16>("dx", Trans::kN, Trans::kN, rows, in, out, Bound::kBF16, "bf16"));
  v.push_back(train_shape<int8_t>("dx", Trans::kN, Trans::kN, rows, in, out, Bound::kInt8, "int8"));
  v.push_back(
      train_shape<int8_t>("dxnt", Trans::kN, Trans::kT, rows, in, out, Bound::kInt8, "int8"));
  v.push_back(train_shape<bf16>("dw", Trans::kT, Trans::kN, out, in, rows, Bound::kBF16, "bf16"));
  v.push_back(train_shape<int8_t>("dw", Trans::kT, Trans::kN, out, in, rows, Bound::kInt8, "int8"));
  v.push_back(
      train_shape<int8_t>("dwnn", Trans::kN, Trans::kN, out, in, rows, Bound::kInt8, "int8"));
  v.push_back(
      train_shape<int8_t>("dwnt", Trans::kN, Trans::kT, out, in, rows, Bound::kInt8, "int8"));
  v.push_back(amx_shape("fwd", rows, out, in, DType::kBF16));
  v.push_back(amx_shape("dx", rows, in, out, DType::kF32));
  v.push_back(amx_shape("dw", out, in, rows, DType::kF32));
}

}  // namespace

std::vector<KernelBench> gemm_train_benches() {
  std::vector<KernelBench> v;
  add_train_shapes(v, 4096, 1408, 512);  // llama-25m MLP up/gate (8 x 512 tokens)
  add_train_shapes(v, 4096, 512, 512);   // llama-25m attention q/k/v/o
  add_train_shapes(v, 4096, 2048, 768);  // llama-110m MLP (4 x 1024 tokens)
  return v;
}

std::vector<KernelBench> gemm_benches() {
  return {
      square<float>(2048, Bound::kF32, "f32"),    square<bf16>(2048, Bound::kBF16, "bf16"),
      square<int8_t>(2048, Bound::kInt8, "int8"), decode<bf16>(1, 2048, 2048, "bf16"),
      decode<bf16>(8, 2048, 2048, "bf16"),        decode<bf16>(16, 2048, 2048, "bf16"),
      decode<bf16>(32, 2048, 2048, "bf16"),       decode<bf16>(64, 2048, 2048, "bf16"),
      decode<int8_t>(1, 2048, 2048, "int8"),      decode<int8_t>(16, 2048, 2048, "int8"),
      decode<int8_t>(32, 2048, 2048, "int8"),     decode<int8_t>(64, 2048, 2048, "int8"),
      decode<float>(1, 2048, 2048, "f32"),
  };
}

}  // namespace hyperion::bench
