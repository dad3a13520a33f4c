#include "recsys/synthetic_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "recsys/auc.h"

namespace hyperion::recsys {
namespace {

using testing_util::expect_error;

std::vector<int32_t> bag(const Batch& b, int64_t table, int64_t row) {
  const int64_t k = table * b.rows + row;
  return {b.sparse_ids.begin() + b.sparse_offsets[size_t(k)],
          b.sparse_ids.begin() + b.sparse_offsets[size_t(k + 1)]};
}

SyntheticSpec small_spec() {
  SyntheticSpec spec;
  spec.dense_features = 5;
  spec.table_rows = {1000, 100000, 7};
  spec.bag_sizes = {1, 3, 1};
  spec.seed = 42;
  return spec;
}

// Criteo-like: 13 dense features, 26 one-hot tables from tiny to large.
SyntheticSpec criteo_like_spec() {
  SyntheticSpec spec;
  for (int t = 0; t < 26; ++t) {
    spec.table_rows.push_back(t % 4 == 0 ? 100000 : t % 4 == 1 ? 5000 : t % 4 == 2 ? 300 : 10);
    spec.bag_sizes.push_back(1);
  }
  spec.seed = 5;
  return spec;
}

TEST(Synthetic, DeterministicAndSliceable) {
  const SyntheticSpec spec = small_spec();
  Batch a, b, lo, hi;
  synthetic_batch(spec, 0, 16, a);
  synthetic_batch(spec, 0, 16, b);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_EQ(a.sparse_ids, b.sparse_ids);
  EXPECT_EQ(a.sparse_offsets, b.sparse_offsets);
  EXPECT_EQ(a.labels, b.labels);

  // [0, 8) + [8, 16) = [0, 16), example by example.
  synthetic_batch(spec, 0, 8, lo);
  synthetic_batch(spec, 8, 8, hi);
  ASSERT_EQ(a.rows, 16);
  ASSERT_EQ(lo.rows, 8);
  ASSERT_EQ(a.sparse_offsets.size(), size_t(3 * 16 + 1));
  for (int64_t i = 0; i < 16; ++i) {
    const Batch& part = i < 8 ? lo : hi;
    const int64_t r = i % 8;
    EXPECT_EQ(a.labels[size_t(i)], part.labels[size_t(r)]) << i;
    for (int64_t j = 0; j < 5; ++j)
      EXPECT_EQ(a.dense[size_t(i * 5 + j)], part.dense[size_t(r * 5 + j)]) << i;
    for (int64_t t = 0; t < 3; ++t) {
      EXPECT_EQ(bag(a, t, i), bag(part, t, r)) << i << " " << t;
      EXPECT_EQ(bag(a, t, i).size(), size_t(spec.bag_sizes[size_t(t)]));
    }
    EXPECT_EQ(synthetic_logit(spec, a, i), synthetic_logit(spec, part, r));
  }

  // Another seed gives other data; reusing a batch overwrites it exactly.
  SyntheticSpec other = spec;
  other.seed = 43;
  synthetic_batch(other, 0, 16, b);
  EXPECT_NE(a.sparse_ids, b.sparse_ids);
  EXPECT_NE(a.dense, b.dense);
  synthetic_batch(spec, 0, 16, b);
  EXPECT_EQ(a.sparse_ids, b.sparse_ids);
  EXPECT_EQ(a.labels, b.labels);
}

TEST(Synthetic, IdsInRangeAndDenseLikeCriteo) {
  SyntheticSpec spec = small_spec();
  Batch batch;
  for (const auto& rows : {std::vector<int64_t>{1, 2, 3}, small_spec().table_rows}) {
    spec.table_rows = rows;
    synthetic_batch(spec, 1000000, 2000, batch);
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t i = 0; i < batch.rows; ++i)
        for (int32_t id : bag(batch, t, i)) {
          ASSERT_GE(id, 0);
          ASSERT_LT(id, rows[size_t(t)]);
        }
    for (float x : batch.dense) {  // log(1 + x) of positive values
      ASSERT_TRUE(std::isfinite(x));
      ASSERT_GT(x, 0.0f);
      ASSERT_LT(x, 20.0f);
    }
  }
  // A table of 2 rows uses both ids.
  EXPECT_NE(std::find(batch.sparse_ids.begin(), batch.sparse_ids.end(), 0), batch.sparse_ids.end());
}

TEST(Synthetic, PowerLawIds) {
  SyntheticSpec spec;
  spec.dense_features = 0;
  spec.table_rows = {100000};
  spec.bag_sizes = {1};
  spec.seed = 3;
  const int64_t n = 20000;
  Batch batch;
  synthetic_batch(spec, 0, n, batch);
  std::unordered_map<int32_t, int64_t> count;
  for (int32_t id : batch.sparse_ids) ++count[id];
  std::vector<std::pair<int64_t, int32_t>> by_count;
  for (const auto& [id, c] : count) by_count.emplace_back(c, id);
  std::sort(by_count.rbegin(), by_count.rend());
  const double mean = double(n) / 100000.0;
  EXPECT_GT(double(by_count[0].first), 20 * mean);
  EXPECT_GT(double(by_count[0].first), 0.03 * n);  // Zipf 1.05 over 1e5: about 7.7%
  // Far fewer distinct ids than uniform draws would give (about 18000).
  EXPECT_LT(count.size(), size_t(12000));
  // The hot ids are scattered over the table, not 0, 1, 2, ...
  int small = 0;
  for (int k = 0; k < 10; ++k) small += by_count[size_t(k)].second < 1000;
  EXPECT_LT(small, 5);

  // zipf_exponent 0: uniform.
  spec.zipf_exponent = 0;
  synthetic_batch(spec, 0, n, batch);
  count.clear();
  for (int32_t id : batch.sparse_ids) ++count[id];
  int64_t top = 0;
  for (const auto& [id, c] : count) top = std::max(top, c);
  EXPECT_LT(top, 8);
}

TEST(Synthetic, LabelsFollowTheLogitAndOracleAucIsHigh) {
  for (const SyntheticSpec& spec : {criteo_like_spec(), small_spec()}) {
    const int64_t n = 20000;
    Batch batch;
    synthetic_batch(spec, 0, n, batch);
    std::vector<float> logits(static_cast<size_t>(n));
    double positives = 0, expected = 0;
    for (int64_t i = 0; i < n; ++i) {
      logits[size_t(i)] = synthetic_logit(spec, batch, i);
      positives += batch.labels[size_t(i)];
      expected += 1.0 / (1.0 + std::exp(-double(logits[size_t(i)])));
    }
    const double rate = positives / double(n), auc = roc_auc(logits, batch.labels);
    std::printf("tables %zu: positive rate %.3f (expected %.3f), oracle AUC %.4f\n",
                spec.table_rows.size(), rate, expected / double(n), auc);
    EXPECT_GT(rate, 0.25);
    EXPECT_LT(rate, 0.5);
    EXPECT_NEAR(rate, expected / double(n), 0.02);  // labels ~ Bernoulli(sigmoid(logit))
    EXPECT_GT(auc, 0.8);
    EXPECT_LT(auc, 0.95);
  }

  // signal = 0: labels carry no information about the features.
  SyntheticSpec spec = criteo_like_spec();
  spec.signal = 0;
  Batch batch;
  synthetic_batch(spec, 0, 20000, batch);
  std::vector<float> scores(20000);
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = batch.dense[i * 13];  // any feature
  EXPECT_NEAR(roc_auc(scores, batch.labels), 0.5, 0.03);
}

TEST(Synthetic, RejectsBadSpecs) {
  Batch batch;
  SyntheticSpec spec = small_spec();
  spec.table_rows.clear();
  spec.bag_sizes.clear();
  expect_error([&] { synthetic_batch(spec, 0, 4, batch); }, {"table_rows", "empty"});
  spec = small_spec();
  spec.bag_sizes.pop_back();
  expect_error([&] { synthetic_batch(spec, 0, 4, batch); }, {"table_rows", "bag_sizes"});
  spec = small_spec();
  spec.bag_sizes[1] = 0;
  expect_error([&] { synthetic_batch(spec, 0, 4, batch); }, {"bag_sizes[1]"});
  spec = small_spec();
  spec.table_rows[2] = 0;
  expect_error([&] { synthetic_batch(spec, 0, 4, batch); }, {"table_rows[2]"});
  spec = small_spec();
  spec.zipf_exponent = -1;
  expect_error([&] { synthetic_batch(spec, 0, 4, batch); }, {"zipf_exponent"});
  spec.zipf_exponent = 1.0;  // the exactly-harmonic branch
  synthetic_batch(spec, 0, 4, batch);
  expect_error([&] { synthetic_batch(spec, 0, 0, batch); }, {"rows = 0"});
  expect_error([&] { synthetic_batch(spec, -1, 4, batch); }, {"first_example"});
  expect_error([&] { synthetic_logit(spec, batch, 4); }, {"row 4"});
  SyntheticSpec wider = spec;
  wider.dense_features = 6;
  expect_error([&] { synthetic_logit(wider, batch, 0); }, {"batch.dense"});
}

}  // namespace
}  // namespace hyperion::recsys
