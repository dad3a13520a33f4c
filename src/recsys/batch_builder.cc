#include "recsys/batch_builder.h"

#include <algorithm>

#include "base/error.h"

namespace hyperion::recsys {

void BatchBuilder::begin(int64_t tables, int64_t dense_features, int64_t capacity_rows) {
  HYP_CHECK(tables >= 0, "BatchBuilder::begin: tables = {} is negative", tables);
  HYP_CHECK(dense_features >= 0, "BatchBuilder::begin: dense_features = {} is negative",
            dense_features);
  HYP_CHECK(capacity_rows >= 0, "BatchBuilder::begin: capacity_rows = {} is negative",
            capacity_rows);
  tables_ = tables;
  dense_features_ = dense_features;
  labels_.clear();
  dense_.clear();
  ids_.clear();
  bag_sizes_.clear();
  labels_.reserve(static_cast<size_t>(capacity_rows));
  dense_.reserve(static_cast<size_t>(capacity_rows * dense_features));
  bag_sizes_.reserve(static_cast<size_t>(capacity_rows * tables));
}

void BatchBuilder::add_example(float label, std::span<const float> dense,
                               std::span<const int32_t> ids, std::span<const int32_t> bag_sizes) {
  const int64_t example = rows();
  HYP_CHECK(tables_ >= 0, "BatchBuilder::add_example: begin() was not called");
  HYP_CHECK(label == 0.0f || label == 1.0f,
            "BatchBuilder::add_example: example {}: label {} is not 0 or 1", example, label);
  HYP_CHECK(static_cast<int64_t>(dense.size()) == dense_features_,
            "BatchBuilder::add_example: example {}: dense has {} values, expected "
            "dense_features = {}",
            example, dense.size(), dense_features_);
  HYP_CHECK(static_cast<int64_t>(bag_sizes.size()) == tables_,
            "BatchBuilder::add_example: example {}: bag_sizes has {} entries, expected one per "
            "table ({})",
            example, bag_sizes.size(), tables_);
  int64_t total = 0;
  for (size_t t = 0; t < bag_sizes.size(); ++t) {
    HYP_CHECK(bag_sizes[t] >= 0,
              "BatchBuilder::add_example: example {}: bag_sizes[{}] = {} is "
              "negative",
              example, t, bag_sizes[t]);
    total += bag_sizes[t];
  }
  HYP_CHECK(static_cast<int64_t>(ids.size()) == total,
            "BatchBuilder::add_example: example {}: ids has {} entries but bag_sizes sum to {}",
            example, ids.size(), total);
  for (size_t k = 0; k < ids.size(); ++k)
    HYP_CHECK(ids[k] >= 0, "BatchBuilder::add_example: example {}: ids[{}] = {} is negative",
              example, k, ids[k]);
  labels_.push_back(label);
  dense_.insert(dense_.end(), dense.begin(), dense.end());
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  bag_sizes_.insert(bag_sizes_.end(), bag_sizes.begin(), bag_sizes.end());
}

void BatchBuilder::finish(Batch& out) {
  HYP_CHECK(tables_ >= 0, "BatchBuilder::finish: begin() was not called");
  const int64_t rows = this->rows(), tables = tables_;
  out.rows = rows;
  out.seq_len = 0;
  out.inputs.clear();
  out.targets.clear();
  out.labels.assign(labels_.begin(), labels_.end());
  out.dense.assign(dense_.begin(), dense_.end());

  // Where each (example, table) bag starts in ids_ (example-major prefix sums).
  starts_.resize(static_cast<size_t>(rows * tables));
  int64_t at = 0;
  for (size_t k = 0; k < starts_.size(); ++k) {
    starts_[k] = at;
    at += bag_sizes_[k];
  }
  // Re-lay the bags table-major.
  out.sparse_ids.resize(ids_.size());
  out.sparse_offsets.resize(static_cast<size_t>(tables * rows + 1));
  int64_t next = 0;
  for (int64_t t = 0; t < tables; ++t) {
    for (int64_t b = 0; b < rows; ++b) {
      const size_t k = static_cast<size_t>(b * tables + t);
      out.sparse_offsets[static_cast<size_t>(t * rows + b)] = next;
      const auto first = ids_.begin() + starts_[k];
      std::copy(first, first + bag_sizes_[k], out.sparse_ids.begin() + next);
      next += bag_sizes_[k];
    }
  }
  out.sparse_offsets.back() = next;

  labels_.clear();
  dense_.clear();
  ids_.clear();
  bag_sizes_.clear();
}

}  // namespace hyperion::recsys
