// The MoE block against a naive per-token loop in double: forward, auxiliary losses, and
// gradients (finite differences of that loop, so the router's are covered too); capped
// with a large capacity equals dropless; a small capacity drops exactly the pairs past it.
#include "model/moe_block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "model/param_store.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

DecoderConfig moe_config(int64_t e = 4, int64_t k = 2, bool normalize = true) {
  DecoderConfig c;
  c.vocab_size = 11;
  c.dim = 16;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 8;
  c.ffn_dim = 20;
  c.max_seq_len = 16;
  c.n_experts = e;
  c.n_experts_per_tok = k;
  c.moe_ffn_dim = 12;
  c.norm_topk_prob = normalize;
  return c;
}

// Buffers for one moe::forward / backward call in f32.
struct Harness {
  MoeShape s;
  MoeOptions o;
  MoeDispatch plan;
  std::vector<float> logits, probs, weights, xs, g, u, a, y;
  std::vector<int32_t> experts;
  std::vector<float> dy, da, dxs, dlogits, dprobs, dlogits_c, dweights;
  MoeActs m;
  MoeGradScratch sc;

  Harness(const DecoderConfig& c, const MoeOptions& opt, int64_t b, int64_t t) : o(opt) {
    s = moe_shape(c, opt, b, t);
    auto sz = [](int64_t n) { return static_cast<size_t>(n); };
    logits.resize(sz(s.n * s.e));
    probs.resize(sz(s.n * s.e));
    weights.resize(sz(s.n * s.k));
    experts.resize(sz(s.n * s.k));
    xs.resize(sz(s.rows * s.d));
    y.resize(sz(s.rows * s.d));
    g.resize(sz(s.rows * s.f));
    u.resize(sz(s.rows * s.f));
    a.resize(sz(s.rows * s.f));
    dy.resize(sz(s.rows * s.d));
    dxs.resize(sz(s.rows * s.d));
    da.resize(sz(s.rows * s.f));
    dlogits.resize(sz(s.n * s.e));
    dprobs.resize(sz(s.n * s.e));
    dlogits_c.resize(sz(s.n * s.e));
    dweights.resize(sz(s.n * s.k));
    m = {logits.data(), probs.data(), experts.data(), weights.data(), &plan,
         xs.data(),     g.data(),     u.data(),       a.data(),       y.data()};
    sc = {dy.data(),     da.data(),        dxs.data(),     dlogits.data(),
          dprobs.data(), dlogits_c.data(), dweights.data()};
  }

  std::vector<float> forward(const ParamStore& ps, const std::vector<float>& h) {
    std::vector<float> out(static_cast<size_t>(s.n * s.d), 0.0f);
    moe::forward(ps, ps.layer(0), s, o, h.data(), DType::kF32, m, out.data());
    return out;
  }
};

// ---- Naive reference: every token, each of its k experts, in double. ----
struct NaiveResult {
  std::vector<double> out;
  double lb = 0, z = 0;
};

NaiveResult naive_forward(const DecoderConfig& c, const ParamStore& ps, const MoeOptions& o,
                          const std::vector<float>& h, int64_t b, int64_t t,
                          const std::vector<char>* kept = nullptr) {
  const int64_t d = c.dim, e = c.n_experts, k = c.n_experts_per_tok, f = c.expert_ffn_dim();
  const int64_t n = b * t;
  const LayerParamIndex& p = ps.layer(0);
  const float* wr = ps.params() + ps.infos()[static_cast<size_t>(p.router)].offset;
  auto expert_w = [&](int first, int64_t x) {
    return ps.params() + ps.infos()[static_cast<size_t>(first + x)].offset;
  };
  NaiveResult r;
  r.out.assign(static_cast<size_t>(n * d), 0.0);
  std::vector<double> density(static_cast<size_t>(b * e), 0.0), dprob(density.size(), 0.0);
  for (int64_t tok = 0; tok < n; ++tok) {
    const float* x = h.data() + tok * d;
    std::vector<double> logit(static_cast<size_t>(e)), prob(static_cast<size_t>(e));
    double mx = -1e300;
    for (int64_t j = 0; j < e; ++j) {
      double s = 0;
      for (int64_t i = 0; i < d; ++i) s += double(x[i]) * wr[j * d + i];
      logit[static_cast<size_t>(j)] = s;
      mx = std::max(mx, s);
    }
    double z = 0;
    for (int64_t j = 0; j < e; ++j) z += std::exp(logit[static_cast<size_t>(j)] - mx);
    for (int64_t j = 0; j < e; ++j)
      prob[static_cast<size_t>(j)] = std::exp(logit[static_cast<size_t>(j)] - mx) / z;
    const double lse = mx + std::log(z);
    r.z += lse * lse / double(n);
    std::vector<int64_t> order(static_cast<size_t>(e));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a1, int64_t a2) {
      return prob[static_cast<size_t>(a1)] > prob[static_cast<size_t>(a2)];
    });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += prob[static_cast<size_t>(order[static_cast<size_t>(j)])];
    const int64_t seq = tok / t;
    for (int64_t j = 0; j < e; ++j)
      dprob[static_cast<size_t>(seq * e + j)] += prob[static_cast<size_t>(j)] / double(t);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t x_e = order[static_cast<size_t>(j)];
      density[static_cast<size_t>(seq * e + x_e)] += 1.0 / double(t);
      if (kept != nullptr && !(*kept)[static_cast<size_t>(tok * k + j)]) continue;
      const double w = prob[static_cast<size_t>(x_e)] / (c.norm_topk_prob ? sum : 1.0);
      const float* w1 = expert_w(p.gate, x_e);
      const float* w3 = expert_w(p.up, x_e);
      const float* w2 = expert_w(p.down, x_e);
      std::vector<double> act(static_cast<size_t>(f));
      for (int64_t q = 0; q < f; ++q) {
        double gq = 0, uq = 0;
        for (int64_t i = 0; i < d; ++i) {
          gq += double(x[i]) * w1[q * d + i];
          uq += double(x[i]) * w3[q * d + i];
        }
        act[static_cast<size_t>(q)] = gq / (1 + std::exp(-gq)) * uq;
      }
      for (int64_t i = 0; i < d; ++i) {
        double yi = 0;
        for (int64_t q = 0; q < f; ++q) yi += act[static_cast<size_t>(q)] * w2[i * f + q];
        r.out[static_cast<size_t>(tok * d + i)] += w * yi;
      }
    }
  }
  double m = 0;
  for (size_t i = 0; i < density.size(); ++i) m += density[i] * dprob[i];
  r.lb = o.load_balance_weight * double(e * e) * m / double(b * e);
  r.z *= o.z_loss_weight;
  return r;
}

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

class MoeBlockTest : public testing::TestWithParam<bool> {};  // param: norm_topk_prob

TEST_P(MoeBlockTest, DroplessForwardMatchesNaiveLoop) {
  const DecoderConfig c = moe_config(4, 2, GetParam());
  ParamStore ps(c, false);
  ps.init(3, 0.3);
  MoeOptions o;
  o.load_balance_weight = 0.1f;
  o.z_loss_weight = 0.01f;
  const int64_t b = 2, t = 5;
  Harness hs(c, o, b, t);
  const auto h = random_vec(static_cast<size_t>(b * t * c.dim), 1);
  const auto out = hs.forward(ps, h);
  const NaiveResult ref = naive_forward(c, ps, o, h, b, t);
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_NEAR(out[i], ref.out[i], 1e-5 + 1e-5 * std::fabs(ref.out[i])) << i;
  EXPECT_NEAR(hs.m.lb_loss, ref.lb, 1e-6);
  EXPECT_NEAR(hs.m.z_loss, ref.z, 1e-6);
  EXPECT_EQ(hs.plan.dropped, 0);
}

// Loss = sum(out * R) + lb + z: the gradient from moe::backward against central
// differences of the naive loop in double, for the router, every expert and the input.
TEST_P(MoeBlockTest, GradientsMatchFiniteDifferencesOfNaiveLoop) {
  const DecoderConfig c = moe_config(4, 2, GetParam());
  ParamStore ps(c, false);
  ps.init(5, 0.3);
  MoeOptions o;
  o.load_balance_weight = 0.5f;
  o.z_loss_weight = 0.05f;
  const int64_t b = 2, t = 4, n = b * t;
  Harness hs(c, o, b, t);
  auto h = random_vec(static_cast<size_t>(n * c.dim), 2);
  const auto r = random_vec(static_cast<size_t>(n * c.dim), 3);
  hs.forward(ps, h);
  std::vector<float> dh(static_cast<size_t>(n * c.dim));
  ps.zero_grads();
  const float dloss = 1.0f;
  moe::backward(ps, ps.layer(0), hs.s, o, h.data(), DType::kF32, hs.m, r.data(), dloss, hs.sc,
                dh.data());
  auto objective = [&] {
    const NaiveResult nr = naive_forward(c, ps, o, h, b, t);
    double s = nr.lb + nr.z;
    for (size_t i = 0; i < nr.out.size(); ++i) s += nr.out[i] * r[i];
    return s;
  };
  auto check = [&](float* w, double analytic, const std::string& what) {
    const float saved = *w;
    const double step = 1e-3;
    *w = saved + float(step);
    const double lp = objective();
    *w = saved - float(step);
    const double lm = objective();
    *w = saved;
    const double fd = (lp - lm) / (2 * step);
    EXPECT_NEAR(analytic, fd, 2e-3 * std::max(std::fabs(fd), 1.0)) << what;
  };
  std::mt19937 rng(7);
  int checked = 0;
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const ParamInfo& p = ps.infos()[i];
    const bool moe_tensor = p.name.find("block_sparse_moe") != std::string::npos;
    if (!moe_tensor) continue;
    for (int rep = 0; rep < 6; ++rep) {
      const int64_t j = static_cast<int64_t>(rng() % p.numel);
      check(ps.params() + p.offset + j, ps.grads()[p.offset + j],
            p.name + "[" + std::to_string(j) + "]");
      ++checked;
    }
  }
  for (int rep = 0; rep < 24; ++rep) {
    const size_t j = rng() % h.size();
    check(&h[j], dh[j], "h[" + std::to_string(j) + "]");
  }
  EXPECT_GT(checked, 70);
}

TEST_P(MoeBlockTest, CappedWithLargeCapacityEqualsDropless) {
  const DecoderConfig c = moe_config(4, 2, GetParam());
  ParamStore ps(c, false);
  ps.init(9, 0.3);
  const int64_t b = 2, t = 6, n = b * t;
  MoeOptions dropless, capped;
  dropless.load_balance_weight = capped.load_balance_weight = 0.1f;
  capped.capacity_factor = 4.0;  // capacity = ceil(t*k/e) * 4 >= t: nothing can drop
  Harness hd(c, dropless, b, t), hc(c, capped, b, t);
  ASSERT_GE(hc.s.capacity, t);
  const auto h = random_vec(static_cast<size_t>(n * c.dim), 4);
  const auto r = random_vec(static_cast<size_t>(n * c.dim), 5);
  const auto od = hd.forward(ps, h), oc = hc.forward(ps, h);
  EXPECT_EQ(hc.plan.dropped, 0);
  for (size_t i = 0; i < od.size(); ++i) ASSERT_NEAR(oc[i], od[i], 1e-6) << i;
  std::vector<float> dhd(h.size()), dhc(h.size());
  ps.zero_grads();
  moe::backward(ps, ps.layer(0), hd.s, dropless, h.data(), DType::kF32, hd.m, r.data(), 1.0f, hd.sc,
                dhd.data());
  const std::vector<float> gd(ps.grads(), ps.grads() + ps.size());
  ps.zero_grads();
  moe::backward(ps, ps.layer(0), hc.s, capped, h.data(), DType::kF32, hc.m, r.data(), 1.0f, hc.sc,
                dhc.data());
  for (int64_t i = 0; i < ps.size(); ++i)
    ASSERT_NEAR(ps.grads()[i], gd[static_cast<size_t>(i)], 1e-5) << i;
  for (size_t i = 0; i < dhd.size(); ++i) ASSERT_NEAR(dhc[i], dhd[i], 1e-5) << i;
}

INSTANTIATE_TEST_SUITE_P(Norm, MoeBlockTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& i) {
                           return i.param ? "normalized" : "unnormalized";
                         });

// A small capacity: the pairs dropped are exactly those past an expert's capacity in
// token order within each sequence, and the output is the naive loop without them.
TEST(MoeBlock, SmallCapacityDropsExactlyThePairsPastCapacity) {
  const DecoderConfig c = moe_config(4, 2);
  ParamStore ps(c, false);
  ps.init(13, 0.6);
  const int64_t b = 2, t = 8, n = b * t, k = 2, e = 4;
  MoeOptions o;
  o.capacity_factor = 0.5;  // capacity = ceil(8*2/4) * 0.5 = 2 per expert and sequence
  Harness hs(c, o, b, t);
  ASSERT_EQ(hs.s.capacity, 2);
  const auto h = random_vec(static_cast<size_t>(n * c.dim), 8);
  const auto out = hs.forward(ps, h);
  std::vector<char> kept(static_cast<size_t>(n * k));
  int64_t dropped = 0;
  for (int64_t s = 0; s < b; ++s) {
    std::vector<int64_t> count(static_cast<size_t>(e), 0);
    for (int64_t p = s * t * k; p < (s + 1) * t * k; ++p) {
      const int32_t x = hs.experts[static_cast<size_t>(p)];
      kept[static_cast<size_t>(p)] = ++count[static_cast<size_t>(x)] <= hs.s.capacity;
      dropped += kept[static_cast<size_t>(p)] ? 0 : 1;
      EXPECT_EQ(hs.plan.pair_row[static_cast<size_t>(p)] >= 0, bool(kept[static_cast<size_t>(p)]))
          << p;
    }
  }
  EXPECT_GT(dropped, 0) << "the test needs some drops";
  EXPECT_EQ(hs.plan.dropped, dropped);
  const NaiveResult ref = naive_forward(c, ps, o, h, b, t, &kept);
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_NEAR(out[i], ref.out[i], 1e-5 + 1e-5 * std::fabs(ref.out[i])) << i;
}

TEST(MoeBlock, Bf16CloseToF32) {
  const DecoderConfig c = moe_config(8, 2);
  ParamStore p32(c, false), p16(c, true);
  p32.init(21, 0.3);
  p16.init(21, 0.3);
  const int64_t b = 2, t = 8, n = b * t;
  MoeOptions o;
  Harness h32(c, o, b, t);
  const auto h = random_vec(static_cast<size_t>(n * c.dim), 9);
  const auto o32 = h32.forward(p32, h);
  // bf16: the same inputs rounded, with bf16 buffers of the same element count.
  Harness h16(c, o, b, t);
  std::vector<bf16> hb(h.size());
  convert_f32_to_bf16(h.data(), hb.data(), h.size());
  std::vector<bf16> xs(h16.xs.size()), g(h16.g.size()), u(h16.u.size()), a(h16.a.size()),
      y(h16.y.size());
  h16.m.xs = xs.data();
  h16.m.g = g.data();
  h16.m.u = u.data();
  h16.m.a = a.data();
  h16.m.y = y.data();
  std::vector<float> o16(o32.size(), 0.0f);
  moe::forward(p16, p16.layer(0), h16.s, o, hb.data(), DType::kBF16, h16.m, o16.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < o32.size(); ++i) {
    num += std::pow(o16[i] - o32[i], 2);
    den += std::pow(o32[i], 2);
  }
  EXPECT_LT(std::sqrt(num / den), 0.03);
}

}  // namespace
}  // namespace hyperion
