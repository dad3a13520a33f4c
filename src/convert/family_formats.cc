#include "convert/family_formats.h"

#include <cstring>

#include "base/error.h"

namespace hyperion::convert {

namespace {

// A family's own row comes before its other spellings (Mistral and Mixtral are Llama).
const HfModelType kHfModelTypes[] = {
    // model_type, architectures[0], family, rope_theta, rms_norm_eps
    {"llama", "LlamaForCausalLM", DecoderFamily::kLlama, 10000.0, 1e-6},
    {"mistral", "MistralForCausalLM", DecoderFamily::kLlama, 10000.0, 1e-6},
    {"mixtral", "MixtralForCausalLM", DecoderFamily::kLlama, 1e6, 1e-5},
    {"gemma", "GemmaForCausalLM", DecoderFamily::kGemma, 10000.0, 1e-6},
    {"gemma2", "Gemma2ForCausalLM", DecoderFamily::kGemma2, 10000.0, 1e-6},
    {"gemma3_text", "Gemma3ForCausalLM", DecoderFamily::kGemma3, 1e6, 1e-6},
    {"qwen2", "Qwen2ForCausalLM", DecoderFamily::kQwen2, 10000.0, 1e-6},
    {"qwen3", "Qwen3ForCausalLM", DecoderFamily::kQwen3, 10000.0, 1e-6},
};

const GgufArch kGgufArchs[] = {
    {DecoderFamily::kLlama, "llama", true},   {DecoderFamily::kGemma, "gemma", false},
    {DecoderFamily::kQwen2, "qwen2", false},  {DecoderFamily::kQwen3, "qwen3", false},
    {DecoderFamily::kGemma2, "gemma2", false}, {DecoderFamily::kGemma3, "gemma3", false},
};

// Tensor names, hyperion's (which are Hugging Face's) -> llama.cpp's (gguf-py's
// tensor_mapping.py). Layer tensors drop "model.layers.{i}." and gain "blk.{i}."; an
// expert's "{e}" is its index, gone from the stacked name.
struct TensorName {
  const char* hf;
  const char* gguf;
};

const TensorName kModelTensors[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

const TensorName kLayerTensors[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    // Mixtral: w1 = gate, w3 = up, w2 = down; llama.cpp stacks the experts.
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
    {"block_sparse_moe.experts.{e}.w1.weight", "ffn_gate_exps.weight"},
    {"block_sparse_moe.experts.{e}.w3.weight", "ffn_up_exps.weight"},
    {"block_sparse_moe.experts.{e}.w2.weight", "ffn_down_exps.weight"},
};

// Llama, Mistral, Mixtral, Gemma, Qwen2, Qwen3: post_attention_layernorm is the MLP's
// input norm.
const TensorName kPreNormLayerTensors[] = {
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
};

// Gemma 2 and 3 (post-norms): post_attention_layernorm is the attention output's norm, and
// the MLP has one before and one after.
const TensorName kPostNormLayerTensors[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};

// `name` against `pattern`, where "{e}" in the pattern matches one decimal index.
bool matches(const std::string& name, const char* pattern) {
  const char* e = std::strstr(pattern, "{e}");
  if (e == nullptr) return name == pattern;
  const size_t head = static_cast<size_t>(e - pattern);
  const std::string tail = e + 3;
  if (name.size() <= head + tail.size() || name.compare(0, head, pattern, head) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
    return false;
  for (size_t i = head; i < name.size() - tail.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return false;
  return true;
}

const char* find(std::span<const TensorName> table, const std::string& name) {
  for (const TensorName& t : table)
    if (matches(name, t.hf)) return t.gguf;
  return nullptr;
}

}  // namespace

std::span<const HfModelType> hf_model_types() {
  return kHfModelTypes;
}

const HfModelType& hf_model_type(DecoderFamily family) {
  for (const HfModelType& m : kHfModelTypes)
    if (m.family == family) return m;
  return kHfModelTypes[0];
}

const GgufArch& gguf_arch(DecoderFamily family) {
  for (const GgufArch& a : kGgufArchs)
    if (a.family == family) return a;
  return kGgufArchs[0];
}

std::vector<std::string> gguf_tensor_names(const DecoderConfig& config,
                                           const std::vector<ParamInfo>& layout) {
  const std::span<const TensorName> norms =
      config.arch.post_norms ? std::span<const TensorName>(kPostNormLayerTensors)
                             : std::span<const TensorName>(kPreNormLayerTensors);
  std::vector<std::string> out;
  out.reserve(layout.size());
  for (const ParamInfo& p : layout) {
    const char* gguf = nullptr;
    std::string prefix;
    if (p.layer < 0) {
      gguf = find(kModelTensors, p.name);
    } else {
      const std::string layer = "model.layers." + std::to_string(p.layer) + ".";
      if (p.name.compare(0, layer.size(), layer) == 0) {
        const std::string rest = p.name.substr(layer.size());
        gguf = find(kLayerTensors, rest);
        if (gguf == nullptr) gguf = find(norms, rest);
        prefix = "blk." + std::to_string(p.layer) + ".";
      }
    }
    HYP_CHECK(gguf != nullptr, "gguf: no llama.cpp name for tensor '{}' ({} family)", p.name,
              family_info(config.arch.family).decoder_block);
    out.push_back(prefix + gguf);
  }
  return out;
}

}  // namespace hyperion::convert
