// Every op of every kernel backend built into this binary (host, and the CUDA backend
// when this binary has it and a GPU is present) against the scalar ref:: kernels: the
// check a new backend must pass before any model runs on it. Inputs are made on the host
// and staged onto the backend's device (Dev); results are downloaded and compared. The
// host backend goes through the same upload/download path, so the staging itself is
// tested on every machine. Tolerances: f32 math everywhere, so 1e-4 relative (1e-3 for
// the attention backward, whose sums are ordered differently on each backend).
#include "kernels/backend.h"

#include <gtest/gtest.h>

#include <limits>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "device_staging.h"
#include "kernel_test_util.h"
#include "kernels/adamw.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/embedding.h"
#include "kernels/global_norm.h"
#include "kernels/grouped_gemm.h"
#include "kernels/moe_routing.h"
#include "kernels/peak.h"
#include "kernels/rmsnorm.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  const std::string msg = error_message(fn);
  ASSERT_FALSE(msg.empty()) << "no hyperion::Error thrown";
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
}

class BackendParity : public testing::TestWithParam<KernelBackend*> {
 protected:
  KernelBackend& k() { return *GetParam(); }
  Dev dev(const Tensor& t) { return Dev(k(), t); }
  Dev dev(DType dt, Shape s) { return Dev(k(), dt, s); }
  template <typename T>
  Dev dev(const std::vector<T>& v) {
    return Dev(k(), v);
  }
};

TEST_P(BackendParity, Gemm) {
  std::mt19937 rng(1);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (Trans tb : {Trans::kN, Trans::kT}) {
      const int64_t m = 37, n = 29, kk = 53;
      Tensor a = random_tensor(dt, {m, kk}, rng);
      Tensor b =
          tb == Trans::kT ? random_tensor(dt, {n, kk}, rng) : random_tensor(dt, {kk, n}, rng);
      Tensor c_ref = Tensor::zeros(DType::kF32, {m, n});
      Dev da = dev(a), db = dev(b), c = dev(DType::kF32, {m, n});
      k().gemm_contiguous(Trans::kN, tb, m, n, kk, da.data(), dt, db.data(), dt, c.data(),
                          DType::kF32);
      ref::gemm(contiguous_gemm_args(Trans::kN, tb, m, n, kk, a.data(), dt, b.data(), dt,
                                     c_ref.data(), DType::kF32));
      expect_close(c, c_ref, 1e-4, 1e-4, std::string(dtype_name(dt)));
    }
  }
  // Transposed A, beta = 1 accumulation into a bf16 C, and a bias.
  const int64_t m = 19, n = 24, kk = 40;
  Tensor a = random_tensor(DType::kBF16, {kk, m}, rng),
         b = random_tensor(DType::kBF16, {n, kk}, rng);
  Tensor c0 = random_tensor(DType::kBF16, {m, n}, rng);
  std::vector<float> bias = randn(static_cast<size_t>(n), rng);
  Tensor c_ref = c0.clone();
  Dev da = dev(a), db = dev(b), c = dev(c0), dbias = dev(bias);
  GemmArgs g = contiguous_gemm_args(Trans::kT, Trans::kT, m, n, kk, da.data(), DType::kBF16,
                                    db.data(), DType::kBF16, c.data(), DType::kBF16, 1.0f);
  g.bias = dbias.as<float>();
  k().gemm(g);
  GemmArgs r = contiguous_gemm_args(Trans::kT, Trans::kT, m, n, kk, a.data(), DType::kBF16,
                                    b.data(), DType::kBF16, c_ref.data(), DType::kBF16, 1.0f);
  r.bias = bias.data();
  ref::gemm(r);
  expect_close(c, c_ref, 1e-2, 1e-2, "bf16 C, beta 1, bias");
}

// The shapes of a decode step's matmuls: 1 to 8 rows against a [n, k] weight (on a GPU the
// one-pass kernel of gemv.cu), f32 and bf16 C, with and without accumulation.
TEST_P(BackendParity, GemmAtDecodeRows) {
  std::mt19937 rng(13);
  for (int64_t m : {1, 2, 3, 4, 5, 8}) {
    for (int64_t kk : {8, 264, 2048}) {
      for (DType ct : {DType::kF32, DType::kBF16}) {
        for (float beta : {0.0f, 1.0f}) {
          const int64_t n = 37;
          Tensor a = random_tensor(DType::kBF16, {m, kk}, rng),
                 b = random_tensor(DType::kBF16, {n, kk}, rng), c0 = random_tensor(ct, {m, n}, rng);
          Tensor c_ref = c0.clone();
          Dev da = dev(a), db = dev(b), c = dev(c0);
          k().gemm_contiguous(Trans::kN, Trans::kT, m, n, kk, da.data(), DType::kBF16, db.data(),
                              DType::kBF16, c.data(), ct, beta);
          ref::gemm(contiguous_gemm_args(Trans::kN, Trans::kT, m, n, kk, a.data(), DType::kBF16,
                                         b.data(), DType::kBF16, c_ref.data(), ct, beta));
          // f32 sums of k products in another order; a bf16 C rounds once more.
          const double abs = (ct == DType::kF32 ? 1e-5 : 1e-2) * std::sqrt(double(kk));
          expect_close(c, c_ref, ct == DType::kF32 ? 1e-4 : 1e-2, abs,
                       "m=" + std::to_string(m) + " k=" + std::to_string(kk) + " " +
                           std::string(dtype_name(ct)) + " beta=" + std::to_string(beta));
        }
      }
    }
  }
}

// Several weights of one input in one call (a layer's q, k, v; gate and up): each output
// equals its own GEMM, at decode rows (one pass on a GPU) and beyond.
TEST_P(BackendParity, LinearManyEqualsOneGemmEach) {
  std::mt19937 rng(14);
  const int64_t in = 264;
  const std::vector<int64_t> outs = {37, 8, 16};
  for (int64_t m : {1, 3, 8, 11}) {
    for (DType yt : {DType::kF32, DType::kBF16}) {
      Tensor x = random_tensor(DType::kBF16, {m, in}, rng);
      Dev dx = dev(x);
      std::vector<Tensor> ws, refs;
      std::vector<Dev> dws, dys;
      std::vector<KernelBackend::LinearTarget> targets;
      for (int64_t o : outs) {
        ws.push_back(random_tensor(DType::kBF16, {o, in}, rng));
        dws.push_back(dev(ws.back()));
        refs.push_back(Tensor::zeros(yt, {m, o}));
        ref::gemm(contiguous_gemm_args(Trans::kN, Trans::kT, m, o, in, x.data(), DType::kBF16,
                                       ws.back().data(), DType::kBF16, refs.back().data(), yt));
        std::vector<unsigned char> poison(refs.back().nbytes(), 0xff);
        dys.push_back(dev(yt, {m, o}));
        k().upload(poison.data(), dys.back().data(), poison.size());
      }
      for (size_t t = 0; t < outs.size(); ++t) targets.push_back({dws[t].data(), outs[t], dys[t].data()});
      k().linear_many(dx.data(), DType::kBF16, m, in, DType::kBF16, yt, targets);
      for (size_t t = 0; t < outs.size(); ++t)
        expect_close(dys[t], refs[t], yt == DType::kF32 ? 1e-4 : 1e-2, yt == DType::kF32 ? 1e-4 : 1e-2,
                     "m=" + std::to_string(m) + " target " + std::to_string(t) + " " +
                         std::string(dtype_name(yt)));
    }
  }
}

// int8 weights of one input (model/linear.h, kInt8): the rows quantised once, each
// product scaled by the row and weight scales, with and without accumulation. On a GPU
// the decode rows are quantised inside the matmul: the same int8 values and exact int32
// sums as the host's, so only the final f32 products may differ, by rounding.
TEST_P(BackendParity, LinearInt8ManyEqualsTheHost) {
  std::mt19937 rng(15);
  const int64_t in = 272;
  const std::vector<int64_t> outs = {37, 16};
  for (int64_t m : {1, 2, 4, 5}) {
    for (DType yt : {DType::kF32, DType::kBF16}) {
      for (float beta : {0.0f, 1.0f}) {
        Tensor x = random_tensor(DType::kBF16, {m, in}, rng);
        Dev dx = dev(x), qx = dev(DType::kI8, {m, in}), qs = dev(DType::kF32, {m});
        std::vector<Tensor> w8, y0;
        std::vector<std::vector<float>> scales;
        std::vector<Dev> dw, ds, dy;
        std::vector<KernelBackend::Int8Target> targets, host_targets;
        for (int64_t o : outs) {
          Tensor wf = random_tensor(DType::kF32, {o, in}, rng);
          w8.push_back(Tensor(DType::kI8, {o, in}));
          scales.emplace_back(static_cast<size_t>(o));
          host_backend().quantize_rows(wf, w8.back(), scales.back().data());
          y0.push_back(random_tensor(yt, {m, o}, rng));
          dw.push_back(dev(w8.back()));
          ds.push_back(dev(scales.back()));
          dy.push_back(dev(y0.back()));
        }
        std::vector<Tensor> want;
        for (size_t t = 0; t < outs.size(); ++t) {
          want.push_back(y0[t].clone());
          targets.push_back({dw[t].as<int8_t>(), ds[t].as<float>(), outs[t], dy[t].data(), beta});
          host_targets.push_back(
              {w8[t].as<int8_t>(), scales[t].data(), outs[t], want.back().data(), beta});
        }
        std::vector<int8_t> hqx(static_cast<size_t>(m * in));
        std::vector<float> hqs(static_cast<size_t>(m));
        host_backend().linear_int8_many(x.data(), DType::kBF16, m, in, yt, host_targets,
                                        hqx.data(), hqs.data());
        k().linear_int8_many(dx.data(), DType::kBF16, m, in, yt, targets, qx.as<int8_t>(),
                             qs.as<float>());
        for (size_t t = 0; t < outs.size(); ++t)
          expect_close(dy[t], want[t], yt == DType::kF32 ? 1e-5 : 8e-3, 1e-6,
                       "m=" + std::to_string(m) + " target " + std::to_string(t) + " " +
                           std::string(dtype_name(yt)) + " beta=" + std::to_string(beta));
      }
    }
  }
}

TEST_P(BackendParity, RmsNormBothOffsets) {
  std::mt19937 rng(2);
  for (float offset : {0.0f, 1.0f}) {
    const int64_t n = 9, h = 70;
    Tensor x = random_tensor(DType::kF32, {n, h}, rng), w = random_tensor(DType::kF32, {h}, rng);
    Tensor dy = random_tensor(DType::kF32, {n, h}, rng);
    Tensor y_ref(DType::kF32, {n, h}), rs_ref(DType::kF32, {n});
    Dev dx_in = dev(x), dw_in = dev(w), ddy = dev(dy), y = dev(DType::kF32, {n, h}),
        rs = dev(DType::kF32, {n});
    k().rmsnorm_forward(dx_in, dw_in, 1e-6f, y, rs, offset);
    ref::rmsnorm_forward(x, w, 1e-6f, y_ref, rs_ref, offset);
    expect_close(y, y_ref, 2e-5, 1e-6, "y");
    Tensor dx_ref(DType::kF32, {n, h});
    Tensor dw_ref = Tensor::zeros(DType::kF32, {h});
    Dev dx = dev(DType::kF32, {n, h}), dw = dev(DType::kF32, {h});
    k().rmsnorm_backward(ddy, dx_in, dw_in, rs, dx, dw, false, offset);
    ref::rmsnorm_backward(dy, x, w, rs_ref, dx_ref, dw_ref, false, offset);
    expect_close(dx, dx_ref, 1e-4, 1e-5, "dx");
    expect_close(dw, dw_ref, 1e-4, 1e-5, "dweight");
  }
}

// The forms the decoder's attention biases and qk-norm use: C += bias as an empty-product
// GEMM (k = 0, beta 1) in f32 and bf16; a bias gradient as ones[1, n] x dy[n, out]; and
// RMSNorm over [rows, head_dim] in bf16 with y on x (forward) and dx on dy (backward).
TEST_P(BackendParity, BiasAndPerHeadNormForms) {
  std::mt19937 rng(12);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t m = 13, n = 40;
    Tensor c0 = random_tensor(dt, {m, n}, rng);
    std::vector<float> bias = randn(static_cast<size_t>(n), rng);
    Tensor c_ref = c0.clone();
    Dev c = dev(c0), dbias = dev(bias);
    GemmArgs g;
    g.m = m, g.n = n, g.k = 0, g.a_dtype = g.b_dtype = dt, g.lda = 1, g.ldb = n;
    g.c = c.data(), g.c_dtype = dt, g.ldc = n, g.beta = 1.0f, g.bias = dbias.as<float>();
    k().gemm(g);
    GemmArgs r = g;
    r.c = c_ref.data(), r.bias = bias.data();
    ref::gemm(r);
    expect_close(c, c_ref, 1e-2, 1e-6, "C += bias " + std::string(dtype_name(dt)));
    // Bias gradient: grad[1, out] += ones[1, rows] dy[rows, out].
    std::vector<float> ones_f(static_cast<size_t>(m), 1.0f);
    Tensor ones(dt, {1, m});
    convert_any(ones_f.data(), DType::kF32, ones.data(), dt, ones_f.size());
    Tensor dy = random_tensor(dt, {m, n}, rng);
    Tensor grad_ref = Tensor::zeros(DType::kF32, {1, n});
    Dev dones = dev(ones), ddy = dev(dy), grad = dev(Tensor::zeros(DType::kF32, {1, n}));
    k().gemm_contiguous(Trans::kN, Trans::kN, 1, n, m, dones.data(), dt, ddy.data(), dt,
                        grad.data(), DType::kF32, 1.0f);
    ref::gemm(contiguous_gemm_args(Trans::kN, Trans::kN, 1, n, m, ones.data(), dt, dy.data(), dt,
                                   grad_ref.data(), DType::kF32, 1.0f));
    expect_close(grad, grad_ref, 1e-4, 1e-4, "bias gradient " + std::string(dtype_name(dt)));
  }
  const int64_t rows = 3 * 4, hd = 64;  // 3 tokens x 4 heads
  Tensor x = random_tensor(DType::kBF16, {rows, hd}, rng), w = random_tensor(DType::kF32, {hd}, rng);
  Tensor dy = random_tensor(DType::kBF16, {rows, hd}, rng);
  Tensor y_ref(DType::kBF16, {rows, hd}), rs_ref(DType::kF32, {rows});
  ref::rmsnorm_forward(x, w, 1e-6f, y_ref, rs_ref, 0.0f);
  Dev xy = dev(x), dw_in = dev(w), rs = dev(DType::kF32, {rows});
  k().rmsnorm_forward(xy, dw_in, 1e-6f, xy, rs, 0.0f);  // in place
  expect_close(xy, y_ref, 1e-2, 1e-2, "per-head rmsnorm in place");
  Tensor dx_ref(DType::kBF16, {rows, hd});
  Tensor dw_ref = Tensor::zeros(DType::kF32, {hd});
  ref::rmsnorm_backward(dy, x, w, rs_ref, dx_ref, dw_ref, false, 0.0f);
  Dev dxy = dev(dy), x_in = dev(x), dw = dev(Tensor::zeros(DType::kF32, {hd}));
  k().rmsnorm_backward(dxy, x_in, dw_in, rs, dxy, dw, false, 0.0f);  // dx on dy
  expect_close(dxy, dx_ref, 2e-2, 2e-2, "per-head rmsnorm backward in place");
  expect_close(dw, dw_ref, 1e-3, 1e-3, "per-head rmsnorm dweight");
}

TEST_P(BackendParity, GatedActivations) {
  std::mt19937 rng(3);
  for (GatedActivation act : {GatedActivation::kSilu, GatedActivation::kGeluTanh}) {
    const bool gelu = act == GatedActivation::kGeluTanh;
    Tensor g = random_tensor(DType::kF32, {5, 67}, rng, 2.0f),
           u = random_tensor(DType::kF32, {5, 67}, rng);
    Tensor dh = random_tensor(DType::kF32, {5, 67}, rng);
    Tensor h_ref(DType::kF32, g.shape());
    Dev dg_in = dev(g), du_in = dev(u), ddh = dev(dh), h = dev(DType::kF32, g.shape());
    k().gated_forward(act, dg_in, du_in, h);
    (gelu ? ref::geglu_forward : ref::swiglu_forward)(g, u, h_ref);
    expect_close(h, h_ref, 1e-5, 1e-6, gated_activation_name(act));
    Tensor dg_ref(DType::kF32, g.shape()), du_ref(DType::kF32, g.shape());
    Dev dg = dev(DType::kF32, g.shape()), du = dev(DType::kF32, g.shape());
    k().gated_backward(act, ddh, dg_in, du_in, dg, du);
    (gelu ? ref::geglu_backward : ref::swiglu_backward)(dh, g, u, dg_ref, du_ref);
    expect_close(dg, dg_ref, 1e-4, 1e-5, "dg");
    expect_close(du, du_ref, 1e-4, 1e-5, "du");
  }
}

TEST_P(BackendParity, RopeByStartAndByPosition) {
  std::mt19937 rng(4);
  const int64_t b = 2, t = 5, heads = 3, hd = 8;
  RopeTable table(64, hd, 10000.0);
  Tensor x = random_tensor(DType::kF32, {b, t, heads, hd}, rng);
  Tensor y_ref(DType::kF32, x.shape());
  std::vector<int32_t> pos;
  for (int64_t i = 0; i < b * t; ++i) pos.push_back(static_cast<int32_t>(7 + i % t));
  Tensor positions = make_i32(pos);
  const TensorView positions_bt(positions.data(), DType::kI32, {b, t});
  Dev dx_in = dev(x), y = dev(DType::kF32, x.shape());
  k().rope_forward(dx_in, y, 7, table);
  ref::rope_forward(x, y_ref, positions_bt, table);
  expect_close(y, y_ref, 1e-5, 1e-6, "start");
  const TensorView flat = dx_in.view().reshape({1, b * t, heads, hd});
  Dev y2 = dev(DType::kF32, {1, b * t, heads, hd}), dpos = dev(positions);
  TensorView flat_dev = flat;
  flat_dev.device = k().device();
  k().rope_forward(flat_dev, y2, dpos, table);
  expect_close(y2, y_ref, 1e-5, 1e-6, "positions");
  Tensor dx_ref(DType::kF32, x.shape());
  Dev dx = dev(DType::kF32, x.shape());
  k().rope_backward(dx_in, dx, 7, table);
  ref::rope_backward(x, dx_ref, positions_bt, table);
  expect_close(dx, dx_ref, 1e-5, 1e-6, "backward");
  // The backward by position (packed documents): positions restarting mid-row.
  std::vector<int32_t> restart;
  for (int64_t i = 0; i < b * t; ++i) restart.push_back(static_cast<int32_t>(i < 3 ? i : i - 3));
  Tensor restart_t = make_i32(restart);
  Tensor dx_ref2(DType::kF32, x.shape());
  ref::rope_backward(x, dx_ref2, TensorView(restart_t.data(), DType::kI32, {b, t}), table);
  Dev dx2 = dev(DType::kF32, {1, b * t, heads, hd}), drestart = dev(restart_t);
  k().rope_backward(flat_dev, dx2, drestart, table);
  expect_close(dx2, dx_ref2, 1e-5, 1e-6, "backward by position");
}

// The element-wise ops at the model's aligned sizes (rows of a multiple of 8 elements,
// D/2 a multiple of 8), where the CUDA backend takes its 16-byte paths; the tests above
// use odd sizes and so its scalar paths. f32 and bf16 storage; the reference computes on
// the bf16 values widened to f32, so bf16 is off by its output rounding only.
TEST_P(BackendParity, ElementwiseAtAlignedSizes) {
  std::mt19937 rng(33);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const bool b16 = dt == DType::kBF16;
    const double rel = b16 ? 1e-2 : 1e-4, abs = b16 ? 1e-2 : 1e-5;
    auto widened = [](const Tensor& t) { return make_tensor(DType::kF32, t.shape(), values(t)); };
    const std::string name(dtype_name(dt));
    // SwiGLU and GeGLU, forward and backward, over 6 x 64.
    for (GatedActivation act : {GatedActivation::kSilu, GatedActivation::kGeluTanh}) {
      const bool gelu = act == GatedActivation::kGeluTanh;
      Tensor g = random_tensor(dt, {6, 64}, rng, 2.0f), u = random_tensor(dt, {6, 64}, rng);
      Tensor dh = random_tensor(dt, {6, 64}, rng);
      Tensor h_ref(DType::kF32, {6, 64}), dg_ref(DType::kF32, {6, 64}),
          du_ref(DType::kF32, {6, 64});
      (gelu ? ref::geglu_forward : ref::swiglu_forward)(widened(g), widened(u), h_ref);
      (gelu ? ref::geglu_backward : ref::swiglu_backward)(widened(dh), widened(g), widened(u),
                                                          dg_ref, du_ref);
      Dev dg_in = dev(g), du_in = dev(u), ddh = dev(dh), h = dev(dt, {6, 64}),
          dg = dev(dt, {6, 64}), du = dev(dt, {6, 64});
      k().gated_forward(act, dg_in, du_in, h);
      k().gated_backward(act, ddh, dg_in, du_in, dg, du);
      const std::string what = std::string(gated_activation_name(act)) + " " + name;
      expect_close(h, h_ref, rel, abs, what);
      expect_close(dg, dg_ref, rel, abs * 10, "dg " + what);
      expect_close(du, du_ref, rel, abs * 10, "du " + what);
    }
    // RMSNorm over 5 rows of 64 (f32 weight), forward and backward.
    {
      Tensor x = random_tensor(dt, {5, 64}, rng), dy = random_tensor(dt, {5, 64}, rng);
      Tensor w = random_tensor(DType::kF32, {64}, rng);
      Tensor y_ref(DType::kF32, {5, 64}), rs_ref(DType::kF32, {5}), dx_ref(DType::kF32, {5, 64});
      Tensor dw_ref = Tensor::zeros(DType::kF32, {64});
      ref::rmsnorm_forward(widened(x), w, 1e-6f, y_ref, rs_ref, 0.0f);
      ref::rmsnorm_backward(widened(dy), widened(x), w, rs_ref, dx_ref, dw_ref, false, 0.0f);
      Dev dx_in = dev(x), dw_in = dev(w), ddy = dev(dy), y = dev(dt, {5, 64}),
          rs = dev(DType::kF32, {5}), dx = dev(dt, {5, 64}), dw = dev(DType::kF32, {64});
      k().rmsnorm_forward(dx_in, dw_in, 1e-6f, y, rs, 0.0f);
      expect_close(y, y_ref, rel, abs, "rmsnorm " + name);
      expect_close(rs, rs_ref, 1e-5, 1e-6, "rstd " + name);
      k().rmsnorm_backward(ddy, dx_in, dw_in, rs, dx, dw, false, 0.0f);
      expect_close(dx, dx_ref, rel, abs * 10, "rmsnorm dx " + name);
      expect_close(dw, dw_ref, 1e-4, 1e-4, "rmsnorm dweight " + name);
    }
    // RoPE with head_dim 16 (8 rotated pairs), by start and backward.
    {
      const int64_t b = 2, t = 5, heads = 3, hd = 16;
      RopeTable table(64, hd, 10000.0);
      Tensor x = random_tensor(dt, {b, t, heads, hd}, rng);
      std::vector<int32_t> pos;
      for (int64_t i = 0; i < b * t; ++i) pos.push_back(static_cast<int32_t>(3 + i % t));
      Tensor positions = make_i32(pos);
      const TensorView positions_bt(positions.data(), DType::kI32, {b, t});
      Tensor y_ref(DType::kF32, x.shape()), dx_ref(DType::kF32, x.shape());
      ref::rope_forward(widened(x), y_ref, positions_bt, table);
      ref::rope_backward(widened(x), dx_ref, positions_bt, table);
      Dev dx_in = dev(x), y = dev(dt, x.shape()), dx = dev(dt, x.shape());
      k().rope_forward(dx_in, y, 3, table);
      k().rope_backward(dx_in, dx, 3, table);
      expect_close(y, y_ref, rel, abs, "rope " + name);
      expect_close(dx, dx_ref, rel, abs, "rope backward " + name);
    }
  }
}

TEST_P(BackendParity, Attention) {
  std::mt19937 rng(5);
  // Odd sizes: 11 tokens, head_dim 16 and 40 (not multiples of the warp), GQA 4:2, and a
  // chunked-prefill shape (Tq < Tk). Then Gemma's and Mistral's score shapes: sliding
  // windows narrower than a tile and than the keys (also with Tq < Tk, where the window
  // cuts queries' ranges at both ends), a soft cap, both with a scale of its own.
  struct Case {
    int64_t b, tq, tk, hq, hkv, hd;
    AttentionParams params = {};
  };
  AttentionParams window5, capped, both;
  window5.window = 5;
  capped.softcap = 2.0f;
  capped.scale = 0.5f;
  both.window = 7;
  both.softcap = 1.5f;
  for (const Case& cs :
       {Case{2, 11, 11, 4, 2, 16}, Case{1, 37, 37, 3, 1, 40}, Case{1, 5, 13, 2, 2, 8},
        Case{2, 41, 41, 4, 2, 16, window5}, Case{1, 9, 50, 2, 1, 40, window5},
        Case{1, 37, 37, 3, 1, 40, capped}, Case{1, 70, 75, 4, 2, 16, both}}) {
    Tensor q = random_tensor(DType::kF32, {cs.b, cs.tq, cs.hq, cs.hd}, rng);
    Tensor kt = random_tensor(DType::kF32, {cs.b, cs.tk, cs.hkv, cs.hd}, rng);
    Tensor v = random_tensor(DType::kF32, {cs.b, cs.tk, cs.hkv, cs.hd}, rng);
    Tensor o_ref(DType::kF32, q.shape()), lse_ref(DType::kF32, {cs.b, cs.hq, cs.tq});
    Dev dq_in = dev(q), dk_in = dev(kt), dv_in = dev(v), o = dev(DType::kF32, q.shape()),
        lse = dev(DType::kF32, {cs.b, cs.hq, cs.tq});
    k().attention_forward(dq_in, dk_in, dv_in, o, lse, cs.params);
    ref::attention_forward(q, kt, v, o_ref, lse_ref, cs.params);
    const std::string what = "T " + std::to_string(cs.tq) + "/" + std::to_string(cs.tk) +
                             " window " + std::to_string(cs.params.window) + " cap " +
                             std::to_string(cs.params.softcap);
    expect_close(o, o_ref, 1e-4, 1e-5, "out " + what);
    expect_close(lse, lse_ref, 1e-5, 1e-5, "lse " + what);
    Tensor dout = random_tensor(DType::kF32, q.shape(), rng);
    Tensor dq_ref(DType::kF32, q.shape()), dk_ref(DType::kF32, kt.shape()),
        dv_ref(DType::kF32, v.shape());
    Dev ddout = dev(dout), dq = dev(DType::kF32, q.shape()), dk = dev(DType::kF32, kt.shape()),
        dv = dev(DType::kF32, v.shape());
    k().attention_backward(dq_in, dk_in, dv_in, o, ddout, lse, dq, dk, dv, cs.params);
    ref::attention_backward(q, kt, v, o_ref, dout, lse_ref, dq_ref, dk_ref, dv_ref, cs.params);
    expect_close(dq, dq_ref, 1e-3, 1e-4, "dq " + what);
    expect_close(dk, dk_ref, 1e-3, 1e-4, "dk " + what);
    expect_close(dv, dv_ref, 1e-3, 1e-4, "dv " + what);
  }
}

// ||got - want|| / ||want||.
double relative_error(const Tensor& got, const Tensor& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = at(got, i) - at(want, i);
    num += d * d;
    den += at(want, i) * at(want, i);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Both checks of the bf16 attention: the whole tensor's relative error within `rel`, and
// no element off by more than 5 * rel of the largest (a wrong row or tile fails this
// even when the norm hides it).
void expect_close_norm(const Tensor& got, const Tensor& want, double rel, const std::string& what) {
  EXPECT_LE(relative_error(got, want), rel) << what;
  double largest = 0, worst = 0;
  int64_t worst_at = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    largest = std::max(largest, std::fabs(at(want, i)));
    const double d = std::fabs(at(got, i) - at(want, i));
    if (!(d <= worst)) {  // NaN counts as the worst
      worst = std::isnan(d) ? INFINITY : d;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, 5 * rel * largest) << what << ": element " << worst_at;
}

// bf16 q/k/v at head dims 64 and 128: the shapes the CUDA backend runs on the tensor
// cores. Lengths that are not multiples of its 64-row tiles, GQA, Tq < Tk, and both output
// dtypes. The CUDA path rounds P and dS to bf16 before their products (FlashAttention's
// choice), so the check is on the relative error of the whole tensor: <= 1e-2 forward and
// 2e-2 backward, no element off by more than 5x that of the largest, and every element
// was written (poisoned outputs).
TEST_P(BackendParity, AttentionBf16AtModelHeadDims) {
  std::mt19937 rng(55);
  struct Case {
    int64_t b, tq, tk, hq, hkv, hd;
    DType out;
    AttentionParams params = {};
  };
  // Gemma 2's local layers at its head dim: a window and a soft cap (on the CUDA backend
  // these leave the tensor-core path for the portable kernels).
  AttentionParams gemma;
  gemma.window = 40;
  gemma.softcap = 50.0f;
  gemma.scale = 0.0625f;
  for (const Case& cs :
       {Case{2, 77, 77, 4, 2, 64, DType::kF32}, Case{1, 45, 130, 2, 1, 128, DType::kF32},
        Case{1, 128, 128, 3, 3, 64, DType::kBF16}, Case{1, 200, 200, 2, 1, 128, DType::kBF16},
        // GQA 4:1 as in Llama 3, a single query row (decode), Tq < Tk with bf16 out, and
        // a sequence past 1024 tokens.
        Case{1, 1, 150, 8, 2, 64, DType::kBF16}, Case{2, 70, 133, 8, 2, 64, DType::kBF16},
        Case{1, 1030, 1030, 2, 1, 64, DType::kF32}, Case{1, 130, 130, 4, 2, 128, DType::kBF16, gemma},
        Case{1, 30, 100, 2, 1, 64, DType::kF32, gemma}}) {
    const std::string what = "T " + std::to_string(cs.tq) + "/" + std::to_string(cs.tk) + " d " +
                             std::to_string(cs.hd) + " out " + std::string(dtype_name(cs.out)) +
                             " window " + std::to_string(cs.params.window);
    Tensor q = random_tensor(DType::kBF16, {cs.b, cs.tq, cs.hq, cs.hd}, rng);
    Tensor kt = random_tensor(DType::kBF16, {cs.b, cs.tk, cs.hkv, cs.hd}, rng);
    Tensor v = random_tensor(DType::kBF16, {cs.b, cs.tk, cs.hkv, cs.hd}, rng);
    Tensor dout = random_tensor(DType::kBF16, q.shape(), rng);
    Tensor o_ref(DType::kF32, q.shape()), lse_ref(DType::kF32, {cs.b, cs.hq, cs.tq});
    ref::attention_forward(q, kt, v, o_ref, lse_ref, cs.params);
    // The backward reads the forward's output in the dtype the model stores it in.
    Tensor o_in = make_tensor(DType::kBF16, q.shape(), values(o_ref));
    Tensor dq_ref(DType::kF32, q.shape()), dk_ref(DType::kF32, kt.shape()),
        dv_ref(DType::kF32, v.shape());
    ref::attention_backward(q, kt, v, o_in, dout, lse_ref, dq_ref, dk_ref, dv_ref, cs.params);
    auto poisoned = [&](Shape s) {
      return dev(make_tensor(cs.out, s, std::vector<float>(static_cast<size_t>(s.numel()), NAN)));
    };

    Dev dq_in = dev(q), dk_in = dev(kt), dv_in = dev(v), o = poisoned(q.shape()),
        lse = dev(DType::kF32, {cs.b, cs.hq, cs.tq});
    k().attention_forward(dq_in, dk_in, dv_in, o, lse, cs.params);
    expect_close_norm(o.host(), o_ref, 1e-2, "out " + what);
    expect_close(lse, lse_ref, 1e-4, 1e-3, "lse " + what);

    Dev ddout = dev(dout), o_dev = dev(o_in), dq = poisoned(q.shape()), dk = poisoned(kt.shape()),
        dv = poisoned(v.shape());
    k().attention_backward(dq_in, dk_in, dv_in, o_dev, ddout, lse, dq, dk, dv, cs.params);
    expect_close_norm(dq.host(), dq_ref, 2e-2, "dq " + what);
    expect_close_norm(dk.host(), dk_ref, 2e-2, "dk " + what);
    expect_close_norm(dv.host(), dv_ref, 2e-2, "dv " + what);
  }
}

TEST_P(BackendParity, EmbeddingScaled) {
  std::mt19937 rng(6);
  Tensor table = random_tensor(DType::kF32, {13, 24}, rng);
  Tensor ids = make_i32({3, 0, 12, 3, 7});
  Tensor out_ref(DType::kF32, {5, 24});
  Dev dtab = dev(table), dids = dev(ids), out = dev(DType::kF32, {5, 24});
  k().embedding_forward(dtab, dids, out, 4.0f);
  ref::embedding_forward(table, ids, out_ref, 4.0f);
  expect_close(out, out_ref, 0, 0, "forward");
  Tensor dt_ref = Tensor::zeros(DType::kF32, {13, 24});
  Dev dt = dev(DType::kF32, {13, 24});
  k().embedding_backward(dids, out, dt, 4.0f);
  ref::embedding_backward(ids, out_ref, dt_ref, 4.0f);
  expect_close(dt, dt_ref, 1e-6, 1e-6, "backward");

  // More ids than the CUDA kernel stages at once (2048), in bf16, many repeats per row:
  // the sums must still run in ascending position (up to fused multiply-adds).
  std::vector<int32_t> many(5000);
  for (int32_t& id : many) id = static_cast<int32_t>(rng() % 300);
  Tensor ids2 = make_i32(many);
  Tensor dout2 = random_tensor(DType::kBF16, {5000, 70}, rng);
  Tensor dt2_ref = Tensor::zeros(DType::kF32, {300, 70});
  Dev dids2 = dev(ids2), ddout2 = dev(dout2), dt2 = dev(DType::kF32, {300, 70});
  k().embedding_backward(dids2, ddout2, dt2, 0.5f);
  ref::embedding_backward(ids2, dout2, dt2_ref, 0.5f);
  expect_close(dt2, dt2_ref, 1e-6, 1e-6, "backward, 5000 ids");
}

// An id outside the vocabulary is an error naming it, on every backend (a device backend
// raises it at its next synchronisation).
TEST_P(BackendParity, EmbeddingRefusesAnIdOutsideTheVocabulary) {
  std::mt19937 rng(6);
  Tensor table = random_tensor(DType::kF32, {13, 8}, rng);
  Dev dtab = dev(table), dids = dev(make_i32({3, 13})), out = dev(DType::kF32, {2, 8});
  expect_error(
      [&] {
        k().embedding_forward(dtab, dids, out, 1.0f);
        k().synchronize();
      },
      {"embedding", "13"});
}

// Greedy picks: the first largest of each row at widths around the vector and block
// sizes, with ties (the lower index wins) and -inf; a row holding a NaN, or nothing above
// -inf, gives -1.
TEST_P(BackendParity, ArgmaxRows) {
  std::mt19937 rng(9);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 7, 16, 33, 257, 4099, 32000}) {
    const int64_t rows = 9;
    Tensor x = random_tensor(DType::kF32, {rows, n}, rng, 3.0f);
    float* p = x.as<float>();
    p[1 * n + n / 2] = 100.0f;  // row 1: a tie at the middle and the end
    p[1 * n + n - 1] = 100.0f;
    p[2 * n + n - 1] = std::numeric_limits<float>::quiet_NaN();  // row 2: NaN last
    for (int64_t j = 0; j < n; ++j) p[3 * n + j] = ninf;     // row 3: all -inf
    for (int64_t j = 0; j < n; ++j)  // row 4: NaN and -inf only
      p[4 * n + j] = j % 2 ? ninf : std::numeric_limits<float>::quiet_NaN();
    for (int64_t j = 0; j < n; ++j) p[5 * n + j] = 1.5f;  // row 5: all equal
    p[6 * n + n - 1] = 50.0f;                              // row 6: the last
    Tensor want(DType::kI32, {rows});
    ref::argmax_rows(x, want);
    EXPECT_EQ(want.as<int32_t>()[2], -1);
    EXPECT_EQ(want.as<int32_t>()[3], -1);
    EXPECT_EQ(want.as<int32_t>()[4], -1);
    EXPECT_EQ(want.as<int32_t>()[5], 0);
    if (n > 2) {
      EXPECT_EQ(want.as<int32_t>()[1], n / 2);
    }
    Dev dx = dev(x), out = dev(DType::kI32, {rows});
    k().argmax_rows(dx, out);
    const std::vector<int32_t> got = out.vec<int32_t>();
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(got[static_cast<size_t>(r)], want.as<int32_t>()[r]) << "n " << n << " row " << r;
  }
}

TEST_P(BackendParity, CrossEntropy) {
  std::mt19937 rng(7);
  const int64_t n = 6, v = 41;
  Tensor logits = random_tensor(DType::kF32, {n, v}, rng, 3.0f);
  Tensor targets = make_i32({1, 40, kIgnoreIndex, 0, 17, 3});
  Tensor d_ref(DType::kF32, {n, v});
  Dev dl = dev(logits), dt = dev(targets), d = dev(DType::kF32, {n, v});
  const CrossEntropyResult f = k().cross_entropy_forward(dl, dt);
  const CrossEntropyResult r = k().cross_entropy_fused(dl, dt, d, 0.5f);
  const CrossEntropyResult want = ref::cross_entropy(logits, targets, d_ref, 0.5f);
  EXPECT_EQ(f.count, want.count);
  EXPECT_EQ(r.count, want.count);
  EXPECT_NEAR(f.loss, want.loss, 1e-5 * std::fabs(want.loss));
  EXPECT_NEAR(r.loss, want.loss, 1e-5 * std::fabs(want.loss));
  expect_close(d, d_ref, 1e-4, 1e-6, "dlogits");

  // Gemma 2's final_logit_softcapping, with logits beyond the cap; then in place (the
  // trainer's form: dlogits is the logits' buffer).
  Tensor big = random_tensor(DType::kF32, {n, v}, rng, 40.0f);
  Tensor dc_ref(DType::kF32, {n, v});
  const CrossEntropyResult cw =
      ref::cross_entropy(big, targets, dc_ref, 0.5f, TensorView(), kIgnoreIndex, 30.0f);
  Dev db = dev(big), dc = dev(DType::kF32, {n, v});
  const CrossEntropyResult cf = k().cross_entropy_forward(db, dt, 30.0f);
  const CrossEntropyResult cr = k().cross_entropy_fused(db, dt, dc, 0.5f, 30.0f);
  EXPECT_EQ(cr.count, cw.count);
  EXPECT_NEAR(cf.loss, cw.loss, 1e-5 * std::fabs(cw.loss));
  EXPECT_NEAR(cr.loss, cw.loss, 1e-5 * std::fabs(cw.loss));
  expect_close(dc, dc_ref, 1e-4, 1e-6, "capped dlogits");
  const CrossEntropyResult ci = k().cross_entropy_fused(db, dt, db, 0.5f, 30.0f);
  EXPECT_NEAR(ci.loss, cw.loss, 1e-5 * std::fabs(cw.loss));
  expect_close(db, dc_ref, 1e-4, 1e-6, "capped dlogits in place");
  expect_error([&] { k().cross_entropy_forward(db, dt, -1.0f); }, {"softcap", "-1"});
}

// The soft cap in place and the post-norm residual add (f32 or bf16 into f32).
TEST_P(BackendParity, SoftCapAndResidualAdd) {
  std::mt19937 rng(34);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const double rel = dt == DType::kBF16 ? 1e-2 : 1e-5;
    Tensor x = random_tensor(dt, {3, 70}, rng, 80.0f);
    Tensor want = make_tensor(DType::kF32, x.shape(), values(x));
    ref::softcap_forward(want, 30.0f);
    Dev dx = dev(x);
    k().softcap_forward(dx, 30.0f);
    expect_close(dx, want, rel, 1e-5, "softcap " + std::string(dtype_name(dt)));

    Tensor y = random_tensor(DType::kF32, {3, 70}, rng);
    Tensor sum = make_tensor(DType::kF32, y.shape(), values(y));
    ref::residual_add(x, sum);
    Dev dr = dev(x), dy = dev(y);
    k().residual_add(dr, dy);
    expect_close(dy, sum, 1e-6, 1e-5, "residual_add " + std::string(dtype_name(dt)));
  }
}

// Dropout's keyed mask: the backend gives the host reference's bits in every dtype pair.
TEST_P(BackendParity, DropoutMaskEqualsTheHosts) {
  std::mt19937 rng(35);
  for (DType xd : {DType::kF32, DType::kBF16})
    for (DType yd : {DType::kF32, DType::kBF16})
      for (bool acc : {false, true}) {
        const Tensor x = random_tensor(xd, {5, 301}, rng);
        const Tensor y = random_tensor(yd, {5, 301}, rng);
        Tensor want = make_tensor(yd, y.shape(), values(y));
        ref::dropout_apply(x, want, 0.25f, 0xfeedULL, acc);
        Dev dx = dev(x), dy = dev(y);
        k().dropout_apply(dx, dy, 0.25f, 0xfeedULL, acc);
        expect_close(dy, want, 0.0, 0.0, "dropout " + std::string(dtype_name(xd)) + "->" + std::string(dtype_name(yd)));
      }
  expect_error([&] { k().dropout_apply(dev(DType::kF32, {4}), dev(DType::kF32, {4}), 1.0f, 1, false); },
               {"dropout_apply", "p"});
}

TEST_P(BackendParity, PagedCacheWriteReadAndAttention) {
  std::mt19937 rng(8);
  const int64_t pages = 4, page_tokens = 4, hkv = 2, hd = 8, hq = 4, len = 10;
  for (DType cache_dtype : {DType::kF32, DType::kI8}) {
    const int64_t cache_elems = pages * page_tokens * hkv * hd;
    Dev kbuf = dev(cache_dtype, {cache_elems}), vbuf = dev(cache_dtype, {cache_elems});
    Dev kscale = dev(DType::kF32, {pages * page_tokens * hkv}),
        vscale = dev(DType::kF32, {pages * page_tokens * hkv});
    PagedKvCache cache;
    cache.k = kbuf.data();
    cache.v = vbuf.data();
    if (cache_dtype == DType::kI8) {
      cache.k_scale = kscale.as<float>();
      cache.v_scale = vscale.as<float>();
    }
    cache.dtype = cache_dtype;
    cache.num_pages = pages;
    cache.page_tokens = page_tokens;
    cache.n_kv_heads = hkv;
    cache.head_dim = hd;
    const std::vector<int32_t> table = {2, 0, 3};  // positions 0..11 over pages 2, 0, 3
    std::vector<int64_t> slots;
    for (int64_t p = 0; p < len; ++p)
      slots.push_back(table[static_cast<size_t>(p / page_tokens)] * page_tokens + p % page_tokens);
    Tensor kn = random_tensor(DType::kF32, {len, hkv, hd}, rng),
           vn = random_tensor(DType::kF32, {len, hkv, hd}, rng);
    Dev dkn = dev(kn), dvn = dev(vn);
    k().paged_kv_write(cache, dkn, dvn, slots.data());
    Dev kr = dev(DType::kF32, {len, hkv, hd}), vr = dev(DType::kF32, {len, hkv, hd});
    k().paged_kv_read(cache, table.data(), len, kr, vr);
    const double tol = cache_dtype == DType::kI8 ? 0.02 : 0;  // int8: half a step of absmax/127
    expect_close(kr, kn, 0, tol * 3, "k read back");
    expect_close(vr, vn, 0, tol * 3, "v read back");
    Tensor q = random_tensor(DType::kF32, {1, hq, hd}, rng);
    Tensor o_ref(DType::kF32, {1, hq, hd});
    Dev dq = dev(q), o = dev(DType::kF32, {1, hq, hd});
    const PagedAttentionRow row{table.data(), len};
    k().paged_attention(cache, dq, &row, o, PagedAttentionParams{});
    // The reference reads a host copy of the cache.
    std::vector<unsigned char> kh(static_cast<size_t>(cache_elems) * dtype_size(cache_dtype)),
        vh(kh.size());
    k().download(kbuf.data(), kh.data(), kh.size());
    k().download(vbuf.data(), vh.data(), vh.size());
    std::vector<float> ksh = kscale.vec<float>(), vsh = vscale.vec<float>();
    PagedKvCache host_cache = cache;
    host_cache.k = kh.data();
    host_cache.v = vh.data();
    if (cache_dtype == DType::kI8) {
      host_cache.k_scale = ksh.data();
      host_cache.v_scale = vsh.data();
    }
    ref::paged_attention(host_cache, q, &row, o_ref);
    expect_close(o, o_ref, 1e-4, 1e-5,
                 std::string("paged attention ") + std::string(dtype_name(cache_dtype)));

    // A window of 5 over the 10 keys, with capped scores: the row starts in its second
    // page, so its first entry may name a released page (-1); it is neither read nor
    // looked up.
    PagedAttentionParams local;
    local.window = 5;
    local.softcap = 3.0f;
    const std::vector<int32_t> released = {-1, 0, 3};
    const PagedAttentionRow local_row{released.data(), len};
    Dev o_local = dev(DType::kF32, {1, hq, hd});
    k().paged_attention(cache, dq, &local_row, o_local, local);
    Tensor o_local_ref(DType::kF32, {1, hq, hd});
    ref::paged_attention(host_cache, q, &row, o_local_ref, local);
    expect_close(o_local, o_local_ref, 1e-4, 1e-5,
                 std::string("windowed paged attention ") + std::string(dtype_name(cache_dtype)));
  }
}

TEST_P(BackendParity, MixtureOfExpertsOps) {
  std::mt19937 rng(10);
  const int64_t b = 2, t = 7, n = b * t, e = 5, kk = 2, d = 12, f = 10;
  std::vector<float> logits = randn(static_cast<size_t>(n * e), rng);
  std::vector<float> probs_ref(static_cast<size_t>(n * e)),
      weights_ref(static_cast<size_t>(n * kk));
  std::vector<int32_t> experts_ref(static_cast<size_t>(n * kk));
  Dev dlog = dev(logits), dprobs = dev(DType::kF32, {n * e}), dweights = dev(DType::kF32, {n * kk}),
      dexperts = dev(DType::kI32, {n * kk});
  k().router_topk_forward(dlog.as<float>(), n, e, kk, true, dprobs.as<float>(),
                          dexperts.as<int32_t>(), dweights.as<float>());
  ref::router_topk_forward(logits.data(), n, e, kk, true, probs_ref.data(), experts_ref.data(),
                           weights_ref.data());
  const std::vector<int32_t> experts = dexperts.vec<int32_t>();
  const std::vector<float> probs = dprobs.vec<float>(), weights = dweights.vec<float>();
  EXPECT_EQ(experts, experts_ref);
  for (size_t i = 0; i < probs.size(); ++i) ASSERT_NEAR(probs[i], probs_ref[i], 1e-6);
  for (size_t i = 0; i < weights.size(); ++i) ASSERT_NEAR(weights[i], weights_ref[i], 1e-6);
  std::vector<float> dw = randn(weights.size(), rng), dl_ref(logits.size());
  Dev ddw = dev(dw), ddl = dev(DType::kF32, {n * e});
  k().router_topk_backward(dprobs.as<float>(), dexperts.as<int32_t>(), dweights.as<float>(),
                           ddw.as<float>(), nullptr, n, e, kk, true, ddl.as<float>());
  ref::router_topk_backward(probs.data(), experts.data(), weights.data(), dw.data(), nullptr, n, e,
                            kk, true, dl_ref.data());
  const std::vector<float> dl = ddl.vec<float>();
  for (size_t i = 0; i < dl.size(); ++i) ASSERT_NEAR(dl[i], dl_ref[i], 1e-5);
  EXPECT_NEAR(k().load_balance_loss(dprobs.as<float>(), dexperts.as<int32_t>(), b, t, e, kk, 0.01f,
                                    nullptr, 0),
              ref::load_balance_loss(probs.data(), experts.data(), b, t, e, kk, 0.01f, nullptr, 0),
              1e-6);
  EXPECT_NEAR(k().router_z_loss(dlog.as<float>(), n, e, 0.001f, nullptr, 0),
              ref::router_z_loss(logits.data(), n, e, 0.001f, nullptr, 0), 1e-6);

  // The dispatch plan is made on the host (its index arrays stay host memory).
  MoeDispatch plan;
  moe_dispatch_plan(experts.data(), b, t, kk, e, -1, &plan);
  const int64_t rows = plan.rows;
  Tensor h = random_tensor(DType::kF32, {n, d}, rng);
  Tensor xs_ref(DType::kF32, {rows, d});
  Dev dh = dev(h), xs = dev(DType::kF32, {rows, d});
  k().moe_gather_rows(dh.data(), DType::kF32, plan.row_token.data(), rows, d, xs.data());
  ref::moe_gather_rows(h.data(), DType::kF32, plan.row_token.data(), rows, d, xs_ref.data());
  expect_close(xs, xs_ref, 0, 0, "gather");
  Tensor w = random_tensor(DType::kF32, {e, f, d}, rng);
  Tensor c_ref(DType::kF32, {rows, f});
  Dev dwt_in = dev(w), c = dev(DType::kF32, {rows, f});
  const std::span<const int64_t> sizes(plan.group_sizes.data(), plan.group_sizes.size());
  k().grouped_gemm(xs, dwt_in, sizes, c, 0.0f);
  ref::grouped_gemm(xs_ref, w, sizes, c_ref);
  expect_close(c, c_ref, 1e-4, 1e-5, "grouped gemm");
  Tensor dxs_ref(DType::kF32, {rows, d});
  Dev dxs = dev(DType::kF32, {rows, d});
  k().grouped_gemm_input_grad(c, dwt_in, sizes, dxs, 0.0f);
  ref::grouped_gemm_input_grad(c_ref, w, sizes, dxs_ref);
  expect_close(dxs, dxs_ref, 1e-4, 1e-4, "grouped gemm input grad");
  Tensor gw_ref = Tensor::zeros(DType::kF32, {e, f, d});
  Dev gw = dev(DType::kF32, {e, f, d});
  k().grouped_gemm_weight_grad(xs, c, sizes, gw);
  ref::grouped_gemm_weight_grad(xs_ref, c_ref, sizes, gw_ref);
  expect_close(gw, gw_ref, 1e-4, 1e-4, "grouped gemm weight grad");
  Tensor out_ref = Tensor::zeros(DType::kF32, {n, d});
  Dev out = dev(DType::kF32, {n, d});
  k().moe_combine(xs.data(), DType::kF32, plan.pair_row.data(), dweights.as<float>(), n, kk, d,
                  out.as<float>());
  ref::moe_combine(xs_ref.data(), DType::kF32, plan.pair_row.data(), weights.data(), n, kk, d,
                   out_ref.as<float>());
  expect_close(out, out_ref, 1e-5, 1e-6, "combine");
  Tensor dy_ref(DType::kF32, {rows, d});
  std::vector<float> dwt_ref(weights.size());
  Dev dy = dev(DType::kF32, {rows, d}), dwt = dev(DType::kF32, {n * kk});
  k().moe_combine_backward(dh.as<float>(), xs.data(), DType::kF32, plan.pair_row.data(),
                           plan.row_token.data(), dweights.as<float>(), n, kk, d, rows, dy.data(),
                           dwt.as<float>());
  ref::moe_combine_backward(h.as<float>(), xs_ref.data(), DType::kF32, plan.pair_row.data(),
                            plan.row_token.data(), weights.data(), n, kk, d, rows, dy_ref.data(),
                            dwt_ref.data());
  expect_close(dy, dy_ref, 1e-5, 1e-6, "combine backward");
  const std::vector<float> dwt_got = dwt.vec<float>();
  for (size_t i = 0; i < dwt_got.size(); ++i) ASSERT_NEAR(dwt_got[i], dwt_ref[i], 1e-4);
  Tensor dsrc_ref = Tensor::zeros(DType::kF32, {n, d});
  Dev dsrc = dev(DType::kF32, {n, d});
  k().moe_scatter_add_rows(xs.data(), DType::kF32, plan.pair_row.data(), n, kk, d,
                           dsrc.as<float>());
  ref::moe_scatter_add_rows(xs_ref.data(), DType::kF32, plan.pair_row.data(), n, kk, d,
                            dsrc_ref.as<float>());
  expect_close(dsrc, dsrc_ref, 1e-5, 1e-6, "scatter add");
}

TEST_P(BackendParity, AdamWAndGlobalNorm) {
  std::mt19937 rng(11);
  const int64_t n = 1037;
  Tensor p = random_tensor(DType::kF32, {n}, rng), g = random_tensor(DType::kF32, {n}, rng);
  Tensor m = random_tensor(DType::kF32, {n}, rng, 0.1f), v = Tensor::zeros(DType::kF32, {n});
  AdamWParams hp;
  hp.lr = 0.01f;
  hp.step = 3;
  hp.grad_scale = 0.5f;
  Tensor p_ref = p.clone(), m_ref = m.clone(), v_ref = v.clone(), b_ref(DType::kBF16, {n});
  Dev dp = dev(p), dg = dev(g), dm = dev(m), dv = dev(v), db = dev(DType::kBF16, {n});
  k().adamw_step(dp, dg, dm, dv, hp, db);
  ref::adamw_step(p_ref, g, m_ref, v_ref, hp, b_ref);
  expect_close(dp, p_ref, 1e-6, 1e-7, "params");
  expect_close(dm, m_ref, 1e-6, 1e-7, "m");
  expect_close(dv, v_ref, 1e-6, 1e-8, "v");
  expect_close(db, b_ref, 1.0 / 128, 0, "bf16 params");
  const Tensor p_now = dp.host();  // the norm of what the backend holds
  const std::vector<TensorView> host_bufs{p_now.view(), g.view()};
  const std::vector<TensorView> dev_bufs{dp.view(), dg.view()};
  EXPECT_NEAR(k().global_l2_norm(dev_bufs), ref::global_l2_norm(host_bufs),
              1e-12 * ref::global_l2_norm(host_bufs));
  k().scale_buffers(dev_bufs, 0.25f);
  const Tensor g_scaled = dg.host();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(at(g_scaled, i), at(g, i) * 0.25f);
}

TEST_P(BackendParity, MemoryOps) {
  std::mt19937 rng(9);
  Tensor a = random_tensor(DType::kF32, {1000}, rng);
  Dev da = dev(a), b = dev(DType::kBF16, {1000}), back = dev(DType::kF32, {1000}),
      c = dev(DType::kF32, {1000});
  k().convert(da.data(), DType::kF32, b.data(), DType::kBF16, 1000);
  k().convert(b.data(), DType::kBF16, back.data(), DType::kF32, 1000);
  expect_close(back, a, 1.0 / 128, 0, "bf16 round trip");
  k().copy(da.data(), c.data(), a.nbytes());
  EXPECT_TRUE(bitwise_equal(a, c.host()));
  k().zero(c.data(), a.nbytes());
  const Tensor z = c.host();
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(at(z, i), 0.0);
  DeviceBuffer buf(k().allocator(), 4096);
  EXPECT_EQ(buf.device(), k().device());
  EXPECT_TRUE(is_aligned(buf.data()));
}

// The device peak a GPU run's MFU is reported against: a GEMM rate measured in the
// backend's own memory (here at a toy size; the trainer uses 8192^3).
TEST_P(BackendParity, MeasuresItsGemmRate) {
  EXPECT_GT(measure_backend_gemm_gflops(k(), DType::kBF16, 64, 0.01), 0.0);
}

// The CUDA backend's status: visible as a skip where this binary has no CUDA or the
// machine no GPU (the parity tests above then run the host backend only).
TEST(CudaBackend, RegisteredWhenADeviceIsUsable) {
  const CudaStatus& s = cuda_status();
  if (!s.available) GTEST_SKIP() << "cuda backend " << s.summary;
  EXPECT_TRUE(s.built);
  EXPECT_EQ(std::string(backend_for(Device::kCuda).name()), "cuda");
  EXPECT_EQ(built_backends().size(), 2u);
  EXPECT_GE(s.compute_capability, 80);
}

TEST(CudaBackend, UnavailableBackendIsRefusedWithTheReason) {
  const CudaStatus& s = cuda_status();
  if (s.available) GTEST_SKIP() << "a GPU is present: " << s.summary;
  for (KernelBackend* b : built_backends())  // a test's simulated device took the slot
    if (b->device() == Device::kCuda) GTEST_SKIP() << "a simulated device is registered";
  expect_error([] { backend_for(Device::kCuda); }, {"no cuda kernel backend", s.summary});
}

// A view on another device is refused by name, never read as host memory.
TEST(HostBackend, RefusesViewsOfAnotherDevice) {
  Tensor x = Tensor::zeros(DType::kF32, {2, 8}), w = Tensor::zeros(DType::kF32, {8});
  Tensor y(DType::kF32, {2, 8}), rs(DType::kF32, {2});
  TensorView on_gpu = x;
  on_gpu.device = Device::kCuda;
  expect_error([&] { host_backend().rmsnorm_forward(on_gpu, w, 1e-6f, y, rs, 0.0f); },
               {"rmsnorm_forward", "host backend", "cuda"});
  EXPECT_EQ(&backend_for(Device::kHost), &host_backend());
}

INSTANTIATE_TEST_SUITE_P(Built, BackendParity, testing::ValuesIn(built_backends()),
                         [](const testing::TestParamInfo<KernelBackend*>& i) {
                           return std::string(i.param->name());
                         });

}  // namespace
}  // namespace hyperion
