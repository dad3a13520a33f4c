// Host data staged onto a kernel backend's memory and back, for the tests that run an op
// on every backend (backend_parity_test.cc, backend_diffusion_ops_test.cc): Dev is a copy
// in the backend's memory, tagged with its device; expect_close compares the result with
// a reference element by element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/allocator.h"
#include "kernel_test_util.h"
#include "kernels/backend.h"
#include "tensor/tensor.h"

namespace hyperion::testing_util {

// A copy of host data in a backend's memory, tagged with its device.
class Dev {
 public:
  Dev(KernelBackend& k, const Tensor& t) : Dev(k, t.dtype(), t.shape()) {
    k.upload(t.data(), buf_.data(), t.nbytes());
  }
  // Zero-filled.
  Dev(KernelBackend& k, DType dtype, Shape shape)
      : k_(&k),
        dtype_(dtype),
        shape_(shape),
        buf_(k.allocator(), std::max<size_t>(TensorView(nullptr, dtype, shape).nbytes(), 64)) {
    k.zero(buf_.data(), buf_.bytes());
  }
  template <typename T>
  Dev(KernelBackend& k, const std::vector<T>& v)
      : Dev(k, DTypeOf<T>::value, Shape{static_cast<int64_t>(v.size())}) {
    k.upload(v.data(), buf_.data(), v.size() * sizeof(T));
  }
  TensorView view() const {
    TensorView v(buf_.data(), dtype_, shape_);
    v.device = k_->device();
    return v;
  }
  operator TensorView() const { return view(); }
  void* data() const { return buf_.data(); }
  template <typename T>
  T* as() const {
    return buf_.as<T>();
  }
  Tensor host() const {
    Tensor t(dtype_, shape_);
    k_->download(buf_.data(), t.data(), t.nbytes());
    return t;
  }
  template <typename T>
  std::vector<T> vec() const {
    std::vector<T> v(static_cast<size_t>(shape_.numel()));
    k_->download(buf_.data(), v.data(), v.size() * sizeof(T));
    return v;
  }

 private:
  KernelBackend* k_;
  DType dtype_;
  Shape shape_;
  DeviceBuffer buf_;
};

// |got - want| <= rel * |want| + abs, element by element.
inline void expect_close(const Tensor& got, const Tensor& want, double rel, double abs,
                  const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  for (int64_t i = 0; i < got.numel(); ++i)
    ASSERT_NEAR(at(got, i), at(want, i), rel * std::fabs(at(want, i)) + abs) << what << " " << i;
}
inline void expect_close(const Dev& got, const Tensor& want, double rel, double abs,
                  const std::string& what) {
  expect_close(got.host(), want, rel, abs, what);
}

}  // namespace hyperion::testing_util
