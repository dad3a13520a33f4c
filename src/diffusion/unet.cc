#include "diffusion/unet.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "diffusion/json_fields.h"
#include "diffusion/unet_tape.h"
#include "kernels/activation.h"
#include "kernels/backend.h"
#include "kernels/dense_ops.h"
#include "kernels/timestep_embedding.h"

namespace hyperion::diffusion {

namespace {

bool is_cross(const std::string& type) {
  return type.rfind("CrossAttn", 0) == 0;
}

}  // namespace

UNetConfig UNetConfig::from_json(const std::string& text, const std::string& origin) {
  const JsonFields f(text, origin);
  UNetConfig c;
  c.sample_size = f.integer("sample_size", 64);
  c.in_channels = f.integer("in_channels", 4);
  c.out_channels = f.integer("out_channels", 4);
  c.flip_sin_to_cos = f.boolean("flip_sin_to_cos", true);
  c.freq_shift = f.number("freq_shift", 0);
  c.down_block_types = f.strings("down_block_types");
  c.up_block_types = f.strings("up_block_types");
  if (c.down_block_types.empty())
    c.down_block_types = {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"};
  if (c.up_block_types.empty())
    c.up_block_types = {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"};
  const size_t blocks = c.down_block_types.size();
  c.mid_block_type = f.has("mid_block_type") ? f.string("mid_block_type", "") : "UNetMidBlock2DCrossAttn";
  c.block_out_channels = f.integers("block_out_channels", 0, {320, 640, 1280, 1280});
  c.layers_per_block = f.integer("layers_per_block", 2);
  c.downsample_padding = f.integer("downsample_padding", 1);
  c.norm_num_groups = f.integer("norm_num_groups", 32);
  c.norm_eps = f.number("norm_eps", 1e-5);
  c.cross_attention_dim = f.integer("cross_attention_dim", 1280);
  c.use_linear_projection = f.boolean("use_linear_projection", false);
  // diffusers' naming quirk: attention_head_dim holds the number of heads when
  // num_attention_heads is not given (every Stable Diffusion config).
  const char* heads_key = f.has("num_attention_heads") ? "num_attention_heads" : "attention_head_dim";
  c.heads = f.integers(heads_key, blocks, std::vector<int64_t>(blocks, 8));
  c.transformer_layers_per_block = f.integers("transformer_layers_per_block", blocks, std::vector<int64_t>(blocks, 1));

  if (c.block_out_channels.size() != blocks) f.refuse("block_out_channels", "must have one entry per down block");
  if (c.up_block_types.size() != blocks) f.refuse("up_block_types", "must have one entry per down block");
  for (const std::string& t : c.down_block_types)
    if (t != "DownBlock2D" && t != "CrossAttnDownBlock2D")
      f.refuse("down_block_types", "\"" + t + "\" is not supported (DownBlock2D, CrossAttnDownBlock2D)");
  for (const std::string& t : c.up_block_types)
    if (t != "UpBlock2D" && t != "CrossAttnUpBlock2D")
      f.refuse("up_block_types", "\"" + t + "\" is not supported (UpBlock2D, CrossAttnUpBlock2D)");
  if (c.mid_block_type != "UNetMidBlock2DCrossAttn" && !c.mid_block_type.empty())
    f.refuse("mid_block_type", "\"" + c.mid_block_type + "\" is not supported (UNetMidBlock2DCrossAttn)");
  for (int64_t ch : c.block_out_channels)
    if (ch <= 0 || ch % c.norm_num_groups != 0)
      f.refuse("block_out_channels", "entries must be positive multiples of norm_num_groups (" +
                                         std::to_string(c.norm_num_groups) + ")");
  for (size_t i = 0; i < blocks; ++i)
    if (c.heads[i] <= 0 || c.block_out_channels[i] % c.heads[i] != 0)
      f.refuse(heads_key, "entry " + std::to_string(i) + " (" + std::to_string(c.heads[i]) +
                              " heads) does not divide the block's " + std::to_string(c.block_out_channels[i]) +
                              " channels");
  if (c.layers_per_block < 1 || c.layers_per_block > 16) f.refuse("layers_per_block", "must be in [1, 16]");
  if (c.downsample_padding != 1) f.refuse("downsample_padding", "must be 1");
  if (c.in_channels < 1 || c.out_channels < 1) f.refuse("in_channels", "and out_channels must be positive");
  if (c.cross_attention_dim < 1) f.refuse("cross_attention_dim", "must be positive (a list is not supported)");

  // What this UNet does not build: refused rather than ignored.
  auto must_be_null = [&](const char* key) {
    if (f.has(key)) f.refuse(key, "is not supported (must be null)");
  };
  for (const char* key : {"class_embed_type", "num_class_embeds", "time_cond_proj_dim", "encoder_hid_dim",
                          "encoder_hid_dim_type", "timestep_post_act", "time_embedding_dim",
                          "reverse_transformer_layers_per_block", "cross_attention_norm",
                          "time_embedding_act_fn"})
    must_be_null(key);
  auto must_equal = [&](const char* key, const std::string& want) {
    if (f.has(key) && f.string(key, want) != want) f.refuse(key, "\"" + f.string(key, want) + "\" is not supported (" + want + ")");
  };
  must_equal("act_fn", "silu");
  must_equal("resnet_time_scale_shift", "default");
  must_equal("time_embedding_type", "positional");
  must_equal("attention_type", "default");
  for (const char* key : {"dual_cross_attention", "center_input_sample", "resnet_skip_time_act",
                          "mid_block_only_cross_attention", "class_embeddings_concat"})
    if (f.has(key) && f.json()[key].is_boolean() && f.boolean(key, false)) f.refuse(key, "true is not supported");
  if (f.has("only_cross_attention") &&
      (!f.json()["only_cross_attention"].is_boolean() || f.boolean("only_cross_attention", false)))
    f.refuse("only_cross_attention", "is not supported (must be false)");
  for (const char* key : {"conv_in_kernel", "conv_out_kernel"})
    if (f.integer(key, 3) != 3) f.refuse(key, "must be 3");
  for (const char* key : {"mid_block_scale_factor", "resnet_out_scale_factor"})
    if (f.number(key, 1.0) != 1.0) f.refuse(key, "must be 1");
  const std::string add = f.string("addition_embed_type", "");
  if (!add.empty() && add != "text_time")
    f.refuse("addition_embed_type", "\"" + add + "\" is not supported (text_time)");
  c.text_time = add == "text_time";
  c.addition_time_embed_dim = f.integer("addition_time_embed_dim", 256);
  c.projection_class_embeddings_input_dim = f.integer("projection_class_embeddings_input_dim", 0);
  if (c.text_time && c.projection_class_embeddings_input_dim <= 6 * c.addition_time_embed_dim)
    f.refuse("projection_class_embeddings_input_dim", "must exceed 6 x addition_time_embed_dim for text_time");
  return c;
}

std::string UNetConfig::to_json() const {
  nlohmann::ordered_json j;
  j["_class_name"] = "UNet2DConditionModel";
  j["_diffusers_version"] = "0.31.0";
  j["act_fn"] = "silu";
  j["addition_embed_type"] = text_time ? nlohmann::ordered_json("text_time") : nlohmann::ordered_json();
  j["addition_time_embed_dim"] = text_time ? nlohmann::ordered_json(addition_time_embed_dim) : nlohmann::ordered_json();
  j["attention_head_dim"] = heads;
  j["block_out_channels"] = block_out_channels;
  j["center_input_sample"] = false;
  j["cross_attention_dim"] = cross_attention_dim;
  j["down_block_types"] = down_block_types;
  j["downsample_padding"] = downsample_padding;
  j["flip_sin_to_cos"] = flip_sin_to_cos;
  j["freq_shift"] = freq_shift;
  j["in_channels"] = in_channels;
  j["layers_per_block"] = layers_per_block;
  j["mid_block_type"] = mid_block_type.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(mid_block_type);
  j["norm_eps"] = norm_eps;
  j["norm_num_groups"] = norm_num_groups;
  j["out_channels"] = out_channels;
  j["projection_class_embeddings_input_dim"] =
      text_time ? nlohmann::ordered_json(projection_class_embeddings_input_dim) : nlohmann::ordered_json();
  j["sample_size"] = sample_size;
  j["transformer_layers_per_block"] = transformer_layers_per_block;
  j["up_block_types"] = up_block_types;
  j["use_linear_projection"] = use_linear_projection;
  return j.dump(2) + "\n";
}

ResnetBlock UNet::resnet(const std::string& name, int64_t in, int64_t out) {
  return ResnetBlock::declare(params_, name, in, out, config_.norm_num_groups, float(config_.norm_eps),
                              config_.time_embed_dim());
}

UNet::Transformer UNet::transformer(const std::string& name, int64_t channels, int64_t heads, int64_t layers) {
  Transformer t;
  // Transformer2DModel's GroupNorm has eps 1e-6 whatever the UNet's norm_eps.
  t.norm = GroupNorm::declare(params_, name + ".norm", channels, config_.norm_num_groups, 1e-6f);
  // SD 1.x's 1x1 convolutions ([C, C, 1, 1] in the file) and SD 2.x's / SDXL's linear
  // layers (use_linear_projection) are the same map over channels-last rows.
  t.proj_in = Linear::declare(params_, name + ".proj_in", channels, channels);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string b = name + ".transformer_blocks." + std::to_string(l);
    TransformerBlock tb;
    tb.norm1 = LayerNorm::declare(params_, b + ".norm1", channels, 1e-5f);
    tb.self_attn = Attention::declare(params_, b + ".attn1", channels, channels, heads, false);
    tb.norm2 = LayerNorm::declare(params_, b + ".norm2", channels, 1e-5f);
    tb.cross_attn = Attention::declare(params_, b + ".attn2", channels, config_.cross_attention_dim, heads, false);
    tb.norm3 = LayerNorm::declare(params_, b + ".norm3", channels, 1e-5f);
    tb.ff_in = Linear::declare(params_, b + ".ff.net.0.proj", channels, channels * 8);
    tb.ff_out = Linear::declare(params_, b + ".ff.net.2", channels * 4, channels);
    t.blocks.push_back(tb);
  }
  t.proj_out = Linear::declare(params_, name + ".proj_out", channels, channels);
  return t;
}

UNet::UNet(const UNetConfig& config) : config_(config) {
  const UNetConfig& c = config_;
  const int64_t c0 = c.block_out_channels.front(), temb = c.time_embed_dim();
  conv_in = Conv::declare(params_, "conv_in", c.in_channels, c0, 3);
  time_linear1 = Linear::declare(params_, "time_embedding.linear_1", c0, temb);
  time_linear2 = Linear::declare(params_, "time_embedding.linear_2", temb, temb);
  if (c.text_time) {
    add_linear1 = Linear::declare(params_, "add_embedding.linear_1", c.projection_class_embeddings_input_dim, temb);
    add_linear2 = Linear::declare(params_, "add_embedding.linear_2", temb, temb);
  }
  const size_t blocks = c.block_out_channels.size();
  int64_t ch = c0;
  for (size_t i = 0; i < blocks; ++i) {
    const std::string name = "down_blocks." + std::to_string(i);
    const int64_t out = c.block_out_channels[i];
    Block b;
    for (int64_t j = 0; j < c.layers_per_block; ++j) {
      b.resnets.push_back(resnet(name + ".resnets." + std::to_string(j), j == 0 ? ch : out, out));
      if (is_cross(c.down_block_types[i]))
        b.attentions.push_back(transformer(name + ".attentions." + std::to_string(j), out, c.heads[i],
                                           c.transformer_layers_per_block[i]));
    }
    b.has_sampler = i + 1 < blocks;
    if (b.has_sampler) b.sampler = Conv::declare(params_, name + ".downsamplers.0.conv", out, out, 3, 2, 1);
    down_.push_back(std::move(b));
    ch = out;
  }
  has_mid_ = !c.mid_block_type.empty();
  if (has_mid_) {
    const int64_t top = c.block_out_channels.back();
    mid_.resnets.push_back(resnet("mid_block.resnets.0", top, top));
    mid_.attentions.push_back(
        transformer("mid_block.attentions.0", top, c.heads.back(), c.transformer_layers_per_block.back()));
    mid_.resnets.push_back(resnet("mid_block.resnets.1", top, top));
  }
  // Up blocks mirror the down blocks (reversed channels, heads and transformer depths).
  int64_t prev = c.block_out_channels.back();
  for (size_t i = 0; i < blocks; ++i) {
    const size_t r = blocks - 1 - i;
    const std::string name = "up_blocks." + std::to_string(i);
    const int64_t out = c.block_out_channels[r];
    const int64_t in = c.block_out_channels[r == 0 ? 0 : r - 1];
    Block b;
    const int64_t layers = c.layers_per_block + 1;
    for (int64_t j = 0; j < layers; ++j) {
      const int64_t skip = j == layers - 1 ? in : out;
      const int64_t res_in = j == 0 ? prev : out;
      b.resnets.push_back(resnet(name + ".resnets." + std::to_string(j), res_in + skip, out));
      if (is_cross(c.up_block_types[i]))
        b.attentions.push_back(transformer(name + ".attentions." + std::to_string(j), out, c.heads[r],
                                           c.transformer_layers_per_block[r]));
    }
    b.has_sampler = i + 1 < blocks;
    if (b.has_sampler) b.sampler = Conv::declare(params_, name + ".upsamplers.0.conv", out, out, 3);
    up_.push_back(std::move(b));
    prev = out;
  }
  norm_out = GroupNorm::declare(params_, "conv_norm_out", c0, c.norm_num_groups, float(c.norm_eps));
  conv_out = Conv::declare(params_, "conv_out", c0, c.out_channels, 3);
}

void UNet::run_transformer(const Transformer& t, Act& x, const float* context, int64_t tokens,
                           TransformerTape* tape) const {
  const int64_t rows = x.rows(), c = x.c, seq = x.h * x.w;
  if (tape) {
    tape->x = x;
    tape->blocks.resize(t.blocks.size());
  }
  const Act normed = t.norm.forward(params_, x, /*silu=*/false, tape ? &tape->gn : nullptr);
  FloatBuffer h(size_t(rows * c)), tmp(size_t(rows * c)), ff(size_t(rows * c * 8)), geglu(size_t(rows * c * 4));
  t.proj_in.forward(params_, normed.data(), rows, h.data());
  for (size_t i = 0; i < t.blocks.size(); ++i) {
    const TransformerBlock& b = t.blocks[i];
    BlockTape* bt = tape ? &tape->blocks[i] : nullptr;
    auto keep = [&](FloatBuffer* dst, const FloatBuffer& src) {
      if (bt) *dst = src;
    };
    auto stats = [&](FloatBuffer* m, FloatBuffer* r) {
      if (bt) {
        *m = FloatBuffer(size_t(rows));
        *r = FloatBuffer(size_t(rows));
      }
    };
    keep(bt ? &bt->h0 : nullptr, h);
    stats(bt ? &bt->m1 : nullptr, bt ? &bt->r1 : nullptr);
    b.norm1.forward(params_, h.data(), rows, tmp.data(), bt ? bt->m1.data() : nullptr, bt ? bt->r1.data() : nullptr);
    keep(bt ? &bt->n1 : nullptr, tmp);
    b.self_attn.forward(params_, tmp.data(), x.n, seq, tmp.data(), seq, h.data(), bt ? &bt->a1 : nullptr);
    keep(bt ? &bt->h1 : nullptr, h);
    stats(bt ? &bt->m2 : nullptr, bt ? &bt->r2 : nullptr);
    b.norm2.forward(params_, h.data(), rows, tmp.data(), bt ? bt->m2.data() : nullptr, bt ? bt->r2.data() : nullptr);
    keep(bt ? &bt->n2 : nullptr, tmp);
    b.cross_attn.forward(params_, tmp.data(), x.n, seq, context, tokens, h.data(), bt ? &bt->a2 : nullptr);
    keep(bt ? &bt->h2 : nullptr, h);
    stats(bt ? &bt->m3 : nullptr, bt ? &bt->r3 : nullptr);
    b.norm3.forward(params_, h.data(), rows, tmp.data(), bt ? bt->m3.data() : nullptr, bt ? bt->r3.data() : nullptr);
    keep(bt ? &bt->n3 : nullptr, tmp);
    b.ff_in.forward(params_, tmp.data(), rows, ff.data());
    KernelBackend& be = backend_for(params_.device());
    be.geglu_forward(be.view(ff.data(), DType::kF32, {rows, c * 8}), be.view(geglu.data(), DType::kF32, {rows, c * 4}));
    keep(bt ? &bt->ff : nullptr, ff);
    keep(bt ? &bt->geglu : nullptr, geglu);
    b.ff_out.forward(params_, geglu.data(), rows, h.data(), /*accumulate=*/true);
  }
  if (tape) {
    tape->normed = normed;
    tape->h = h;
  }
  // x += proj_out(h): the block's residual connection.
  t.proj_out.forward(params_, h.data(), rows, x.data(), /*accumulate=*/true);
}

Act UNet::forward(const Act& sample, const float* timesteps, const float* context, int64_t tokens,
                  const float* text_embeds, const float* time_ids) const {
  return forward(sample, timesteps, context, tokens, text_embeds, time_ids, nullptr);
}

Act UNet::forward(const Act& sample, const float* timesteps, const float* context, int64_t tokens,
                  const float* text_embeds, const float* time_ids, std::shared_ptr<Tape>* tape_out) const {
  const UNetConfig& c = config_;
  HYP_CHECK(sample.c == c.in_channels, "unet: the sample has {} channels, the model takes {}", sample.c,
            c.in_channels);
  HYP_CHECK(!c.text_time || (text_embeds && time_ids), "unet: an SDXL UNet needs text_embeds and time_ids");
  HYP_CHECK(sample.v.device() == params_.device(), "unet: the sample is on the {}, the model on the {}",
            device_name(sample.v.device()), device_name(params_.device()));
  // Every buffer below lives where the weights do; so do the inputs (the caller uploads).
  DeviceScope scope(params_.device());
  KernelBackend& be = backend_for(params_.device());
  auto f32 = [&](const float* p, Shape shape) { return be.view(const_cast<float*>(p), DType::kF32, shape); };
  std::shared_ptr<Tape> tape_holder = tape_out ? std::make_shared<Tape>() : nullptr;
  Tape* tape = tape_holder.get();
  const int64_t n = sample.n, c0 = c.block_out_channels.front(), temb_dim = c.time_embed_dim();
  // Time embedding: sinusoidal -> linear -> silu -> linear (+ SDXL's added embedding).
  FloatBuffer tproj(size_t(n * c0)), hidden(size_t(n * temb_dim)), hidden_silu(size_t(n * temb_dim)),
      temb(size_t(n * temb_dim));
  be.timestep_embedding(f32(timesteps, {n}), {c0, c.flip_sin_to_cos, float(c.freq_shift)}, f32(tproj.data(), {n, c0}));
  time_linear1.forward(params_, tproj.data(), n, hidden.data());
  be.activation_forward(Activation::kSilu, f32(hidden.data(), {n * temb_dim}), f32(hidden_silu.data(), {n * temb_dim}));
  time_linear2.forward(params_, hidden_silu.data(), n, temb.data());
  FloatBuffer add_in, add_hidden, add_hidden_silu;
  if (c.text_time) {
    const int64_t td = c.addition_time_embed_dim, in = c.projection_class_embeddings_input_dim;
    const int64_t pooled = in - 6 * td;
    FloatBuffer time_emb(size_t(n * 6 * td));
    add_in = FloatBuffer(size_t(n * in));
    add_hidden = FloatBuffer(size_t(n * temb_dim));
    add_hidden_silu = FloatBuffer(size_t(n * temb_dim));
    be.timestep_embedding(f32(time_ids, {n * 6}), {td, c.flip_sin_to_cos, float(c.freq_shift)},
                          f32(time_emb.data(), {n * 6, td}));
    // add_in rows: [pooled text embedding | the six time ids' embeddings].
    const size_t f = sizeof(float);
    be.copy_2d(text_embeds, size_t(pooled) * f, add_in.data(), size_t(in) * f, size_t(pooled) * f, size_t(n));
    be.copy_2d(time_emb.data(), size_t(6 * td) * f, add_in.data() + pooled, size_t(in) * f, size_t(6 * td) * f,
               size_t(n));
    add_linear1.forward(params_, add_in.data(), n, add_hidden.data());
    be.activation_forward(Activation::kSilu, f32(add_hidden.data(), {n * temb_dim}),
                          f32(add_hidden_silu.data(), {n * temb_dim}));
    add_linear2.forward(params_, add_hidden_silu.data(), n, temb.data(), /*accumulate=*/true);
  }
  FloatBuffer temb_silu(temb.size());
  be.activation_forward(Activation::kSilu, f32(temb.data(), {n * temb_dim}), f32(temb_silu.data(), {n * temb_dim}));

  Act h = conv_in.forward(params_, sample);
  std::vector<Act> skips = {h};
  auto rt = [&]() -> ResnetBlock::Tape* {
    if (!tape) return nullptr;
    tape->resnets.emplace_back();
    return &tape->resnets.back();
  };
  auto tt = [&]() -> TransformerTape* {
    if (!tape) return nullptr;
    tape->transformers.emplace_back();
    return &tape->transformers.back();
  };
  // Remat: what each block kept beyond its input goes as soon as the block is done
  // (the backward pass recomputes it).
  auto drop_resnet = [&] {
    if (tape && remat_) tape->resnets.back().drop();
  };
  auto drop_transformer = [&] {
    if (!tape || !remat_) return;
    TransformerTape& t = tape->transformers.back();
    t.normed = Act();
    t.blocks.clear();
    t.h = FloatBuffer();
  };
  for (const Block& b : down_) {
    for (size_t j = 0; j < b.resnets.size(); ++j) {
      h = b.resnets[j].forward(params_, h, temb_silu.data(), rt());
      drop_resnet();
      if (!b.attentions.empty()) {
        run_transformer(b.attentions[j], h, context, tokens, tt());
        drop_transformer();
      }
      skips.push_back(h);
    }
    if (b.has_sampler) {
      if (tape) tape->sampler_inputs.push_back(h);
      h = b.sampler.forward(params_, h);
      skips.push_back(h);
    }
  }
  if (has_mid_) {
    h = mid_.resnets[0].forward(params_, h, temb_silu.data(), rt());
    drop_resnet();
    run_transformer(mid_.attentions[0], h, context, tokens, tt());
    drop_transformer();
    h = mid_.resnets[1].forward(params_, h, temb_silu.data(), rt());
    drop_resnet();
  }
  for (const Block& b : up_) {
    for (size_t j = 0; j < b.resnets.size(); ++j) {
      if (tape) tape->skip_channels.push_back(skips.back().c);
      h = b.resnets[j].forward(params_, concat_channels(h, skips.back()), temb_silu.data(), rt());
      drop_resnet();
      skips.pop_back();
      if (!b.attentions.empty()) {
        run_transformer(b.attentions[j], h, context, tokens, tt());
        drop_transformer();
      }
    }
    if (b.has_sampler) {
      // To the next skip's size: twice this map's, or one less where a downsampling
      // rounded an odd side up (diffusers' upsample_size).
      if (tape) tape->upsampled_from.emplace_back(h.h, h.w);
      Act up = upsample_to(h, skips.back().h, skips.back().w);
      h = b.sampler.forward(params_, up);
      if (tape) tape->sampler_inputs.push_back(std::move(up));
    }
  }
  GroupNorm::Saved* out_saved = tape ? &tape->norm_out : nullptr;
  Act a_out = norm_out.forward(params_, h, /*silu=*/true, out_saved);
  Act y = conv_out.forward(params_, a_out);
  if (tape) {
    tape->sample = &sample;
    tape->context = context;
    tape->tokens = tokens;
    tape->tproj = std::move(tproj);
    tape->hidden = std::move(hidden);
    tape->hidden_silu = std::move(hidden_silu);
    tape->temb = std::move(temb);
    tape->temb_silu = std::move(temb_silu);
    tape->add_in = std::move(add_in);
    tape->add_hidden = std::move(add_hidden);
    tape->add_hidden_silu = std::move(add_hidden_silu);
    tape->h_out = std::move(h);
    tape->a_out = std::move(a_out);
    *tape_out = tape_holder;
  }
  return y;
}

}  // namespace hyperion::diffusion
