// Area under the ROC curve, the ranking metric recommender models report (Criteo / DLRM
// runs quote AUC rather than loss): the probability that a random positive example scores
// above a random negative one.
//
// Exact, not binned: the Mann-Whitney U statistic over the examples sorted by score, with
// a tie between a positive and a negative counted 1/2, in O(n log n). The result does not
// depend on the order of the examples. Scores may be logits or probabilities (any
// monotone transform gives the same AUC).
#pragma once

#include <span>

namespace hyperion::recsys {

// ROC AUC of `scores` against `labels` (same size; each label 0 or 1). Returns NaN when
// only one class is present (or there are no examples): the AUC is undefined there, and
// NaN cannot be mistaken for a model's measured 0.5. Throws hyperion::Error naming the
// index when the sizes differ, a label is not 0 or 1, or a score is NaN.
double roc_auc(std::span<const float> scores, std::span<const float> labels);

}  // namespace hyperion::recsys
