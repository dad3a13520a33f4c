// The embedding tables of a recommender, placed over the ranks of a job (TorchRec's
// sharded EmbeddingBagCollection), looked up and updated by the table-batched kernels
// (kernels/embedding_bag.h).
//
// Placement:
//   table  whole tables per rank, balanced by size (largest first onto the least loaded
//          rank); the rows of a table stay together.
//   row    every table split into contiguous row blocks, block r on rank r (a table too
//          big for one rank, or a few huge tables over many ranks).
// One process holds everything and calls the fused kernels directly.
//
// With several ranks a step runs (each rank with its own batch, the dense part data
// parallel):
//   1. every rank de-duplicates its ids per table and sends each distinct id to the
//      rank that owns its row (all-to-all of counts, then of ids);
//   2. owners gather those rows and send them back (all-to-all of rows);
//   3. each rank pools its bags from the rows it received (the same kernel, over the
//      received rows: an id's row is fetched once however often the batch uses it);
//   backward: each rank sums the gradient of every distinct row it used (the
//   accumulate form of the fused kernel), sends it to the row's owner, and the owner
//   applies the sparse optimizer once per row over the sum from every rank.
// Pooled values are bitwise those of one process; updates differ from one process only
// by the order of the float sums over ranks.
//
// Initial values depend only on (seed, table, global row), so every placement starts
// from the same tables. Checkpoint tensors: `embedding_bags.<t>.weight` [rows, dim]
// (whole) or `embedding_bags.<t>.weight@<first row>` (a row block), with optimizer
// state `<tensor>.sum` ([rows, dim] for Adagrad, [rows] for row-wise Adagrad).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/aligned.h"
#include "dist/communicator.h"
#include "io/safetensors.h"
#include "kernels/embedding_bag.h"
#include "model/trainable_model.h"
#include "recsys/dlrm_config.h"

namespace hyperion::recsys {

// Where one table's rows live.
struct TableShard {
  int64_t rows = 0;       // the whole table
  int64_t first_row = 0;  // this rank's rows: [first_row, first_row + local_rows)
  int64_t local_rows = 0;
  int64_t block = 0;  // row sharding: rows per rank (owner of id = id / block)
  int owner = 0;      // table sharding: the rank holding the table
};

class EmbeddingCollection {
 public:
  EmbeddingCollection(const DlrmConfig& config, dist::Communicator& comm);

  // Where rank `rank` of `world` holds each table's rows (see the top of the file).
  static std::vector<TableShard> placement(const DlrmConfig& config, int world, int rank);
  // Bytes of rows and optimizer state on the busiest rank of `world`.
  static int64_t max_rank_bytes(const DlrmConfig& config, int world);

  // Initial rows: uniform(-1/sqrt(rows), 1/sqrt(rows)); state zero.
  void init(uint64_t seed);

  // Pools the batch's bags (batch.sparse_*: table-major, rows examples) into
  // out[b * out_stride + first_column + t * dim + j]. A collective with several ranks.
  void forward(const Batch& batch, float* out, int64_t out_stride, int64_t first_column);
  // After a forward pass that has no backward (prediction): forgets the batch.
  void end_forward() { batch_ = nullptr; }
  // After forward on the same batch: dout laid out as out (the pooled vectors'
  // gradients). Updates the rows the batch used (on their owners) with `lr`.
  void backward_update(const float* dout, int64_t dout_stride, int64_t first_column, float lr);

  // This rank's tensors for a checkpoint (weights to `model`, state to `optimizer`); the
  // pointers stay valid until the next update.
  void add_tensors(io::SafetensorsWriter& model, io::SafetensorsWriter& optimizer) const;
  // Copies every piece of the files that overlaps this rank's rows (any placement and
  // rank count may have written them); throws naming the tensor when a table's rows or
  // state are not all covered or a shape disagrees.
  void load(std::span<const io::SafetensorsFile* const> model_files,
            std::span<const io::SafetensorsFile* const> optimizer_files);

  const DlrmConfig& config() const { return config_; }
  const TableShard& shard(int64_t t) const { return shards_[size_t(t)]; }
  int64_t local_bytes() const;  // rows and optimizer state held here
  // Distinct rows the last backward updated here, and the ids it looked up.
  int64_t last_updated_rows() const { return last_updated_; }
  // The rows and state this rank holds of table t (tests).
  const void* local_weights(int64_t t) const { return weights_[size_t(t)].data(); }
  const float* local_state(int64_t t) const { return state_[size_t(t)].data(); }

 private:
  int owner_of(int64_t t, int32_t id) const;
  EmbeddingBagTable local_table(int64_t t) const;
  std::vector<EmbeddingBagTable> local_tables(int64_t first_column) const;
  std::vector<EmbeddingBagTable> received_tables(int64_t first_column);
  void forward_sharded(const Batch& batch, float* out, int64_t out_stride, int64_t first_column);
  void backward_sharded(const float* dout, int64_t dout_stride, int64_t first_column, float lr);

  DlrmConfig config_;
  dist::Communicator& comm_;
  int rank_ = 0, world_ = 1;
  std::vector<TableShard> shards_;
  std::vector<AlignedBuffer<unsigned char>> weights_;  // local rows per table (embedding_dtype)
  std::vector<AlignedBuffer<float>> state_;            // optimizer state per table
  int64_t last_updated_ = 0;
  EmbeddingBagScratch scratch_;

  // The batch of the last forward (for backward).
  const Batch* batch_ = nullptr;
  // Sharded steps: per table the distinct ids and each position's index into them, the
  // rows received for them, and the routing (counts per rank and table, both ways).
  std::vector<int32_t> inverse_;              // table-major positions, like sparse_ids
  std::vector<std::vector<int32_t>> unique_;  // per table, ascending
  std::vector<std::vector<float>> rows_;      // per table [unique, dim]
  std::vector<int64_t> send_counts_;          // [rank][table] ids this rank asks for
  std::vector<int64_t> recv_counts_;          // [rank][table] ids others ask of it
  std::vector<int32_t> recv_ids_;             // ids others asked for, in rank, table order
};

}  // namespace hyperion::recsys
