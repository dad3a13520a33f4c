// The diffusion layers' ops (kernels/backend.h: conv2d, group and layer norm, nearest
// upsampling, timestep embedding, activations, GEGLU, non-causal attention with Tq !=
// Tk, and the strided copy that concatenates channels) on every backend this process has: the host, the simulated device where no
// GPU is usable (device discipline: the ops touch only device memory), and the CUDA
// backend where one is. Each result is checked against the scalar ref:: kernels on odd
// shapes. The weight gradients must accumulate onto what the buffers held. f32 math
// everywhere: 1e-4 of the largest value (bf16 convolutions: the reference runs on the
// bf16-rounded operands, so only the summation order differs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "device_staging.h"
#include "kernel_test_util.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/conv2d.h"
#include "kernels/group_norm.h"
#include "kernels/layer_norm.h"
#include "kernels/timestep_embedding.h"
#include "kernels/upsample.h"
#include "simulated_device.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

std::vector<KernelBackend*> backends() {
  simulated_device();  // registers itself where no GPU holds the device
  return built_backends();
}

class DiffusionOps : public testing::TestWithParam<KernelBackend*> {
 protected:
  KernelBackend& k() { return *GetParam(); }
  Dev dev(const std::vector<float>& v, Shape s) { return Dev(k(), make_tensor(DType::kF32, s, v)); }
  Dev dev_bf16(const std::vector<float>& v, Shape s) {
    return Dev(k(), make_tensor(DType::kBF16, s, v));
  }
  Dev zeros(Shape s) { return Dev(k(), DType::kF32, s); }
  static TensorView none() { return TensorView(); }
};

// |got - want| <= tol * max|want| (the largest at least 0.01), element by element.
void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-2;  // a floor: a gradient that is 0 in exact arithmetic is rounding noise here
  for (float w : want) scale = std::max(scale, double(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * scale) << what << " at " << i;
}

std::vector<float> rounded_to_bf16(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

TEST_P(DiffusionOps, Conv2dForwardAndBackwardMatchTheReference) {
  std::mt19937 rng(7);
  const Conv2dShape shapes[] = {
      {2, 7, 5, 3, 4, 3, 1, 1},  // 3x3, padded
      {1, 9, 8, 5, 6, 3, 2, 1},  // 3x3 stride 2 (a Downsample2D)
      {2, 4, 3, 6, 5, 1, 1, 0},  // 1x1: the GEMM alone
      {1, 6, 6, 2, 3, 3, 1, 0},  // no padding
  };
  for (const Conv2dShape& s : shapes) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const bool bf = dt == DType::kBF16;
      const std::string what = "conv " + std::to_string(s.height) + "x" + std::to_string(s.width) +
                               " k" + std::to_string(s.kernel) + " s" + std::to_string(s.stride) +
                               (bf ? " bf16" : " f32");
      std::vector<float> x = randn(size_t(s.x_numel()), rng), w = randn(size_t(s.w_numel()), rng),
                         b = randn(size_t(s.out_channels), rng),
                         dy = randn(size_t(s.y_numel()), rng),
                         dw0 = randn(size_t(s.w_numel()), rng),
                         db0 = randn(size_t(s.out_channels), rng);
      // What the backend computes with: bf16 activations and gradients, weights rounded.
      const std::vector<float> xr = bf ? rounded_to_bf16(x) : x, wr = bf ? rounded_to_bf16(w) : w,
                               dyr = bf ? rounded_to_bf16(dy) : dy;
      const double tol = 1e-4;

      std::vector<float> want(static_cast<size_t>(s.y_numel()));
      ref::conv2d_forward(s, xr.data(), wr.data(), b.data(), want.data());
      Dev dx_in = bf ? dev_bf16(x, {s.x_numel()}) : dev(x, {s.x_numel()});
      Dev dwt = dev(w, {s.w_numel()}), dbias = dev(b, {s.out_channels}), y = zeros({s.y_numel()});
      k().conv2d_forward(s, dx_in, dwt, dbias, y);
      expect_near_all(y.vec<float>(), want, tol, what + " forward");
      // Without a bias.
      ref::conv2d_forward(s, xr.data(), wr.data(), nullptr, want.data());
      k().conv2d_forward(s, dx_in, dwt, none(), y);
      expect_near_all(y.vec<float>(), want, tol, what + " forward without bias");

      std::vector<float> want_dx(static_cast<size_t>(s.x_numel())), want_dw = dw0, want_db = db0;
      ref::conv2d_backward(s, dyr.data(), xr.data(), wr.data(), want_dx.data(), want_dw.data(),
                           want_db.data());
      Dev ddy = bf ? dev_bf16(dy, {s.y_numel()}) : dev(dy, {s.y_numel()});
      Dev gx = dev(randn(size_t(s.x_numel()), rng), {s.x_numel()});  // overwritten
      Dev gw = dev(dw0, {s.w_numel()}), gb = dev(db0, {s.out_channels});
      k().conv2d_backward(s, ddy, dx_in, dwt, gx, gw, gb);
      expect_near_all(gx.vec<float>(), want_dx, tol, what + " dx");
      expect_near_all(gw.vec<float>(), want_dw, tol, what + " dw (accumulated)");
      expect_near_all(gb.vec<float>(), want_db, tol, what + " dbias (accumulated)");
      // The first layer's form: no input gradient.
      Dev gw2 = dev(dw0, {s.w_numel()});
      k().conv2d_backward(s, ddy, dx_in, dwt, none(), gw2, none());
      expect_near_all(gw2.vec<float>(), want_dw, tol, what + " dw without dx");
    }
  }
}

TEST_P(DiffusionOps, GroupNormMatchesTheReference) {
  std::mt19937 rng(8);
  for (const GroupNormShape s : {GroupNormShape{2, 13, 12, 4}, GroupNormShape{1, 7, 6, 1},
                                 GroupNormShape{3, 5, 8, 8}}) {
    const int64_t n = s.batch * s.pixels * s.channels, stats = s.batch * s.groups;
    std::vector<float> x = randn(size_t(n), rng), g = randn(size_t(s.channels), rng),
                       b = randn(size_t(s.channels), rng), dy = randn(size_t(n), rng);
    for (float& v : x) v = 3.0f + 2.0f * v;  // a mean far from 0: the two-pass variance
    std::vector<float> y(static_cast<size_t>(n)), mean(static_cast<size_t>(stats)), rstd(static_cast<size_t>(stats));
    ref::group_norm_forward(s, x.data(), g.data(), b.data(), 1e-5f, y.data(), mean.data(),
                            rstd.data());
    Dev dx_in = dev(x, {n}), dg = dev(g, {s.channels}), db = dev(b, {s.channels}),
        dyv = zeros({n}), dmean = zeros({stats}), drstd = zeros({stats});
    k().group_norm_forward(s, dx_in, dg, db, 1e-5f, dyv, dmean, drstd);
    expect_near_all(dyv.vec<float>(), y, 1e-4, "group norm y");
    expect_near_all(dmean.vec<float>(), mean, 1e-5, "group norm mean");
    expect_near_all(drstd.vec<float>(), rstd, 1e-4, "group norm rstd");

    std::vector<float> dx(static_cast<size_t>(n)), dgamma = randn(size_t(s.channels), rng), dbeta = dgamma;
    Dev ddx = zeros({n}), ddg = dev(dgamma, {s.channels}), ddb = dev(dbeta, {s.channels});
    ref::group_norm_backward(s, dy.data(), x.data(), g.data(), mean.data(), rstd.data(),
                             dx.data(), dgamma.data(), dbeta.data());
    k().group_norm_backward(s, dev(dy, {n}), dx_in, dg, dmean, drstd, ddx, ddg, ddb);
    expect_near_all(ddx.vec<float>(), dx, 1e-4, "group norm dx");
    expect_near_all(ddg.vec<float>(), dgamma, 1e-4, "group norm dgamma (accumulated)");
    expect_near_all(ddb.vec<float>(), dbeta, 1e-4, "group norm dbeta (accumulated)");
  }
}

TEST_P(DiffusionOps, LayerNormMatchesTheReference) {
  std::mt19937 rng(9);
  for (const int64_t cols : {2, 7, 40, 300}) {
    const int64_t rows = 11, n = rows * cols;
    std::vector<float> x = randn(size_t(n), rng), g = randn(size_t(cols), rng),
                       b = randn(size_t(cols), rng), dy = randn(size_t(n), rng);
    for (float& v : x) v = 5.0f + v;
    std::vector<float> y(static_cast<size_t>(n)), mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
    ref::layer_norm_forward(x.data(), rows, cols, g.data(), b.data(), 1e-5f, y.data(), mean.data(),
                            rstd.data());
    Dev dx_in = dev(x, {rows, cols}), dg = dev(g, {cols}), db = dev(b, {cols}),
        dyv = zeros({rows, cols}), dmean = zeros({rows}), drstd = zeros({rows});
    k().layer_norm_forward(dx_in, dg, db, 1e-5f, dyv, dmean, drstd);
    expect_near_all(dyv.vec<float>(), y, 1e-4, "layer norm y");
    expect_near_all(dmean.vec<float>(), mean, 1e-5, "layer norm mean");
    expect_near_all(drstd.vec<float>(), rstd, 1e-4, "layer norm rstd");
    Dev y2 = zeros({rows, cols});  // inference: no statistics kept
    k().layer_norm_forward(dx_in, dg, db, 1e-5f, y2, none(), none());
    expect_near_all(y2.vec<float>(), y, 1e-4, "layer norm y without statistics");

    std::vector<float> dx(static_cast<size_t>(n)), dgamma = randn(size_t(cols), rng), dbeta = dgamma;
    Dev ddx = zeros({rows, cols}), ddg = dev(dgamma, {cols}), ddb = dev(dbeta, {cols});
    ref::layer_norm_backward(dy.data(), x.data(), rows, cols, g.data(), mean.data(), rstd.data(),
                             dx.data(), dgamma.data(), dbeta.data());
    Dev ddy = dev(dy, {rows, cols});
    k().layer_norm_backward(ddy, dx_in, dg, dmean, drstd, ddx, ddg, ddb);
    expect_near_all(ddx.vec<float>(), dx, 1e-4, "layer norm dx");
    expect_near_all(ddg.vec<float>(), dgamma, 1e-4, "layer norm dgamma (accumulated)");
    expect_near_all(ddb.vec<float>(), dbeta, 1e-4, "layer norm dbeta (accumulated)");
    Dev ddx2 = zeros({rows, cols});  // a frozen norm: no weight gradients
    k().layer_norm_backward(ddy, dx_in, dg, dmean, drstd, ddx2, none(), none());
    expect_near_all(ddx2.vec<float>(), dx, 1e-4, "layer norm dx without weight gradients");
  }
}

TEST_P(DiffusionOps, NearestUpsamplingMatchesTheReference) {
  std::mt19937 rng(10);
  struct Case {
    int64_t n, h, w, c, oh, ow;
  };
  for (const Case& t : {Case{2, 3, 4, 5, 6, 8}, Case{1, 3, 5, 2, 7, 9}, Case{1, 2, 2, 3, 2, 5}}) {
    const int64_t small = t.n * t.h * t.w * t.c, big = t.n * t.oh * t.ow * t.c;
    std::vector<float> x = randn(size_t(small), rng), dy = randn(size_t(big), rng);
    std::vector<float> y(static_cast<size_t>(big)), dx(static_cast<size_t>(small));
    ref::upsample_nearest_to_forward(x.data(), t.n, t.h, t.w, t.c, t.oh, t.ow, y.data());
    ref::upsample_nearest_to_backward(dy.data(), t.n, t.h, t.w, t.c, t.oh, t.ow, dx.data());
    Dev dyv = zeros({t.n, t.oh, t.ow, t.c}), ddx = zeros({t.n, t.h, t.w, t.c});
    k().upsample_nearest_forward(dev(x, {t.n, t.h, t.w, t.c}), dyv);
    expect_near_all(dyv.vec<float>(), y, 0, "upsample forward");
    k().upsample_nearest_backward(dev(dy, {t.n, t.oh, t.ow, t.c}), ddx);
    expect_near_all(ddx.vec<float>(), dx, 1e-6, "upsample backward");
  }
}

TEST_P(DiffusionOps, TimestepEmbeddingMatchesTheReference) {
  const std::vector<float> t = {0.0f, 1.0f, 250.5f, 999.0f, 37.25f};
  for (const int64_t dim : {320, 7}) {
    for (const bool flip : {true, false}) {
      TimestepEmbeddingParams p;
      p.dim = dim;
      p.flip_sin_to_cos = flip;
      p.freq_shift = flip ? 0.0f : 1.0f;
      const auto n = static_cast<int64_t>(t.size());
      std::vector<float> want(static_cast<size_t>(n * dim));
      ref::timestep_embedding(t.data(), n, p, want.data());
      Dev out = zeros({n, dim});
      k().timestep_embedding(dev(t, {n}), p, out);
      // sin and cos of arguments near 1000 rad: a float ulp of the argument is 6e-5.
      expect_near_all(out.vec<float>(), want, 2e-4, "timestep embedding dim " + std::to_string(dim));
    }
  }
}

TEST_P(DiffusionOps, ActivationsAndGegluMatchTheReference) {
  std::mt19937 rng(11);
  const int64_t n = 1003;
  std::vector<float> x = randn(size_t(n), rng, 3.0f), dy = randn(size_t(n), rng);
  for (Activation a : {Activation::kSilu, Activation::kGelu, Activation::kQuickGelu}) {
    std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
    ref::activation_forward(a, x.data(), y.data(), n);
    ref::activation_backward(a, dy.data(), x.data(), dx.data(), n);
    Dev dxv = dev(x, {n}), out = zeros({n}), grad = zeros({n});
    k().activation_forward(a, dxv, out);
    expect_near_all(out.vec<float>(), y, 1e-5, std::string(activation_name(a)) + " forward");
    k().activation_backward(a, dev(dy, {n}), dxv, grad);
    expect_near_all(grad.vec<float>(), dx, 1e-5, std::string(activation_name(a)) + " backward");
  }
  const int64_t rows = 13, f = 37;
  std::vector<float> gx = randn(size_t(rows * 2 * f), rng, 2.0f), dh = randn(size_t(rows * f), rng);
  std::vector<float> h(static_cast<size_t>(rows * f)), gdx(static_cast<size_t>(rows * 2 * f));
  ref::geglu_rows_forward(gx.data(), rows, f, h.data());
  ref::geglu_rows_backward(dh.data(), gx.data(), rows, f, gdx.data());
  Dev dgx = dev(gx, {rows, 2 * f}), dhv = zeros({rows, f}), ddx = zeros({rows, 2 * f});
  k().geglu_forward(dgx, dhv);
  expect_near_all(dhv.vec<float>(), h, 1e-5, "geglu forward");
  k().geglu_backward(dev(dh, {rows, f}), dgx, ddx);
  expect_near_all(ddx.vec<float>(), gdx, 1e-5, "geglu backward");
}

// A UNet's cross-attention: 23 latent pixels attend to 9 text tokens (Tq > Tk), not
// causal, head dim 40 (SD 1.5's first level); and its self-attention (Tq == Tk).
TEST_P(DiffusionOps, NonCausalAttentionMatchesTheReference) {
  std::mt19937 rng(12);
  for (const int64_t tk : {9, 23}) {
    const int64_t b = 2, tq = 23, h = 2, d = 40;
    Tensor q = random_tensor(DType::kF32, {b, tq, h, d}, rng),
           kk = random_tensor(DType::kF32, {b, tk, h, d}, rng),
           v = random_tensor(DType::kF32, {b, tk, h, d}, rng),
           dout = random_tensor(DType::kF32, {b, tq, h, d}, rng);
    AttentionParams params;
    params.causal = false;
    Tensor out = Tensor::zeros(DType::kF32, {b, tq, h, d}), lse = Tensor::zeros(DType::kF32, {b, h, tq});
    ref::attention_forward(q, kk, v, out, lse, params);
    Tensor dq = Tensor::zeros(DType::kF32, {b, tq, h, d}), dk = Tensor::zeros(DType::kF32, {b, tk, h, d}),
           dv = Tensor::zeros(DType::kF32, {b, tk, h, d});
    ref::attention_backward(q, kk, v, out, dout, lse, dq, dk, dv, params);

    Dev gq(k(), q), gk(k(), kk), gv(k(), v), gdout(k(), dout);
    Dev gout(k(), DType::kF32, {b, tq, h, d}), glse(k(), DType::kF32, {b, h, tq});
    k().attention_forward(gq, gk, gv, gout, glse, params);
    expect_close(gout, out, 1e-4, 1e-5, "cross-attention out, tk " + std::to_string(tk));
    expect_close(glse, lse, 1e-4, 1e-5, "cross-attention lse");
    Dev gdq(k(), DType::kF32, {b, tq, h, d}), gdk(k(), DType::kF32, {b, tk, h, d}),
        gdv(k(), DType::kF32, {b, tk, h, d});
    k().attention_backward(gq, gk, gv, gout, gdout, glse, gdq, gdk, gdv, params);
    expect_close(gdq, dq, 1e-3, 1e-4, "cross-attention dq");
    expect_close(gdk, dk, 1e-3, 1e-4, "cross-attention dk");
    expect_close(gdv, dv, 1e-3, 1e-4, "cross-attention dv");
  }
}

// A VAE's mid-block attention: one head of 512 channels, wider than the CUDA flash
// kernels' 256 (the CUDA backend runs it through materialised scores in row chunks).
TEST_P(DiffusionOps, WideHeadAttentionForwardMatchesTheReference) {
  std::mt19937 rng(13);
  const int64_t b = 2, t = 37, h = 1, d = 512;
  Tensor q = random_tensor(DType::kF32, {b, t, h, d}, rng), kk = random_tensor(DType::kF32, {b, t, h, d}, rng),
         v = random_tensor(DType::kF32, {b, t, h, d}, rng);
  AttentionParams params;
  params.causal = false;
  Tensor out = Tensor::zeros(DType::kF32, {b, t, h, d}), lse = Tensor::zeros(DType::kF32, {b, h, t});
  ref::attention_forward(q, kk, v, out, lse, params);
  Dev gq(k(), q), gk(k(), kk), gv(k(), v);
  Dev gout(k(), DType::kF32, {b, t, h, d}), glse(k(), DType::kF32, {b, h, t});
  k().attention_forward(gq, gk, gv, gout, glse, params);
  expect_close(gout, out, 1e-4, 1e-5, "wide-head attention out");
  expect_close(glse, lse, 1e-4, 1e-5, "wide-head attention lse");
}

// A UNet up block's channel concatenation [a | b] of two channels-last maps, and a map
// copied into a larger one: strided rows, as copy_2d moves them.
TEST_P(DiffusionOps, Copy2dConcatenatesChannels) {
  const int64_t pixels = 7, ca = 3, cb = 2;
  std::vector<float> a(static_cast<size_t>(pixels * ca)), b(static_cast<size_t>(pixels * cb));
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 100.0f + float(i);
  Dev da = dev(a, {pixels, ca}), db = dev(b, {pixels, cb}), cat = zeros({pixels, ca + cb});
  const size_t f = sizeof(float);
  k().copy_2d(da.data(), ca * f, cat.data(), (ca + cb) * f, ca * f, pixels);
  k().copy_2d(db.data(), cb * f, cat.as<float>() + ca, (ca + cb) * f, cb * f, pixels);
  const std::vector<float> got = cat.vec<float>();
  for (int64_t p = 0; p < pixels; ++p) {
    for (int64_t c = 0; c < ca; ++c) EXPECT_EQ(got[size_t(p * (ca + cb) + c)], a[size_t(p * ca + c)]);
    for (int64_t c = 0; c < cb; ++c) EXPECT_EQ(got[size_t(p * (ca + cb) + ca + c)], b[size_t(p * cb + c)]);
  }
  const std::string msg =
      error_message([&] { k().copy_2d(da.data(), f, cat.data(), (ca + cb) * f, ca * f, pixels); });
  EXPECT_NE(msg.find("copy_2d"), std::string::npos) << msg;
}

TEST_P(DiffusionOps, WrongViewsAreRefusedByName) {
  const Conv2dShape s{1, 4, 4, 2, 3, 3, 1, 1};
  Dev x = zeros({s.x_numel()}), w = zeros({s.w_numel()}), y_short = zeros({s.y_numel() - 1});
  std::string msg = error_message([&] { k().conv2d_forward(s, x, w, TensorView(), y_short); });
  EXPECT_NE(msg.find("conv2d_forward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("y is"), std::string::npos) << msg;
  Conv2dShape bad = s;
  bad.kernel = 9;  // larger than the padded input
  msg = error_message([&] { k().conv2d_forward(bad, x, w, TensorView(), y_short); });
  EXPECT_FALSE(msg.empty());
  const GroupNormShape gs{1, 4, 6, 4};  // 6 channels do not split into 4 groups
  Dev gx = zeros({24}), gg = zeros({6}), stats = zeros({4});
  msg = error_message([&] { k().group_norm_forward(gs, gx, gg, gg, 1e-5f, gx, stats, stats); });
  EXPECT_NE(msg.find("group"), std::string::npos) << msg;
  Dev small = zeros({1, 4, 4, 2}), smaller = zeros({1, 3, 4, 2});
  msg = error_message([&] { k().upsample_nearest_forward(small, smaller); });
  EXPECT_NE(msg.find("upsample_nearest_forward"), std::string::npos) << msg;
  Dev odd = zeros({3, 5}), half = zeros({3, 2});
  msg = error_message([&] { k().geglu_forward(odd, half); });
  EXPECT_NE(msg.find("geglu_forward"), std::string::npos) << msg;
  TimestepEmbeddingParams one;
  one.dim = 1;  // no sin / cos pair
  Dev t = zeros({2}), emb = zeros({2, 1});
  msg = error_message([&] { k().timestep_embedding(t, one, emb); });
  EXPECT_NE(msg.find("dim 1"), std::string::npos) << msg;
  // Queries with no keys to attend to.
  AttentionParams cross;
  cross.causal = false;
  Dev q(k(), DType::kF32, {1, 3, 1, 8}), kv(k(), DType::kF32, {1, 0, 1, 8}),
      out(k(), DType::kF32, {1, 3, 1, 8}), lse(k(), DType::kF32, {1, 1, 3});
  msg = error_message([&] { k().attention_forward(q, kv, kv, out, lse, cross); });
  EXPECT_FALSE(msg.empty()) << "3 queries against 0 keys were not refused";
}

INSTANTIATE_TEST_SUITE_P(Built, DiffusionOps, testing::ValuesIn(backends()),
                         [](const testing::TestParamInfo<KernelBackend*>& i) {
                           return std::string(i.param->name());
                         });

}  // namespace
}  // namespace hyperion
