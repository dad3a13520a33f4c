// A deterministic synthetic click dataset with a known signal, for testing and
// benchmarking recommender training without the Criteo files: a model that learns the
// per-id effects below reaches an AUC of about 0.85, so AUC means something, and
// synthetic_logit() gives the true logit for the oracle AUC.
//
// Example i depends only on (seed, i) (counter-based splitmix64 hashing of
// (seed, i, table, k)), so ranks can take disjoint slices and a run can resume from any
// index without replaying a generator.
//
//   dense feature j    x = exp(mu_j + z), z ~ N(0, 1), mu_j in [1, 3] from (seed, j),
//                      stored as log(1 + x) (Criteo preprocessing)
//   ids of table t     bag_sizes[t] draws from a Zipf-like power law over ranks
//                      [0, table_rows[t]) (continuous inverse CDF of p(r) ~ (r + 1)^-s,
//                      s = zipf_exponent), each mapped to an id by a bijection of
//                      [0, table_rows[t]) derived from (seed, t), so the hot ids are spread
//                      over the table rather than being the small numbers
//   logit              bias + signal * (sum_j w_j (dense_j - mu_j) / sqrt(D)
//                                       + 3.2 * sum_t (mean_bag(effect(t, id)) - c_t) / sqrt(T))
//                      w_j and effect(t, id) uniform in [-1, 1] from (seed, j) and
//                      (seed, t, id); c_t the mean effect of table t under its id
//                      distribution (over its 32 hottest ranks, which hold most of the mass
//                      of a skewed table), so that a few hot ids cannot shift every
//                      example's logit; bias = -1
//   label              Bernoulli(sigmoid(logit)) from (seed, i)
//
// With one-hot tables (3 to 26 of them) the logit's spread gives an oracle AUC of about
// 0.82-0.86 and a positive rate of 30-39% over seeds; multi-hot bags average their
// effects, so they carry less signal per table. signal = 0 gives labels independent of
// the features (positive rate sigmoid(-1) = 27%).
#pragma once

#include <cstdint>
#include <vector>

#include "model/trainable_model.h"

namespace hyperion::recsys {

struct SyntheticSpec {
  int64_t dense_features = 13;      // D >= 0
  std::vector<int64_t> table_rows;  // rows of each embedding table, in [1, 2^31]
  std::vector<int32_t> bag_sizes;   // ids per bag per table (multi-hot; 1 = one-hot), >= 1
  double zipf_exponent = 1.05;      // s >= 0 (0: uniform ids)
  uint64_t seed = 0;
  double signal = 1.0;  // scales the logit's dependence on the features
};

// Fills `out` with examples [first_example, first_example + rows) in the Batch layout of
// batch_builder.h (table-major bags), reusing its vectors. Throws hyperion::Error naming
// the field when the spec is invalid (table_rows and bag_sizes empty or of different
// sizes, a table size or bag size out of range, a negative dense_features or
// zipf_exponent, a non-finite signal) or rows < 1 or first_example < 0.
void synthetic_batch(const SyntheticSpec& spec, int64_t first_example, int64_t rows, Batch& out);

// The true logit of example `row` of `batch` (a batch synthetic_batch filled for `spec`),
// computed from the batch's dense values and ids: its label was drawn with probability
// sigmoid(logit). Throws naming the field when the batch's shape does not fit the spec or
// row is outside [0, batch.rows). O(D + ids of the row) per call: what the logit derives
// from the spec is computed once and cached per thread.
float synthetic_logit(const SyntheticSpec& spec, const Batch& batch, int64_t row);

}  // namespace hyperion::recsys
