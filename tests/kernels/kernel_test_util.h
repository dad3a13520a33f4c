// Helpers shared by the kernel tests: deterministic random tensors, element access,
// bitwise comparison, running a check under every Highway target, error-message checks
// and thread-count restoration. Header-only; test files pull it in with
// `using namespace testing_util;` inside their anonymous namespace.
#pragma once

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "base/threads.h"
#include "tensor/convert.h"
#include "tensor/tensor.h"

namespace hyperion::testing_util {

// A tensor of normal(mean, stddev) samples drawn in element order from rng (bf16 tensors
// hold the f32 sample rounded once).
inline Tensor random_normal_tensor(DType dtype, Shape shape, std::mt19937& rng, float mean,
                                   float stddev) {
  Tensor t(dtype, shape);
  std::normal_distribution<float> dist(mean, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kF32)
      t.as<float>()[i] = dist(rng);
    else
      t.as<bf16>()[i] = f32_to_bf16(dist(rng));
  }
  return t;
}

// Zero-mean normal samples with the given standard deviation.
inline Tensor random_tensor(DType dtype, Shape shape, std::mt19937& rng, float stddev = 1.0f) {
  return random_normal_tensor(dtype, shape, rng, 0.0f, stddev);
}

// n zero-mean normal f32 samples.
inline std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A tensor of `dtype` holding the f32 values v (converted with convert_any).
inline Tensor make_tensor(DType dtype, Shape shape, const std::vector<float>& v) {
  Tensor t(dtype, shape);
  convert_any(v.data(), DType::kF32, t.data(), dtype, v.size());
  return t;
}

// A 1-D i32 tensor holding v (token ids, targets).
inline Tensor make_i32(const std::vector<int32_t>& v) {
  Tensor out(DType::kI32, {int64_t(v.size())});
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(int32_t));
  return out;
}

// All elements of t as f32.
inline std::vector<float> values(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = load_as_f32(t.data, t.dtype, i);
  return out;
}

// Element i of a contiguous tensor, widened to double.
inline double at(const Tensor& t, int64_t i) {
  return load_as_f32(t.data(), t.dtype(), static_cast<size_t>(i));
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Runs fn once per SIMD target compiled in and supported here (AVX-512, AVX2, SSE4, ...,
// the emulated 128-bit fallback), so every dispatch path is checked on this machine.
template <typename Fn>
void for_each_target(Fn&& fn) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  for (int64_t target : targets) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The message of the hyperion::Error fn throws, or "" if it throws none.
inline std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Restores the thread count on scope exit, so determinism tests that switch between
// 1 and 2 threads leave the process as they found it even when an assertion returns early.
class RestoreNumThreads {
 public:
  RestoreNumThreads() : saved_(num_threads()) {}
  ~RestoreNumThreads() { set_num_threads(saved_); }
  RestoreNumThreads(const RestoreNumThreads&) = delete;
  RestoreNumThreads& operator=(const RestoreNumThreads&) = delete;

 private:
  int saved_;
};

}  // namespace hyperion::testing_util
