#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

Tensor random_tensor(DType dtype, Shape shape, std::mt19937& rng, float stddev = 1.0f) {
  Tensor t(dtype, shape);
  std::normal_distribution<float> dist(0.0f, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kF32)
      t.as<float>()[i] = dist(rng);
    else
      t.as<bf16>()[i] = f32_to_bf16(dist(rng));
  }
  return t;
}

double at(const Tensor& t, int64_t i) {
  return load_as_f32(t.data(), t.dtype(), static_cast<size_t>(i));
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Largest |got - want| relative to the largest |want| (at least 1), so that tolerances
// are stated against the scale of the tensor rather than of each (possibly tiny) element.
double scaled_error(const Tensor& got, const Tensor& want) {
  double err = 0, scale = 1;
  for (int64_t i = 0; i < want.numel(); ++i) {
    err = std::max(err, std::fabs(at(got, i) - at(want, i)));
    scale = std::max(scale, std::fabs(at(want, i)));
  }
  return err / scale;
}

struct Case {
  int64_t b, tq, tk, hq, hkv, d;
  bool causal;
  Shape q_shape() const { return {b, tq, hq, d}; }
  Shape kv_shape() const { return {b, tk, hkv, d}; }
  Shape lse_shape() const { return {b, hq, tq}; }
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "B=" << c.b << " Tq=" << c.tq << " Tk=" << c.tk << " Hq=" << c.hq << " Hkv=" << c.hkv
            << " D=" << c.d << (c.causal ? " causal" : " full");
}

// T = 1, 7, 64, 100, 130 (block tails on both sides of 64), D = 16, 40, 64 and beyond,
// Hq / Hkv = 1, 2, 4, B = 1, 2, causal and not, and query offsets (Tq < Tk).
const std::vector<Case> kCases = {
    {1, 1, 1, 1, 1, 16, true},      {1, 7, 7, 2, 1, 16, true},     {2, 7, 7, 4, 1, 40, false},
    {1, 64, 64, 2, 2, 64, true},    {2, 64, 64, 4, 2, 64, false},  {1, 100, 100, 4, 4, 40, true},
    {1, 100, 100, 2, 1, 64, false}, {2, 130, 130, 4, 1, 16, true}, {1, 130, 130, 2, 2, 64, true},
    {1, 130, 130, 4, 2, 40, false}, {1, 5, 70, 2, 1, 64, true},    {1, 64, 130, 2, 2, 40, true},
    {2, 33, 100, 4, 2, 16, false},  {1, 70, 200, 2, 1, 64, true},  {1, 70, 20, 2, 1, 16, false},
    {1, 65, 65, 2, 1, 128, true},   {1, 20, 20, 1, 1, 200, true},  {1, 9, 9, 3, 3, 1, true},
};

// Tolerances relative to the tensor's largest magnitude (see scaled_error) against the
// f64 reference. f32 (observed <= 1.1e-6): summation order and the exp2 polynomial
// (~2e-7). bf16 (observed <= 3.6e-3): outputs are rounded once (2^-9 of each value); the
// backward also uses the rounded out in rowsum(dO * O).
double fwd_tol(DType dt) {
  return dt == DType::kF32 ? 5e-6 : 1.0 / 128;
}
double bwd_tol(DType dt) {
  return dt == DType::kF32 ? 1e-5 : 1.0 / 128;
}

struct Inputs {
  Tensor q, k, v, dout;
  Inputs(const Case& c, DType dt, std::mt19937& rng, float stddev = 1.0f)
      : q(random_tensor(dt, c.q_shape(), rng, stddev)),
        k(random_tensor(dt, c.kv_shape(), rng, stddev)),
        v(random_tensor(dt, c.kv_shape(), rng)),
        dout(random_tensor(dt, c.q_shape(), rng)) {}
};

struct Grads {
  Tensor dq, dk, dv;
  Grads(const Case& c, DType dt)
      : dq(dt, c.q_shape()), dk(dt, c.kv_shape()), dv(dt, c.kv_shape()) {}
};

// Every backward schedule with `params` (tiles as it says) against the gradients `ref`.
void expect_backward_matches(const Case& c, DType dt, const Inputs& in, const Tensor& out,
                             const Tensor& lse, const Grads& ref, AttentionParams params) {
  for (auto schedule : {AttentionBackwardSchedule::kPerKvHead, AttentionBackwardSchedule::kPerHead,
                        AttentionBackwardSchedule::kSplit}) {
    SCOPED_TRACE(testing::Message() << "schedule " << int(schedule));
    params.schedule = schedule;
    Grads g(c, dt);
    attention_backward(in.q, in.k, in.v, out, in.dout, lse, g.dq, g.dk, g.dv, params);
    EXPECT_LE(scaled_error(g.dq, ref.dq), bwd_tol(dt));
    EXPECT_LE(scaled_error(g.dk, ref.dk), bwd_tol(dt));
    EXPECT_LE(scaled_error(g.dv, ref.dv), bwd_tol(dt));
  }
}

TEST(Attention, ForwardMatchesReference) {
  std::mt19937 rng(1);
  for (DType dt : {DType::kF32, DType::kBF16})
    for (const Case& c : kCases) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << c);
      Inputs in(c, dt, rng);
      AttentionParams params;
      params.causal = c.causal;
      // Reference outputs in f32: the kernel's bf16 output is compared with the exact value.
      Tensor out_ref(DType::kF32, c.q_shape()), lse_ref(DType::kF32, c.lse_shape());
      ref::attention_forward(in.q, in.k, in.v, out_ref, lse_ref, params);
      for (bool portable : {false, true}) {
        if (portable && c.tq * c.tk > 100 * 100) continue;  // scalar tiles: keep it quick
        SCOPED_TRACE(portable ? "portable" : "simd");
        params.force_portable = portable;
        Tensor out(dt, c.q_shape()), lse(DType::kF32, c.lse_shape());
        attention_forward(in.q, in.k, in.v, out, lse, params);
        EXPECT_LE(scaled_error(out, out_ref), fwd_tol(dt));
        EXPECT_LE(scaled_error(lse, lse_ref), 2e-6);
      }
    }
}

TEST(Attention, BackwardMatchesReference) {
  std::mt19937 rng(2);
  for (DType dt : {DType::kF32, DType::kBF16})
    for (const Case& c : kCases) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << c);
      Inputs in(c, dt, rng);
      AttentionParams params;
      params.causal = c.causal;
      Tensor out(dt, c.q_shape()), lse(DType::kF32, c.lse_shape());
      attention_forward(in.q, in.k, in.v, out, lse, params);
      Grads ref(c, DType::kF32);
      ref::attention_backward(in.q, in.k, in.v, out, in.dout, lse, ref.dq, ref.dk, ref.dv, params);
      for (bool portable : {false, true}) {
        if (portable && c.tq * c.tk > 100 * 100) continue;  // scalar tiles: keep it quick
        SCOPED_TRACE(portable ? "portable" : "simd");
        params.force_portable = portable;
        expect_backward_matches(c, dt, in, out, lse, ref, params);
      }
    }
}

TEST(Attention, LargeScoresAndCustomScaleStayStable) {
  // Scores of several hundred: the online softmax must rescale, not overflow.
  std::mt19937 rng(3);
  const Case c{1, 150, 150, 2, 1, 32, true};
  Inputs in(c, DType::kF32, rng, 4.0f);
  for (float scale : {0.0f, 0.7f}) {
    SCOPED_TRACE(testing::Message() << "scale " << scale);
    AttentionParams params;
    params.scale = scale;
    Tensor out(DType::kF32, c.q_shape()), lse(DType::kF32, c.lse_shape());
    Tensor out_ref(DType::kF32, c.q_shape()), lse_ref(DType::kF32, c.lse_shape());
    attention_forward(in.q, in.k, in.v, out, lse, params);
    ref::attention_forward(in.q, in.k, in.v, out_ref, lse_ref, params);
    EXPECT_LE(scaled_error(out, out_ref), 1e-4);
    // lse is a few hundred here: relative agreement.
    EXPECT_LE(scaled_error(lse, lse_ref), 1e-6);
    Grads g(c, DType::kF32), ref(c, DType::kF32);
    attention_backward(in.q, in.k, in.v, out, in.dout, lse, g.dq, g.dk, g.dv, params);
    ref::attention_backward(in.q, in.k, in.v, out, in.dout, lse, ref.dq, ref.dk, ref.dv, params);
    EXPECT_LE(scaled_error(g.dq, ref.dq), 1e-4);
    EXPECT_LE(scaled_error(g.dk, ref.dk), 1e-4);
    EXPECT_LE(scaled_error(g.dv, ref.dv), 1e-4);
  }
}

TEST(Attention, MixedDtypes) {
  // bf16 activations with f32 gradients (and the reverse) are accepted; each tensor is
  // converted at the tile boundary.
  std::mt19937 rng(4);
  const Case c{1, 70, 70, 4, 2, 40, true};
  Inputs in(c, DType::kBF16, rng);
  Tensor out(DType::kF32, c.q_shape()), lse(DType::kF32, c.lse_shape());
  Tensor out_ref(DType::kF32, c.q_shape()), lse_ref(DType::kF32, c.lse_shape());
  attention_forward(in.q, in.k, in.v, out, lse);
  ref::attention_forward(in.q, in.k, in.v, out_ref, lse_ref);
  EXPECT_LE(scaled_error(out, out_ref), 2e-5);
  Grads g(c, DType::kF32), ref(c, DType::kF32);
  attention_backward(in.q, in.k, in.v, out, in.dout, lse, g.dq, g.dk, g.dv);
  ref::attention_backward(in.q, in.k, in.v, out, in.dout, lse, ref.dq, ref.dk, ref.dv);
  EXPECT_LE(scaled_error(g.dq, ref.dq), 5e-5);
  EXPECT_LE(scaled_error(g.dk, ref.dk), 5e-5);
  EXPECT_LE(scaled_error(g.dv, ref.dv), 5e-5);
}

// Independent f64 forward for the finite differences: L = sum(out * w).
double loss_f64(const Case& c, const std::vector<double>& q, const std::vector<double>& k,
                const std::vector<double>& v, const std::vector<double>& w, double scale,
                int64_t window = 0, double softcap = 0) {
  const int64_t group = c.hq / c.hkv, off = c.tk - c.tq;
  double loss = 0;
  std::vector<double> s(static_cast<size_t>(c.tk));
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.tq; ++i) {
        const int64_t n = c.causal ? off + i + 1 : c.tk;
        const int64_t first = window > 0 ? std::max<int64_t>(0, n - window) : 0;
        const int64_t qi = ((b * c.tq + i) * c.hq + h) * c.d;
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < first; ++j) s[j] = -1e300;  // outside the window
        for (int64_t j = first; j < n; ++j) {
          const int64_t kj = ((b * c.tk + j) * c.hkv + h / group) * c.d;
          double dot = 0;
          for (int64_t e = 0; e < c.d; ++e) dot += q[qi + e] * k[kj + e];
          s[j] = dot * scale;
          if (softcap > 0) s[j] = softcap * std::tanh(s[j] / softcap);
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - mx);
        for (int64_t e = 0; e < c.d; ++e) {
          double o = 0;
          for (int64_t j = 0; j < n; ++j)
            o += std::exp(s[j] - mx) / sum * v[((b * c.tk + j) * c.hkv + h / group) * c.d + e];
          loss += o * w[qi + e];
        }
      }
  return loss;
}

std::vector<double> to_f64(const Tensor& t) {
  std::vector<double> r(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) r[i] = at(t, i);
  return r;
}

// The kernel's f32 gradients of L = sum(out * dout) against central differences of the
// independent f64 loss, for `params`' causality, window and soft cap.
void expect_gradients_match_finite_differences(const Case& c, std::mt19937& rng, float stddev,
                                               AttentionParams params) {
  Inputs in(c, DType::kF32, rng, stddev);
  const double scale = 1.0 / std::sqrt(double(c.d));
  Tensor out(DType::kF32, c.q_shape()), lse(DType::kF32, c.lse_shape());
  Grads g(c, DType::kF32);
  params.causal = c.causal;
  attention_forward(in.q, in.k, in.v, out, lse, params);
  attention_backward(in.q, in.k, in.v, out, in.dout, lse, g.dq, g.dk, g.dv, params);
  std::vector<double> x[3] = {to_f64(in.q), to_f64(in.k), to_f64(in.v)};
  const std::vector<double> w = to_f64(in.dout);
  const Tensor* grads[3] = {&g.dq, &g.dk, &g.dv};
  const char* names[3] = {"dq", "dk", "dv"};
  const double step = 1e-6;
  auto loss = [&] { return loss_f64(c, x[0], x[1], x[2], w, scale, params.window, params.softcap); };
  for (int t = 0; t < 3; ++t)
    for (size_t i = 0; i < x[t].size(); ++i) {
      const double keep = x[t][i];
      x[t][i] = keep + step;
      const double lp = loss();
      x[t][i] = keep - step;
      const double lm = loss();
      x[t][i] = keep;
      const double fd = (lp - lm) / (2 * step);
      EXPECT_NEAR(at(*grads[t], int64_t(i)), fd, 1e-4 * (1 + std::fabs(fd))) << names[t] << " " << i;
    }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(5);
  for (const Case& c : std::vector<Case>{
           {1, 5, 5, 2, 1, 8, true}, {2, 3, 6, 2, 2, 4, true}, {1, 4, 3, 4, 2, 3, false}}) {
    SCOPED_TRACE(testing::Message() << c);
    expect_gradients_match_finite_differences(c, rng, 1.0f, {});
  }
}

// Sliding windows (Mistral's, Gemma's local layers): query p sees keys (p - W, p]. The
// window's edge crosses 64-key blocks at many offsets here (W = 1 .. Tk - 1, Tq < Tk,
// GQA), in both dtypes, every backward schedule, SIMD and portable tiles, against the
// reference; and the reference's gradients against finite differences of an independent
// loss.
TEST(Attention, SlidingWindowMatchesReference) {
  struct WCase {
    Case c;
    int64_t window;
  };
  const std::vector<WCase> cases = {
      {{1, 130, 130, 2, 1, 16, true}, 1},   {{1, 130, 130, 2, 2, 40, true}, 5},
      {{2, 130, 130, 4, 2, 16, true}, 64},  {{1, 130, 130, 2, 1, 64, true}, 70},
      {{1, 130, 130, 2, 1, 16, true}, 129}, {{1, 70, 200, 2, 1, 64, true}, 100},
      {{1, 5, 70, 2, 1, 16, true}, 9},      {{1, 200, 200, 4, 1, 16, true}, 33},
      {{1, 20, 20, 1, 1, 8, true}, 500},  // wider than the sequence: no window
  };
  std::mt19937 rng(21);
  for (DType dt : {DType::kF32, DType::kBF16})
    for (const WCase& w : cases) {
      const Case& c = w.c;
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << c << " window " << w.window);
      Inputs in(c, dt, rng);
      AttentionParams params;
      params.window = w.window;
      Tensor out_ref(DType::kF32, c.q_shape()), lse_ref(DType::kF32, c.lse_shape());
      ref::attention_forward(in.q, in.k, in.v, out_ref, lse_ref, params);
      Tensor out(dt, c.q_shape()), lse(DType::kF32, c.lse_shape());
      Grads ref(c, DType::kF32);
      for (bool portable : {false, true}) {
        SCOPED_TRACE(portable ? "portable" : "simd");
        params.force_portable = portable;
        attention_forward(in.q, in.k, in.v, out, lse, params);
        EXPECT_LE(scaled_error(out, out_ref), fwd_tol(dt));
        EXPECT_LE(scaled_error(lse, lse_ref), 2e-6);
        if (!portable)
          ref::attention_backward(in.q, in.k, in.v, out, in.dout, lse, ref.dq, ref.dk, ref.dv,
                                  params);
        expect_backward_matches(c, dt, in, out, lse, ref, params);
      }
    }
  // The window really narrows: with W = 1 every query sees only its own key, so out = v.
  const Case c{1, 9, 9, 1, 1, 4, true};
  Inputs in(c, DType::kF32, rng);
  AttentionParams one;
  one.window = 1;
  Tensor out(DType::kF32, c.q_shape()), lse(DType::kF32, c.lse_shape());
  attention_forward(in.q, in.k, in.v, out, lse, one);
  EXPECT_LE(scaled_error(out, in.v), 1e-6);
  AttentionParams bad;
  bad.causal = false;
  bad.window = 4;
  try {
    attention_forward(in.q, in.k, in.v, out, lse, bad);
    ADD_FAILURE() << "a sliding window without causal attention was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding window needs causal attention"),
              std::string::npos)
        << e.what();
  }
}

TEST(Attention, SlidingWindowBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(22);
  for (auto [c, window] : std::vector<std::pair<Case, int64_t>>{
           {{1, 6, 6, 2, 1, 4, true}, 2}, {{1, 3, 7, 2, 2, 3, true}, 3}}) {
    SCOPED_TRACE(testing::Message() << c << " window " << window);
    AttentionParams params;
    params.window = window;
    expect_gradients_match_finite_differences(c, rng, 1.0f, params);
  }
}

// Soft-capped scores (Gemma 2: S = cap tanh(scale q.k / cap)), with and without windows,
// in both dtypes, every schedule, SIMD and portable tiles, against the reference; the
// capped gradients against finite differences of the independent loss.
TEST(Attention, SoftCapMatchesReferenceAndFiniteDifferences) {
  struct CCase {
    Case c;
    int64_t window;
    float cap;
  };
  const std::vector<CCase> cases = {
      {{1, 130, 130, 2, 1, 16, true}, 0, 1.5f}, {{1, 70, 200, 4, 2, 40, true}, 33, 2.0f},
      {{2, 7, 7, 2, 2, 64, false}, 0, 0.5f},    {{1, 100, 100, 2, 1, 16, true}, 64, 50.0f},
  };
  std::mt19937 rng(31);
  for (DType dt : {DType::kF32, DType::kBF16})
    for (const CCase& w : cases) {
      const Case& c = w.c;
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << c << " window " << w.window
                                      << " cap " << w.cap);
      Inputs in(c, dt, rng, 3.0f);  // large scores: the cap bends them
      AttentionParams params;
      params.causal = c.causal;
      params.window = w.window;
      params.softcap = w.cap;
      Tensor out_ref(DType::kF32, c.q_shape()), lse_ref(DType::kF32, c.lse_shape());
      ref::attention_forward(in.q, in.k, in.v, out_ref, lse_ref, params);
      Tensor out(dt, c.q_shape()), lse(DType::kF32, c.lse_shape());
      Grads ref(c, DType::kF32);
      for (bool portable : {false, true}) {
        SCOPED_TRACE(portable ? "portable" : "simd");
        params.force_portable = portable;
        attention_forward(in.q, in.k, in.v, out, lse, params);
        EXPECT_LE(scaled_error(out, out_ref), fwd_tol(dt));
        EXPECT_LE(scaled_error(lse, lse_ref), 4e-6);
        if (!portable)
          ref::attention_backward(in.q, in.k, in.v, out, in.dout, lse, ref.dq, ref.dk, ref.dv,
                                  params);
        expect_backward_matches(c, dt, in, out, lse, ref, params);
      }
    }
  // The cap changes the result (so the tests above are not vacuous).
  {
    const Case c{1, 9, 9, 1, 1, 8, true};
    Inputs in(c, DType::kF32, rng, 3.0f);
    Tensor a(DType::kF32, c.q_shape()), b(DType::kF32, c.q_shape()), lse(DType::kF32, c.lse_shape());
    AttentionParams capped;
    capped.softcap = 0.5f;
    attention_forward(in.q, in.k, in.v, a, lse, {});
    attention_forward(in.q, in.k, in.v, b, lse, capped);
    EXPECT_GT(scaled_error(a, b), 1e-2);
  }
  for (auto [c, window] : std::vector<std::pair<Case, int64_t>>{
           {{1, 6, 6, 2, 1, 4, true}, 0}, {{1, 3, 7, 2, 2, 3, true}, 3}, {{1, 4, 3, 2, 1, 3, false}, 0}}) {
    SCOPED_TRACE(testing::Message() << c << " window " << window);
    AttentionParams params;
    params.window = window;
    params.softcap = 0.7f;
    expect_gradients_match_finite_differences(c, rng, 2.0f, params);
  }
}

// Copies kv head h / group of each position into head h: [B, T, Hkv, D] -> [B, T, Hq, D].
Tensor repeat_heads(const Tensor& kv, int64_t hq) {
  const Shape& s = kv.shape();
  const int64_t group = hq / s[2], d = s[3];
  Tensor r(kv.dtype(), {s[0], s[1], hq, d});
  const size_t row = size_t(d) * dtype_size(kv.dtype());
  for (int64_t bt = 0; bt < s[0] * s[1]; ++bt)
    for (int64_t h = 0; h < hq; ++h)
      std::memcpy(static_cast<char*>(r.data()) + (bt * hq + h) * row,
                  static_cast<const char*>(kv.data()) + (bt * s[2] + h / group) * row, row);
  return r;
}

TEST(Attention, GroupedQueryHeadsEqualRepeatedHeads) {
  std::mt19937 rng(6);
  for (const Case& c : std::vector<Case>{{1, 100, 100, 4, 1, 64, true},
                                         {2, 70, 90, 6, 2, 24, true},
                                         {1, 65, 65, 4, 2, 16, false}}) {
    SCOPED_TRACE(testing::Message() << c);
    Inputs in(c, DType::kF32, rng);
    AttentionParams params;
    params.causal = c.causal;
    Tensor out(DType::kF32, c.q_shape()), lse(DType::kF32, c.lse_shape());
    attention_forward(in.q, in.k, in.v, out, lse, params);
    Grads g(c, DType::kF32);
    attention_backward(in.q, in.k, in.v, out, in.dout, lse, g.dq, g.dk, g.dv, params);

    // Reference with every query head given its own copy of its kv head.
    const Case mha{c.b, c.tq, c.tk, c.hq, c.hq, c.d, c.causal};
    Tensor k_rep = repeat_heads(in.k, c.hq), v_rep = repeat_heads(in.v, c.hq);
    Tensor out_ref(DType::kF32, c.q_shape()), lse_ref(DType::kF32, c.lse_shape());
    ref::attention_forward(in.q, k_rep, v_rep, out_ref, lse_ref, params);
    Grads ref(mha, DType::kF32);
    ref::attention_backward(in.q, k_rep, v_rep, out_ref, in.dout, lse_ref, ref.dq, ref.dk, ref.dv,
                            params);
    EXPECT_LE(scaled_error(out, out_ref), 2e-5);
    EXPECT_LE(scaled_error(g.dq, ref.dq), 5e-5);
    // Sum the repeated-head gradients over each group.
    Tensor dk_sum = Tensor::zeros(DType::kF32, c.kv_shape());
    Tensor dv_sum = Tensor::zeros(DType::kF32, c.kv_shape());
    const int64_t group = c.hq / c.hkv;
    for (int64_t bt = 0; bt < c.b * c.tk; ++bt)
      for (int64_t h = 0; h < c.hq; ++h)
        for (int64_t e = 0; e < c.d; ++e) {
          const int64_t src = (bt * c.hq + h) * c.d + e, dst = (bt * c.hkv + h / group) * c.d + e;
          dk_sum.as<float>()[dst] += ref.dk.as<float>()[src];
          dv_sum.as<float>()[dst] += ref.dv.as<float>()[src];
        }
    EXPECT_LE(scaled_error(g.dk, dk_sum), 5e-5);
    EXPECT_LE(scaled_error(g.dv, dv_sum), 5e-5);
  }
}

TEST(Attention, DeterministicAcrossThreadCountsAndSchedules) {
  const int saved = num_threads();
  // With 1 thread kAuto always picks per-kv-head; with 2 it picks per-head for the cases
  // with B * Hkv = 1 and split for the one with B * Hq = 1. Every schedule is also run
  // explicitly.
  for (const Case& c : std::vector<Case>{{1, 200, 200, 4, 1, 64, true},
                                         {2, 130, 130, 4, 2, 40, false},
                                         {1, 90, 150, 2, 1, 16, true},
                                         {1, 150, 150, 1, 1, 32, true}})
    for (DType dt : {DType::kF32, DType::kBF16})
      for (bool portable : {false, true}) {
        if (portable && c.tq > 100) continue;  // the scalar tiles are slow under ASan
        SCOPED_TRACE(testing::Message()
                     << c << " " << dtype_name(dt) << (portable ? " portable" : " simd"));
        std::mt19937 rng(7);
        Inputs in(c, dt, rng);
        AttentionParams params;
        params.causal = c.causal;
        params.force_portable = portable;
        std::vector<Tensor> outs, lses;
        std::vector<Grads> grads;
        for (int threads : {1, 2})
          for (auto schedule :
               {AttentionBackwardSchedule::kAuto, AttentionBackwardSchedule::kPerKvHead,
                AttentionBackwardSchedule::kPerHead, AttentionBackwardSchedule::kSplit}) {
            set_num_threads(threads);
            params.schedule = schedule;
            outs.emplace_back(dt, c.q_shape());
            lses.emplace_back(DType::kF32, c.lse_shape());
            attention_forward(in.q, in.k, in.v, outs.back(), lses.back(), params);
            grads.emplace_back(c, dt);
            Grads& g = grads.back();
            attention_backward(in.q, in.k, in.v, outs.back(), in.dout, lses.back(), g.dq, g.dk,
                               g.dv, params);
          }
        for (size_t r = 1; r < outs.size(); ++r) {
          SCOPED_TRACE(testing::Message() << "run " << r);
          EXPECT_TRUE(bitwise_equal(outs[0], outs[r]));
          EXPECT_TRUE(bitwise_equal(lses[0], lses[r]));
          EXPECT_TRUE(bitwise_equal(grads[0].dq, grads[r].dq));
          EXPECT_TRUE(bitwise_equal(grads[0].dk, grads[r].dk));
          EXPECT_TRUE(bitwise_equal(grads[0].dv, grads[r].dv));
        }
      }
  set_num_threads(saved);
}

TEST(Attention, NoStateLeaksBetweenCalls) {
  // Per-thread scratch is reused: a call on NaN inputs leaves NaN in every tile, and the
  // packed keys/values of a head are cached within a call. Neither may leak into later
  // calls on the same thread, also when the inputs change in place.
  const int saved = num_threads();
  set_num_threads(1);
  std::mt19937 rng(10);
  const Case c{1, 130, 130, 2, 1, 64, true};
  Inputs in(c, DType::kF32, rng);
  Inputs poison(c, DType::kF32, rng);
  std::fill(poison.q.as<float>(), poison.q.as<float>() + poison.q.numel(), NAN);
  std::fill(poison.dout.as<float>(), poison.dout.as<float>() + poison.dout.numel(), NAN);
  Tensor out(DType::kF32, c.q_shape()), lse(DType::kF32, c.lse_shape());
  Grads g(c, DType::kF32);
  for (auto schedule : {AttentionBackwardSchedule::kPerKvHead, AttentionBackwardSchedule::kPerHead,
                        AttentionBackwardSchedule::kSplit})
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE(testing::Message() << "schedule " << int(schedule) << " round " << round);
      const AttentionParams params{.causal = true, .schedule = schedule};
      attention_forward(poison.q, poison.k, poison.v, out, lse, params);
      attention_backward(poison.q, poison.k, poison.v, out, poison.dout, lse, g.dq, g.dk, g.dv,
                         params);
      if (round == 1) in.k.as<float>()[5] += 1.0f;  // same buffers, new values
      Tensor out_ref(DType::kF32, c.q_shape()), lse_ref(DType::kF32, c.lse_shape());
      ref::attention_forward(in.q, in.k, in.v, out_ref, lse_ref, params);
      attention_forward(in.q, in.k, in.v, out, lse, params);
      EXPECT_LE(scaled_error(out, out_ref), fwd_tol(DType::kF32));
      Grads ref(c, DType::kF32);
      ref::attention_backward(in.q, in.k, in.v, out, in.dout, lse, ref.dq, ref.dk, ref.dv, params);
      attention_backward(in.q, in.k, in.v, out, in.dout, lse, g.dq, g.dk, g.dv, params);
      EXPECT_LE(scaled_error(g.dq, ref.dq), bwd_tol(DType::kF32));
      EXPECT_LE(scaled_error(g.dk, ref.dk), bwd_tol(DType::kF32));
      EXPECT_LE(scaled_error(g.dv, ref.dv), bwd_tol(DType::kF32));
    }
  set_num_threads(saved);
}

TEST(Attention, EmptyShapes) {
  // No queries: nothing to write, and dk / dv are zero.
  const Case c{2, 0, 5, 2, 1, 8, false};
  std::mt19937 rng(8);
  Inputs in(c, DType::kF32, rng);
  Tensor out(DType::kF32, c.q_shape()), lse(DType::kF32, c.lse_shape());
  attention_forward(in.q, in.k, in.v, out, lse, {.causal = false});
  Grads g(c, DType::kF32);
  std::fill(g.dk.as<float>(), g.dk.as<float>() + g.dk.numel(), 1.0f);
  std::fill(g.dv.as<float>(), g.dv.as<float>() + g.dv.numel(), 1.0f);
  attention_backward(in.q, in.k, in.v, out, in.dout, lse, g.dq, g.dk, g.dv, {.causal = false});
  for (int64_t i = 0; i < g.dk.numel(); ++i) {
    ASSERT_EQ(at(g.dk, i), 0.0);
    ASSERT_EQ(at(g.dv, i), 0.0);
  }
}

TEST(Attention, VisiblePairs) {
  EXPECT_EQ(attention_visible_pairs(4, 4, true), 10);
  EXPECT_EQ(attention_visible_pairs(2, 5, true), 4 + 5);
  EXPECT_EQ(attention_visible_pairs(3, 5, false), 15);
  EXPECT_EQ(attention_visible_pairs(1024, 1024, true), 1024 * 1025 / 2);
  EXPECT_EQ(attention_visible_pairs(4, 4, true, 2), 1 + 2 + 2 + 2);
  EXPECT_EQ(attention_visible_pairs(2, 5, true, 3), 3 + 3);
  EXPECT_EQ(attention_visible_pairs(4, 4, true, 9), 10);  // wider than the keys
}

// Expects fn to throw a hyperion::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message '" << e.what() << "' lacks '" << part << "'";
  }
}

TEST(Attention, RejectsBadArguments) {
  const DType f32 = DType::kF32;
  Tensor q(f32, {1, 8, 4, 16}), k(f32, {1, 8, 2, 16}), v(f32, {1, 8, 2, 16});
  Tensor out(f32, {1, 8, 4, 16}), lse(f32, {1, 4, 8});
  Tensor dq(f32, {1, 8, 4, 16}), dk(f32, {1, 8, 2, 16}), dv(f32, {1, 8, 2, 16});
  std::mt19937 rng(9);
  for (Tensor* t : {&q, &k, &v, &out, &dq}) *t = random_tensor(f32, t->shape(), rng);

  // Head size mismatch.
  Tensor k_bad(f32, {1, 8, 2, 8});
  expect_error([&] { attention_forward(q, k_bad, v, out, lse); },
               {"attention_forward", "[1, 8, 4, 16]", "[1, 8, 2, 8]"});
  // Hq not a multiple of Hkv.
  Tensor k3(f32, {1, 8, 3, 16}), v3(f32, {1, 8, 3, 16});
  expect_error([&] { attention_forward(q, k3, v3, out, lse); },
               {"attention_forward", "multiple", "[1, 8, 4, 16]", "[1, 8, 3, 16]"});
  // k and v disagree.
  Tensor v_bad(f32, {1, 9, 2, 16});
  expect_error([&] { attention_forward(q, k, v_bad, out, lse); },
               {"attention_forward", "[1, 9, 2, 16]"});
  // lse of the wrong shape and dtype.
  Tensor lse_bad(f32, {1, 8, 4});
  expect_error([&] { attention_forward(q, k, v, out, lse_bad); },
               {"attention_forward", "lse", "[1, 8, 4]"});
  Tensor lse_bf16(DType::kBF16, {1, 4, 8});
  expect_error([&] { attention_forward(q, k, v, out, lse_bf16); }, {"attention_forward", "lse"});
  // Unsupported dtype and wrong rank.
  Tensor q16(DType::kF16, {1, 8, 4, 16});
  expect_error([&] { attention_forward(q16, k, v, out, lse); }, {"attention_forward", "f16"});
  Tensor q3(f32, {8, 4, 16});
  expect_error([&] { attention_forward(q3, k, v, out, lse); }, {"attention_forward", "rank"});
  // Causal needs Tq <= Tk.
  Tensor kshort(f32, {1, 4, 2, 16}), vshort(f32, {1, 4, 2, 16});
  expect_error([&] { attention_forward(q, kshort, vshort, out, lse); },
               {"attention_forward", "causal", "[1, 4, 2, 16]"});
  // Bad scale.
  expect_error([&] { attention_forward(q, k, v, out, lse, {.scale = -1.0f}); },
               {"attention_forward", "scale"});
  // Non-contiguous.
  TensorView strided(q.data(), f32, {1, 8, 4, 8}, {512, 64, 16, 1});
  Tensor out8(f32, {1, 8, 4, 8});
  Tensor k8(f32, {1, 8, 2, 8}), v8(f32, {1, 8, 2, 8});
  expect_error([&] { attention_forward(strided, k8, v8, out8, lse); },
               {"attention_forward", "contiguous"});

  attention_forward(q, k, v, out, lse);
  Tensor dout = random_tensor(f32, q.shape(), rng);
  // Backward: gradient shapes must match their inputs.
  Tensor dk_bad(f32, {1, 8, 4, 16});
  expect_error([&] { attention_backward(q, k, v, out, dout, lse, dq, dk_bad, dv); },
               {"attention_backward", "[1, 8, 4, 16]", "[1, 8, 2, 16]"});
  Tensor dout_bad(f32, {1, 7, 4, 16});
  expect_error([&] { attention_backward(q, k, v, out, dout_bad, lse, dq, dk, dv); },
               {"attention_backward", "[1, 7, 4, 16]"});
  expect_error([&] { attention_backward(q, k3, v3, out, dout, lse, dq, dk, dv); },
               {"attention_backward", "multiple"});
}

}  // namespace
}  // namespace hyperion
