// Tensor views (non-owning) and tensors (owning, 64-byte aligned). Strides are in
// elements. Kernels take views and check shapes and dtypes at their boundary, then work
// on flat contiguous buffers inside.
#pragma once

#include "base/allocator.h"

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "base/aligned.h"
#include "tensor/dtype.h"

namespace hyperion {

inline constexpr int kMaxRank = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  template <typename It>
  Shape(It begin, It end) {
    for (auto it = begin; it != end; ++it) push_back(static_cast<int64_t>(*it));
  }

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  int64_t dim(int i) const;  // negative i counts from the end; checked
  int64_t numel() const;
  void push_back(int64_t d);
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "[2, 3, 4]"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

Shape contiguous_strides(const Shape& shape);

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Shape strides;  // in elements
  Device device = Device::kHost;  // where data lives (base/allocator.h)

  TensorView() = default;
  TensorView(void* d, DType t, Shape s)
      : data(d), dtype(t), shape(s), strides(contiguous_strides(s)) {}
  TensorView(void* d, DType t, Shape s, Shape st) : data(d), dtype(t), shape(s), strides(st) {}

  int rank() const { return shape.rank(); }
  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  std::string str() const;  // "f32[2, 3]"

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Checked typed access: throws naming `op` if the dtype differs.
  template <typename T>
  T* typed(const char* op) const {
    check_dtype(DTypeOf<T>::value, op);
    return static_cast<T*>(data);
  }
  void check_dtype(DType expected, const char* op) const;

  // View of rows [begin, end) along dimension 0.
  TensorView slice0(int64_t begin, int64_t end) const;
  // Same data, new contiguous shape with the same element count.
  TensorView reshape(Shape new_shape) const;
};

// Owning tensor. Moves, never copies implicitly.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);  // uninitialised
  static Tensor zeros(DType dtype, Shape shape);

  Tensor(Tensor&&) = default;
  Tensor& operator=(Tensor&&) = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor clone() const;

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  void* data() const { return view_.data; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(view_.data);
  }
  DType dtype() const { return view_.dtype; }
  const Shape& shape() const { return view_.shape; }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }

 private:
  AlignedBuffer<unsigned char> storage_;
  TensorView view_;
};

// Checks used by kernels: they throw hyperion::Error naming the op and the shapes.
void check_same_shape(const char* op, const TensorView& a, const TensorView& b);
void check_rank(const char* op, const char* name, const TensorView& t, int rank);
void check_contiguous(const char* op, const char* name, const TensorView& t);

}  // namespace hyperion
