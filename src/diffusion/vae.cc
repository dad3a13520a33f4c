#include "diffusion/vae.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "diffusion/json_fields.h"
#include "diffusion/vae_tape.h"
#include "kernels/backend.h"

namespace hyperion::diffusion {

VaeConfig VaeConfig::from_json(const std::string& text, const std::string& origin) {
  const JsonFields f(text, origin);
  VaeConfig c;
  c.in_channels = f.integer("in_channels", 3);
  c.out_channels = f.integer("out_channels", 3);
  c.latent_channels = f.integer("latent_channels", 4);
  c.block_out_channels = f.integers("block_out_channels", 0, {64});
  c.layers_per_block = f.integer("layers_per_block", 1);
  c.norm_num_groups = f.integer("norm_num_groups", 32);
  c.sample_size = f.integer("sample_size", 32);
  c.scaling_factor = f.number("scaling_factor", 0.18215);
  c.shift_factor = f.number("shift_factor", 0.0);
  c.use_quant_conv = f.boolean("use_quant_conv", true);
  c.use_post_quant_conv = f.boolean("use_post_quant_conv", true);
  c.mid_block_add_attention = f.boolean("mid_block_add_attention", true);
  const size_t blocks = c.block_out_channels.size();
  const std::vector<std::string> down = f.strings("down_block_types"), up = f.strings("up_block_types");
  for (const std::string& t : down)
    if (t != "DownEncoderBlock2D") f.refuse("down_block_types", "\"" + t + "\" is not supported (DownEncoderBlock2D)");
  for (const std::string& t : up)
    if (t != "UpDecoderBlock2D") f.refuse("up_block_types", "\"" + t + "\" is not supported (UpDecoderBlock2D)");
  if ((!down.empty() && down.size() != blocks) || (!up.empty() && up.size() != blocks))
    f.refuse("block_out_channels", "must have one entry per block type");
  if (f.has("act_fn") && f.string("act_fn", "silu") != "silu") f.refuse("act_fn", "must be \"silu\"");
  if (f.has("norm_type") && f.string("norm_type", "group") != "group") f.refuse("norm_type", "must be \"group\"");
  for (const char* key : {"latents_mean", "latents_std"})
    if (f.has(key)) f.refuse(key, "is not supported (must be null)");
  for (int64_t ch : c.block_out_channels)
    if (ch <= 0 || ch % c.norm_num_groups != 0)
      f.refuse("block_out_channels", "entries must be positive multiples of norm_num_groups");
  if (c.latent_channels < 1 || c.in_channels < 1 || c.out_channels < 1)
    f.refuse("latent_channels", "and in/out_channels must be positive");
  if (!(c.scaling_factor > 0) || !std::isfinite(c.scaling_factor)) f.refuse("scaling_factor", "must be positive");
  if (c.layers_per_block < 1 || c.layers_per_block > 16) f.refuse("layers_per_block", "must be in [1, 16]");
  return c;
}

std::string VaeConfig::to_json() const {
  nlohmann::ordered_json j;
  j["_class_name"] = "AutoencoderKL";
  j["_diffusers_version"] = "0.31.0";
  j["act_fn"] = "silu";
  j["block_out_channels"] = block_out_channels;
  j["down_block_types"] = std::vector<std::string>(block_out_channels.size(), "DownEncoderBlock2D");
  j["in_channels"] = in_channels;
  j["latent_channels"] = latent_channels;
  j["layers_per_block"] = layers_per_block;
  j["mid_block_add_attention"] = mid_block_add_attention;
  j["norm_num_groups"] = norm_num_groups;
  j["out_channels"] = out_channels;
  j["sample_size"] = sample_size;
  j["scaling_factor"] = scaling_factor;
  if (shift_factor != 0.0) j["shift_factor"] = shift_factor;
  j["up_block_types"] = std::vector<std::string>(block_out_channels.size(), "UpDecoderBlock2D");
  j["use_post_quant_conv"] = use_post_quant_conv;
  j["use_quant_conv"] = use_quant_conv;
  return j.dump(2) + "\n";
}

ResnetBlock Vae::resnet(const std::string& name, int64_t in, int64_t out) {
  return ResnetBlock::declare(params_, name, in, out, config_.norm_num_groups, 1e-6f, /*time_dim=*/0);
}

Vae::Mid Vae::mid(const std::string& name, int64_t ch) {
  Mid m;
  m.first = resnet(name + ".resnets.0", ch, ch);
  m.has_attention = config_.mid_block_add_attention;
  if (m.has_attention) {
    m.attention.norm = GroupNorm::declare(params_, name + ".attentions.0.group_norm", ch, config_.norm_num_groups, 1e-6f);
    // One head over all channels, q/k/v with biases (diffusers' converted attention block).
    m.attention.attn = Attention::declare(params_, name + ".attentions.0", ch, ch, 1, /*qkv_bias=*/true);
  }
  m.second = resnet(name + ".resnets.1", ch, ch);
  return m;
}

Vae::Vae(const VaeConfig& config) : config_(config) {
  const VaeConfig& c = config_;
  const size_t blocks = c.block_out_channels.size();
  const int64_t c0 = c.block_out_channels.front(), top = c.block_out_channels.back();
  enc_conv_in = Conv::declare(params_, "encoder.conv_in", c.in_channels, c0, 3);
  int64_t ch = c0;
  for (size_t i = 0; i < blocks; ++i) {
    const std::string name = "encoder.down_blocks." + std::to_string(i);
    const int64_t out = c.block_out_channels[i];
    Block b;
    for (int64_t j = 0; j < c.layers_per_block; ++j)
      b.resnets.push_back(resnet(name + ".resnets." + std::to_string(j), j == 0 ? ch : out, out));
    b.has_sampler = i + 1 < blocks;
    // Padding 0: the input is padded by one on the right and bottom first (diffusers).
    if (b.has_sampler) b.sampler = Conv::declare(params_, name + ".downsamplers.0.conv", out, out, 3, 2, 0);
    enc_blocks_.push_back(std::move(b));
    ch = out;
  }
  enc_mid_ = mid("encoder.mid_block", top);
  enc_norm_out = GroupNorm::declare(params_, "encoder.conv_norm_out", top, c.norm_num_groups, 1e-6f);
  enc_conv_out = Conv::declare(params_, "encoder.conv_out", top, 2 * c.latent_channels, 3);
  if (c.use_quant_conv) quant_conv = Conv::declare(params_, "quant_conv", 2 * c.latent_channels, 2 * c.latent_channels, 1);
  if (c.use_post_quant_conv)
    post_quant_conv = Conv::declare(params_, "post_quant_conv", c.latent_channels, c.latent_channels, 1);
  dec_conv_in = Conv::declare(params_, "decoder.conv_in", c.latent_channels, top, 3);
  dec_mid_ = mid("decoder.mid_block", top);
  int64_t prev = top;
  for (size_t i = 0; i < blocks; ++i) {
    const std::string name = "decoder.up_blocks." + std::to_string(i);
    const int64_t out = c.block_out_channels[blocks - 1 - i];
    Block b;
    for (int64_t j = 0; j <= c.layers_per_block; ++j)
      b.resnets.push_back(resnet(name + ".resnets." + std::to_string(j), j == 0 ? prev : out, out));
    b.has_sampler = i + 1 < blocks;
    if (b.has_sampler) b.sampler = Conv::declare(params_, name + ".upsamplers.0.conv", out, out, 3);
    dec_blocks_.push_back(std::move(b));
    prev = out;
  }
  dec_norm_out = GroupNorm::declare(params_, "decoder.conv_norm_out", c0, c.norm_num_groups, 1e-6f);
  dec_conv_out = Conv::declare(params_, "decoder.conv_out", c0, c.out_channels, 3);
}

Act Vae::run_mid(const Mid& m, const Act& x, MidTape* tape) const {
  Act h = m.first.forward(params_, x, nullptr, tape ? &tape->first : nullptr);
  if (m.has_attention) {
    const Act normed = m.attention.norm.forward(params_, h, false, tape ? &tape->gn : nullptr);
    const int64_t seq = h.h * h.w;
    if (tape) tape->h = h;
    m.attention.attn.forward(params_, normed.data(), h.n, seq, normed.data(), seq, h.data(),
                             tape ? &tape->attn : nullptr);
    if (tape) tape->normed = normed;
  }
  return m.second.forward(params_, h, nullptr, tape ? &tape->second : nullptr);
}

Act Vae::encode(const Act& images) const {
  return encode(images, nullptr);
}

Act Vae::encode(const Act& images, std::shared_ptr<Tape>* tape_out) const {
  const VaeConfig& c = config_;
  HYP_CHECK(images.c == c.in_channels, "vae: images have {} channels, the encoder takes {}", images.c, c.in_channels);
  HYP_CHECK(images.h % c.downscale() == 0 && images.w % c.downscale() == 0,
            "vae: image size {}x{} must be a multiple of {}", images.h, images.w, c.downscale());
  HYP_CHECK(images.v.device() == params_.device(), "vae: the images are on the {}, the model on the {}",
            device_name(images.v.device()), device_name(params_.device()));
  DeviceScope scope(params_.device());
  std::shared_ptr<Tape> holder = tape_out ? std::make_shared<Tape>() : nullptr;
  Tape* tape = holder.get();
  auto rt = [&]() -> ResnetBlock::Tape* {
    if (!tape) return nullptr;
    tape->resnets.emplace_back();
    return &tape->resnets.back();
  };
  Act h = enc_conv_in.forward(params_, images);
  for (const Block& b : enc_blocks_) {
    for (const ResnetBlock& r : b.resnets) h = r.forward(params_, h, nullptr, rt());
    if (b.has_sampler) {
      // Zero padding of one pixel on the right and the bottom, then a stride-2 convolution.
      Act padded(h.n, h.h + 1, h.w + 1, h.c);
      KernelBackend& be = backend_for(params_.device());
      const size_t f = sizeof(float), row = size_t(h.w * h.c) * f;
      be.zero(padded.data(), size_t(padded.numel()) * f);
      for (int64_t n = 0; n < h.n; ++n)  // each image's rows into the wider rows
        be.copy_2d(h.data() + n * h.h * h.w * h.c, row, padded.data() + n * padded.h * padded.w * h.c,
                   size_t(padded.w * h.c) * f, row, size_t(h.h));
      h = b.sampler.forward(params_, padded);
      if (tape) tape->sampler_inputs.push_back(std::move(padded));
    }
  }
  h = run_mid(enc_mid_, h, tape ? &tape->mid : nullptr);
  Act a = enc_norm_out.forward(params_, h, true, tape ? &tape->norm_out : nullptr);
  Act y = enc_conv_out.forward(params_, a);
  if (tape) {
    tape->input = &images;
    tape->h_out = std::move(h);
    tape->a_out = std::move(a);
  }
  if (c.use_quant_conv) {
    if (tape) tape->quant_in = y;
    y = quant_conv.forward(params_, y);
  }
  if (tape_out) *tape_out = holder;
  return y;
}

Act Vae::decode(const Act& latents) const {
  return decode(latents, nullptr);
}

Act Vae::decode(const Act& latents, std::shared_ptr<Tape>* tape_out) const {
  const VaeConfig& c = config_;
  HYP_CHECK(latents.c == c.latent_channels, "vae: latents have {} channels, the decoder takes {}", latents.c,
            c.latent_channels);
  HYP_CHECK(latents.v.device() == params_.device(), "vae: the latents are on the {}, the model on the {}",
            device_name(latents.v.device()), device_name(params_.device()));
  DeviceScope scope(params_.device());
  std::shared_ptr<Tape> holder = tape_out ? std::make_shared<Tape>() : nullptr;
  Tape* tape = holder.get();
  auto rt = [&]() -> ResnetBlock::Tape* {
    if (!tape) return nullptr;
    tape->resnets.emplace_back();
    return &tape->resnets.back();
  };
  Act h = c.use_post_quant_conv ? post_quant_conv.forward(params_, latents) : latents;
  if (tape) tape->conv_in_input = h;
  h = dec_conv_in.forward(params_, h);
  h = run_mid(dec_mid_, h, tape ? &tape->mid : nullptr);
  for (const Block& b : dec_blocks_) {
    for (const ResnetBlock& r : b.resnets) h = r.forward(params_, h, nullptr, rt());
    if (b.has_sampler) {
      Act up = upsample2x(h);
      h = b.sampler.forward(params_, up);
      if (tape) tape->sampler_inputs.push_back(std::move(up));
    }
  }
  Act a = dec_norm_out.forward(params_, h, true, tape ? &tape->norm_out : nullptr);
  Act y = dec_conv_out.forward(params_, a);
  if (tape) {
    tape->input = &latents;
    tape->h_out = std::move(h);
    tape->a_out = std::move(a);
    *tape_out = holder;
  }
  return y;
}

Act Vae::encode_latents(const Act& images, const float* noise) const {
  const Act moments = params_.device() == Device::kHost
                          ? encode(images)
                          : to_device(encode(to_device(images, params_.device())), Device::kHost);
  const int64_t L = config_.latent_channels;
  Act z(moments.n, moments.h, moments.w, L);
  const float scale = float(config_.scaling_factor), shift = float(config_.shift_factor);
  for (int64_t r = 0; r < moments.rows(); ++r)
    for (int64_t ch = 0; ch < L; ++ch) {
      const float mean = moments.data()[r * 2 * L + ch];
      // diffusers clamps the log-variance to [-30, 20].
      const float logvar = std::clamp(moments.data()[r * 2 * L + L + ch], -30.0f, 20.0f);
      const float sample = noise ? mean + std::exp(0.5f * logvar) * noise[r * L + ch] : mean;
      z.data()[r * L + ch] = (sample - shift) * scale;
    }
  return z;
}

Act Vae::decode_latents(const Act& latents) const {
  Act z = latents;
  const float inv = float(1.0 / config_.scaling_factor), shift = float(config_.shift_factor);
  for (float& x : z.v) x = x * inv + shift;
  if (params_.device() == Device::kHost) return decode(z);
  return to_device(decode(to_device(z, params_.device())), Device::kHost);
}

}  // namespace hyperion::diffusion
