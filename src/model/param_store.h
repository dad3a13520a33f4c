// Parameters of a decoder in flat contiguous buffers. Every tensor has a fixed
// offset (64-byte aligned) into one f32 master buffer, and the same offset into the
// gradient buffer and the optional bf16 compute copy. Each decoder layer's tensors are
// contiguous, so a layer is one [begin, end) range: the unit a data-parallel or FSDP
// trainer reduces or gathers in buckets.
//
// Order: model.embed_tokens, then per layer input_layernorm, q_proj, k_proj, v_proj (each
// followed by its bias where the family has one), q_norm and k_norm (qk-norm families),
// o_proj (and its bias), post_attention_layernorm (with post-norms, Gemma 2/3: the
// attention output's norm, then pre_feedforward_layernorm), and either the dense MLP (gate_proj, up_proj,
// down_proj, then post_feedforward_layernorm with post-norms) or the mixture of experts (block_sparse_moe.gate = the router [E, D], then
// every expert's w1 (gate), every expert's w3 (up), every expert's w2 (down)), then
// model.norm and lm_head (absent when tied). Matrices are [out, in] as Hugging Face
// stores them. An MoE layer's E expert matrices of one kind sit back to back with no
// padding, so they form the stacked [E, out, in] tensor the grouped GEMM reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/aligned.h"
#include "base/allocator.h"
#include "kernels/block_quant.h"
#include "model/decoder_config.h"
#include "tensor/tensor.h"

namespace hyperion {

enum class ParamKind : uint8_t { kEmbedding, kMatrix, kNorm, kBias };

struct ParamInfo {
  std::string name;  // Hugging Face tensor name (llama.cpp's: convert/family_formats.h)
  Shape shape;
  int64_t offset = 0;  // elements into the flat buffers
  int64_t numel = 0;
  int layer = -1;  // decoder layer, or -1 for embedding / final norm / lm_head
  ParamKind kind = ParamKind::kMatrix;
};

// Indices of one layer's tensors in ParamStore::infos().
// In an MoE layer gate/up/down index expert 0's w1/w3/w2 (expert e is at index + e, see
// ParamStore::stacked_*) and router the gate; a dense layer has router = -1.
struct LayerParamIndex {
  int input_norm, q, k, v, o, mlp_norm, gate, up, down;  // mlp_norm: the MLP's input norm
  int attn_out_norm = -1, mlp_out_norm = -1;  // post-norms on the blocks' outputs; -1: none
  int router = -1;
  int q_bias = -1, k_bias = -1, v_bias = -1, o_bias = -1;  // -1: no bias
  int q_norm = -1, k_norm = -1;                            // -1: no qk-norm
  bool moe() const { return router >= 0; }
};

// A tensor of a store with a layout of its own (LoRA adapters, model/lora.h).
struct ParamSpec {
  std::string name;
  Shape shape;
  int layer = -1;
  ParamKind kind = ParamKind::kMatrix;
};

// What a ParamStore holds besides the f32 master weights.
struct ParamBuffers {
  bool bf16_copy = false;  // the bf16 copy the matmuls read in bf16 mode
  bool gradients = true;   // f32 gradients: training only (inference skips 4 B/param)
};

class ParamStore {
 public:
  // The buffers come from `alloc` (the host by default); zeroing and the bf16 refresh run
  // on the backend of its device.
  ParamStore(const DecoderConfig& config, bool bf16_copy, bool gradients = true,
             Allocator& alloc = host_allocator());

  // A store of the given tensors, in order (each layer's contiguous, layers ascending,
  // none before or after them), beside a model of `config`: its buckets are the model's
  // (0 and the last empty, 1 + l = layer l's tensors), so the data-parallel sync, the
  // optimizer and checkpoints treat it as they treat the model. The decoder indices
  // (layer(), embed() ...) are the model's business and absent here.
  ParamStore(const DecoderConfig& config, const std::vector<ParamSpec>& tensors, ParamBuffers buffers,
             Allocator& alloc = host_allocator());

  // The tensors of a model of `config` (names, shapes, offsets) without allocating them:
  // what a checkpoint must hold, checked before anything large is allocated.
  static std::vector<ParamInfo> layout(const DecoderConfig& config);
  // Bytes a ParamStore of `config` allocates with `buffers`.
  static int64_t bytes(const DecoderConfig& config, ParamBuffers buffers);

  const DecoderConfig& config() const { return config_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo* find(const std::string& name) const;
  int64_t size() const { return size_; }  // elements in each flat buffer (with padding)
  bool has_bf16() const { return !bf16_.empty(); }
  // Where the buffers live (the allocator's device); models run on its backend.
  Device device() const { return device_; }

  float* params() { return params_.as<float>(); }
  const float* params() const { return params_.as<float>(); }
  bool has_grads() const { return !grads_.empty(); }
  float* grads() { return grads_.as<float>(); }
  const float* grads() const { return grads_.as<float>(); }
  bf16* params_bf16() { return bf16_.as<bf16>(); }
  // The f32 master weights in host memory, for checkpoints and exports: params() on the
  // host; on a device a host copy that params_to_host() refreshes (before reading) and
  // params_to_device() writes back (after writing; it also refreshes the bf16 copy).
  float* host_params() { return device_ == Device::kHost ? params() : host_copy(); }
  const float* host_params() const { return const_cast<ParamStore*>(this)->host_params(); }
  void params_to_host() const;
  void params_to_device();

  // Views of tensor i in each buffer.
  TensorView param(int i) const;
  TensorView grad(int i) const;
  TensorView param_bf16(int i) const;  // empty view without a bf16 copy
  // The tensor a matmul reads: the bf16 copy in bf16 mode, else the f32 master.
  TensorView compute_weight(int i) const;
  // Tensors first .. first+count-1 (stacked experts, contiguous) as one [count, ...] view.
  TensorView stacked_param(int first, int count) const;
  TensorView stacked_grad(int first, int count) const;
  TensorView stacked_compute_weight(int first, int count) const;

  const LayerParamIndex& layer(int l) const { return layers_[static_cast<size_t>(l)]; }
  int embed() const { return embed_; }
  int final_norm() const { return final_norm_; }
  int lm_head() const { return tie_ ? embed_ : lm_head_; }
  // [begin, end) element range of layer l's tensors (the bucket a reduction works on).
  std::pair<int64_t, int64_t> layer_range(int l) const;
  // Buckets, the unit of gradient reduction and FSDP gathering, in forward order: 0 = the
  // embedding (everything before layer 0), 1 + l = layer l, n_layers + 1 = the final
  // norm and lm_head (everything after the last layer; with tied embeddings only the
  // norm). Together they cover [0, size()) without gaps.
  int num_buckets() const { return static_cast<int>(config_.n_layers) + 2; }
  std::pair<int64_t, int64_t> bucket_range(int b) const;

  // Hugging Face initialisation: matrices and embedding normal(0, std), norms 1. The
  // random stream depends only on the seed and the tensor's name, so it does not change
  // when tensors are added or reordered.
  void init(uint64_t seed, double std = 0.02);
  void zero_grads();
  // Refreshes the bf16 copy from the master weights (after loading a checkpoint); a
  // tensor whose master is dropped keeps its bf16 as it is.
  void sync_bf16();

  // A frozen bf16 store (LoRA's base) needs no f32 master of the matrices its matmuls
  // read in bf16: the dense layers' projections and an untied lm_head. From this call on
  // each of them is held in bf16 alone: its bf16 refreshed from its f32 master and the
  // master's pages returned to the OS, now and whenever it is written again (init,
  // load_model_weights through master_written), and param() of it throws. The norms,
  // biases, embedding (its lookup reads f32) and MoE layers keep theirs. A host store
  // with a bf16 copy and no gradients only. `fresh`: nothing has written the store yet
  // (both copies still zero), so there is nothing to convert or release. Returns the f32
  // elements dropped.
  int64_t drop_matrix_masters(bool fresh = false);
  bool master_dropped(int i) const {
    return !dropped_.empty() && dropped_[static_cast<size_t>(i)];
  }
  // Tensor i's f32 master was just written in place: a dropped one is converted to bf16
  // and released again (so loading holds one tensor in f32 at a time).
  void master_written(int i);
  // The tensors drop_matrix_masters() drops in a store of `config`, by index.
  static std::vector<int> droppable_masters(const DecoderConfig& config);

  // A matrix held in llama.cpp's block quantisation (a GGUF model's Q4_K, Q8_0 ...;
  // kernels/block_quant.h), read by the matmuls on its blocks: rows of `type` blocks at
  // `data`, kept alive by `owner` (the mapped file, or a buffer of rows reordered at
  // load). Its f32 master and bf16 copy are never written (a fresh host store never
  // commits their pages) and param() / compute_weight() of it throw naming it. Host
  // stores only; the embedding may be held so too (its lookup dequantises the rows).
  struct BlockWeight {
    BlockType type = BlockType::kQ8_0;
    const void* data = nullptr;
    // `data` is a read-only file mapping: a reader done with its pages may hand them back
    // (release_pages; they are read from the file again if touched).
    bool mapped = false;
  };
  void hold_in_blocks(int i, BlockType type, const void* data, std::shared_ptr<const void> owner,
                      bool mapped = false);
  const BlockWeight* block_weight(int i) const {
    return blocks_.empty() || blocks_[static_cast<size_t>(i)].data == nullptr
               ? nullptr
               : &blocks_[static_cast<size_t>(i)];
  }
  bool has_block_weights() const { return !blocks_.empty(); }
  // "gguf q4_K x 97, q6_K x 16" for a store holding block weights ("" otherwise): what
  // logs and benchmarks name its weights by.
  std::string block_weights_summary() const;

 private:
  int add(std::string name, Shape shape, int layer, ParamKind kind);
  // Adds `count` tensors named prefix + e + suffix back to back (no padding between them).
  int add_stacked(const std::string& prefix, const std::string& suffix, int count, Shape shape,
                  int layer);
  static TensorView stack(const TensorView& first, int count);
  ParamStore() = default;  // for layout() and bytes(): described, never allocated
  // Lays out every tensor (infos_, layers_, size_) without allocating.
  void describe();
  // Fills layer_begin_ from the tensors' layers, after they are laid out.
  void index_layers();
  void allocate(ParamBuffers buffers, Allocator& alloc);

  DecoderConfig config_;
  bool tie_ = false;
  std::vector<ParamInfo> infos_;
  std::vector<LayerParamIndex> layers_;
  int embed_ = -1, final_norm_ = -1, lm_head_ = -1;
  int64_t size_ = 0;
  // layer_begin_[l]: the offset where layer l's tensors start; [n_layers]: where the
  // tensors after the last layer start (size_ when there are none).
  std::vector<int64_t> layer_begin_;
  Device device_ = Device::kHost;
  DeviceBuffer params_, grads_, bf16_;
  std::vector<float> host_copy_;  // device stores: the host copy of params_
  std::vector<bool> dropped_;     // per tensor: f32 master released (bf16 only)
  std::vector<BlockWeight> blocks_;                  // per tensor, when any is held in blocks
  std::vector<std::shared_ptr<const void>> block_owners_;
  void drop_master(int i);
  std::vector<int> droppable() const;  // droppable_masters() of this store
  float* host_copy();
};

}  // namespace hyperion
