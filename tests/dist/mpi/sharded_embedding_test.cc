// Sharded tables equal one process: each rank pools its slice of a global batch through
// the all-to-all exchange (table-wise and row-wise placement) and must get bitwise the
// pooled vectors one process computes with every table; after the fused update, the rows
// each rank holds equal one process's update over the whole global batch (up to the order
// of the float sums over ranks). Then a DLRM step on every rank's slice equals one
// process's step on the global batch.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "mpi_test_env.h"
#include "recsys/dlrm_model.h"
#include "recsys/embedding_collection.h"
#include "recsys/synthetic_data.h"
#include "tensor/convert.h"

namespace hyperion::recsys {
namespace {

DlrmConfig config_for(Sharding sharding, SparseOptimizer opt, DType dtype) {
  DlrmConfig c;
  c.dense_features = 4;
  c.table_rows = {50, 7, 1000, 3, 333};
  c.embedding_dim = 8;
  c.pooling = Pooling::kSqrtN;
  c.embedding_dtype = dtype;
  c.bottom_mlp = {16, 8};
  c.top_mlp = {16, 1};
  c.cross_layers = 2;
  c.cross_rank = 4;
  c.sparse_optimizer = opt;
  c.sharding = sharding;
  c.bag_sizes = {3, 1, 5, 2, 4};
  return c;
}

SyntheticSpec spec_of(const DlrmConfig& c) {
  SyntheticSpec s;
  s.dense_features = c.dense_features;
  s.table_rows = c.table_rows;
  s.bag_sizes = c.bag_sizes;
  s.zipf_exponent = 1.2;  // many repeated ids within and across ranks
  s.seed = 9;
  return s;
}

float row_value(const EmbeddingCollection& e, int64_t t, int64_t local_row, int64_t j) {
  const int64_t i = local_row * e.config().embedding_dim + j;
  if (e.config().embedding_dtype == DType::kF32)
    return static_cast<const float*>(e.local_weights(t))[i];
  return bf16_to_f32(static_cast<const bf16*>(e.local_weights(t))[i]);
}

void check_collection(Sharding sharding, SparseOptimizer opt, DType dtype) {
  dist::Communicator& comm = dist::test_comm();
  const int rank = comm.rank(), world = comm.world_size();
  const DlrmConfig c = config_for(sharding, opt, dtype);
  auto single = dist::make_single_process_communicator();
  EmbeddingCollection sharded(c, comm), whole(c, *single);
  sharded.init(5);
  whole.init(5);
  const int64_t B = 24, G = B * world, width = c.tables() * c.embedding_dim + 3;
  Batch local, global;
  synthetic_batch(spec_of(c), rank * B, B, local);
  synthetic_batch(spec_of(c), 0, G, global);

  std::vector<float> out(size_t(B * width), -1.0f), all(size_t(G * width), -1.0f);
  sharded.forward(local, out.data(), width, 2);
  whole.forward(global, all.data(), width, 2);
  for (int64_t i = 0; i < B * width; ++i)
    ASSERT_EQ(out[size_t(i)], all[size_t(rank * B * width + i)]) << "pooled element " << i;

  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> dout(size_t(G * width));
  for (float& v : dout) v = normal(rng);
  sharded.backward_update(dout.data() + rank * B * width, width, 2, 0.05f);
  whole.backward_update(dout.data(), width, 2, 0.05f);
  for (int64_t t = 0; t < c.tables(); ++t) {
    const TableShard& s = sharded.shard(t);
    for (int64_t r = 0; r < s.local_rows; ++r)
      for (int64_t j = 0; j < c.embedding_dim; ++j) {
        const float got = row_value(sharded, t, r, j);
        const float want = row_value(whole, t, s.first_row + r, j);
        ASSERT_NEAR(got, want, (dtype == DType::kF32 ? 1e-6f : 1e-2f) * (1 + std::fabs(want)))
            << "table " << t << " row " << s.first_row + r;
      }
  }
}

TEST(ShardedEmbedding, TableWiseEqualsOneProcess) {
  check_collection(Sharding::kTable, SparseOptimizer::kRowwiseAdagrad, DType::kF32);
  check_collection(Sharding::kTable, SparseOptimizer::kAdagrad, DType::kBF16);
}

TEST(ShardedEmbedding, RowWiseEqualsOneProcess) {
  check_collection(Sharding::kRow, SparseOptimizer::kAdagrad, DType::kF32);
  check_collection(Sharding::kRow, SparseOptimizer::kSgd, DType::kF32);
}

TEST(ShardedEmbedding, DlrmStepsEqualOneProcess) {
  dist::Communicator& comm = dist::test_comm();
  const int rank = comm.rank(), world = comm.world_size();
  for (Sharding sharding : {Sharding::kTable, Sharding::kRow}) {
    const DlrmConfig c = config_for(sharding, SparseOptimizer::kRowwiseAdagrad, DType::kF32);
    auto single = dist::make_single_process_communicator();
    const int64_t B = 16, G = B * world;
    DlrmModel sharded(c, B, comm), whole(c, G, *single);
    sharded.init(3);
    whole.init(3);
    for (int step = 0; step < 4; ++step) {
      Batch local, global;
      synthetic_batch(spec_of(c), step * G + rank * B, B, local);
      synthetic_batch(spec_of(c), step * G, G, global);
      double loss = sharded.train_step(local, 0.02f).loss;
      float l = static_cast<float>(loss);
      comm.all_reduce(&l, 1, dist::ReduceOp::kAvg);
      const double want = whole.train_step(global, 0.02f).loss;
      EXPECT_NEAR(l, want, 1e-5 * (1 + std::fabs(want)))
          << sharding_name(sharding) << " step " << step;
    }
    for (int64_t i = 0; i < sharded.dense_size(); ++i)
      ASSERT_NEAR(sharded.dense_params()[i], whole.dense_params()[i], 1e-5f)
          << sharding_name(sharding) << " dense element " << i;
  }
}

}  // namespace
}  // namespace hyperion::recsys
