#include "kernels/conv2d.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "finite_difference.h"
#include "tensor/convert.h"
#include "kernel_test_util.h"

namespace hyperion {
namespace {

using namespace testing_util;

// Odd sizes, strides 1 and 2 (a UNet's downsampler), 1x1 (its shortcut) and padding 0.
const std::vector<Conv2dShape> kShapes = {
    {1, 5, 7, 3, 4, 3, 1, 1},   {2, 8, 8, 16, 32, 3, 1, 1}, {2, 9, 6, 5, 7, 3, 2, 1},
    {1, 8, 8, 32, 16, 1, 1, 0}, {3, 4, 5, 6, 2, 3, 1, 0},   {1, 3, 3, 1, 1, 3, 1, 1},
    {2, 16, 16, 64, 64, 3, 1, 1}};

double max_rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 1e-6, err = 0.0;
  for (float w : want) scale = std::max(scale, double(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, double(std::fabs(got[i] - want[i])));
  return err / scale;
}

TEST(Conv2d, ForwardMatchesReference) {
  std::mt19937 rng(1);
  for (const Conv2dShape& s : kShapes) {
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(testing::Message() << s.batch << "x" << s.height << "x" << s.width << "x"
                                      << s.in_channels << "->" << s.out_channels << " k" << s.kernel
                                      << " s" << s.stride << " p" << s.padding << " bias " << with_bias);
      const auto x = randn(size_t(s.x_numel()), rng), w = randn(size_t(s.w_numel()), rng, 0.2f);
      const auto b = randn(size_t(s.out_channels), rng);
      std::vector<float> y(size_t(s.y_numel())), y_ref(y.size());
      conv2d_forward(s, x.data(), w.data(), with_bias ? b.data() : nullptr, y.data());
      ref::conv2d_forward(s, x.data(), w.data(), with_bias ? b.data() : nullptr, y_ref.data());
      EXPECT_LT(max_rel_error(y, y_ref), 2e-6);
    }
  }
}

TEST(Conv2d, BackwardMatchesReferenceAndAccumulates) {
  std::mt19937 rng(2);
  for (const Conv2dShape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << s.batch << "x" << s.height << "x" << s.width << "x"
                                    << s.in_channels << "->" << s.out_channels << " k" << s.kernel
                                    << " s" << s.stride);
    const auto x = randn(size_t(s.x_numel()), rng), w = randn(size_t(s.w_numel()), rng, 0.2f);
    const auto dy = randn(size_t(s.y_numel()), rng);
    // The weight and bias gradients start non-zero: the kernel must add to them.
    const auto dw0 = randn(w.size(), rng), db0 = randn(size_t(s.out_channels), rng);
    std::vector<float> dx(x.size()), dx_ref(x.size()), dw = dw0, dw_ref = dw0, db = db0, db_ref = db0;
    conv2d_backward(s, dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data());
    ref::conv2d_backward(s, dy.data(), x.data(), w.data(), dx_ref.data(), dw_ref.data(),
                         db_ref.data());
    EXPECT_LT(max_rel_error(dx, dx_ref), 2e-6);
    EXPECT_LT(max_rel_error(dw, dw_ref), 2e-6);
    EXPECT_LT(max_rel_error(db, db_ref), 2e-6);
    // Each output is optional.
    std::vector<float> dw_only = dw0;
    conv2d_backward(s, dy.data(), x.data(), w.data(), nullptr, dw_only.data(), nullptr);
    EXPECT_LT(max_rel_error(dw_only, dw_ref), 2e-6);
  }
}

TEST(Conv2d, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(3);
  for (const Conv2dShape& s : {Conv2dShape{1, 5, 6, 3, 4, 3, 2, 1}, Conv2dShape{2, 4, 4, 2, 3, 3, 1, 1}}) {
    const auto x = randn(size_t(s.x_numel()), rng), w = randn(size_t(s.w_numel()), rng, 0.5f);
    const auto b = randn(size_t(s.out_channels), rng), dy = randn(size_t(s.y_numel()), rng);
    std::vector<float> dx(x.size()), dw(w.size(), 0.0f), db(b.size(), 0.0f);
    ref::conv2d_backward(s, dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data());
    auto wrt_x = [&](const std::vector<float>& v, std::vector<float>& y) {
      ref::conv2d_forward(s, v.data(), w.data(), b.data(), y.data());
    };
    auto wrt_w = [&](const std::vector<float>& v, std::vector<float>& y) {
      ref::conv2d_forward(s, x.data(), v.data(), b.data(), y.data());
    };
    auto wrt_b = [&](const std::vector<float>& v, std::vector<float>& y) {
      ref::conv2d_forward(s, x.data(), w.data(), v.data(), y.data());
    };
    const auto cx = sample_coords(x.size(), 12, rng);
    const auto fdx = finite_difference(wrt_x, x, dy, cx);
    for (size_t i = 0; i < cx.size(); ++i)
      EXPECT_NEAR(dx[cx[i]], fdx[i], 2e-3 * std::max(1.0, std::fabs(fdx[i]))) << "dx " << cx[i];
    const auto cw = sample_coords(w.size(), 12, rng);
    const auto fdw = finite_difference(wrt_w, w, dy, cw);
    for (size_t i = 0; i < cw.size(); ++i)
      EXPECT_NEAR(dw[cw[i]], fdw[i], 2e-3 * std::max(1.0, std::fabs(fdw[i]))) << "dw " << cw[i];
    const auto cb = sample_coords(b.size(), 4, rng);
    const auto fdb = finite_difference(wrt_b, b, dy, cb);
    for (size_t i = 0; i < cb.size(); ++i)
      EXPECT_NEAR(db[cb[i]], fdb[i], 2e-3 * std::max(1.0, std::fabs(fdb[i]))) << "db " << cb[i];
  }
}

// Mixed precision: bf16 activations and output gradients, f32 weights rounded to bf16 by
// the kernel, f32 accumulation. Against the reference on the same rounded values, the
// only differences left are f32 summation order (the reference sums in double).
std::vector<float> rounded(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_to_f32(f32_to_bf16(v[i]));
  return r;
}

std::vector<bf16> as_bf16(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = f32_to_bf16(v[i]);
  return r;
}

TEST(Conv2d, Bf16ForwardMatchesReferenceOnRoundedInputs) {
  std::mt19937 rng(4);
  for (const Conv2dShape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << s.batch << "x" << s.height << "x" << s.width << "x" << s.in_channels << "->"
                                    << s.out_channels << " k" << s.kernel << " s" << s.stride);
    const auto x = randn(size_t(s.x_numel()), rng), w = randn(size_t(s.w_numel()), rng, 0.2f);
    const auto b = randn(size_t(s.out_channels), rng);
    std::vector<float> y(size_t(s.y_numel())), y_emulated(y.size()), y_ref(y.size()), y_f32(y.size());
    conv2d_forward_bf16(s, as_bf16(x).data(), w.data(), b.data(), y.data());
    conv2d_forward_bf16_emulated(s, as_bf16(x).data(), w.data(), b.data(), y_emulated.data());
    ref::conv2d_forward(s, rounded(x).data(), rounded(w).data(), b.data(), y_ref.data());
    EXPECT_LT(max_rel_error(y, y_ref), 2e-6);
    EXPECT_LT(max_rel_error(y_emulated, y_ref), 2e-6);
    // And within bf16's rounding of the unrounded f32 result.
    ref::conv2d_forward(s, x.data(), w.data(), b.data(), y_f32.data());
    EXPECT_LT(max_rel_error(y, y_f32), 2e-2);
  }
}

TEST(Conv2d, Bf16BackwardMatchesReferenceOnRoundedInputsAndAccumulates) {
  std::mt19937 rng(5);
  for (const Conv2dShape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << s.batch << "x" << s.height << "x" << s.width << "x" << s.in_channels << "->"
                                    << s.out_channels << " k" << s.kernel << " s" << s.stride);
    const auto x = randn(size_t(s.x_numel()), rng), w = randn(size_t(s.w_numel()), rng, 0.2f);
    const auto dy = randn(size_t(s.y_numel()), rng);
    const auto dw0 = randn(w.size(), rng), db0 = randn(size_t(s.out_channels), rng);
    std::vector<float> dx(x.size()), dx_ref(x.size()), dw = dw0, dw_ref = dw0, db = db0, db_ref = db0;
    conv2d_backward_bf16(s, as_bf16(dy).data(), as_bf16(x).data(), w.data(), dx.data(), dw.data(), db.data());
    ref::conv2d_backward(s, rounded(dy).data(), rounded(x).data(), rounded(w).data(), dx_ref.data(), dw_ref.data(),
                         db_ref.data());
    EXPECT_LT(max_rel_error(dx, dx_ref), 2e-6);
    EXPECT_LT(max_rel_error(dw, dw_ref), 2e-6);
    EXPECT_LT(max_rel_error(db, db_ref), 2e-6);
    std::vector<float> dx_e(x.size()), dw_e = dw0, db_e = db0;
    conv2d_backward_bf16_emulated(s, as_bf16(dy).data(), as_bf16(x).data(), w.data(), dx_e.data(), dw_e.data(),
                                  db_e.data());
    EXPECT_LT(max_rel_error(dx_e, dx_ref), 2e-6);
    EXPECT_LT(max_rel_error(dw_e, dw_ref), 2e-6);
    EXPECT_LT(max_rel_error(db_e, db_ref), 2e-6);
  }
}

TEST(Conv2d, RefusesBadShapesByName) {
  std::vector<float> buf(64);
  EXPECT_NE(error_message([&] {
              conv2d_forward({1, 2, 2, 1, 1, 5, 1, 0}, buf.data(), buf.data(), nullptr, buf.data());
            }).find("kernel 5 is larger than the padded input 2x2"),
            std::string::npos);
  EXPECT_NE(error_message([&] {
              conv2d_forward({1, 2, 2, 0, 1, 1, 1, 0}, buf.data(), buf.data(), nullptr, buf.data());
            }).find("channels 0 -> 1 must be positive"),
            std::string::npos);
}

}  // namespace
}  // namespace hyperion
