// What the trainer drives (train/trainer.h): a model it can step, evaluate and
// checkpoint, fed batches by a data source. CausalLM is one. The recommender
// (recsys/dlrm_model.h) reads the same Batch (its dense and sparse fields) but steps its
// own sharded tables and optimizers, under train/recsys_trainer.h.
#pragma once

#include <cstdint>
#include <vector>

#include "model/bucket_hooks.h"
#include "model/moe_block.h"
#include "model/param_store.h"

namespace hyperion {

class QuantizedMatmuls;

// Routing statistics of the last forward pass over all MoE layers.
struct MoeStats {
  float lb_loss = 0.0f;  // load-balance loss, weighted, summed over MoE layers
  float z_loss = 0.0f;   // router z-loss, weighted, summed over MoE layers
  // (token, choice) pairs dropped past capacity / all pairs (0 when dropless).
  double dropped_fraction = 0.0;
  // Expert load = pairs routed to an expert / the balanced share (n * k / E), over every
  // (MoE layer, expert): min and max, and the coefficient of variation (std / mean) of
  // the loads averaged over the MoE layers. Balanced routing gives 1, 1, 0.
  double load_min = 0.0, load_max = 0.0, load_cv = 0.0;
};

// A micro-batch: what a data source fills and a model's step reads. Language models use
// the token fields; a recommender the dense and sparse features and the labels.
struct Batch {
  int64_t rows = 0;                      // sequences or examples
  int64_t seq_len = 0;                   // tokens per sequence (language models)
  std::vector<int32_t> inputs, targets;  // [rows * seq_len] token ids, next-token targets
  // Packed rows (several documents per sequence): each token's position within its
  // document, 0 where one starts; a document attends to itself only. Empty: each row is
  // one sequence from position 0.
  std::vector<int32_t> positions;
  std::vector<float> dense;              // [rows, dense features]
  // Bags in table-major order: bag (table t, example b) is sparse_ids[sparse_offsets[t *
  // rows + b] .. sparse_offsets[t * rows + b + 1]) (kernels/embedding_bag.h).
  std::vector<int32_t> sparse_ids;
  std::vector<int64_t> sparse_offsets;  // tables * rows + 1 entries
  std::vector<float> labels;             // [rows]

  // A token batch of rows x seq_len (zeros).
  static Batch tokens(int64_t rows, int64_t seq_len) {
    Batch b;
    b.rows = rows;
    b.seq_len = seq_len;
    b.inputs.assign(static_cast<size_t>(rows * seq_len), 0);
    b.targets.assign(static_cast<size_t>(rows * seq_len), 0);
    return b;
  }
};

// A step's loss: the mean over `count` predictions, and the auxiliary losses the gradient
// included but the mean leaves out (MoE load balance and z-loss).
struct StepLoss {
  double loss = 0;
  int64_t count = 0;
  double aux = 0;
};

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;
  // The parameters and their gradients; with the optimizer's moments, what a checkpoint
  // holds.
  virtual ParamStore& params() = 0;
  // An empty batch of the shape the model steps on, for the data source to fill.
  virtual Batch make_batch() const = 0;
  // Items per batch that throughput counts (tokens for a language model).
  virtual int64_t items_per_batch() const = 0;
  // Hooks for the following passes (null: none). Not owned.
  virtual void set_hooks(BucketHooks* hooks) = 0;
  // Forward and backward: ACCUMULATES dloss x the gradient of (loss + aux) into
  // params().grads(), so accumulation over micro-batches passes dloss = 1 / steps.
  virtual StepLoss forward_backward(const Batch& batch, float dloss) = 0;
  // Routing statistics of the last forward (MoE models; zeros otherwise).
  virtual const MoeStats& moe_stats() const = 0;
  // The quantised matmuls (`quantization`), whose state a checkpoint holds; null when off.
  virtual QuantizedMatmuls* quantized() { return nullptr; }
};

}  // namespace hyperion
