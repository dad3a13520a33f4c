#include "model/quantized_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "kernels/quantize.h"
#include "kernels/quantize_train.h"
#include "model/causal_lm.h"
#include "model/linear.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

DecoderConfig small_config() {
  DecoderConfig c;
  c.vocab_size = 61;
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.ffn_dim = 96;
  c.max_seq_len = 32;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000;
  return c;
}

std::vector<bf16> random_bf16(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<bf16> v(n);
  for (bf16& x : v) x = f32_to_bf16(d(rng));
  return v;
}

double rel_l2(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

QuantOptions opts(QuantMode m) {
  QuantOptions o;
  o.mode = m;
  o.amax_history_len = 16;
  o.seed = 7;
  return o;
}

// The int8 forward is the integer GEMM of the per-token and per-channel quantised
// operands, dequantised in f32 by the two scales: it equals that computation exactly.
TEST(QuantizedMatmul, Int8ForwardEqualsIntegerReference) {
  ParamStore ps(small_config(), true);
  ps.init(1, 0.3);
  QuantizedMatmuls q(ps, opts(QuantMode::kInt8), 24);
  const int idx = ps.layer(0).gate;  // [96, 64]
  const int64_t n = 24, in = 64, out = 96;
  const auto x = random_bf16(size_t(n * in), 2);
  std::vector<float> y(size_t(n * out));
  q.begin_pass(true);
  q.forward(idx, q.slot(0, 2), x.data(), y.data(), DType::kF32, n, 0.0f);

  std::vector<int8_t> qx(size_t(n * in)), qw(size_t(out * in));
  std::vector<float> sx(static_cast<size_t>(n)), sw(static_cast<size_t>(out));
  quantize_rows(TensorView(const_cast<bf16*>(x.data()), DType::kBF16, {n, in}),
                TensorView(qx.data(), DType::kI8, {n, in}), sx.data());
  quantize_rows(ps.param(idx), TensorView(qw.data(), DType::kI8, {out, in}), sw.data());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      int32_t acc = 0;
      for (int64_t i = 0; i < in; ++i)
        acc += int32_t(qx[size_t(r * in + i)]) * qw[size_t(o * in + i)];
      const float want = float(acc) * (1.0f * sx[size_t(r)]) * sw[size_t(o)];
      ASSERT_EQ(y[size_t(r * out + o)], want) << r << "," << o;
    }
  // The weights the forward read are the serving path's per-channel int8 weights.
  const float* scales = nullptr;
  const int8_t* w8 = q.int8_weight(idx, &scales);
  EXPECT_EQ(std::memcmp(w8, qw.data(), qw.size()), 0);
  EXPECT_EQ(std::memcmp(scales, sw.data(), sw.size() * 4), 0);
  // Serving with quantize_weights=int8 reads the same int8 matrices: no second rounding.
  LinearWeights serving(ps, WeightFormat::kInt8);
  for (int i : {ps.layer(0).q, ps.layer(1).down, idx}) {
    const float *s_train = nullptr, *s_serve = nullptr;
    const int8_t* w_train = q.int8_weight(i, &s_train);
    const int8_t* w_serve = serving.int8_matrix(i, &s_serve);
    ASSERT_NE(w_serve, nullptr);
    const TensorView w = ps.param(i);
    EXPECT_EQ(std::memcmp(w_train, w_serve, size_t(w.numel())), 0);
    EXPECT_EQ(std::memcmp(s_train, s_serve, size_t(w.shape[0]) * 4), 0);
  }
}

// dx and dW of the quantised Linear against the unquantised (dequantised-input)
// reference: close in one pass, and (stochastic rounding being unbiased) closer on
// average over passes; the same for fp8.
TEST(QuantizedMatmul, GradientsMatchDequantizedReference) {
  for (QuantMode mode : {QuantMode::kInt8, QuantMode::kFp8}) {
    ParamStore ps(small_config(), true);
    ps.init(1, 0.3);
    QuantizedMatmuls q(ps, opts(mode), 32);
    const int idx = ps.layer(1).up;  // [96, 64]
    const int64_t n = 32, in = 64, out = 96;
    const auto x = random_bf16(size_t(n * in), 3);
    const auto dy = random_bf16(size_t(n * out), 4, 0.01f);
    const TensorView w = ps.compute_weight(idx);
    std::vector<double> dx_ref(size_t(n * in), 0.0), dw_ref(size_t(out * in), 0.0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < out; ++o) {
        const double g = bf16_to_f32(dy[size_t(r * out + o)]);
        for (int64_t i = 0; i < in; ++i) {
          dx_ref[size_t(r * in + i)] += g * load_as_f32(w.data, DType::kBF16, size_t(o * in + i));
          dw_ref[size_t(o * in + i)] += g * bf16_to_f32(x[size_t(r * in + i)]);
        }
      }
    // What stochastic rounding averages to (int8): dy times the nearest-rounded W (per
    // input channel) and x (per token), dequantised.
    std::vector<double> dx_det(dx_ref.size(), 0.0), dw_det(dw_ref.size(), 0.0);
    if (mode == QuantMode::kInt8) {
      std::vector<int8_t> qw(static_cast<size_t>(out * in)), qx(static_cast<size_t>(n * in));
      std::vector<float> sw(static_cast<size_t>(in)), sx(static_cast<size_t>(n));
      quantize_cols_int8(ps.param(idx), TensorView(qw.data(), DType::kI8, {out, in}), sw.data());
      quantize_rows(TensorView(const_cast<bf16*>(x.data()), DType::kBF16, {n, in}),
                    TensorView(qx.data(), DType::kI8, {n, in}), sx.data());
      for (int64_t r = 0; r < n; ++r)
        for (int64_t o = 0; o < out; ++o) {
          const double g = bf16_to_f32(dy[size_t(r * out + o)]);
          for (int64_t i = 0; i < in; ++i) {
            dx_det[size_t(r * in + i)] += g * qw[size_t(o * in + i)] * double(sw[size_t(i)]);
            dw_det[size_t(o * in + i)] += g * qx[size_t(r * in + i)] * double(sx[size_t(r)]);
          }
        }
    }
    const int passes = 32;
    double first_dx_det = 0, first_dw_det = 0;
    std::vector<double> dx_mean(dx_ref.size(), 0.0), dw_mean(dw_ref.size(), 0.0);
    double first_dx = 0, first_dw = 0;
    std::vector<float> y(size_t(n * out)), dx(size_t(n * in));
    for (int p = 0; p < passes; ++p) {
      ps.zero_grads();
      q.begin_pass(true);
      q.forward(idx, q.slot(1, 2), x.data(), y.data(), DType::kF32, n, 0.0f);
      q.backward(idx, q.slot(1, 2), dy.data(), dx.data(), DType::kF32, n, 0.0f);
      const TensorView g = ps.grad(idx);
      std::vector<double> dxd(dx.begin(), dx.end());
      std::vector<double> dwd(static_cast<const float*>(g.data),
                              static_cast<const float*>(g.data) + out * in);
      if (p == 0) {
        first_dx = rel_l2(dxd, dx_ref);
        first_dw = rel_l2(dwd, dw_ref);
        if (mode == QuantMode::kInt8) {
          first_dx_det = rel_l2(dxd, dx_det);
          first_dw_det = rel_l2(dwd, dw_det);
        }
      }
      for (size_t i = 0; i < dxd.size(); ++i) dx_mean[i] += dxd[i] / passes;
      for (size_t i = 0; i < dwd.size(); ++i) dw_mean[i] += dwd[i] / passes;
    }
    const double tol = mode == QuantMode::kInt8 ? 0.03 : 0.12;
    EXPECT_LT(first_dx, tol) << quant_mode_name(mode);
    EXPECT_LT(first_dw, tol) << quant_mode_name(mode);
    if (mode == QuantMode::kInt8) {
      // Unbiased: over 32 passes (32 seeds) the mean approaches the expectation, the
      // deterministic quantisation of W and x, as 1/sqrt(32) (margin: 1/3).
      EXPECT_LT(rel_l2(dx_mean, dx_det), first_dx_det / 3);
      EXPECT_LT(rel_l2(dw_mean, dw_det), first_dw_det / 3);
    }
  }
}

// The AMX kernel path (forward, dx and the transposed-gradient dW) equals the oneDNN path
// bit for bit (on machines without AMX both runs take oneDNN).
TEST(QuantizedMatmul, AmxAndOneDnnPathsAgreeBitForBit) {
  const int64_t n = 128, in = 64, out = 96;
  std::vector<std::vector<float>> results;
  for (bool amx : {true, false}) {
    ParamStore ps(small_config(), true);
    ps.init(1, 0.3);
    QuantOptions o = opts(QuantMode::kInt8);
    o.use_amx = amx;
    QuantizedMatmuls q(ps, o, n);
    const int idx = ps.layer(0).up;
    const auto x = random_bf16(static_cast<size_t>(n * in), 11);
    const auto dy = random_bf16(static_cast<size_t>(n * out), 12, 0.01f);
    std::vector<bf16> y(static_cast<size_t>(n * out));
    std::vector<float> dx(static_cast<size_t>(n * in), 0.5f);
    ps.zero_grads();
    q.begin_pass(true);
    q.forward(idx, q.slot(0, 2), x.data(), y.data(), DType::kBF16, n, 0.0f);
    q.backward(idx, q.slot(0, 2), dy.data(), dx.data(), DType::kF32, n, 1.0f);
    std::vector<float> all(dx);
    for (bf16 v : y) all.push_back(bf16_to_f32(v));
    const TensorView g = ps.grad(idx);
    all.insert(all.end(), static_cast<const float*>(g.data),
               static_cast<const float*>(g.data) + out * in);
    results.push_back(std::move(all));
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * 4), 0);
}

// int8 keeps its quantised weights across passes until weights_changed() (an optimizer
// step): micro-batches and evaluation passes of one step reuse them.
TEST(QuantizedMatmul, Int8WeightsRequantiseOnlyWhenChanged) {
  ParamStore ps(small_config(), true);
  ps.init(1, 0.3);
  QuantizedMatmuls q(ps, opts(QuantMode::kInt8), 8);
  const int idx = ps.layer(0).v;
  const float* s = nullptr;
  q.begin_pass(true);
  const int8_t before = q.int8_weight(idx, &s)[0];
  const float scale_before = s[0];
  float* w = static_cast<float*>(ps.param(idx).data);
  for (int64_t i = 0; i < 64; ++i) w[i] = -w[i];  // row 0 negated: same scale, q negated
  q.begin_pass(true);
  EXPECT_EQ(q.int8_weight(idx, &s)[0], before);  // not told: the step's copy
  q.weights_changed();
  q.begin_pass(false);
  EXPECT_EQ(q.int8_weight(idx, &s)[0], -before);
  EXPECT_EQ(s[0], scale_before);
}

TEST(AmaxHistory, RollMaxMarginAndFirstSteps) {
  AmaxHistory h(4);
  EXPECT_EQ(h.scale(448.0f, 0.0f), 0.0f);  // empty: the caller uses the current amax
  h.record(1.0f, 0);
  h.record(3.0f, 1);
  EXPECT_EQ(h.filled(), 2);
  EXPECT_EQ(h.scale(448.0f, 0.0f), 3.0f / 448.0f);
  EXPECT_EQ(h.scale(448.0f, 1.0f), 6.0f / 448.0f);  // margin: x 2^margin
  h.record(0.5f, 2);
  h.record(0.25f, 3);
  h.record(0.5f, 4);  // overwrites pass 0's 1.0
  EXPECT_EQ(h.scale(448.0f, 0.0f), 3.0f / 448.0f);
  h.record(0.1f, 5);  // overwrites pass 1's 3.0: the max rolls out
  EXPECT_EQ(h.filled(), 4);
  EXPECT_EQ(h.scale(448.0f, 0.0f), 0.5f / 448.0f);
  EXPECT_EQ(h.values(), (std::vector<float>{0.5f, 0.1f, 0.5f, 0.25f}));
}

// Delayed scaling in the model's matmuls: the first training pass scales by its own amax;
// the next pass uses the history (so a larger input saturates); evaluation passes do not
// record.
TEST(QuantizedMatmul, Fp8DelayedScalingRecordsOncePerTrainingPass) {
  ParamStore ps(small_config(), true);
  ps.init(1, 0.3);
  QuantizedMatmuls q(ps, opts(QuantMode::kFp8), 8);
  const int idx = ps.layer(0).q;
  const int64_t n = 8, in = 64, out = 64;
  auto x = random_bf16(size_t(n * in), 5);
  float amax = 0;
  for (bf16 v : x) amax = std::max(amax, std::fabs(bf16_to_f32(v)));
  std::vector<float> y(size_t(n * out)), y2(y.size());
  auto history_of = [&](const std::string& name) {
    for (const auto& [nm, v] : q.histories())
      if (nm == name) return v;
    ADD_FAILURE() << "no history " << name;
    return std::vector<float>();
  };
  const std::string xname = "model.layers.0.attention_input.input_amax_history";
  q.begin_pass(true);
  q.forward(idx, q.slot(0, 0), x.data(), y.data(), DType::kF32, n, 0.0f);
  // k shares q's input slot: quantised and recorded once.
  q.forward(ps.layer(0).k, q.slot(0, 0), x.data(), y2.data(), DType::kF32, n, 0.0f);
  EXPECT_EQ(history_of(xname)[0], amax);
  EXPECT_EQ(history_of(xname)[1], 0.0f);
  q.begin_pass(false);  // evaluation: no record
  q.forward(idx, q.slot(0, 0), x.data(), y.data(), DType::kF32, n, 0.0f);
  EXPECT_EQ(history_of(xname)[1], 0.0f);
  // A pass with inputs 4x larger: scaled by the history (amax / 448), so values above
  // 448 * amax / 4... saturate at 448 * scale = amax; the new amax is recorded after.
  for (bf16& v : x) v = f32_to_bf16(4.0f * bf16_to_f32(v));
  q.begin_pass(true);
  q.forward(idx, q.slot(0, 0), x.data(), y.data(), DType::kF32, n, 0.0f);
  EXPECT_EQ(history_of(xname)[1], 4.0f * amax);
  EXPECT_EQ(q.passes(), 2u);
  // Restore puts the counter and histories back.
  QuantizedMatmuls r(ps, opts(QuantMode::kFp8), 8);
  r.restore(q.passes(), q.histories());
  EXPECT_EQ(r.histories(), q.histories());
  EXPECT_EQ(r.passes(), 2u);
}

// The whole quantised model: one forward/backward gives bitwise the same loss and
// gradients at 1 and 2 threads, in both modes.
TEST(QuantizedMatmul, ModelStepIsBitwiseEqualAtOneAndTwoThreads) {
  const int saved = num_threads();
  for (QuantMode mode : {QuantMode::kInt8, QuantMode::kFp8}) {
    std::vector<std::vector<float>> grads;
    std::vector<double> losses;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      ParamStore ps(small_config(), true);
      ps.init(3, 0.3);
      ModelOptions mo(2, 16, true, RematPolicy::kMinimal);
      mo.quant = opts(mode);
      CausalLM m(ps, mo);
      std::mt19937 rng(4);
      std::vector<int32_t> in(32), tg(32);
      for (auto& t : in) t = int32_t(rng() % 61);
      for (auto& t : tg) t = int32_t(rng() % 61);
      losses.push_back(m.forward_backward(in.data(), tg.data(), 1.0f).loss);
      grads.emplace_back(ps.grads(), ps.grads() + ps.size());
    }
    EXPECT_EQ(losses[0], losses[1]) << quant_mode_name(mode);
    EXPECT_EQ(std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * 4), 0)
        << quant_mode_name(mode);
  }
  set_num_threads(saved);
}

TEST(QuantizedMatmul, BadSettingsAreRefusedByName) {
  EXPECT_THROW(parse_quant_mode("int4", "config key quantization"), Error);
  EXPECT_EQ(parse_quant_mode("", "q"), QuantMode::kOff);
  ParamStore f32(small_config(), false);
  EXPECT_THROW(QuantizedMatmuls(f32, opts(QuantMode::kInt8), 8), Error);
}

}  // namespace
}  // namespace hyperion
