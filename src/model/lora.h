// LoRA adapters (Hu et al., 2021) in PEFT's layout: for each adapted matrix W [out, in]
// of the decoder, A [r, in] and B [out, r], and
//
//   y = x W^T + s * (x A^T) B^T,   s = alpha / r   (alpha / sqrt(r) with rsLoRA)
//
// A starts kaiming-uniform (bound 1 / sqrt(in), PEFT's default), B at zero, so a fresh
// adapter leaves the model's outputs unchanged. The adapters sit in a ParamStore of their
// own (bucketed per layer like the model's), so training steps, syncs and checkpoints
// them with the machinery the full model uses, while the base stays frozen (a ParamStore
// without gradients). The decoder applies them in its matmuls (Decoder::set_lora).
//
// Tensor names are PEFT's: "base_model.model.<module path>.lora_A.weight" (and lora_B)
// for the base matrix "<module path>.weight".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/param_store.h"

namespace hyperion {

// The adaptable matrices, in PEFT's module names and the decoder's order.
enum class LoraModule : uint8_t { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kLoraModules = 7;
const char* lora_module_name(LoraModule m);  // "q_proj" ... "down_proj"

struct LoraConfig {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 16;
  double dropout = 0;  // on the adapter's input, training only
  bool rslora = false;  // scale alpha / sqrt(r) instead of alpha / r
  std::vector<LoraModule> targets;  // in decoder order, each once
  bool enabled() const { return rank > 0; }
  float scale() const;
  bool targets_module(LoraModule m) const;
};

// PEFT's target_modules: "all-linear" (every projection of the decoder; never lm_head),
// or names among q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj. Throws
// naming `what` (a config key or a file) and the unknown name.
std::vector<LoraModule> parse_lora_targets(const std::vector<std::string>& names,
                                           const std::string& what);
// The same from a comma-separated list ("q_proj,v_proj" or "all-linear").
std::vector<LoraModule> parse_lora_targets(const std::string& list, const std::string& what);

// PEFT's tensor names for base matrix `base_name` ("model.layers.0.self_attn.q_proj.weight").
std::string lora_a_name(const std::string& base_name);
std::string lora_b_name(const std::string& base_name);

class LoraAdapter {
 public:
  // Zero adapters (A and B) for every target matrix of `base`, on the base's device, with
  // f32 gradients when `gradients` and a bf16 copy when `bf16_copy` (the base computes in
  // bf16). Throws naming the config key for an MoE model's MLP targets (the experts are
  // not adaptable yet) and for rank 0.
  LoraAdapter(const ParamStore& base, const LoraConfig& config, bool gradients, bool bf16_copy);

  const LoraConfig& config() const { return config_; }
  float scale() const { return scale_; }
  int64_t rank() const { return config_.rank; }
  ParamStore& store() { return store_; }
  const ParamStore& store() const { return store_; }
  // The index in store() of the A matrix adapting base parameter `base_index` (its B is
  // the next index), or -1 when that parameter has no adapter.
  int a_of(int base_index) const {
    return base_index >= 0 && base_index < static_cast<int>(a_of_.size())
               ? a_of_[static_cast<size_t>(base_index)]
               : -1;
  }
  // The base parameter adapted by store tensor i (an A or a B).
  int base_of(int i) const { return base_of_[static_cast<size_t>(i)]; }
  // PEFT's initialisation: A kaiming-uniform (bound 1 / sqrt(in), the random stream
  // keyed by the seed and the tensor's name), B zero.
  void init(uint64_t seed);
  // Elements of the adapters (A and B over every target).
  int64_t elements() const;

 private:
  LoraConfig config_;
  float scale_ = 1.0f;
  ParamStore store_;
  std::vector<int> a_of_;     // per base parameter
  std::vector<int> base_of_;  // per store tensor
};

// The adapter tensors a base of `config` gets (names, shapes, layers), without allocating.
std::vector<ParamSpec> lora_layout(const DecoderConfig& config, const LoraConfig& lora);

// "q_proj,v_proj" (or "all-linear" when every module is a target).
std::string lora_target_list(const LoraConfig& lora);

// A full fine-tune's training memory plan turned into a LoRA run's: gradients and AdamW
// moments for the adapters alone (the base keeps its weights and bf16 copy, frozen; with
// `bf16_only_matrices` its dense matrices lose their f32 masters, ParamStore::
// drop_matrix_masters), the adapters' weights added, and their [2, n, r] scratch for n
// tokens per micro-batch (with dropout also an f32 [n, in] for the dropped input and its
// gradient's term).
MemoryPlan lora_memory_plan(const MemoryPlan& full, const DecoderConfig& config, const LoraConfig& lora,
                            bool bf16, int64_t tokens, bool bf16_only_matrices = false);

// Training FLOPs per token of a LoRA run (the MFU numerator): the frozen base's matmuls
// forward and for their input gradients only (4 of a full fine-tune's 6 per parameter),
// attention forward and backward as in full training, and the adapters' 6 per parameter.
double lora_train_flops_per_token(const DecoderConfig& config, const LoraConfig& lora, int64_t seq_len);

// Folds the adapter into the base: W += s * B A for every adapted matrix (f32 master
// weights, then the bf16 copy). The base's host copy is updated on a device store.
void merge_lora(const LoraAdapter& adapter, ParamStore& base);

}  // namespace hyperion
