#include "recsys/batch_builder.h"

#include <gtest/gtest.h>

#include <vector>

#include "../test_files.h"
#include "base/error.h"

namespace hyperion::recsys {
namespace {

using testing_util::expect_error;

TEST(BatchBuilder, TableMajorLayoutWithEmptyBags) {
  BatchBuilder builder;
  builder.begin(/*tables=*/2, /*dense_features=*/2, /*capacity_rows=*/2);
  // Example 0: table 0 [5], table 1 [7, 8]. Example 1: table 0 [], table 1 [9].
  // Example 2: both bags empty.
  builder.add_example(1.0f, std::vector<float>{1, 2}, std::vector<int32_t>{5, 7, 8},
                      std::vector<int32_t>{1, 2});
  builder.add_example(0.0f, std::vector<float>{3, 4}, std::vector<int32_t>{9},
                      std::vector<int32_t>{0, 1});
  builder.add_example(1.0f, std::vector<float>{5, 6}, {}, std::vector<int32_t>{0, 0});
  EXPECT_EQ(builder.rows(), 3);

  Batch batch = Batch::tokens(2, 3);  // stale token fields are cleared
  builder.finish(batch);
  EXPECT_EQ(batch.rows, 3);
  EXPECT_EQ(batch.seq_len, 0);
  EXPECT_TRUE(batch.inputs.empty());
  EXPECT_TRUE(batch.targets.empty());
  EXPECT_EQ(batch.labels, (std::vector<float>{1, 0, 1}));
  EXPECT_EQ(batch.dense, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  // Table 0: [5] [] []; table 1: [7, 8] [9] [].
  EXPECT_EQ(batch.sparse_ids, (std::vector<int32_t>{5, 7, 8, 9}));
  EXPECT_EQ(batch.sparse_offsets, (std::vector<int64_t>{0, 1, 1, 1, 3, 4, 4}));
  EXPECT_EQ(builder.rows(), 0);

  // The builder is ready for the next batch of the same shape; the batch is overwritten.
  builder.add_example(0.0f, std::vector<float>{7, 8}, std::vector<int32_t>{1, 2, 3},
                      std::vector<int32_t>{2, 1});
  builder.add_example(1.0f, std::vector<float>{9, 10}, std::vector<int32_t>{4},
                      std::vector<int32_t>{1, 0});
  builder.finish(batch);
  EXPECT_EQ(batch.rows, 2);
  EXPECT_EQ(batch.labels, (std::vector<float>{0, 1}));
  EXPECT_EQ(batch.dense, (std::vector<float>{7, 8, 9, 10}));
  // Table 0: [1, 2] [4]; table 1: [3] [].
  EXPECT_EQ(batch.sparse_ids, (std::vector<int32_t>{1, 2, 4, 3}));
  EXPECT_EQ(batch.sparse_offsets, (std::vector<int64_t>{0, 2, 3, 4, 4}));

  builder.finish(batch);  // no examples
  EXPECT_EQ(batch.rows, 0);
  EXPECT_EQ(batch.sparse_offsets, (std::vector<int64_t>{0}));
  EXPECT_TRUE(batch.labels.empty() && batch.dense.empty() && batch.sparse_ids.empty());
}

TEST(BatchBuilder, NoTablesOrNoDense) {
  BatchBuilder builder;
  builder.begin(0, 1);
  builder.add_example(1.0f, std::vector<float>{3}, {}, {});
  Batch batch;
  builder.finish(batch);
  EXPECT_EQ(batch.sparse_offsets, (std::vector<int64_t>{0}));
  builder.begin(1, 0);
  builder.add_example(0.0f, {}, std::vector<int32_t>{4}, std::vector<int32_t>{1});
  builder.finish(batch);
  EXPECT_EQ(batch.sparse_offsets, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(batch.dense.empty());
}

TEST(BatchBuilder, RejectsMismatchedExamples) {
  BatchBuilder builder;
  const std::vector<float> dense = {1, 2};
  const std::vector<int32_t> ids = {1, 2, 3}, sizes = {1, 2};
  expect_error([&] { builder.add_example(1.0f, dense, ids, sizes); }, {"begin()"});
  expect_error([&] { builder.begin(-1, 2); }, {"tables"});
  builder.begin(2, 2);
  builder.add_example(1.0f, dense, ids, sizes);
  expect_error([&] { builder.add_example(1.0f, std::vector<float>{1}, ids, sizes); },
               {"example 1", "dense", "dense_features = 2"});
  expect_error([&] { builder.add_example(1.0f, dense, ids, std::vector<int32_t>{3}); },
               {"example 1", "bag_sizes"});
  expect_error(
      [&] {
        builder.add_example(1.0f, dense, ids, std::vector<int32_t>{1, 1});
      },
      {"example 1", "ids has 3", "sum to 2"});
  expect_error(
      [&] {
        builder.add_example(1.0f, dense, ids, std::vector<int32_t>{4, -1});
      },
      {"bag_sizes[1]"});
  expect_error([&] { builder.add_example(0.5f, dense, ids, sizes); }, {"label"});
  expect_error(
      [&] {
        builder.add_example(1.0f, dense, std::vector<int32_t>{1, -2, 3}, sizes);
      },
      {"ids[1]", "negative"});
  EXPECT_EQ(builder.rows(), 1);  // the rejected examples added nothing
}

}  // namespace
}  // namespace hyperion::recsys
