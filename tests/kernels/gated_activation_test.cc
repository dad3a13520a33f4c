#include "kernels/gated_activation.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "kernel_test_util.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

Tensor from_values(DType dtype, Shape shape, const std::vector<float>& v) {
  Tensor t(dtype, shape);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kF32)
      t.as<float>()[i] = v[i];
    else
      t.as<bf16>()[i] = f32_to_bf16(v[i]);
  }
  return t;
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 1},   {3, 7},  {2, 17},  {4, 63},
                                                          {1, 100}, {5, 33}, {3, 1000}};

// f32: within a few ulp of the f64 reference, relative to the size of the terms (dg has
// cancellation in 1 + g*(1 - s) near g = -1.28). bf16: one rounding of that, so within
// one bf16 ulp (relative 2^-8).
double tolerance(DType dtype, double ref, double scale) {
  return (dtype == DType::kF32 ? 1e-5 * std::fabs(ref) : std::fabs(ref) / 128) + 1e-6 * scale +
         1e-7;
}

using RefForward = void (*)(const TensorView&, const TensorView&, const TensorView&);
using RefBackward = void (*)(const TensorView&, const TensorView&, const TensorView&,
                             const TensorView&, const TensorView&);

TEST(GatedActivation, ForwardAndBackwardMatchReference) {
  std::mt19937 rng(21);
  for_each_target([&] {
    for (GatedActivation act : {GatedActivation::kSilu, GatedActivation::kGeluTanh}) {
      const bool gelu = act == GatedActivation::kGeluTanh;
      const RefForward ref_fwd = gelu ? &ref::geglu_forward : &ref::swiglu_forward;
      const RefBackward ref_bwd = gelu ? &ref::geglu_backward : &ref::swiglu_backward;
      for (DType dt : {DType::kF32, DType::kBF16}) {
        for (auto [n, f] : kShapes) {
          SCOPED_TRACE(testing::Message() << gated_activation_name(act) << " " << dtype_name(dt)
                                          << " N=" << n << " F=" << f);
          Tensor g = random_tensor(dt, {n, f}, rng, 3.0f);
          Tensor u = random_tensor(dt, {n, f}, rng);
          Tensor dh = random_tensor(dt, {n, f}, rng);
          Tensor h(dt, {n, f}), h_ref(dt, {n, f});
          gated_forward(act, g, u, h);
          ref_fwd(g, u, h_ref);
          for (int64_t i = 0; i < n * f; ++i) {
            const double scale = std::fabs(at(g, i) * at(u, i));
            ASSERT_NEAR(at(h, i), at(h_ref, i), tolerance(dt, at(h_ref, i), scale)) << i;
          }
          Tensor dg(dt, {n, f}), du(dt, {n, f}), dg_ref(dt, {n, f}), du_ref(dt, {n, f});
          gated_backward(act, dh, g, u, dg, du);
          ref_bwd(dh, g, u, dg_ref, du_ref);
          for (int64_t i = 0; i < n * f; ++i) {
            // GELU's slope has a g^3 term inside the sigmoid: errors scale with g^2 too.
            const double gg = std::fabs(at(g, i));
            const double scale = std::fabs(at(dh, i)) * (std::fabs(at(u, i)) + 1) * (1 + gg) *
                                 (gelu ? 1 + gg * gg : 1.0);
            ASSERT_NEAR(at(dg, i), at(dg_ref, i), tolerance(dt, at(dg_ref, i), scale)) << i;
            ASSERT_NEAR(at(du, i), at(du_ref, i), tolerance(dt, at(du_ref, i), scale)) << i;
          }
        }
      }
    }
  });
}

// The named entry points are the by-kind ones, bit for bit.
TEST(GatedActivation, NamedKernelsAreTheDispatchedOnes) {
  std::mt19937 rng(24);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor g = random_tensor(dt, {5, 77}, rng, 3.0f), u = random_tensor(dt, {5, 77}, rng);
    Tensor a(dt, g.shape()), b(dt, g.shape());
    geglu_forward(g, u, a);
    gated_forward(GatedActivation::kGeluTanh, g, u, b);
    EXPECT_TRUE(bitwise_equal(a, b));
    swiglu_forward(g, u, a);
    gated_forward(GatedActivation::kSilu, g, u, b);
    EXPECT_TRUE(bitwise_equal(a, b));
  }
  GatedActivation act{};
  EXPECT_TRUE(parse_gated_activation("gelu_pytorch_tanh", &act));
  EXPECT_EQ(act, GatedActivation::kGeluTanh);
  EXPECT_TRUE(parse_gated_activation("silu", &act));
  EXPECT_EQ(act, GatedActivation::kSilu);
  EXPECT_FALSE(parse_gated_activation("relu", &act));
  EXPECT_FALSE(parse_gated_activation("gelu", &act));  // the exact erf form: not this kernel
}

TEST(GeGLU, LargeInputsSaturateWithoutNaN) {
  const std::vector<float> gv = {-1e4f, -200, -20, -5, -1e-30f, 0, 1e-30f, 5, 20, 200, 1e4f};
  const int64_t n = static_cast<int64_t>(gv.size());
  for_each_target([&] {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      Tensor g = from_values(dt, {n}, gv);
      Tensor ones = from_values(dt, {n}, std::vector<float>(gv.size(), 1.0f));
      Tensor h(dt, {n}), dg(dt, {n}), du(dt, {n});
      geglu_forward(g, ones, h);
      geglu_backward(ones, g, ones, dg, du);
      for (int64_t i = 0; i < n; ++i) {
        const double x = at(g, i);
        const double gelu = 0.5 * x * (1 + std::tanh(0.7978845608 * (x + 0.044715 * x * x * x)));
        ASSERT_TRUE(std::isfinite(at(h, i)) && std::isfinite(at(dg, i))) << x;
        EXPECT_NEAR(at(h, i), gelu, 1e-2 * std::fabs(gelu) + 1e-30) << x;
        // d/dx gelu_tanh(x) in double; saturates to 1 (x >> 0) and 0 (x << 0).
        const double c = 0.7978845608028654, th = std::tanh(c * (x + 0.044715 * x * x * x));
        const double slope =
            0.5 * (1 + th) + 0.5 * x * (1 - th * th) * c * (1 + 3 * 0.044715 * x * x);
        EXPECT_NEAR(at(dg, i), slope, 1e-2) << x;
      }
    }
  });
}

TEST(SwiGLU, LargeInputsSaturateWithoutNaN) {
  const std::vector<float> gv = {-200, -104, -100, -88,  -20, -1e-30f, 0,  1e-30f, 20,
                                 88,   100,  200,  -150, 150, -90,     90, 3};
  const int64_t n = static_cast<int64_t>(gv.size());
  for_each_target([&] {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      Tensor g = from_values(dt, {n}, gv);
      Tensor ones = from_values(dt, {n}, std::vector<float>(gv.size(), 1.0f));
      Tensor h(dt, {n}), dg(dt, {n}), du(dt, {n});
      swiglu_forward(g, ones, h);
      swiglu_backward(ones, g, ones, dg, du);
      for (int64_t i = 0; i < n; ++i) {
        const double x = at(g, i);
        const double s = 1.0 / (1.0 + std::exp(-x));
        ASSERT_TRUE(std::isfinite(at(h, i)) && std::isfinite(at(dg, i))) << x;
        EXPECT_NEAR(at(h, i), x * s, 1e-2 * std::fabs(x * s) + 1e-30) << x;
        EXPECT_NEAR(at(dg, i), s * (1 + x * (1 - s)), 1e-2) << x;
        EXPECT_NEAR(at(du, i), x * s, 1e-2 * std::fabs(x * s) + 1e-30) << x;
      }
    }
  });
}

// The backward of either activation against central differences of the f64 loss
// L = sum(act(g) * u * r), act written independently of the kernel (tanh for GELU, as
// PyTorch writes it); each element depends only on its own g and u.
TEST(GatedActivation, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(22);
  const int64_t n = 3, f = 37;
  for (GatedActivation act : {GatedActivation::kSilu, GatedActivation::kGeluTanh}) {
    SCOPED_TRACE(gated_activation_name(act));
    const bool gelu = act == GatedActivation::kGeluTanh;
    Tensor g = random_tensor(DType::kF32, {n, f}, rng, gelu ? 3.0f : 2.0f);
    Tensor u = random_tensor(DType::kF32, {n, f}, rng);
    Tensor r = random_tensor(DType::kF32, {n, f}, rng);
    Tensor dg(DType::kF32, {n, f}), du(DType::kF32, {n, f});
    gated_backward(act, r, g, u, dg, du);
    auto term = [gelu](double gi, double ui, double ri) {
      const double a =
          gelu ? 0.5 * gi * (1 + std::tanh(std::sqrt(2 / M_PI) * (gi + 0.044715 * gi * gi * gi)))
               : gi / (1 + std::exp(-gi));
      return a * ui * ri;
    };
    const double step = 1e-6;
    for (int64_t i = 0; i < n * f; ++i) {
      const double gi = at(g, i), ui = at(u, i), ri = at(r, i);
      const double fd_g = (term(gi + step, ui, ri) - term(gi - step, ui, ri)) / (2 * step);
      const double fd_u = (term(gi, ui + step, ri) - term(gi, ui - step, ri)) / (2 * step);
      EXPECT_NEAR(at(dg, i), fd_g, 1e-5 * (1 + std::fabs(fd_g))) << i;
      EXPECT_NEAR(at(du, i), fd_u, 1e-5 * (1 + std::fabs(fd_u))) << i;
    }
  }
}

TEST(SwiGLU, OutputsMayAliasInputs) {
  std::mt19937 rng(23);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor g = random_tensor(dt, {7, 41}, rng, 2.0f);
    Tensor u = random_tensor(dt, {7, 41}, rng);
    Tensor dh = random_tensor(dt, {7, 41}, rng);
    Tensor h(dt, g.shape()), dg(dt, g.shape()), du(dt, g.shape());
    swiglu_forward(g, u, h);
    swiglu_backward(dh, g, u, dg, du);
    Tensor g2 = g.clone(), u2 = u.clone();
    swiglu_backward(dh, g2, u2, g2, u2);  // gradients overwrite the saved activations
    EXPECT_TRUE(bitwise_equal(g2, dg));
    EXPECT_TRUE(bitwise_equal(u2, du));
    Tensor g3 = g.clone(), u3 = u.clone();
    swiglu_backward(dh, g3, u3, u3, g3);  // crossed
    EXPECT_TRUE(bitwise_equal(u3, dg));
    EXPECT_TRUE(bitwise_equal(g3, du));
    swiglu_forward(g, u, g);
    EXPECT_TRUE(bitwise_equal(g, h));
  }
}

TEST(SwiGLU, ErrorsNameTheOpAndShapes) {
  Tensor g = Tensor::zeros(DType::kF32, {4, 8});
  Tensor u_bad = Tensor::zeros(DType::kF32, {4, 9});
  Tensor u_bf16 = Tensor::zeros(DType::kBF16, {4, 8});
  Tensor h = Tensor::zeros(DType::kF32, {4, 8});
  Tensor g_i32 = Tensor::zeros(DType::kI32, {4, 8});
  expect_error([&] { swiglu_forward(g, u_bad, h); }, {"swiglu_forward", "f32[4, 9]", "f32[4, 8]"});
  expect_error([&] { swiglu_forward(g, u_bf16, h); }, {"swiglu_forward", "bf16[4, 8]"});
  expect_error([&] { swiglu_forward(g_i32, g_i32, g_i32); }, {"swiglu_forward", "int32"});
  expect_error([&] { swiglu_backward(u_bad, g, h, h, h); }, {"swiglu_backward", "f32[4, 9]"});
  expect_error([&] { swiglu_backward(h, g, h, u_bf16, h); }, {"swiglu_backward", "dg"});
  Tensor strided(DType::kF32, {4, 8});
  TensorView view(strided.data(), DType::kF32, {4, 4}, {8, 1});
  expect_error([&] { swiglu_forward(view, view, view); }, {"swiglu_forward", "contiguous"});
  EXPECT_THROW(ref::swiglu_forward(g, u_bad, h), Error);
}

}  // namespace
}  // namespace hyperion
