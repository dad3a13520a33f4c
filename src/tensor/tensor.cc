#include "tensor/tensor.h"

#include <cstring>

#include "base/error.h"

namespace hyperion {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

void Shape::push_back(int64_t d) {
  HYP_CHECK(rank_ < kMaxRank, "Shape: rank exceeds the maximum of {}", kMaxRank);
  HYP_CHECK(d >= 0, "Shape: negative dimension {} at axis {}", d, rank_);
  dims_[rank_++] = d;
}

int64_t Shape::dim(int i) const {
  int j = i < 0 ? rank_ + i : i;
  HYP_CHECK(j >= 0 && j < rank_, "Shape{}: axis {} out of range", str(), i);
  return dims_[j];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides;
  for (int i = 0; i < shape.rank(); ++i) strides.push_back(0);
  int64_t stride = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

bool TensorView::is_contiguous() const {
  return strides == contiguous_strides(shape);
}

std::string TensorView::str() const {
  return std::string(dtype_name(dtype)) + shape.str();
}

void TensorView::check_dtype(DType expected, const char* op) const {
  HYP_CHECK(dtype == expected, "{}: expected dtype {} but got {}", op, dtype_name(expected), str());
}

TensorView TensorView::slice0(int64_t begin, int64_t end) const {
  HYP_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape[0],
            "slice0: range [{}, {}) out of bounds for {}", begin, end, str());
  TensorView v = *this;
  v.shape[0] = end - begin;
  v.data = static_cast<unsigned char*>(data) + begin * strides[0] * int64_t(dtype_size(dtype));
  return v;
}

TensorView TensorView::reshape(Shape new_shape) const {
  HYP_CHECK(is_contiguous(), "reshape: {} is not contiguous", str());
  HYP_CHECK(new_shape.numel() == numel(), "reshape: cannot view {} as {}", str(), new_shape.str());
  return TensorView(data, dtype, new_shape);
}

Tensor::Tensor(DType dtype, Shape shape)
    : storage_(static_cast<size_t>(shape.numel()) * dtype_size(dtype)),
      view_(storage_.data(), dtype, shape) {}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t(dtype, shape);
  std::memset(t.data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::clone() const {
  Tensor t(dtype(), shape());
  HYP_CHECK(view_.is_contiguous(), "clone: {} is not contiguous", view_.str());
  std::memcpy(t.data(), data(), nbytes());
  return t;
}

void check_same_shape(const char* op, const TensorView& a, const TensorView& b) {
  HYP_CHECK(a.shape == b.shape, "{}: shape mismatch {} vs {}", op, a.str(), b.str());
}

void check_rank(const char* op, const char* name, const TensorView& t, int rank) {
  HYP_CHECK(t.rank() == rank, "{}: {} must have rank {}, got {}", op, name, rank, t.str());
}

void check_contiguous(const char* op, const char* name, const TensorView& t) {
  HYP_CHECK(t.is_contiguous(), "{}: {} {} must be contiguous", op, name, t.str());
}

}  // namespace hyperion
