// transformers' CLIPTextModel and CLIPTextModelWithProjection (SD's text_encoder,
// SDXL's text_encoder_2) from config.json: token + position embeddings, pre-LayerNorm
// transformer layers with causal self-attention and a quick_gelu or gelu MLP, the final
// LayerNorm, the pooled output at each sequence's first end-of-text token and, with
// projection, text_projection. Names and shapes are transformers' (model.safetensors).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diffusion/nn.h"
#include "diffusion/param_table.h"
#include "kernels/activation.h"

namespace hyperion::diffusion {

struct ClipTextConfig {
  int64_t vocab_size = 49408, hidden_size = 768, intermediate_size = 3072;
  int64_t layers = 12, heads = 12, max_positions = 77;
  Activation act = Activation::kQuickGelu;
  double layer_norm_eps = 1e-5;
  bool with_projection = false;  // CLIPTextModelWithProjection
  int64_t projection_dim = 768;
  int32_t eos_token_id = 49407;  // where the pooled output is read

  static ClipTextConfig from_json(const std::string& text, const std::string& origin);
  std::string to_json() const;
};

struct ClipTextOutput {
  int64_t n = 0, tokens = 0, hidden = 0;
  std::vector<float> last;         // [n, tokens, hidden]: after the final LayerNorm
  std::vector<float> penultimate;  // [n, tokens, hidden]: hidden_states[-2] (SDXL's choice)
  std::vector<float> pooled;       // [n, hidden]: last at each sequence's end token
  std::vector<float> text_embeds;  // [n, projection_dim] (with projection)
};

class ClipTextModel {
 public:
  explicit ClipTextModel(const ClipTextConfig& config);
  const ClipTextConfig& config() const { return config_; }
  ParamTable& params() { return params_; }
  const ParamTable& params() const { return params_; }
  // ids [n, tokens] (tokens <= max_positions; ids in the vocabulary). The pooled output
  // is read at the first eos_token_id of each row (the last position when a row has none).
  ClipTextOutput forward(const std::vector<int32_t>& ids, int64_t n) const;

 private:
  struct Layer {
    LayerNorm norm1, norm2;
    Attention attn;
    Linear fc1, fc2;
  };
  ClipTextConfig config_;
  ParamTable params_;
  int token_embedding_ = -1, position_embedding_ = -1, projection_ = -1;
  std::vector<Layer> layers_;
  LayerNorm final_norm_;
};

}  // namespace hyperion::diffusion
