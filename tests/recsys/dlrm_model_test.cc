#include "recsys/dlrm_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/error.h"
#include "recsys/synthetic_data.h"

namespace hyperion::recsys {
namespace {

DlrmConfig tiny_config(SparseOptimizer opt, Pooling pooling) {
  DlrmConfig c;
  c.dense_features = 5;
  c.table_rows = {7, 40, 3};
  c.embedding_dim = 4;
  c.pooling = pooling;
  c.bottom_mlp = {6, 4};
  c.top_mlp = {8, 1};
  c.cross_layers = 2;
  c.cross_rank = 3;
  c.sparse_optimizer = opt;
  c.bag_sizes = {2, 3, 1};
  return c;
}

Batch tiny_batch(const DlrmConfig& c, int64_t rows) {
  SyntheticSpec s;
  s.dense_features = c.dense_features;
  s.table_rows = c.table_rows;
  s.bag_sizes = c.bag_sizes;
  s.seed = 3;
  Batch b;
  synthetic_batch(s, 0, rows, b);
  return b;
}

// The dense gradients of one step (lr 0 leaves the weights as they are) against central
// differences of the loss, in double-checked f32.
TEST(DlrmModel, DenseGradientsMatchFiniteDifferences) {
  auto comm = dist::make_single_process_communicator();
  const DlrmConfig c = tiny_config(SparseOptimizer::kSgd, Pooling::kMean);
  DlrmModel model(c, 6, *comm);
  model.init(1);
  const Batch b = tiny_batch(c, 6);
  model.train_step(b, 0.0f);
  const std::vector<float> grads = model.dense_grads();
  int checked = 0;
  for (const DenseTensor& t : model.dense_tensors()) {
    // A few elements of every tensor.
    for (int64_t i = 0; i < t.shape.numel(); i += std::max<int64_t>(1, t.shape.numel() / 5)) {
      float* p = model.dense_params() + t.offset + i;
      const float x = *p, h = 1e-2f;
      *p = x + h;
      const double up = model.train_step(b, 0.0f).loss;
      *p = x - h;
      const double down = model.train_step(b, 0.0f).loss;
      *p = x;
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(grads[size_t(t.offset + i)], fd, 2e-3 + 2e-2 * std::fabs(fd))
          << t.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
}

// The tables' gradient, seen through one SGD step (w -= lr * g), against central
// differences of the loss.
TEST(DlrmModel, EmbeddingGradientsMatchFiniteDifferences) {
  auto comm = dist::make_single_process_communicator();
  for (Pooling pooling : {Pooling::kSum, Pooling::kSqrtN}) {
    const DlrmConfig c = tiny_config(SparseOptimizer::kSgd, pooling);
    DlrmModel model(c, 6, *comm);
    model.init(2);
    const Batch b = tiny_batch(c, 6);
    for (int64_t t = 0; t < c.tables(); ++t) {
      auto* w = static_cast<float*>(const_cast<void*>(model.embeddings().local_weights(t)));
      const int64_t n = c.table_rows[size_t(t)] * c.embedding_dim;
      const std::vector<float> before(w, w + n);
      const float lr = 1e-3f;
      model.train_step(b, lr);
      std::vector<float> grad(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) grad[size_t(i)] = (before[size_t(i)] - w[i]) / lr;
      std::copy(before.begin(), before.end(), w);
      // The dense step changed the dense weights: undo it for the differences by reloading
      // a fresh model with the same seed.
      DlrmModel fresh(c, 6, *comm);
      fresh.init(2);
      auto* fw = static_cast<float*>(const_cast<void*>(fresh.embeddings().local_weights(t)));
      for (int64_t i = 0; i < n; i += 3) {
        const float x = fw[i], h = 1e-2f;
        fw[i] = x + h;
        const double up = fresh.train_step(b, 0.0f).loss;
        fw[i] = x - h;
        const double down = fresh.train_step(b, 0.0f).loss;
        fw[i] = x;
        const double fd = (up - down) / (2 * h);
        EXPECT_NEAR(grad[size_t(i)], fd, 3e-3 + 3e-2 * std::fabs(fd))
            << pooling_name(pooling) << " table " << t << " element " << i;
      }
      model.init(2);
    }
  }
}

TEST(DlrmModel, RejectsAMismatchedBatch) {
  auto comm = dist::make_single_process_communicator();
  const DlrmConfig c = tiny_config(SparseOptimizer::kAdagrad, Pooling::kSum);
  DlrmModel model(c, 4, *comm);
  model.init(1);
  Batch b = tiny_batch(c, 6);
  try {
    model.train_step(b, 0.1f);
    FAIL() << "no error";
  } catch (const hyperion::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a batch of 6 examples (this model takes 1 to 4)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hyperion::recsys
