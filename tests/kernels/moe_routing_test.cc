#include "kernels/moe_routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "kernel_test_util.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

const DType kDTypes[] = {DType::kF32, DType::kBF16};

// Rows of f32 or bf16 held as bytes.
struct Rows {
  DType dt;
  std::vector<unsigned char> bytes;
  Rows(DType dtype, const std::vector<float>& v) : dt(dtype), bytes(v.size() * dtype_size(dtype)) {
    convert_any(v.data(), DType::kF32, bytes.data(), dt, v.size());
  }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  float at(size_t i) const { return load_as_f32(bytes.data(), dt, i); }
  size_t size() const { return bytes.size() / dtype_size(dt); }
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                  double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " at " << i;
}

// k distinct experts per token, uniformly random.
std::vector<int32_t> random_experts(int64_t n, int64_t e, int64_t k, std::mt19937& rng) {
  std::vector<int32_t> all(static_cast<size_t>(e)), out;
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < n; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    out.insert(out.end(), all.begin(), all.begin() + k);
  }
  return out;
}

std::vector<int32_t> sizes_k(int64_t e) {
  std::vector<int32_t> ks;
  for (int64_t k : {int64_t{1}, int64_t{2}, e})
    if (k <= e && std::find(ks.begin(), ks.end(), k) == ks.end()) ks.push_back(int32_t(k));
  return ks;
}

// ---------------------------------------------------------------- router forward

TEST(MoeRouter, ForwardMatchesReference) {
  std::mt19937 rng(1);
  for_each_target([&] {
    for (int64_t n : {1, 7, 33}) {
      for (int64_t e : {1, 4, 8, 17}) {
        for (int64_t k : sizes_k(e)) {
          for (bool norm : {false, true}) {
            SCOPED_TRACE(fmt::format("n {} e {} k {} normalize {}", n, e, k, norm));
            auto logits = randn(size_t(n * e), rng, 2.0f);
            std::vector<float> p(n * e), w(n * k), p_ref(n * e), w_ref(n * k);
            std::vector<int32_t> ex(n * k), ex_ref(n * k);
            router_topk_forward(logits.data(), n, e, k, norm, p.data(), ex.data(), w.data());
            ref::router_topk_forward(logits.data(), n, e, k, norm, p_ref.data(), ex_ref.data(),
                                     w_ref.data());
            expect_close(p, p_ref, 1e-5, 1e-7, "probs");
            ASSERT_EQ(ex, ex_ref);
            expect_close(w, w_ref, 1e-5, 1e-7, "weights");
          }
        }
      }
    }
  });
}

TEST(MoeRouter, NormalizedWeightsAreSoftmaxOverChosenLogits) {
  std::mt19937 rng(2);
  const int64_t n = 9, e = 8, k = 3;
  auto logits = randn(size_t(n * e), rng, 3.0f);
  std::vector<float> p(n * e), w(n * k);
  std::vector<int32_t> ex(n * k);
  router_topk_forward(logits.data(), n, e, k, true, p.data(), ex.data(), w.data());
  for (int64_t t = 0; t < n; ++t) {
    double z = 0, sum = 0;
    for (int64_t j = 0; j < k; ++j) z += std::exp(double(logits[t * e + ex[t * k + j]]));
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_NEAR(w[t * k + j], std::exp(double(logits[t * e + ex[t * k + j]])) / z, 1e-6);
      sum += w[t * k + j];
      if (j > 0) {
        EXPECT_GE(w[t * k + j - 1], w[t * k + j]);  // descending order
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
    // The chosen are the k largest logits.
    std::vector<float> row(logits.begin() + t * e, logits.begin() + (t + 1) * e);
    std::sort(row.rbegin(), row.rend());
    for (int64_t j = 0; j < k; ++j) EXPECT_EQ(logits[t * e + ex[t * k + j]], row[j]);
  }
}

TEST(MoeRouter, KEqualsEChoosesEveryExpertInDescendingOrder) {
  std::mt19937 rng(3);
  const int64_t n = 5, e = 17, k = 17;
  auto logits = randn(size_t(n * e), rng);
  std::vector<float> p(n * e), w(n * k);
  std::vector<int32_t> ex(n * k);
  router_topk_forward(logits.data(), n, e, k, true, p.data(), ex.data(), w.data());
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> sorted(ex.begin() + t * k, ex.begin() + (t + 1) * k);
    std::sort(sorted.begin(), sorted.end());
    for (int32_t x = 0; x < e; ++x) EXPECT_EQ(sorted[x], x);
    for (int64_t j = 0; j < k; ++j) {
      // Normalising by a sum of all probs (~1) leaves the probs.
      EXPECT_NEAR(w[t * k + j], p[t * e + ex[t * k + j]], 1e-6);
      if (j > 0) {
        EXPECT_GT(w[t * k + j - 1], w[t * k + j]);
      }
    }
  }
}

TEST(MoeRouter, TiesPickLowerIndex) {
  for_each_target([&] {
    const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f,   // token 0
                                       2.0f, 2.0f, 2.0f, 2.0f, 2.0f};  // token 1: all equal
    const int64_t n = 2, e = 5, k = 2;
    std::vector<float> p(n * e), w(n * k), p_ref(n * e), w_ref(n * k);
    std::vector<int32_t> ex(n * k), ex_ref(n * k);
    router_topk_forward(logits.data(), n, e, k, false, p.data(), ex.data(), w.data());
    ref::router_topk_forward(logits.data(), n, e, k, false, p_ref.data(), ex_ref.data(),
                             w_ref.data());
    EXPECT_EQ(ex, (std::vector<int32_t>{1, 2, 0, 1}));
    EXPECT_EQ(ex_ref, ex);
    EXPECT_FLOAT_EQ(w[2], 0.2f);
    // k == e with all ties: identity order.
    std::vector<int32_t> all(e);
    std::vector<float> wall(e);
    router_topk_forward(logits.data() + e, 1, e, e, true, p.data(), all.data(), wall.data());
    EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  });
}

TEST(MoeRouter, NaNLogitsPropagateWithValidExperts) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for_each_target([&] {
    for (int64_t e : {4, 40}) {  // one vector and several
      for (int64_t k : {1, 2, 4}) {
        SCOPED_TRACE(fmt::format("e {} k {}", e, k));
        std::vector<float> logits(size_t(e), 0.5f);
        logits[1] = nan;
        std::vector<float> p(static_cast<size_t>(e)), w(static_cast<size_t>(k));
        std::vector<int32_t> ex(static_cast<size_t>(k));
        router_topk_forward(logits.data(), 1, e, k, true, p.data(), ex.data(), w.data());
        EXPECT_TRUE(std::isnan(w[0]));
        std::vector<int32_t> sorted = ex;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());  // distinct
        for (int32_t x : ex) EXPECT_TRUE(x >= 0 && x < e);
      }
    }
  });
}

// ---------------------------------------------------------------- router backward

TEST(MoeRouter, BackwardMatchesReference) {
  std::mt19937 rng(4);
  for (int64_t n : {1, 7, 33}) {
    for (int64_t e : {1, 4, 8, 17}) {
      for (int64_t k : sizes_k(e)) {
        for (bool norm : {false, true}) {
          for (bool with_dprobs : {false, true}) {
            SCOPED_TRACE(
                fmt::format("n {} e {} k {} normalize {} dprobs {}", n, e, k, norm, with_dprobs));
            auto logits = randn(size_t(n * e), rng);
            std::vector<float> p(n * e), w(n * k);
            std::vector<int32_t> ex(n * k);
            router_topk_forward(logits.data(), n, e, k, norm, p.data(), ex.data(), w.data());
            auto dw = randn(size_t(n * k), rng), dp = randn(size_t(n * e), rng);
            const float* dpp = with_dprobs ? dp.data() : nullptr;
            std::vector<float> dl(n * e, 123.0f), dl_ref(n * e);  // overwritten
            router_topk_backward(p.data(), ex.data(), w.data(), dw.data(), dpp, n, e, k, norm,
                                 dl.data());
            ref::router_topk_backward(p.data(), ex.data(), w.data(), dw.data(), dpp, n, e, k, norm,
                                      dl_ref.data());
            expect_close(dl, dl_ref, 1e-4, 1e-6, "dlogits");
          }
        }
      }
    }
  }
}

// Loss sum(weights * R) + sum(probs * Q) in double for a fixed top-k choice.
double router_loss(const std::vector<double>& logits, const std::vector<int32_t>& ex, int64_t n,
                   int64_t e, int64_t k, bool norm, const std::vector<float>& R,
                   const std::vector<float>& Q) {
  double loss = 0;
  for (int64_t t = 0; t < n; ++t) {
    double m = -1e300, z = 0, s = 0;
    for (int64_t x = 0; x < e; ++x) m = std::max(m, logits[t * e + x]);
    std::vector<double> p(e);
    for (int64_t x = 0; x < e; ++x) z += p[x] = std::exp(logits[t * e + x] - m);
    for (int64_t x = 0; x < e; ++x) {
      p[x] /= z;
      loss += p[x] * Q[t * e + x];
    }
    for (int64_t j = 0; j < k; ++j) s += p[ex[t * k + j]];
    for (int64_t j = 0; j < k; ++j) loss += p[ex[t * k + j]] / (norm ? s : 1.0) * R[t * k + j];
  }
  return loss;
}

TEST(MoeRouter, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(5);
  const int64_t n = 3, e = 6, k = 2;
  for (bool norm : {false, true}) {
    SCOPED_TRACE(fmt::format("normalize {}", norm));
    // Logits spaced >= 0.5 apart so a perturbation of h never changes the top-k set.
    std::vector<float> logits(n * e);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> row(e);
      for (int64_t x = 0; x < e; ++x) row[x] = 0.5f * float(x) - 1.0f;
      std::shuffle(row.begin(), row.end(), rng);
      std::copy(row.begin(), row.end(), logits.begin() + t * e);
    }
    std::vector<float> p(n * e), w(n * k), dl(n * e);
    std::vector<int32_t> ex(n * k);
    router_topk_forward(logits.data(), n, e, k, norm, p.data(), ex.data(), w.data());
    auto R = randn(size_t(n * k), rng), Q = randn(size_t(n * e), rng);
    router_topk_backward(p.data(), ex.data(), w.data(), R.data(), Q.data(), n, e, k, norm,
                         dl.data());
    const double h = 1e-4;
    std::vector<double> x(logits.begin(), logits.end());
    for (int64_t i = 0; i < n * e; ++i) {
      const double x0 = x[i];
      x[i] = x0 + h;
      const double lp = router_loss(x, ex, n, e, k, norm, R, Q);
      x[i] = x0 - h;
      const double lm = router_loss(x, ex, n, e, k, norm, R, Q);
      x[i] = x0;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(dl[i], fd, 1e-3 * std::fabs(fd) + 1e-5) << "logit " << i;
    }
  }
}

// ---------------------------------------------------------------- auxiliary losses

TEST(MoeLoadBalance, HandComputedPerSequence) {
  // b = 2, t = 2, e = 2, k = 1. Sequence 0 routes both tokens to expert 0, sequence 1 to 1.
  const std::vector<float> probs = {0.75f, 0.25f, 0.5f, 0.5f, 0.25f, 0.75f, 0.5f, 0.5f};
  const std::vector<int32_t> ex = {0, 0, 1, 1};
  // f0 = [1, 0], P0 = [0.625, 0.375]; f1 = [0, 1], P1 = [0.375, 0.625];
  // loss = w * 4 * (0.625 + 0.625) / 4 = 1.25 w (a global f, P would give 1.0 w).
  EXPECT_FLOAT_EQ(load_balance_loss(probs.data(), ex.data(), 2, 2, 2, 1, 0.1f, nullptr, 1.0f),
                  0.125f);
  EXPECT_FLOAT_EQ(ref::load_balance_loss(probs.data(), ex.data(), 2, 2, 2, 1, 0.1f, nullptr, 1),
                  0.125f);
  // Gradient: w * e / (b t^2) * count = 0.1 * 2 / 8 * 2 for the chosen expert, else 0.
  std::vector<float> dp(8, 1.0f);
  load_balance_loss(probs.data(), ex.data(), 2, 2, 2, 1, 0.1f, dp.data(), 2.0f);
  const std::vector<float> want = {1.1f, 1.0f, 1.1f, 1.0f, 1.0f, 1.1f, 1.0f, 1.1f};
  expect_close(dp, want, 1e-6, 0, "dprobs");
}

TEST(MoeLoadBalance, UniformRoutingGivesWeightTimesK) {
  const int64_t b = 3, t = 4, e = 4, k = 2;
  std::vector<float> probs(b * t * e, 0.25f);
  std::vector<int32_t> ex;
  for (int64_t r = 0; r < b * t; ++r) {
    ex.push_back(int32_t(r % e));
    ex.push_back(int32_t((r + 1) % e));
  }
  EXPECT_FLOAT_EQ(load_balance_loss(probs.data(), ex.data(), b, t, e, k, 0.01f, nullptr, 1), 0.02f);
}

TEST(MoeLoadBalance, MatchesReferenceAndFiniteDifferences) {
  std::mt19937 rng(6);
  for (int64_t b : {1, 3}) {
    for (int64_t t : {1, 7, 33}) {
      for (int64_t e : {1, 4, 17}) {
        for (int64_t k : sizes_k(e)) {
          SCOPED_TRACE(fmt::format("b {} t {} e {} k {}", b, t, e, k));
          const int64_t n = b * t;
          auto logits = randn(size_t(n * e), rng);
          std::vector<float> p(n * e), w(n * k);
          std::vector<int32_t> ex(n * k);
          ref::router_topk_forward(logits.data(), n, e, k, true, p.data(), ex.data(), w.data());
          auto init = randn(size_t(n * e), rng);
          std::vector<float> dp = init, dp_ref = init;
          const float loss =
              load_balance_loss(p.data(), ex.data(), b, t, e, k, 0.3f, dp.data(), 1.5f);
          const float loss_ref =
              ref::load_balance_loss(p.data(), ex.data(), b, t, e, k, 0.3f, dp_ref.data(), 1.5f);
          EXPECT_NEAR(loss, loss_ref, 1e-6 * std::fabs(loss_ref));
          expect_close(dp, dp_ref, 1e-5, 1e-7, "dprobs");
          if (n * e > 40) continue;
          // Central differences on probs (f fixed by the experts).
          const float h = 1e-2f;
          for (int64_t i = 0; i < n * e; ++i) {
            const float p0 = p[i];
            p[i] = p0 + h;
            const double lp = load_balance_loss(p.data(), ex.data(), b, t, e, k, 0.3f, nullptr, 0);
            p[i] = p0 - h;
            const double lm = load_balance_loss(p.data(), ex.data(), b, t, e, k, 0.3f, nullptr, 0);
            p[i] = p0;
            const double fd = (lp - lm) / (2 * h) * 1.5;
            EXPECT_NEAR(dp[i] - init[i], fd, 1e-3 * std::fabs(fd) + 1e-4) << "prob " << i;
          }
        }
      }
    }
  }
}

TEST(MoeZLoss, HandComputedAndMatchesReference) {
  std::vector<float> zeros(2 * 4, 0.0f);
  const double l4 = std::log(4.0);
  EXPECT_NEAR(router_z_loss(zeros.data(), 2, 4, 0.5f, nullptr, 1), 0.5 * l4 * l4, 1e-6);
  std::mt19937 rng(7);
  for_each_target([&] {
    for (int64_t n : {1, 7, 33, 130}) {
      for (int64_t e : {1, 4, 8, 17}) {
        SCOPED_TRACE(fmt::format("n {} e {}", n, e));
        auto logits = randn(size_t(n * e), rng, 3.0f);
        auto init = randn(size_t(n * e), rng);
        std::vector<float> dl = init, dl_ref = init;  // accumulated into
        const float z = router_z_loss(logits.data(), n, e, 0.01f, dl.data(), 2.0f);
        const float z_ref = ref::router_z_loss(logits.data(), n, e, 0.01f, dl_ref.data(), 2.0f);
        EXPECT_NEAR(z, z_ref, 1e-5 * std::fabs(z_ref));
        expect_close(dl, dl_ref, 1e-5, 1e-7, "dlogits");
        EXPECT_EQ(router_z_loss(logits.data(), n, e, 0.01f, nullptr, 0), z);
      }
    }
  });
}

TEST(MoeZLoss, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(8);
  const int64_t n = 3, e = 5;
  auto logits = randn(size_t(n * e), rng, 2.0f);
  std::vector<float> dl(n * e, 0.0f);
  router_z_loss(logits.data(), n, e, 0.7f, dl.data(), 1.0f);
  const float h = 1e-2f;
  for (int64_t i = 0; i < n * e; ++i) {
    const float x0 = logits[i];
    logits[i] = x0 + h;
    const double lp = router_z_loss(logits.data(), n, e, 0.7f, nullptr, 0);
    logits[i] = x0 - h;
    const double lm = router_z_loss(logits.data(), n, e, 0.7f, nullptr, 0);
    logits[i] = x0;
    const double fd = (lp - lm) / (2 * h);
    EXPECT_NEAR(dl[i], fd, 1e-3 * std::fabs(fd) + 1e-4) << "logit " << i;
  }
}

TEST(MoeLosses, IndependentOfThreadCount) {
  RestoreNumThreads restore;
  std::mt19937 rng(9);
  const int64_t b = 4, t = 300, e = 8, k = 2, n = b * t;
  auto logits = randn(size_t(n * e), rng);
  std::vector<float> p(n * e), w(n * k);
  std::vector<int32_t> ex(n * k);
  router_topk_forward(logits.data(), n, e, k, true, p.data(), ex.data(), w.data());
  std::vector<float> results[2];
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<float> dz(n * e, 0.0f), dp(n * e, 0.0f);
    auto& r = results[threads - 1];
    r.push_back(router_z_loss(logits.data(), n, e, 1e-3f, dz.data(), 1.0f));
    r.push_back(load_balance_loss(p.data(), ex.data(), b, t, e, k, 1e-2f, dp.data(), 1.0f));
    r.insert(r.end(), dz.begin(), dz.end());
    r.insert(r.end(), dp.begin(), dp.end());
  }
  EXPECT_EQ(results[0], results[1]);
}

// ---------------------------------------------------------------- capacity and plans

TEST(MoeDispatchPlan, CapacityFormula) {
  EXPECT_EQ(moe_capacity(512, 2, 8, 1.0), 128);
  EXPECT_EQ(moe_capacity(512, 2, 8, 1.25), 160);
  EXPECT_EQ(moe_capacity(512, 2, 8, 2.0), 256);
  EXPECT_EQ(moe_capacity(10, 2, 8, 1.0), 3);  // ceil(20 / 8) = 3
  EXPECT_EQ(moe_capacity(1, 1, 8, 1.5), 1);   // ceil(1/8) = 1 -> 1.5 -> 1
  EXPECT_EQ(moe_capacity(0, 1, 8, 2.5), 2);   // ceil * cf = 0 < cf -> floor(cf)
  EXPECT_EQ(moe_capacity(1, 1, 8, 0.5), 0);
}

TEST(MoeDispatchPlan, DroplessIsStableCountingSort) {
  std::mt19937 rng(10);
  MoeDispatch plan;  // reused across cases on purpose
  for (int64_t n : {1, 7, 33}) {
    for (int64_t e : {1, 4, 8, 17}) {
      for (int64_t k : sizes_k(e)) {
        SCOPED_TRACE(fmt::format("n {} e {} k {}", n, e, k));
        // Skew towards low experts so some experts get no tokens.
        std::vector<int32_t> ex = random_experts(n, std::min<int64_t>(e, k + 1), k, rng);
        moe_dispatch_plan(ex.data(), 1, n, k, e, -1, &plan);
        ASSERT_EQ(plan.rows, n * k);
        ASSERT_EQ(plan.dropped, 0);
        ASSERT_EQ(plan.group_sizes.size(), size_t(e));
        ASSERT_EQ(plan.pair_row.size(), size_t(n * k));
        ASSERT_EQ(plan.row_token.size(), size_t(n * k));
        std::vector<int64_t> bincount(e, 0);
        for (int32_t x : ex) ++bincount[x];
        EXPECT_EQ(plan.group_sizes, bincount);
        EXPECT_EQ(plan.expert_load, bincount);
        // Expected order: for each expert, its pairs in pair index order.
        std::vector<int64_t> order;
        for (int32_t x = 0; x < e; ++x)
          for (int64_t p = 0; p < n * k; ++p)
            if (ex[p] == x) order.push_back(p);
        std::vector<int> seen(n * k, 0);
        for (int64_t r = 0; r < n * k; ++r) {
          EXPECT_EQ(plan.pair_row[order[r]], r);
          EXPECT_EQ(plan.row_token[r], order[r] / k);
        }
        for (int32_t row : plan.pair_row) ++seen.at(row);
        for (int s : seen) EXPECT_EQ(s, 1);  // every pair exactly once
      }
    }
  }
}

TEST(MoeDispatchPlan, DroplessEmptyGroupsAndOneExpertTakingAll) {
  const int64_t n = 5, e = 4, k = 1;
  std::vector<int32_t> ex(n, 2);
  MoeDispatch plan;
  moe_dispatch_plan(ex.data(), 1, n, k, e, -1, &plan);
  EXPECT_EQ(plan.group_sizes, (std::vector<int64_t>{0, 0, 5, 0}));
  EXPECT_EQ(plan.row_token, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(plan.pair_row, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  // k = 2: expert 3 first slot everywhere, expert 0 second: experts 1, 2 empty.
  std::vector<int32_t> ex2 = {3, 0, 3, 0, 3, 0};
  moe_dispatch_plan(ex2.data(), 1, 3, 2, e, -1, &plan);
  EXPECT_EQ(plan.group_sizes, (std::vector<int64_t>{3, 0, 0, 3}));
  EXPECT_EQ(plan.row_token, (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(plan.pair_row, (std::vector<int32_t>{3, 0, 4, 1, 5, 2}));
}

TEST(MoeDispatchPlan, DroplessRowAlignPadsEachGroupWithZeroRows) {
  // Loads 3, 0, 5 with row_align 4: groups 4, 0, 8; padding rows hold no token.
  const int64_t e = 3, k = 1;
  std::vector<int32_t> ex = {2, 0, 2, 2, 0, 2, 0, 2};
  MoeDispatch plan;
  moe_dispatch_plan(ex.data(), 1, 8, k, e, -1, &plan, 4);
  EXPECT_EQ(plan.group_sizes, (std::vector<int64_t>{4, 0, 8}));
  EXPECT_EQ(plan.rows, 12);
  EXPECT_EQ(plan.row_token, (std::vector<int32_t>{1, 4, 6, -1, 0, 2, 3, 5, 7, -1, -1, -1}));
  EXPECT_EQ(plan.pair_row, (std::vector<int32_t>{4, 0, 5, 6, 1, 7, 2, 8}));
  EXPECT_EQ(plan.dropped, 0);
  EXPECT_LE(plan.rows, moe_dropless_max_rows(8, k, e, 4));
  EXPECT_THROW(moe_dispatch_plan(ex.data(), 1, 8, k, e, -1, &plan, 0), Error);
}

TEST(MoeDispatchPlan, CappedDropsExactlyPairsOverCapacityPerSequence) {
  std::mt19937 rng(11);
  MoeDispatch plan;
  for (int64_t b : {1, 3}) {
    for (int64_t t : {1, 7, 20}) {
      for (int64_t e : {1, 4, 8}) {
        for (int64_t k : sizes_k(e)) {
          for (int64_t cap : {0, 1, 2, 5}) {
            SCOPED_TRACE(fmt::format("b {} t {} e {} k {} capacity {}", b, t, e, k, cap));
            const int64_t n = b * t;
            std::vector<int32_t> ex = random_experts(n, e, k, rng);
            // Skew: route half the tokens' first slot to expert 0 so it overflows.
            for (int64_t r = 0; r < n; r += 2)
              if (std::find(ex.begin() + r * k, ex.begin() + (r + 1) * k, 0) ==
                  ex.begin() + (r + 1) * k)
                ex[r * k] = 0;
            moe_dispatch_plan(ex.data(), b, t, k, e, cap, &plan);
            // Independent brute force.
            std::vector<int32_t> want_pair(n * k, -1), want_token(e * b * cap, -1);
            std::vector<int64_t> load(e, 0);
            int64_t dropped = 0;
            for (int64_t s = 0; s < b; ++s) {
              for (int32_t x = 0; x < e; ++x) {
                int64_t c = 0;
                for (int64_t p = s * t * k; p < (s + 1) * t * k; ++p) {
                  if (ex[p] != x) continue;
                  ++load[x];
                  if (c < cap) {
                    const int64_t row = x * b * cap + s * cap + c;
                    want_pair[p] = int32_t(row);
                    want_token[row] = int32_t(p / k);
                  } else {
                    ++dropped;
                  }
                  ++c;
                }
              }
            }
            ASSERT_EQ(plan.rows, e * b * cap);
            EXPECT_EQ(plan.group_sizes, std::vector<int64_t>(e, b * cap));
            EXPECT_EQ(plan.pair_row, want_pair);
            EXPECT_EQ(plan.row_token, want_token);
            EXPECT_EQ(plan.expert_load, load);
            EXPECT_EQ(plan.dropped, dropped);
          }
        }
      }
    }
  }
}

TEST(MoeDispatchPlan, CappedHandExample) {
  // b = 2, t = 3, k = 1, e = 2, capacity 2. Seq 0: 0, 0, 0 (third dropped); seq 1: 0, 1, 0.
  const std::vector<int32_t> ex = {0, 0, 0, 0, 1, 0};
  MoeDispatch plan;
  moe_dispatch_plan(ex.data(), 2, 3, 1, 2, 2, &plan);
  EXPECT_EQ(plan.rows, 8);
  EXPECT_EQ(plan.pair_row, (std::vector<int32_t>{0, 1, -1, 2, 6, 3}));
  EXPECT_EQ(plan.row_token, (std::vector<int32_t>{0, 1, 3, 5, -1, -1, 4, -1}));
  EXPECT_EQ(plan.dropped, 1);
  EXPECT_EQ(plan.expert_load, (std::vector<int64_t>{5, 1}));
}

// ---------------------------------------------------------------- data movement

// A plan for random experts: dropless (cap < 0) or capped.
MoeDispatch make_plan(int64_t n, int64_t e, int64_t k, int64_t cap, std::mt19937& rng) {
  std::vector<int32_t> ex = random_experts(n, e, k, rng);
  MoeDispatch plan;
  moe_dispatch_plan(ex.data(), 1, n, k, e, cap, &plan);
  return plan;
}

TEST(MoeRows, MatchReference) {
  std::mt19937 rng(12);
  for_each_target([&] {
    for (DType dt : kDTypes) {
      for (int64_t n : {1, 7, 33}) {
        for (int64_t e : {1, 4, 17}) {
          for (int64_t k : sizes_k(e)) {
            for (int64_t d : {1, 7, 100}) {
              for (int64_t cap : {int64_t{-1}, int64_t{2}}) {
                SCOPED_TRACE(fmt::format("{} n {} e {} k {} d {} capacity {}", dtype_name(dt), n, e,
                                         k, d, cap));
                const MoeDispatch plan = make_plan(n, e, k, cap, rng);
                const int64_t rows = plan.rows;
                const Rows x(dt, randn(size_t(n * d), rng));
                // gather: a copy, bitwise equal.
                Rows g(dt, std::vector<float>(rows * d, 7.0f)), g_ref = g;
                moe_gather_rows(x.data(), dt, plan.row_token.data(), rows, d, g.data());
                ref::moe_gather_rows(x.data(), dt, plan.row_token.data(), rows, d, g_ref.data());
                ASSERT_EQ(g.bytes, g_ref.bytes);
                // scatter-add (accumulates).
                const Rows y(dt, randn(size_t(rows * d), rng));
                auto init = randn(size_t(n * d), rng);
                std::vector<float> s = init, s_ref = init;
                moe_scatter_add_rows(y.data(), dt, plan.pair_row.data(), n, k, d, s.data());
                ref::moe_scatter_add_rows(y.data(), dt, plan.pair_row.data(), n, k, d,
                                          s_ref.data());
                expect_close(s, s_ref, 1e-6, 1e-5, "scatter_add");
                // combine (accumulates).
                auto w = randn(size_t(n * k), rng);
                std::vector<float> c = init, c_ref = init;
                moe_combine(y.data(), dt, plan.pair_row.data(), w.data(), n, k, d, c.data());
                ref::moe_combine(y.data(), dt, plan.pair_row.data(), w.data(), n, k, d,
                                 c_ref.data());
                expect_close(c, c_ref, 1e-6, 1e-5, "combine");
                // combine backward: dy is a product rounded once (bitwise), dweights a dot.
                auto dout = randn(size_t(n * d), rng);
                Rows dy(dt, std::vector<float>(rows * d, 9.0f)), dy_ref = dy;
                std::vector<float> dw(n * k, 5.0f), dw_ref(n * k);
                moe_combine_backward(dout.data(), y.data(), dt, plan.pair_row.data(),
                                     plan.row_token.data(), w.data(), n, k, d, rows, dy.data(),
                                     dw.data());
                ref::moe_combine_backward(dout.data(), y.data(), dt, plan.pair_row.data(),
                                          plan.row_token.data(), w.data(), n, k, d, rows,
                                          dy_ref.data(), dw_ref.data());
                ASSERT_EQ(dy.bytes, dy_ref.bytes);
                expect_close(dw, dw_ref, 1e-5, 1e-5 * std::sqrt(double(d)), "dweights");
                for (int64_t r = 0; r < rows; ++r) {
                  if (plan.row_token[r] >= 0) continue;
                  for (int64_t i = 0; i < d; ++i) {
                    ASSERT_EQ(g.at(r * d + i), 0.0f);
                    ASSERT_EQ(dy.at(r * d + i), 0.0f);
                  }
                }
                for (int64_t p = 0; p < n * k; ++p) {
                  if (plan.pair_row[p] < 0) {
                    ASSERT_EQ(dw[p], 0.0f);
                  }
                }
              }
            }
          }
        }
      }
    }
  });
}

TEST(MoeRows, RoundTripsOnDroplessPlan) {
  std::mt19937 rng(13);
  for (DType dt : kDTypes) {
    const int64_t n = 33, e = 8, k = 2, d = 100;
    SCOPED_TRACE(dtype_name(dt));
    const MoeDispatch plan = make_plan(n, e, k, -1, rng);
    const Rows x(dt, randn(size_t(n * d), rng));
    Rows g(dt, std::vector<float>(plan.rows * d));
    moe_gather_rows(x.data(), dt, plan.row_token.data(), plan.rows, d, g.data());
    // scatter_add(gather(x)) == k * x (exact: k = 2 doubles).
    std::vector<float> s(n * d, 0.0f);
    moe_scatter_add_rows(g.data(), dt, plan.pair_row.data(), n, k, d, s.data());
    for (int64_t i = 0; i < n * d; ++i) ASSERT_EQ(s[i], 2.0f * x.at(i));
    // combine(gather(x)) with weights summing to 1 gives x.
    std::vector<float> w(n * k);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int64_t t = 0; t < n; ++t) {
      w[t * k] = u(rng);
      w[t * k + 1] = 1.0f - w[t * k];
    }
    std::vector<float> c(n * d, 0.0f);
    moe_combine(g.data(), dt, plan.pair_row.data(), w.data(), n, k, d, c.data());
    for (int64_t i = 0; i < n * d; ++i) ASSERT_NEAR(c[i], x.at(i), 1e-6 * (1 + std::fabs(x.at(i))));
  }
}

// loss = sum(out * G), out = combine(y, w): bilinear, so central differences are exact up
// to rounding.
TEST(MoeRows, CombineBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(14);
  const int64_t n = 4, e = 3, k = 2, d = 5;
  for (int64_t cap : {int64_t{-1}, int64_t{2}}) {
    SCOPED_TRACE(fmt::format("capacity {}", cap));
    const MoeDispatch plan = make_plan(n, e, k, cap, rng);
    const int64_t rows = plan.rows;
    auto y = randn(size_t(rows * d), rng), w = randn(size_t(n * k), rng);
    auto G = randn(size_t(n * d), rng);
    auto loss = [&] {
      std::vector<float> out(n * d, 0.0f);
      moe_combine(y.data(), DType::kF32, plan.pair_row.data(), w.data(), n, k, d, out.data());
      double l = 0;
      for (int64_t i = 0; i < n * d; ++i) l += double(out[i]) * G[i];
      return l;
    };
    std::vector<float> dy(rows * d), dw(n * k);
    moe_combine_backward(G.data(), y.data(), DType::kF32, plan.pair_row.data(),
                         plan.row_token.data(), w.data(), n, k, d, rows, dy.data(), dw.data());
    const float h = 1e-2f;
    auto fd = [&](float& v) {
      const float v0 = v;
      v = v0 + h;
      const double lp = loss();
      v = v0 - h;
      const double lm = loss();
      v = v0;
      return (lp - lm) / (2 * h);
    };
    for (int64_t i = 0; i < rows * d; ++i) {
      const double want = fd(y[i]);
      EXPECT_NEAR(dy[i], want, 1e-3 * std::fabs(want) + 1e-4) << "y " << i;
    }
    for (int64_t p = 0; p < n * k; ++p) {
      const double want = fd(w[p]);
      EXPECT_NEAR(dw[p], want, 1e-3 * std::fabs(want) + 1e-4) << "w " << p;
    }
  }
}

TEST(MoeRows, IndependentOfThreadCount) {
  RestoreNumThreads restore;
  std::mt19937 rng(15);
  const int64_t n = 600, e = 8, k = 2, d = 64;
  const MoeDispatch plan = make_plan(n, e, k, 160, rng);
  const int64_t rows = plan.rows;
  const Rows y(DType::kBF16, randn(size_t(rows * d), rng));
  auto w = randn(size_t(n * k), rng), dout = randn(size_t(n * d), rng);
  std::vector<float> out[2];
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<float> s(n * d, 0.0f), c(n * d, 0.0f), dw(n * k);
    Rows dy(DType::kBF16, std::vector<float>(rows * d, 1.0f));
    moe_scatter_add_rows(y.data(), y.dt, plan.pair_row.data(), n, k, d, s.data());
    moe_combine(y.data(), y.dt, plan.pair_row.data(), w.data(), n, k, d, c.data());
    moe_combine_backward(dout.data(), y.data(), y.dt, plan.pair_row.data(), plan.row_token.data(),
                         w.data(), n, k, d, rows, dy.data(), dw.data());
    auto& o = out[threads - 1];
    o.insert(o.end(), s.begin(), s.end());
    o.insert(o.end(), c.begin(), c.end());
    o.insert(o.end(), dw.begin(), dw.end());
    for (size_t i = 0; i < dy.size(); ++i) o.push_back(dy.at(i));
  }
  EXPECT_EQ(out[0], out[1]);
}

// ---------------------------------------------------------------- error paths

void expect_error(const std::function<void()>& fn, const std::string& op) {
  const std::string msg = error_message(fn);
  EXPECT_NE(msg.find(op), std::string::npos) << "message: '" << msg << "'";
}

TEST(MoeErrors, BadArgumentsThrowNamingTheOp) {
  std::vector<float> logits(16, 0.0f), p(16), w(16), dl(16);
  std::vector<int32_t> ex(16, 0);
  MoeDispatch plan;
  // k > e and k < 1.
  expect_error(
      [&] { router_topk_forward(logits.data(), 2, 4, 5, true, p.data(), ex.data(), w.data()); },
      "router_topk_forward: k = 5 must be in [1, e = 4]");
  expect_error(
      [&] { router_topk_forward(logits.data(), 2, 4, 0, true, p.data(), ex.data(), w.data()); },
      "router_topk_forward");
  expect_error(
      [&] {
        router_topk_backward(p.data(), ex.data(), w.data(), w.data(), nullptr, 2, 4, 5, true,
                             dl.data());
      },
      "router_topk_backward");
  expect_error([&] { load_balance_loss(p.data(), ex.data(), 1, 2, 4, 0, 1, nullptr, 1); },
               "load_balance_loss");
  expect_error([&] { moe_dispatch_plan(ex.data(), 1, 2, 5, 4, -1, &plan); }, "moe_dispatch_plan");
  expect_error([&] { moe_dispatch_plan(ex.data(), 1, 2, 0, 4, 3, &plan); }, "moe_dispatch_plan");
  expect_error([&] { moe_capacity(8, 3, 2, 1.0); }, "moe_capacity");
  // cf <= 0.
  expect_error([&] { moe_capacity(8, 1, 2, 0.0); }, "moe_capacity: capacity factor 0");
  expect_error([&] { moe_capacity(8, 1, 2, -1.0); }, "moe_capacity");
  // Out-of-range expert ids.
  ex[3] = 4;
  expect_error([&] { moe_dispatch_plan(ex.data(), 1, 2, 2, 4, -1, &plan); },
               "moe_dispatch_plan: experts[1, 1] = 4 is out of range for e = 4");
  expect_error([&] { load_balance_loss(p.data(), ex.data(), 1, 2, 4, 2, 1, nullptr, 1); },
               "load_balance_loss");
  expect_error(
      [&] {
        router_topk_backward(p.data(), ex.data(), w.data(), w.data(), nullptr, 2, 4, 2, true,
                             dl.data());
      },
      "router_topk_backward");
  ex[3] = 0;
  // Row ops: dtype, k, null buffers.
  expect_error([&] { moe_gather_rows(p.data(), DType::kI32, ex.data(), 2, 2, w.data()); },
               "moe_gather_rows");
  expect_error([&] { moe_combine(p.data(), DType::kF32, ex.data(), w.data(), 2, 0, 2, dl.data()); },
               "moe_combine");
  expect_error([&] { moe_scatter_add_rows(p.data(), DType::kF32, nullptr, 2, 1, 2, dl.data()); },
               "moe_scatter_add_rows");
  expect_error(
      [&] {
        moe_combine_backward(p.data(), p.data(), DType::kF32, ex.data(), ex.data(), w.data(), 2, 1,
                             2, -1, dl.data(), w.data());
      },
      "moe_combine_backward");
  expect_error([&] { router_z_loss(logits.data(), 2, 0, 1, nullptr, 1); }, "router_z_loss");
  EXPECT_THROW(moe_capacity(8, 1, 2, 0.0), Error);
}

TEST(MoeEdgeCases, EmptyInputs) {
  MoeDispatch plan;
  plan.pair_row.assign(10, 3);
  moe_dispatch_plan(nullptr, 0, 5, 2, 4, -1, &plan);
  EXPECT_EQ(plan.rows, 0);
  EXPECT_TRUE(plan.pair_row.empty());
  EXPECT_EQ(plan.group_sizes, std::vector<int64_t>(4, 0));
  EXPECT_EQ(load_balance_loss(nullptr, nullptr, 0, 5, 4, 2, 1, nullptr, 1), 0.0f);
  EXPECT_EQ(router_z_loss(nullptr, 0, 4, 1, nullptr, 1), 0.0f);
  router_topk_forward(nullptr, 0, 4, 2, true, nullptr, nullptr, nullptr);
  moe_combine(nullptr, DType::kF32, nullptr, nullptr, 0, 2, 8, nullptr);
}

}  // namespace
}  // namespace hyperion
