#include "recsys/auc.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "base/error.h"

namespace hyperion::recsys {

double roc_auc(std::span<const float> scores, std::span<const float> labels) {
  HYP_CHECK(scores.size() == labels.size(), "roc_auc: {} scores but {} labels", scores.size(),
            labels.size());
  struct Item {
    float score;
    bool positive;
  };
  std::vector<Item> items(scores.size());
  int64_t positives = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    const float l = labels[i];
    HYP_CHECK(l == 0.0f || l == 1.0f, "roc_auc: labels[{}] = {} is not 0 or 1", i, l);
    HYP_CHECK(!std::isnan(scores[i]), "roc_auc: scores[{}] is NaN", i);
    items[i] = {scores[i], l == 1.0f};
    positives += l == 1.0f;
  }
  const int64_t negatives = static_cast<int64_t>(items.size()) - positives;
  if (positives == 0 || negatives == 0) return std::numeric_limits<double>::quiet_NaN();

  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.score < b.score; });
  // Walk the groups of equal scores upwards: each positive beats every negative in the
  // groups below and ties with the negatives of its own group. Counts are exact integers
  // (as doubles up to 2^53 pairs; 2 * wins stays integral with the halves).
  double twice_wins = 0.0;
  int64_t negatives_below = 0;
  for (size_t g = 0; g < items.size();) {
    size_t e = g;
    int64_t pos = 0, neg = 0;
    for (; e < items.size() && items[e].score == items[g].score; ++e)
      (items[e].positive ? pos : neg) += 1;
    twice_wins += static_cast<double>(pos) * static_cast<double>(2 * negatives_below + neg);
    negatives_below += neg;
    g = e;
  }
  return twice_wins / (2.0 * static_cast<double>(positives) * static_cast<double>(negatives));
}

}  // namespace hyperion::recsys
