#include "model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"

namespace hyperion {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected hyperion::Error";
  return "";
}

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

SamplingParams params(float t, int k, float p, uint64_t seed) {
  SamplingParams s;
  s.temperature = t;
  s.top_k = k;
  s.top_p = p;
  s.seed = seed;
  return s;
}

int32_t reference_argmax(const std::vector<float>& x) {
  int32_t best = 0;
  for (size_t i = 1; i < x.size(); ++i)
    if (x[i] > x[best]) best = static_cast<int32_t>(i);
  return best;
}

// The filtered, renormalised distribution, written independently in double: sort by
// logit (descending, ties by index), keep K, softmax at T, keep the smallest prefix with
// mass >= top_p.
std::vector<double> expected_probs(const std::vector<float>& x, const SamplingParams& p) {
  const size_t n = x.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] > x[b]; });
  size_t keep = (p.top_k > 0 && size_t(p.top_k) < n) ? size_t(p.top_k) : n;
  const double mx = x[order[0]];
  std::vector<double> e(keep);
  double sum = 0;
  for (size_t j = 0; j < keep; ++j) sum += e[j] = std::exp((x[order[j]] - mx) / p.temperature);
  if (p.top_p < 1.0f) {
    double cum = 0;
    size_t cut = keep;
    for (size_t j = 0; j < keep; ++j) {
      cum += e[j];
      if (cum >= double(p.top_p) * sum) {
        cut = j + 1;
        break;
      }
    }
    keep = cut;
    sum = cum;
  }
  std::vector<double> probs(n, 0.0);
  for (size_t j = 0; j < keep; ++j) probs[order[j]] = e[j] / sum;
  return probs;
}

// Returns the size of the kept set.
size_t check_frequencies(const std::vector<float>& x, const SamplingParams& p, int draws) {
  const std::vector<double> expect = expected_probs(x, p);
  Sampler s(p);
  std::vector<int> counts(x.size(), 0);
  for (int i = 0; i < draws; ++i) {
    const int32_t t = s.sample(x.data(), static_cast<int64_t>(x.size()));
    EXPECT_TRUE(t >= 0 && t < static_cast<int32_t>(x.size())) << t;
    if (t < 0 || t >= static_cast<int32_t>(x.size())) return 0;
    ++counts[t];
  }
  for (size_t i = 0; i < x.size(); ++i) {
    const double f = double(counts[i]) / draws;
    if (expect[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " is outside the kept set";
      continue;
    }
    // ~5 standard deviations plus slack: generous, and deterministic (seeded).
    const double tol = 5.0 * std::sqrt(expect[i] * (1 - expect[i]) / draws) + 2e-3;
    EXPECT_NEAR(f, expect[i], tol)
        << "token " << i << " T=" << p.temperature << " k=" << p.top_k << " p=" << p.top_p;
  }
  return static_cast<size_t>(
      std::count_if(expect.begin(), expect.end(), [](double e) { return e > 0.0; }));
}

TEST(Sampler, ValidateNamesTheField) {
  EXPECT_NO_THROW(validate(SamplingParams{}));
  EXPECT_NO_THROW(validate(params(0.0f, 0, 1.0f, 0)));
  const std::pair<SamplingParams, const char*> bad[] = {
      {params(-0.5f, 0, 1.0f, 0), "temperature"}, {params(NAN, 0, 1.0f, 0), "temperature"},
      {params(kInf, 0, 1.0f, 0), "temperature"},  {params(1.0f, -1, 1.0f, 0), "top_k"},
      {params(1.0f, 0, 0.0f, 0), "top_p"},        {params(1.0f, 0, 1.5f, 0), "top_p"},
      {params(1.0f, 0, -0.1f, 0), "top_p"},       {params(1.0f, 0, NAN, 0), "top_p"},
  };
  for (const auto& [p, field] : bad) {
    const SamplingParams sp = p;  // (clang 14 cannot capture a structured binding)
    const std::string msg = error_of([&] { validate(sp); });
    EXPECT_NE(msg.find(field), std::string::npos) << msg;
    EXPECT_THROW(Sampler{p}, Error) << field;
  }
}

TEST(Sampler, GreedyIsArgmaxWithTiesToLowestIndex) {
  for (size_t n : {1, 7, 17, 63, 100, 1000, 32001}) {
    std::vector<float> x = random_logits(n, 11 + uint32_t(n));
    Sampler s(params(0.0f, 0, 1.0f, 5));
    const uint64_t state = s.rng_state();
    EXPECT_EQ(s.sample(x.data(), int64_t(n)), reference_argmax(x)) << n;
    EXPECT_EQ(s.rng_state(), state);  // greedy draws no random number
    if (n >= 7) {
      // Ties at the max: the lowest index wins, also across SIMD vectors.
      const float top = *std::max_element(x.begin(), x.end()) + 1.0f;
      x[n - 1] = top;
      x[n / 2] = top;
      x[3] = top;
      EXPECT_EQ(s.sample(x.data(), int64_t(n)), 3) << n;
      // Filtering params do not matter for greedy.
      Sampler f(params(0.0f, 5, 0.5f, 1));
      EXPECT_EQ(f.sample(x.data(), int64_t(n)), 3) << n;
    }
  }
  std::vector<float> masked = {-kInf, -kInf, -3.0f, -kInf};
  Sampler s(params(0.0f, 0, 1.0f, 0));
  EXPECT_EQ(s.sample(masked.data(), 4), 2);
}

TEST(Sampler, TopK1IsArgmaxAtAnyTemperature) {
  for (size_t n : {2, 17, 1000, 5000}) {
    std::vector<float> x = random_logits(n, 7 + uint32_t(n));
    x[n - 1] = x[n / 3] = *std::max_element(x.begin(), x.end());  // tie: n/3 wins
    const int32_t want = reference_argmax(x);
    for (float t : {0.01f, 0.5f, 1.0f, 3.0f, 1000.0f}) {
      for (float p : {1.0f, 0.3f}) {
        Sampler s(params(t, 1, p, 99));
        for (int i = 0; i < 20; ++i)
          ASSERT_EQ(s.sample(x.data(), int64_t(n)), want) << n << " " << t;
      }
    }
  }
}

TEST(Sampler, SeedDeterminesTheSequence) {
  const std::vector<float> x = random_logits(1000, 3, 1.0f);
  const auto run = [&](const SamplingParams& p) {
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(x.data(), 1000));
    return out;
  };
  for (const SamplingParams& base : {params(1.0f, 0, 1.0f, 0), params(0.8f, 50, 1.0f, 0),
                                     params(1.2f, 0, 0.9f, 0), params(1.0f, 100, 0.95f, 0)}) {
    SamplingParams a = base, b = base;
    a.seed = 42;
    b.seed = 43;
    EXPECT_EQ(run(a), run(a));
    EXPECT_NE(run(a), run(b));
  }
  // The RNG state can be saved and restored mid-sequence (resuming a generation).
  Sampler s(params(1.0f, 0, 1.0f, 7));
  s.sample(x.data(), 1000);
  const uint64_t saved = s.rng_state();
  std::vector<int32_t> first, second;
  for (int i = 0; i < 16; ++i) first.push_back(s.sample(x.data(), 1000));
  EXPECT_NE(s.rng_state(), saved);
  s.set_rng_state(saved);
  for (int i = 0; i < 16; ++i) second.push_back(s.sample(x.data(), 1000));
  EXPECT_EQ(first, second);
}

TEST(Sampler, FrequenciesMatchFilteredDistribution) {
  const std::vector<float> x = {1.0f, 2.5f, 0.3f, -1.0f, 2.5f, 0.9f, -kInf, 1.7f};
  for (const SamplingParams& p :
       {params(1.0f, 0, 1.0f, 1), params(0.7f, 0, 1.0f, 2), params(2.0f, 0, 1.0f, 3),
        params(1.0f, 3, 1.0f, 4), params(0.5f, 5, 1.0f, 5), params(1.0f, 0, 0.8f, 6),
        params(1.5f, 0, 0.6f, 7), params(1.0f, 6, 0.9f, 8), params(1.0f, 8, 1.0f, 9),
        params(1.0f, 100, 1.0f, 10)}) {
    check_frequencies(x, p, 20000);
  }
}

TEST(Sampler, FrequenciesAcrossBlocksOfALargeVocab) {
  // A few likely tokens spread over several 512-element blocks and the tail; the rest
  // are tiny or masked.
  std::vector<float> x(2100, -30.0f);
  for (size_t i = 0; i < x.size(); i += 3) x[i] = -kInf;
  x[1] = 1.0f;
  x[514] = 2.0f;
  x[1100] = 0.5f;
  x[2099] = 1.5f;
  x[2048] = 1.5f;
  check_frequencies(x, params(1.0f, 0, 1.0f, 21), 10000);
  check_frequencies(x, params(0.8f, 4, 1.0f, 22), 10000);
  check_frequencies(x, params(1.0f, 0, 0.7f, 23), 10000);
  // A nearly flat distribution: the frequency of each block of tokens (sum of many
  // small probabilities) must match.
  std::vector<float> flat = random_logits(3000, 5, 0.3f);
  const SamplingParams p = params(1.0f, 0, 1.0f, 24);
  const std::vector<double> expect = expected_probs(flat, p);
  Sampler s(p);
  std::vector<int> counts(6, 0);
  const int draws = 10000;
  for (int i = 0; i < draws; ++i) ++counts[s.sample(flat.data(), 3000) / 500];
  for (size_t g = 0; g < 6; ++g) {
    const double e = std::accumulate(expect.begin() + g * 500, expect.begin() + (g + 1) * 500, 0.0);
    EXPECT_NEAR(double(counts[g]) / draws, e, 5.0 * std::sqrt(e * (1 - e) / draws) + 2e-3) << g;
  }
}

TEST(Sampler, TopKKeepsExactlyTheKLargest) {
  std::vector<float> x = random_logits(5000, 17, 0.5f);
  for (int k : {1, 5, 40, 700}) {
    std::vector<size_t> order(x.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] > x[b]; });
    std::vector<bool> allowed(x.size(), false);
    for (int j = 0; j < k; ++j) allowed[order[j]] = true;
    Sampler s(params(50.0f, k, 1.0f, 3));  // high temperature: nearly uniform over the K
    std::vector<bool> seen(x.size(), false);
    for (int i = 0; i < std::min(20 * k + 200, 3000); ++i) {
      const int32_t t = s.sample(x.data(), int64_t(x.size()));
      ASSERT_TRUE(allowed[t]) << "k=" << k << " token " << t;
      seen[t] = true;
    }
    if (k <= 40) {
      for (int j = 0; j < k; ++j) EXPECT_TRUE(seen[order[j]]) << "k=" << k << " rank " << j;
    }
  }
}

TEST(Sampler, TopPKeepsExactlyTheNucleus) {
  // probabilities 0.4, 0.25, 0.15, 0.1, 0.05, 0.05 (shuffled): the nucleus for 0.75 is
  // the three largest (0.4 + 0.25 = 0.65 < 0.75 <= 0.8).
  const std::vector<double> pr = {0.05, 0.25, 0.1, 0.4, 0.05, 0.15};
  std::vector<float> x;
  for (double q : pr) x.push_back(float(std::log(q)));
  Sampler s(params(1.0f, 0, 0.75f, 31));
  std::vector<int> counts(6, 0);
  for (int i = 0; i < 20000; ++i) ++counts[s.sample(x.data(), 6)];
  EXPECT_EQ(counts[0] + counts[2] + counts[4], 0);
  EXPECT_NEAR(counts[3] / 20000.0, 0.4 / 0.8, 0.02);
  EXPECT_NEAR(counts[1] / 20000.0, 0.25 / 0.8, 0.02);
  EXPECT_NEAR(counts[5] / 20000.0, 0.15 / 0.8, 0.02);
  // A tiny top_p still keeps the most likely token.
  Sampler one(params(1.0f, 0, 1e-6f, 32));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(one.sample(x.data(), 6), 3);

  // A flat vocabulary of 2000: top_p 0.3001 keeps tokens 0..600 (ties sort by index),
  // more than the 64 of the first try.
  std::vector<float> flat(2000, 0.25f);
  Sampler f(params(1.0f, 0, 0.3001f, 33));
  int32_t hi = 0;
  for (int i = 0; i < 3000; ++i) {
    const int32_t t = f.sample(flat.data(), 2000);
    ASSERT_LE(t, 600);
    hi = std::max(hi, t);
  }
  EXPECT_GE(hi, 580);
  // Nucleus inside a top-k set, over a vocabulary with a long tail.
  std::vector<float> tail = random_logits(1200, 9, 2.0f);
  // (more than the 64 tokens of the first try: the quickselect path)
  EXPECT_GT(check_frequencies(tail, params(2.0f, 0, 0.5f, 34), 6000), 64u);
  // (within the first 64)
  EXPECT_LE(check_frequencies(tail, params(0.5f, 0, 0.5f, 36), 10000), 64u);
  check_frequencies(tail, params(0.9f, 30, 0.8f, 35), 10000);
}

TEST(Sampler, LogprobIsRawLogSoftmax) {
  for (size_t n : {1, 9, 1000, 40000}) {
    const std::vector<float> x = random_logits(n, 100 + uint32_t(n), 2.0f);
    double mx = -1e300;
    for (float v : x) mx = std::max(mx, double(v));
    double sum = 0;
    for (float v : x) sum += std::exp(double(v) - mx);
    const double lse = mx + std::log(sum);
    for (const SamplingParams& p :
         {params(0.0f, 0, 1.0f, 1), params(1.0f, 0, 1.0f, 2), params(0.5f, 0, 1.0f, 3),
          params(1.0f, 10, 1.0f, 4), params(1.0f, 0, 0.9f, 5), params(2.0f, 20, 0.5f, 6)}) {
      Sampler s(p);
      for (int i = 0; i < 5; ++i) {
        float lp = 1.0f;
        const int32_t t = s.sample(x.data(), int64_t(n), &lp);
        EXPECT_NEAR(lp, double(x[t]) - lse, 2e-5 * std::max(1.0, std::abs(x[t] - lse)))
            << n << " T=" << p.temperature;
      }
    }
  }
  // Masked tokens do not count in the normaliser.
  const std::vector<float> m = {0.0f, -kInf, 0.0f, -kInf};
  Sampler s(params(0.0f, 0, 1.0f, 0));
  float lp = 0;
  EXPECT_EQ(s.sample(m.data(), 4, &lp), 0);
  EXPECT_NEAR(lp, std::log(0.5), 1e-6);
}

TEST(Sampler, MaskedTokensAreNeverDrawn) {
  std::vector<float> x(700, -kInf);
  x[5] = 0.0f;
  x[600] = -1.0f;
  for (const SamplingParams& p : {params(1.0f, 0, 1.0f, 1), params(1.0f, 50, 1.0f, 2),
                                  params(1.0f, 0, 0.99f, 3), params(3.0f, 600, 0.999f, 4)}) {
    Sampler s(p);
    for (int i = 0; i < 500; ++i) {
      const int32_t t = s.sample(x.data(), 700);
      ASSERT_TRUE(t == 5 || t == 600) << t;
    }
  }
}

TEST(Sampler, BadLogitsAreErrorsNamingTheSampler) {
  Sampler s(params(1.0f, 0, 1.0f, 0));
  for (size_t n : {5, 100}) {
    std::vector<float> x(n, 0.5f);
    x[n - 2] = NAN;
    std::string msg = error_of([&] { s.sample(x.data(), int64_t(n)); });
    EXPECT_NE(msg.find("sampler"), std::string::npos) << msg;
    EXPECT_NE(msg.find("logits[" + std::to_string(n - 2) + "]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("nan"), std::string::npos) << msg;
    x[n - 2] = kInf;
    msg = error_of([&] { s.sample(x.data(), int64_t(n)); });
    EXPECT_NE(msg.find("inf"), std::string::npos) << msg;
    std::fill(x.begin(), x.end(), -kInf);
    msg = error_of([&] { s.sample(x.data(), int64_t(n)); });
    EXPECT_NE(msg.find("all"), std::string::npos) << msg;
    Sampler g(params(0.0f, 0, 1.0f, 0));
    EXPECT_THROW(g.sample(x.data(), int64_t(n)), Error);
  }
  float one = 1.0f;
  EXPECT_NE(error_of([&] { s.sample(nullptr, 10); }).find("sampler"), std::string::npos);
  EXPECT_NE(error_of([&] { s.sample(&one, 0); }).find("vocab"), std::string::npos);
  EXPECT_NE(error_of([&] { s.sample(&one, -3); }).find("vocab"), std::string::npos);
  // An error does not consume randomness.
  const uint64_t state = s.rng_state();
  float nan = NAN;
  EXPECT_THROW(s.sample(&nan, 1), Error);
  EXPECT_EQ(s.rng_state(), state);
}

TEST(Sampler, LargeVocabularyTopKTopP) {
  const size_t n = 128256;
  const std::vector<float> x = random_logits(n, 77, 2.5f);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 40, order.end(),
                    [&](size_t a, size_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  std::vector<bool> top40(n, false);
  for (int j = 0; j < 40; ++j) top40[order[j]] = true;
  Sampler s(params(0.8f, 40, 0.9f, 123));
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(top40[s.sample(x.data(), int64_t(n))]);
  // The nucleus at 0.95 (a few 10k tokens here) lies inside the reference's at 0.951,
  // whatever the rounding at its boundary.
  Sampler full(params(1.0f, 0, 0.95f, 124));
  const std::vector<double> expect = expected_probs(x, params(1.0f, 0, 0.951f, 0));
  for (int i = 0; i < 10; ++i) ASSERT_GT(expect[full.sample(x.data(), int64_t(n))], 0.0);
}

}  // namespace
// A refused number is printed as sent, and one the sampler's f32 would turn into another
// setting is refused: a top_p or temperature of 1e-300 is not 0.
TEST(Sampler, TinyParametersAreRefusedAsSent) {
  EXPECT_EQ(top_p_error(0.5), "");
  EXPECT_EQ(temperature_error(0.0), "");
  EXPECT_EQ(temperature_error(0.7), "");
  for (const std::string& e : {top_p_error(1e-300), temperature_error(1e-300)})
    EXPECT_NE(e.find("got 1e-300"), std::string::npos) << e;
  EXPECT_NE(top_p_error(1.5).find("got 1.5"), std::string::npos);
}

}  // namespace hyperion
