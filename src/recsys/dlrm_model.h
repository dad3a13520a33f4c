// DLRM-V2 (MLPerf's DLRM-DCNv2), forward and backward by hand as llm.c does for GPT-2:
//
//   dense [B, F] -> bottom MLP (ReLU after every layer) -> h [B, D]
//   sparse bags  -> embedding tables (pooled)            -> e [B, T, D]
//   x0 = [h, e_0 .. e_{T-1}]  [B, N], N = (1 + T) D
//   DCNv2 low-rank cross layers: x_{l+1} = x0 * (V_l (U_l x_l) + b_l) + x_l
//   top MLP (ReLU after every layer but the last) -> logit [B]
//   loss: binary cross-entropy of the logit, mean over the global batch
//
// The dense part (MLPs, cross layers: one flat f32 buffer) is data parallel: each rank
// runs its batch, the gradients are summed over ranks, and every rank applies the same
// Adagrad update. The tables are sharded (recsys/embedding_collection.h) and updated by
// the sparse optimizer fused into their backward, so a table's gradient never exists.
// Both halves use the same learning rate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "model/trainable_model.h"
#include "recsys/dlrm_config.h"
#include "recsys/embedding_collection.h"
#include "tensor/tensor.h"

namespace hyperion::recsys {

// One tensor of the dense buffer (Hugging Face-style names: bottom_mlp.0.weight, ...).
struct DenseTensor {
  std::string name;
  Shape shape;
  int64_t offset = 0;
};

struct DlrmStepResult {
  double loss = 0;       // mean over this rank's examples
  double grad_norm = 0;  // of the dense gradient, after the sum over ranks
};

class DlrmModel {
 public:
  // Activations for up to `max_batch` examples per call.
  DlrmModel(const DlrmConfig& config, int64_t max_batch, dist::Communicator& comm);

  // Dense weights from `seed` (the same on every rank) and the tables (recsys/
  // embedding_collection.h); optimizer state zero.
  void init(uint64_t seed);

  // One optimizer step on this rank's batch (a collective with several ranks): forward,
  // backward with the tables' fused updates, the dense gradients summed over ranks, and
  // Adagrad on the dense part. The gradient is that of the mean loss over the global
  // batch (every rank's batch has the same size).
  DlrmStepResult train_step(const Batch& batch, float lr);
  // Logits of a batch (forward only; a collective with several ranks).
  void predict(const Batch& batch, float* logits);

  const DlrmConfig& config() const { return config_; }
  const std::vector<DenseTensor>& dense_tensors() const { return tensors_; }
  int64_t dense_size() const { return int64_t(params_.size()); }
  float* dense_params() { return params_.data(); }
  const float* dense_params() const { return params_.data(); }
  float* dense_state() { return state_.data(); }
  const float* dense_state() const { return state_.data(); }
  EmbeddingCollection& embeddings() { return embeddings_; }
  const EmbeddingCollection& embeddings() const { return embeddings_; }
  // Gradients of the last train_step (tests).
  const std::vector<float>& dense_grads() const { return grads_; }

 private:
  struct Linear {
    int64_t in = 0, out = 0, w = 0, b = 0;  // offsets into the dense buffers
  };
  struct Cross {
    int64_t u = 0, v = 0, b = 0;  // U [r, N], V [N, r], b [N]
  };
  int64_t add(const std::string& name, Shape shape);
  void forward(const Batch& batch);
  void backward(const Batch& batch, int64_t rows);

  DlrmConfig config_;
  int64_t max_batch_;
  dist::Communicator& comm_;
  EmbeddingCollection embeddings_;
  std::vector<DenseTensor> tensors_;
  std::vector<Linear> bottom_, top_;
  std::vector<Cross> cross_;
  std::vector<float> params_, grads_, state_;
  // Activations [max_batch, width]: bottom layer outputs, x_0 .. x_L, u_l and z_l of each
  // cross layer, top layer outputs (the last is the logit), and backward scratch.
  std::vector<std::vector<float>> bottom_acts_, xs_, us_, zs_, top_acts_;
  std::vector<float> g_, g2_, dx0_, dz_, du_, dlogit_;
  int64_t rows_ = 0;
};

}  // namespace hyperion::recsys
