#include "tensor/tensor.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/error.h"

namespace hyperion {
namespace {

// Runs fn, expects a hyperion::Error and returns its message.
template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected hyperion::Error";
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Shape, BasicsAndNumel) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s[1], 3);
  EXPECT_EQ(s.dim(0), 2);
  EXPECT_EQ(s.dim(-1), 4);
  EXPECT_EQ(s.dim(-3), 2);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(Shape{}.numel(), 1);  // a scalar has one element
  EXPECT_EQ(Shape{}.str(), "[]");
  EXPECT_EQ((Shape{5, 0, 3}).numel(), 0);
  EXPECT_EQ((Shape{7}).str(), "[7]");

  std::vector<int> dims{4, 5};
  Shape from_range(dims.begin(), dims.end());
  EXPECT_EQ(from_range, (Shape{4, 5}));
  EXPECT_NE(from_range, (Shape{4, 5, 1}));
  EXPECT_NE(from_range, (Shape{5, 4}));
  int64_t sum = 0;
  for (int64_t d : from_range) sum += d;
  EXPECT_EQ(sum, 9);
}

TEST(Shape, Errors) {
  Shape s{2, 3};
  std::string msg = error_message([&] { s.dim(2); });
  EXPECT_TRUE(contains(msg, "[2, 3]")) << msg;
  EXPECT_TRUE(contains(msg, "2")) << msg;
  EXPECT_THROW(s.dim(-3), Error);
  EXPECT_THROW((Shape{3, -1}), Error);

  Shape max_rank{1, 2, 3, 4, 5, 6};
  EXPECT_EQ(max_rank.rank(), kMaxRank);
  EXPECT_EQ(max_rank.numel(), 720);
  msg = error_message([] { Shape too_big{1, 2, 3, 4, 5, 6, 7}; });
  EXPECT_TRUE(contains(msg, "rank")) << msg;
  EXPECT_TRUE(contains(msg, std::to_string(kMaxRank))) << msg;
  EXPECT_THROW(max_rank.push_back(1), Error);
  std::vector<int64_t> seven(7, 1);
  EXPECT_THROW(Shape(seven.begin(), seven.end()), Error);
}

TEST(Shape, ContiguousStrides) {
  EXPECT_EQ(contiguous_strides(Shape{2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(contiguous_strides(Shape{5}), (Shape{1}));
  EXPECT_EQ(contiguous_strides(Shape{}), Shape{});
  EXPECT_EQ(contiguous_strides(Shape{3, 0, 2}), (Shape{0, 2, 1}));
}

TEST(TensorView, ContiguityAndStr) {
  float buf[24];
  TensorView v(buf, DType::kF32, Shape{2, 3, 4});
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.strides, (Shape{12, 4, 1}));
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.nbytes(), 96u);
  EXPECT_EQ(v.rank(), 3);
  EXPECT_EQ(v.str(), "f32[2, 3, 4]");
  EXPECT_EQ(TensorView(buf, DType::kBF16, Shape{2, 3}).nbytes(), 12u);
  EXPECT_EQ(TensorView(buf, DType::kE4M3, Shape{5}).str(), "fp8_e4m3[5]");
  // A transposed view of a 3x4 matrix.
  TensorView t(buf, DType::kF32, Shape{4, 3}, Shape{1, 4});
  EXPECT_FALSE(t.is_contiguous());
}

TEST(TensorView, Slice0) {
  std::vector<int32_t> buf(24);
  for (int i = 0; i < 24; ++i) buf[i] = i;
  TensorView v(buf.data(), DType::kI32, Shape{4, 6});
  TensorView s = v.slice0(1, 3);
  EXPECT_EQ(s.shape, (Shape{2, 6}));
  EXPECT_EQ(s.strides, v.strides);
  EXPECT_EQ(s.as<int32_t>(), buf.data() + 6);
  EXPECT_EQ(s.as<int32_t>()[0], 6);
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(v.slice0(4, 4).numel(), 0);  // empty slice at the end is fine
  EXPECT_EQ(v.slice0(0, 4).data, v.data);

  // Pointer arithmetic is in bytes of the dtype and follows the dim-0 stride.
  std::vector<uint16_t> h(40);
  TensorView hv(h.data(), DType::kBF16, Shape{5, 8});
  EXPECT_EQ(hv.slice0(3, 5).data, static_cast<void*>(h.data() + 24));
  TensorView strided(h.data(), DType::kF16, Shape{4, 3}, Shape{1, 4});  // transposed 3x4
  TensorView ss = strided.slice0(2, 4);
  EXPECT_EQ(ss.data, static_cast<void*>(h.data() + 2));
  EXPECT_EQ(ss.strides, (Shape{1, 4}));

  for (auto [b, e] : {std::pair{-1, 2}, std::pair{3, 2}, std::pair{0, 5}, std::pair{5, 5}}) {
    std::string msg = error_message([&, b = b, e = e] { v.slice0(b, e); });
    EXPECT_TRUE(contains(msg, "slice0")) << msg;
    EXPECT_TRUE(contains(msg, "int32[4, 6]")) << msg;
  }
  float scalar = 1.0f;
  EXPECT_THROW(TensorView(&scalar, DType::kF32, Shape{}).slice0(0, 0), Error);
}

TEST(TensorView, Reshape) {
  float buf[24];
  TensorView v(buf, DType::kF32, Shape{2, 3, 4});
  TensorView r = v.reshape(Shape{6, 4});
  EXPECT_EQ(r.data, v.data);
  EXPECT_EQ(r.shape, (Shape{6, 4}));
  EXPECT_EQ(r.strides, (Shape{4, 1}));
  EXPECT_EQ(r.dtype, DType::kF32);
  EXPECT_EQ(v.reshape(Shape{24}).rank(), 1);

  std::string msg = error_message([&] { v.reshape(Shape{5, 5}); });
  EXPECT_TRUE(contains(msg, "reshape")) << msg;
  EXPECT_TRUE(contains(msg, "f32[2, 3, 4]")) << msg;
  EXPECT_TRUE(contains(msg, "[5, 5]")) << msg;

  TensorView t(buf, DType::kF32, Shape{4, 3}, Shape{1, 4});
  msg = error_message([&] { t.reshape(Shape{12}); });
  EXPECT_TRUE(contains(msg, "reshape")) << msg;
  EXPECT_TRUE(contains(msg, "not contiguous")) << msg;
  EXPECT_TRUE(contains(msg, "f32[4, 3]")) << msg;
}

TEST(TensorView, TypedChecksDType) {
  float buf[6] = {};
  TensorView v(buf, DType::kF32, Shape{2, 3});
  EXPECT_EQ(v.typed<float>("my_op"), buf);
  std::string msg = error_message([&] { v.typed<bf16>("my_op"); });
  EXPECT_TRUE(contains(msg, "my_op")) << msg;
  EXPECT_TRUE(contains(msg, "bf16")) << msg;
  EXPECT_TRUE(contains(msg, "f32[2, 3]")) << msg;
  EXPECT_THROW(v.typed<int32_t>("op"), Error);
  EXPECT_THROW(v.check_dtype(DType::kI8, "op"), Error);
  EXPECT_NO_THROW(v.check_dtype(DType::kF32, "op"));
}

TEST(TensorView, KernelBoundaryChecks) {
  float buf[12];
  TensorView a(buf, DType::kF32, Shape{3, 4}), b(buf, DType::kF32, Shape{4, 3});
  EXPECT_NO_THROW(check_same_shape("add", a, a));
  std::string msg = error_message([&] { check_same_shape("add", a, b); });
  EXPECT_TRUE(contains(msg, "add")) << msg;
  EXPECT_TRUE(contains(msg, "f32[3, 4]")) << msg;
  EXPECT_TRUE(contains(msg, "f32[4, 3]")) << msg;

  EXPECT_NO_THROW(check_rank("matmul", "x", a, 2));
  msg = error_message([&] { check_rank("matmul", "x", a, 3); });
  EXPECT_TRUE(contains(msg, "matmul")) << msg;
  EXPECT_TRUE(contains(msg, "x")) << msg;
  EXPECT_TRUE(contains(msg, "f32[3, 4]")) << msg;

  EXPECT_NO_THROW(check_contiguous("softmax", "x", a));
  TensorView t(buf, DType::kF32, Shape{4, 3}, Shape{1, 4});
  msg = error_message([&] { check_contiguous("softmax", "logits", t); });
  EXPECT_TRUE(contains(msg, "softmax")) << msg;
  EXPECT_TRUE(contains(msg, "logits")) << msg;
}

TEST(Tensor, ZerosAndAlignment) {
  for (DType d : kAllDTypes) {
    Tensor t = Tensor::zeros(d, Shape{3, 5, 7});
    EXPECT_EQ(t.dtype(), d);
    EXPECT_EQ(t.shape(), (Shape{3, 5, 7}));
    EXPECT_EQ(t.numel(), 105);
    EXPECT_EQ(t.nbytes(), 105 * dtype_size(d));
    EXPECT_TRUE(is_aligned(t.data()));
    EXPECT_TRUE(t.view().is_contiguous());
    const unsigned char* p = t.as<unsigned char>();
    for (size_t i = 0; i < t.nbytes(); ++i) ASSERT_EQ(p[i], 0) << dtype_name(d) << " byte " << i;
  }
  Tensor empty = Tensor::zeros(DType::kF32, Shape{0, 4});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.nbytes(), 0u);
  Tensor scalar(DType::kI32, Shape{});
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_NE(scalar.data(), nullptr);
}

TEST(Tensor, CloneIsADeepCopyAndMovesTransferOwnership) {
  Tensor t(DType::kF32, Shape{4, 3});
  for (int i = 0; i < 12; ++i) t.as<float>()[i] = float(i) * 0.5f;
  Tensor c = t.clone();
  EXPECT_NE(c.data(), t.data());
  EXPECT_EQ(c.shape(), t.shape());
  EXPECT_EQ(c.dtype(), DType::kF32);
  EXPECT_EQ(std::memcmp(c.data(), t.data(), t.nbytes()), 0);
  t.as<float>()[0] = 100.0f;
  EXPECT_EQ(c.as<float>()[0], 0.0f);

  void* p = c.data();
  Tensor moved = std::move(c);
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(moved.as<float>()[5], 2.5f);
  // A Tensor converts to its view for kernel calls.
  const TensorView& v = moved;
  EXPECT_EQ(v.data, p);
  EXPECT_EQ(v.str(), "f32[4, 3]");

  Tensor empty = Tensor::zeros(DType::kBF16, Shape{0});
  Tensor empty_clone = empty.clone();
  EXPECT_EQ(empty_clone.numel(), 0);
  static_assert(!std::is_copy_constructible_v<Tensor>);
}

}  // namespace
}  // namespace hyperion
