#include "diffusion/clip_text.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "diffusion/json_fields.h"
#include "kernels/backend.h"

namespace hyperion::diffusion {

ClipTextConfig ClipTextConfig::from_json(const std::string& text, const std::string& origin) {
  const JsonFields f(text, origin);
  ClipTextConfig c;
  c.vocab_size = f.integer("vocab_size", 49408);
  c.hidden_size = f.integer("hidden_size", 512);
  c.intermediate_size = f.integer("intermediate_size", 2048);
  c.layers = f.integer("num_hidden_layers", 12);
  c.heads = f.integer("num_attention_heads", 8);
  c.max_positions = f.integer("max_position_embeddings", 77);
  c.layer_norm_eps = f.number("layer_norm_eps", 1e-5);
  c.projection_dim = f.integer("projection_dim", 512);
  const std::string act = f.string("hidden_act", "quick_gelu");
  if (!parse_activation(act, &c.act)) f.refuse("hidden_act", "\"" + act + "\" is not supported (quick_gelu, gelu)");
  const std::vector<std::string> arch = f.strings("architectures");
  c.with_projection = !arch.empty() && arch[0] == "CLIPTextModelWithProjection";
  if (!arch.empty() && arch[0] != "CLIPTextModel" && arch[0] != "CLIPTextModelWithProjection")
    f.refuse("architectures", "\"" + arch[0] + "\" is not supported (CLIPTextModel, CLIPTextModelWithProjection)");
  // Old configs say eos_token_id 2 and transformers then pools at the largest id (the end
  // token, 49407, in CLIP's vocabulary): the same position.
  const int64_t eos = f.integer("eos_token_id", 49407);
  c.eos_token_id = int32_t(eos == 2 ? c.vocab_size - 1 : eos);
  if (c.hidden_size < 1 || c.heads < 1 || c.hidden_size % c.heads != 0)
    f.refuse("num_attention_heads", "must divide hidden_size");
  if (c.layers < 1 || c.layers > 256) f.refuse("num_hidden_layers", "must be in [1, 256]");
  if (c.vocab_size < 2 || c.max_positions < 2) f.refuse("vocab_size", "and max_position_embeddings must be > 1");
  if (c.intermediate_size < 1) f.refuse("intermediate_size", "must be positive");
  return c;
}

std::string ClipTextConfig::to_json() const {
  nlohmann::ordered_json j;
  j["architectures"] = {with_projection ? "CLIPTextModelWithProjection" : "CLIPTextModel"};
  j["bos_token_id"] = vocab_size - 2;
  j["eos_token_id"] = eos_token_id;
  j["hidden_act"] = activation_name(act);
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["layer_norm_eps"] = layer_norm_eps;
  j["max_position_embeddings"] = max_positions;
  j["model_type"] = "clip_text_model";
  j["num_attention_heads"] = heads;
  j["num_hidden_layers"] = layers;
  j["projection_dim"] = projection_dim;
  j["torch_dtype"] = "float32";
  j["vocab_size"] = vocab_size;
  return j.dump(2) + "\n";
}

ClipTextModel::ClipTextModel(const ClipTextConfig& config) : config_(config) {
  const ClipTextConfig& c = config_;
  const float eps = float(c.layer_norm_eps);
  token_embedding_ = params_.add("text_model.embeddings.token_embedding.weight", {c.vocab_size, c.hidden_size});
  position_embedding_ =
      params_.add("text_model.embeddings.position_embedding.weight", {c.max_positions, c.hidden_size});
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string name = "text_model.encoder.layers." + std::to_string(l);
    Layer layer;
    layer.norm1 = LayerNorm::declare(params_, name + ".layer_norm1", c.hidden_size, eps);
    layer.attn = Attention::declare(params_, name + ".self_attn", c.hidden_size, c.hidden_size, c.heads, true,
                                    /*clip_names=*/true);
    layer.attn.causal = true;
    layer.norm2 = LayerNorm::declare(params_, name + ".layer_norm2", c.hidden_size, eps);
    layer.fc1 = Linear::declare(params_, name + ".mlp.fc1", c.hidden_size, c.intermediate_size);
    layer.fc2 = Linear::declare(params_, name + ".mlp.fc2", c.intermediate_size, c.hidden_size);
    layers_.push_back(layer);
  }
  final_norm_ = LayerNorm::declare(params_, "text_model.final_layer_norm", c.hidden_size, eps);
  if (c.with_projection) projection_ = params_.add("text_projection.weight", {c.projection_dim, c.hidden_size});
}

ClipTextOutput ClipTextModel::forward(const std::vector<int32_t>& ids, int64_t n) const {
  const ClipTextConfig& c = config_;
  HYP_CHECK(n > 0 && int64_t(ids.size()) % n == 0, "text encoder: {} ids for {} sequences", ids.size(), n);
  const int64_t t = int64_t(ids.size()) / n, d = c.hidden_size, rows = n * t;
  HYP_CHECK(t >= 1 && t <= c.max_positions, "text encoder: {} tokens per sequence (at most {})", t, c.max_positions);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t id = ids[size_t(r)];
    HYP_CHECK(id >= 0 && id < c.vocab_size, "text encoder: token id {} outside the vocabulary [0, {})", id,
              c.vocab_size);
  }
  ClipTextOutput out;
  out.n = n;
  out.tokens = t;
  out.hidden = d;
  // Runs where the weights are; the outputs come back to the host.
  const Device device = params_.device();
  DeviceScope scope(device);
  KernelBackend& be = backend_for(device);
  auto f32 = [&](const float* p, Shape shape) { return be.view(const_cast<float*>(p), DType::kF32, shape); };
  auto download = [&](const FloatBuffer& src, std::vector<float>* dst) {
    dst->resize(src.size());
    be.download(src.data(), dst->data(), src.size() * sizeof(float));
  };
  FloatBuffer h(size_t(rows * d)), tmp(h.size()), mlp(size_t(rows * c.intermediate_size));
  // Token embeddings, then each sequence's position embeddings added.
  DeviceBuffer ids_dev(be.allocator(), ids.size() * sizeof(int32_t));
  be.upload(ids.data(), ids_dev.data(), ids.size() * sizeof(int32_t));
  be.embedding_forward(f32(params_.data(token_embedding_), {c.vocab_size, d}),
                       be.view(ids_dev.data(), DType::kI32, {rows}), f32(h.data(), {rows, d}), 1.0f);
  for (int64_t i = 0; i < n; ++i)
    be.residual_add(f32(params_.data(position_embedding_), {t * d}), f32(h.data() + i * t * d, {t * d}));
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (l + 1 == layers_.size()) download(h, &out.penultimate);  // the input of the last layer
    const Layer& layer = layers_[l];
    layer.norm1.forward(params_, h.data(), rows, tmp.data());
    layer.attn.forward(params_, tmp.data(), n, t, tmp.data(), t, h.data());
    layer.norm2.forward(params_, h.data(), rows, tmp.data());
    layer.fc1.forward(params_, tmp.data(), rows, mlp.data());
    be.activation_forward(c.act, f32(mlp.data(), {rows * c.intermediate_size}),
                          f32(mlp.data(), {rows * c.intermediate_size}));
    layer.fc2.forward(params_, mlp.data(), rows, h.data(), /*accumulate=*/true);
  }
  final_norm_.forward(params_, h.data(), rows, tmp.data());
  download(tmp, &out.last);
  out.pooled.resize(size_t(n * d));
  for (int64_t i = 0; i < n; ++i) {
    int64_t at = t - 1;
    for (int64_t j = 0; j < t; ++j)
      if (ids[size_t(i * t + j)] == c.eos_token_id) {
        at = j;
        break;
      }
    std::copy(out.last.data() + (i * t + at) * d, out.last.data() + (i * t + at + 1) * d, out.pooled.data() + i * d);
  }
  if (c.with_projection) {
    Linear proj;
    proj.w = projection_;
    proj.in = d;
    proj.out = c.projection_dim;
    const FloatBuffer pooled = to_device(out.pooled.data(), n * d, device);
    FloatBuffer embeds(size_t(n * c.projection_dim));
    proj.forward(params_, pooled.data(), n, embeds.data());
    download(embeds, &out.text_embeds);
  }
  return out;
}

}  // namespace hyperion::diffusion
