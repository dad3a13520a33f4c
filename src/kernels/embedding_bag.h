// Table-batched embedding bags: the lookups of a recommender (FBGEMM's "TBE" on the
// CPU). One call covers every table of a batch, so the threads split the whole batch's
// bags at once instead of one small call per table.
//
// A batch of B examples over T tables holds T * B bags in table-major order: bag (t, b)
// is ids[offsets[t * B + b] .. offsets[t * B + b + 1]) into table t (multi-hot; an
// empty bag pools to zeros), with optional per-id weights. Pooling per table:
//   sum     pooled = sum_i w_i * row(id_i)
//   mean    pooled = sum_i (w_i / n) * row(id_i)        n = ids in the bag
//   sqrtn   pooled = sum_i (w_i / sqrt(n)) * row(id_i)
// (the factor is folded into each id's weight, so every path rounds the same way).
// Rows are f32, bf16 or int8 with one f32 scale per row (symmetric absmax, the
// serving form: kernels/quantize.h); pooled vectors are f32.
//
// The backward pass is fused with a sparse optimizer, as TorchRec's fused TBE: the ids
// of each table are de-duplicated (sorted by id, occurrences in batch order), each used
// row's gradient is summed from the pooled gradients of its bags, and the optimizer
// updates that row right away. No gradient the size of a table ever exists; rows (and
// optimizer state) the batch did not use are never read or written.
//   sgd            w -= lr * g
//   adagrad        s += g * g (per element);      w -= lr * g / (sqrt(s) + eps)
//   rowwise        s += mean_j(g_j^2) (per row);  w -= lr * g / (sqrt(s) + eps)
//   accumulate     w += g   (f32 rows: the gradient of a buffer of rows, e.g. rows
//                  gathered from another rank, to be sent back to their owner)
// (PyTorch's Adagrad with lr_decay 0 and initial accumulator 0, and FBGEMM's row-wise
// Adagrad.) bf16 rows are updated in f32 and rounded to nearest even; int8 rows are for
// serving only and are refused.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace hyperion {

enum class Pooling : uint8_t { kSum, kMean, kSqrtN };
const char* pooling_name(Pooling p);
// "sum", "mean" or "sqrtn"; errors name `what` (a config key).
Pooling parse_pooling(const std::string& text, const std::string& what);

enum class SparseOptimizer : uint8_t { kSgd, kAdagrad, kRowwiseAdagrad, kAccumulate };
const char* sparse_optimizer_name(SparseOptimizer o);
// "sgd", "adagrad" or "rowwise_adagrad"; errors name `what`.
SparseOptimizer parse_sparse_optimizer(const std::string& text, const std::string& what);
// Optimizer state floats per row: dim (adagrad), 1 (row-wise), 0 (sgd, accumulate).
int64_t sparse_optimizer_state_per_row(SparseOptimizer o, int64_t dim);

// One table of a call. The pooled vector of table t lands in columns
// [out_column, out_column + dim) of the output rows.
struct EmbeddingBagTable {
  void* weights = nullptr;            // [rows, dim] row-major
  DType dtype = DType::kF32;          // f32, bf16 or i8
  const float* row_scales = nullptr;  // i8: [rows]
  float* state = nullptr;  // optimizer state, sparse_optimizer_state_per_row floats per row
  int64_t rows = 0, dim = 0;
  int64_t out_column = 0;
  Pooling pooling = Pooling::kSum;
};

// The bags of a batch (see the top of the file).
struct BagBatch {
  int64_t tables = 0, batch = 0;
  const int32_t* ids = nullptr;
  const int64_t* offsets = nullptr;  // [tables * batch + 1]: offsets[0] = 0, non-decreasing
  const float* weights = nullptr;    // per id, or null (all 1)
};

struct SparseOptimizerArgs {
  SparseOptimizer kind = SparseOptimizer::kAdagrad;
  float lr = 0.01f;
  float eps = 1e-10f;  // PyTorch's Adagrad default
};

// Checks the call before anything is written (hyperion::Error naming `op`, the table
// and, for a bad id, its position and value): dtypes, shapes, output columns inside
// out_stride, offsets, ids in range.
void check_embedding_bags(const char* op, std::span<const EmbeddingBagTable> tables,
                          const BagBatch& bags, int64_t out_stride);

// out[b * out_stride + out_column_t + j] = pooled value of bag (t, b), column j.
// Columns of out that no table covers are left as they are.
void embedding_bag_forward(std::span<const EmbeddingBagTable> tables, const BagBatch& bags,
                           float* out, int64_t out_stride);

// Reusable scratch of the fused backward (sorting and grouping the ids); keep one per
// caller to avoid reallocating every step.
struct EmbeddingBagScratch {
  std::vector<uint64_t> keys;               // (id << 32 | position) per id, sorted per table
  std::vector<int32_t> bag_of;              // position -> bag within its table
  std::vector<int64_t> uniques;             // per table: first index into keys of each distinct id
  std::vector<int64_t> table_unique_begin;  // [tables + 1] into uniques
};

// The fused backward + update of every table, from dout [batch, dout_stride] (the
// pooled vectors' gradients, laid out as out above). Rows of one id are updated once
// with the sum over all of its occurrences in the batch. Returns the number of distinct
// rows updated (over all tables).
int64_t embedding_bag_backward_update(std::span<const EmbeddingBagTable> tables,
                                      const BagBatch& bags, const float* dout, int64_t dout_stride,
                                      const SparseOptimizerArgs& opt,
                                      EmbeddingBagScratch* scratch = nullptr);

// The distinct ids of ids[0, n) in ascending order, and for each position the index of
// its id in `unique` (ids[i] == unique[inverse[i]]). Used before a lookup to fetch each
// row once (and to send each id once to the rank that owns it).
void dedup_ids(const int32_t* ids, int64_t n, std::vector<int32_t>& unique,
               std::vector<int32_t>& inverse);

namespace ref {
// Scalar references (plain loops): same contracts.
void embedding_bag_forward(std::span<const EmbeddingBagTable> tables, const BagBatch& bags,
                           float* out, int64_t out_stride);
int64_t embedding_bag_backward_update(std::span<const EmbeddingBagTable> tables,
                                      const BagBatch& bags, const float* dout, int64_t dout_stride,
                                      const SparseOptimizerArgs& opt);
}  // namespace ref

}  // namespace hyperion
