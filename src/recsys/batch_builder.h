// Assembles a recommender Batch (model/trainable_model.h) one example at a time.
//
// Readers (criteo_reader.h) and generators see examples one by one, each with its label,
// dense features and one bag of ids per table; the embedding-bag kernels want the bags of
// a table contiguous. The builder stores examples as they come (example-major) and
// finish() lays them out as the Batch contract says:
//
//   dense           [rows * dense_features] f32, row-major
//   sparse_offsets  [tables * rows + 1], TABLE-major: bag (table t, example b) is
//                   sparse_ids[sparse_offsets[t * rows + b] .. sparse_offsets[t * rows + b + 1])
//   labels          [rows], each 0 or 1
//
// Bags may be empty (a missing category). The builder keeps its vectors between batches,
// and finish() resizes the batch's vectors in place, so a steady stream of batches of one
// shape allocates nothing after the first.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/trainable_model.h"

namespace hyperion::recsys {

class BatchBuilder {
 public:
  // Starts an empty batch of examples with `tables` bags (>= 0) and `dense_features`
  // dense values (>= 0) each. capacity_rows (>= 0) only reserves memory; more examples
  // may be added. Throws hyperion::Error naming the argument when one is negative.
  void begin(int64_t tables, int64_t dense_features, int64_t capacity_rows = 0);

  // Appends one example. dense has dense_features values; bag_sizes has one entry (>= 0)
  // per table; ids is the concatenation of the bags in table order (sum(bag_sizes) ids,
  // each >= 0). Throws hyperion::Error naming the example and the field at fault when a
  // size disagrees, an id is negative or the label is not 0 or 1, and then adds nothing.
  void add_example(float label, std::span<const float> dense, std::span<const int32_t> ids,
                   std::span<const int32_t> bag_sizes);

  // Writes the examples added since begin() into `out` in the layout above (rows =
  // rows(); the token fields are cleared), then empties the builder for the next batch
  // of the same shape. Throws if begin() was never called.
  void finish(Batch& out);

  int64_t rows() const { return static_cast<int64_t>(labels_.size()); }
  int64_t tables() const { return tables_; }
  int64_t dense_features() const { return dense_features_; }

 private:
  int64_t tables_ = -1;  // -1: begin() not called yet
  int64_t dense_features_ = 0;
  std::vector<float> labels_;
  std::vector<float> dense_;
  std::vector<int32_t> ids_;        // example-major: example 0's bags, then example 1's, ...
  std::vector<int32_t> bag_sizes_;  // [rows * tables], example-major
  std::vector<int64_t> starts_;     // finish()'s scratch: example-major bag starts
};

}  // namespace hyperion::recsys
