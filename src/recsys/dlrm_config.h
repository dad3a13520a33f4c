// The shape of a DLRM-V2 recommender (MLPerf's: 13 dense and 26 sparse features,
// embedding dim 128, bottom MLP 512-256-128, DCNv2 interaction with 3 low-rank cross
// layers, top MLP 1024-1024-512-256-1) and how it is trained, from the `dlrm.*` keys of
// a training config (`model_type: dlrm`; configs/dlrm-tiny.yml, configs/dlrm-v2.yml).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/config.h"
#include "kernels/embedding_bag.h"
#include "tensor/dtype.h"

namespace hyperion::recsys {

enum class Sharding : uint8_t { kTable, kRow };
const char* sharding_name(Sharding s);

struct DlrmConfig {
  int64_t dense_features = 13;
  std::vector<int64_t> table_rows;  // one table per sparse feature
  int64_t embedding_dim = 128;
  Pooling pooling = Pooling::kSum;
  DType embedding_dtype = DType::kF32;  // f32 or bf16 rows (int8 is for serving)
  std::vector<int64_t> bottom_mlp;      // layer widths; the last is embedding_dim
  std::vector<int64_t> top_mlp;         // layer widths; the last is 1 (the logit)
  int64_t cross_layers = 3;
  int64_t cross_rank = 512;
  SparseOptimizer sparse_optimizer = SparseOptimizer::kRowwiseAdagrad;
  double adagrad_eps = 1e-8;
  Sharding sharding = Sharding::kTable;
  // Synthetic data (dataset_path empty): ids per bag per table, the power law of the ids
  // and the strength of the planted signal; held-out examples for AUC.
  std::vector<int32_t> bag_sizes;
  double zipf_exponent = 1.05;
  double synthetic_signal = 1.0;
  int64_t eval_examples = 16384;
  std::string eval_dataset_path;  // Criteo data: the held-out file (empty: no evaluation)

  int64_t tables() const { return static_cast<int64_t>(table_rows.size()); }
  // Width of the interaction input x0: the bottom MLP's output and every pooled vector.
  int64_t interaction_dim() const { return (1 + tables()) * embedding_dim; }
  int64_t embedding_params() const;
  int64_t dense_params() const;  // MLPs and cross layers, with biases
  // FLOPs of one example's forward pass (2 per multiply-add of the MLPs and cross layers;
  // the pooling adds are memory-bound and left out); training is 3x.
  double forward_flops_per_example() const;
};

// The `dlrm.*` keys (added to the training schema).
std::vector<ConfigKey> dlrm_config_schema();
// Parses and validates them (errors name the key and where its value came from).
DlrmConfig parse_dlrm_config(const Config& c);

}  // namespace hyperion::recsys
