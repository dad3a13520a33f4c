// Parameters of a Llama model in flat contiguous buffers. Every tensor has a fixed
// offset (64-byte aligned) into one f32 master buffer, and the same offset into the
// gradient buffer and the optional bf16 compute copy. Each decoder layer's tensors are
// contiguous, so a layer is one [begin, end) range: the unit a data-parallel or FSDP
// trainer reduces or gathers in buckets.
//
// Order: model.embed_tokens, then per layer input_layernorm, q_proj, k_proj, v_proj,
// o_proj, post_attention_layernorm, gate_proj, up_proj, down_proj, then model.norm and
// lm_head (absent when tied). Matrices are [out, in] as Hugging Face stores them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/aligned.h"
#include "model/llama_config.h"
#include "tensor/tensor.h"

namespace hyperion {

enum class ParamKind : uint8_t { kEmbedding, kMatrix, kNorm };

struct ParamInfo {
  std::string name;  // Hugging Face tensor name
  Shape shape;
  int64_t offset = 0;  // elements into the flat buffers
  int64_t numel = 0;
  int layer = -1;  // decoder layer, or -1 for embedding / final norm / lm_head
  ParamKind kind = ParamKind::kMatrix;
};

// Indices of one layer's tensors in ParamStore::infos().
struct LayerParamIndex {
  int input_norm, q, k, v, o, post_norm, gate, up, down;
};

class ParamStore {
 public:
  ParamStore(const LlamaConfig& config, bool bf16_copy);

  const LlamaConfig& config() const { return config_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo* find(const std::string& name) const;
  int64_t size() const { return size_; }  // elements in each flat buffer (with padding)
  bool has_bf16() const { return bf16_.size() > 0; }

  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  bf16* params_bf16() { return bf16_.data(); }

  // Views of tensor i in each buffer.
  TensorView param(int i) const;
  TensorView grad(int i) const;
  TensorView param_bf16(int i) const;  // empty view without a bf16 copy
  // The tensor a matmul reads: the bf16 copy in bf16 mode, else the f32 master.
  TensorView compute_weight(int i) const;

  const LayerParamIndex& layer(int l) const { return layers_[static_cast<size_t>(l)]; }
  int embed() const { return embed_; }
  int final_norm() const { return final_norm_; }
  int lm_head() const { return tie_ ? embed_ : lm_head_; }
  // [begin, end) element range of layer l's tensors (the bucket a reduction works on).
  std::pair<int64_t, int64_t> layer_range(int l) const;

  // Hugging Face initialisation: matrices and embedding normal(0, std), norms 1. The
  // random stream depends only on the seed and the tensor's name, so it does not change
  // when tensors are added or reordered.
  void init(uint64_t seed, double std = 0.02);
  void zero_grads();
  // Refreshes the bf16 copy from the master weights (after loading a checkpoint).
  void sync_bf16();

 private:
  int add(std::string name, Shape shape, int layer, ParamKind kind);

  LlamaConfig config_;
  bool tie_ = false;
  std::vector<ParamInfo> infos_;
  std::vector<LayerParamIndex> layers_;
  int embed_ = -1, final_norm_ = -1, lm_head_ = -1;
  int64_t size_ = 0;
  AlignedBuffer<float> params_, grads_;
  AlignedBuffer<bf16> bf16_;
};

}  // namespace hyperion
