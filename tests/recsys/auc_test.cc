#include "recsys/auc.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "../test_files.h"
#include "base/error.h"

namespace hyperion::recsys {
namespace {

using testing_util::expect_error;

// The definition: over every (positive, negative) pair, 1 if the positive scores higher,
// 1/2 on a tie.
double brute_force_auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (labels[i] != 1.0f) continue;
    for (size_t j = 0; j < scores.size(); ++j) {
      if (labels[j] != 0.0f) continue;
      pairs += 1;
      wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
    }
  }
  return wins / pairs;
}

TEST(Auc, MatchesPairCountWithTies) {
  std::mt19937 rng(7);
  for (int levels : {3, 17, 1000000}) {  // few distinct scores: many ties
    for (int n : {2, 13, 500, 1201}) {
      std::vector<float> scores(static_cast<size_t>(n)), labels(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        scores[size_t(i)] = static_cast<float>(rng() % unsigned(levels)) - 1.5f;
        labels[size_t(i)] = static_cast<float>(rng() % 3 == 0);
      }
      labels[0] = 1.0f;
      labels[1] = 0.0f;
      EXPECT_NEAR(roc_auc(scores, labels), brute_force_auc(scores, labels), 1e-12)
          << "levels " << levels << " n " << n;
    }
  }
}

TEST(Auc, PerfectReversedAndTied) {
  const std::vector<float> labels = {0, 0, 1, 0, 1, 1};
  const std::vector<float> perfect = {0.1f, 0.2f, 0.7f, 0.3f, 0.8f, 0.9f};
  const std::vector<float> reversed = {0.9f, 0.8f, 0.3f, 0.7f, 0.2f, 0.1f};
  const std::vector<float> tied(6, 4.0f);
  EXPECT_EQ(roc_auc(perfect, labels), 1.0);
  EXPECT_EQ(roc_auc(reversed, labels), 0.0);
  EXPECT_EQ(roc_auc(tied, labels), 0.5);
  // Infinite logits rank like any other score.
  const std::vector<float> inf = {-INFINITY, 0.f, INFINITY, 1.f, INFINITY, 5.f};
  EXPECT_NEAR(roc_auc(inf, labels), brute_force_auc(inf, labels), 1e-15);
}

TEST(Auc, OneClassIsNaN) {
  EXPECT_TRUE(std::isnan(roc_auc(std::vector<float>{1, 2, 3}, std::vector<float>{1, 1, 1})));
  EXPECT_TRUE(std::isnan(roc_auc(std::vector<float>{1, 2}, std::vector<float>{0, 0})));
  EXPECT_TRUE(std::isnan(roc_auc(std::vector<float>{}, std::vector<float>{})));
}

TEST(Auc, RejectsBadInput) {
  expect_error(
      [] {
        roc_auc(std::vector<float>{1, 2, 3, 4}, std::vector<float>{0, 1, 0, 2});
      },
      {"labels[3]", "not 0 or 1"});
  expect_error(
      [] {
        roc_auc(std::vector<float>{1, 2}, std::vector<float>{0, 0.5f});
      },
      {"labels[1]"});
  expect_error(
      [] {
        roc_auc(std::vector<float>{1, 2}, std::vector<float>{0, 1, 1});
      },
      {"2 scores", "3 labels"});
  expect_error(
      [] {
        roc_auc(std::vector<float>{1, NAN}, std::vector<float>{0, 1});
      },
      {"scores[1]", "NaN"});
}

}  // namespace
}  // namespace hyperion::recsys
