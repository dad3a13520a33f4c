#include "diffusion/single_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "diffusion/components.h"
#include "diffusion/json_fields.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/weight_files.h"

namespace hyperion::diffusion {

namespace fs = std::filesystem;

namespace {

// Where the text encoders sit: SD 1.x's CLIP, and SDXL's CLIP ViT-L and OpenCLIP ViT-bigG.
constexpr const char* kSdClip = "cond_stage_model.transformer.";
constexpr const char* kSdxlClip = "conditioner.embedders.0.transformer.";
constexpr const char* kSdxlOpenClip = "conditioner.embedders.1.model.";

// Suffix tables: diffusers' name of a tensor inside a block -> the original's.
struct Rename {
  const char* diffusers;
  const char* original;
};
constexpr Rename kUNetResnet[] = {{"norm1.", "in_layers.0."},         {"conv1.", "in_layers.2."},
                                  {"time_emb_proj.", "emb_layers.1."}, {"norm2.", "out_layers.0."},
                                  {"conv2.", "out_layers.3."},         {"conv_shortcut.", "skip_connection."}};
constexpr Rename kVaeResnet[] = {{"norm1.", "norm1."}, {"conv1.", "conv1."}, {"norm2.", "norm2."},
                                 {"conv2.", "conv2."}, {"conv_shortcut.", "nin_shortcut."}};
constexpr Rename kVaeAttention[] = {{"group_norm.", "norm."}, {"to_q.", "q."},          {"to_k.", "k."},
                                    {"to_v.", "v."},          {"to_out.0.", "proj_out."}};
// Whole names outside the blocks.
constexpr Rename kUNetTop[] = {{"conv_in.", "input_blocks.0.0."},
                               {"time_embedding.linear_1.", "time_embed.0."},
                               {"time_embedding.linear_2.", "time_embed.2."},
                               {"add_embedding.linear_1.", "label_emb.0.0."},  // SDXL's text_time
                               {"add_embedding.linear_2.", "label_emb.0.2."},
                               {"conv_norm_out.", "out.0."},
                               {"conv_out.", "out.2."}};
constexpr Rename kVaeTop[] = {{"encoder.conv_norm_out.", "encoder.norm_out."},
                              {"decoder.conv_norm_out.", "decoder.norm_out."}};

std::string rename_suffix(const std::string& rest, const Rename* table, size_t n, const std::string& whole) {
  for (size_t i = 0; i < n; ++i) {
    const std::string d = table[i].diffusers;
    if (rest.compare(0, d.size(), d) == 0) return table[i].original + rest.substr(d.size());
  }
  fail("single-file checkpoint: no rule for tensor {}", whole);
}

template <size_t N>
std::string rename(const std::string& rest, const Rename (&table)[N], const std::string& whole) {
  return rename_suffix(rest, table, N, whole);
}

// "a.b.c" -> {"a", "b", "c"}.
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t dot; (dot = s.find('.', begin)) != std::string::npos; begin = dot + 1) out.push_back(s.substr(begin, dot - begin));
  out.push_back(s.substr(begin));
  return out;
}

// parts[from..] joined with dots.
std::string join(const std::vector<std::string>& parts, size_t from) {
  std::string out;
  for (size_t i = from; i < parts.size(); ++i) out += (i > from ? "." : "") + parts[i];
  return out;
}

int64_t index_at(const std::vector<std::string>& parts, size_t i, const std::string& whole) {
  HYP_CHECK(i < parts.size() && !parts[i].empty() && parts[i].find_first_not_of("0123456789") == std::string::npos,
            "single-file checkpoint: no rule for tensor {}", whole);
  return std::stoll(parts[i]);
}

std::string unet_name(const std::string& name, const UNetConfig& c) {
  const std::string p = "model.diffusion_model.";
  const int64_t lpb = c.layers_per_block;
  const std::vector<std::string> s = split(name);
  auto part = [&](size_t i) { return i < s.size() ? s[i] : std::string(); };
  if (part(0) == "down_blocks" || part(0) == "up_blocks") {
    const bool down = part(0) == "down_blocks";
    const int64_t level = index_at(s, 1, name);
    const std::string kind = part(2);
    if (kind == "resnets" || kind == "attentions") {
      const int64_t j = index_at(s, 3, name);
      // input_blocks: [conv_in], then per level lpb (resnet, attention) blocks and a
      // downsampler; output_blocks: per level lpb + 1 blocks.
      const int64_t block = down ? 1 + level * (lpb + 1) + j : level * (lpb + 1) + j;
      const std::string rest = join(s, 4);
      return p + (down ? "input_blocks." : "output_blocks.") + std::to_string(block) +
             (kind == "resnets" ? ".0." + rename(rest, kUNetResnet, name) : ".1." + rest);
    }
    if (down && kind == "downsamplers" && part(3) == "0" && part(4) == "conv")
      return p + "input_blocks." + std::to_string(1 + level * (lpb + 1) + lpb) + ".0.op." + join(s, 5);
    if (!down && kind == "upsamplers" && part(3) == "0" && part(4) == "conv") {
      // The upsampler sits in the level's last block, after its attention when it has one.
      HYP_CHECK(level < int64_t(c.up_block_types.size()), "single-file checkpoint: no rule for tensor {}", name);
      const bool attn = c.up_block_types[size_t(level)].rfind("CrossAttn", 0) == 0;
      return p + "output_blocks." + std::to_string(level * (lpb + 1) + lpb) + (attn ? ".2" : ".1") + ".conv." +
             join(s, 5);
    }
    fail("single-file checkpoint: no rule for tensor {}", name);
  }
  if (part(0) == "mid_block") {
    if (part(1) == "resnets")
      return p + "middle_block." + (index_at(s, 2, name) == 0 ? "0." : "2.") + rename(join(s, 3), kUNetResnet, name);
    if (part(1) == "attentions" && part(2) == "0") return p + "middle_block.1." + join(s, 3);
    fail("single-file checkpoint: no rule for tensor {}", name);
  }
  return p + rename(name, kUNetTop, name);
}

std::string vae_name(const std::string& name, const VaeConfig& c) {
  const std::string p = "first_stage_model.";
  const int64_t levels = int64_t(c.block_out_channels.size());
  const std::vector<std::string> s = split(name);
  auto part = [&](size_t i) { return i < s.size() ? s[i] : std::string(); };
  const std::string side = part(0);
  if (side == "encoder" && part(1) == "down_blocks") {
    const int64_t level = index_at(s, 2, name);
    if (part(3) == "resnets")
      return p + "encoder.down." + std::to_string(level) + ".block." + std::to_string(index_at(s, 4, name)) + "." +
             rename(join(s, 5), kVaeResnet, name);
    if (part(3) == "downsamplers" && part(4) == "0" && part(5) == "conv")
      return p + "encoder.down." + std::to_string(level) + ".downsample.conv." + join(s, 6);
    fail("single-file checkpoint: no rule for tensor {}", name);
  }
  if (side == "decoder" && part(1) == "up_blocks") {
    // The original decoder numbers its levels from the lowest resolution up.
    const int64_t level = levels - 1 - index_at(s, 2, name);
    if (part(3) == "resnets")
      return p + "decoder.up." + std::to_string(level) + ".block." + std::to_string(index_at(s, 4, name)) + "." +
             rename(join(s, 5), kVaeResnet, name);
    if (part(3) == "upsamplers" && part(4) == "0" && part(5) == "conv")
      return p + "decoder.up." + std::to_string(level) + ".upsample.conv." + join(s, 6);
    fail("single-file checkpoint: no rule for tensor {}", name);
  }
  if ((side == "encoder" || side == "decoder") && part(1) == "mid_block") {
    if (part(2) == "resnets")
      return p + side + ".mid.block_" + std::to_string(index_at(s, 3, name) + 1) + "." +
             rename(join(s, 4), kVaeResnet, name);
    if (part(2) == "attentions" && part(3) == "0") return p + side + ".mid.attn_1." + rename(join(s, 4), kVaeAttention, name);
    fail("single-file checkpoint: no rule for tensor {}", name);
  }
  for (const Rename& r : kVaeTop)
    if (name.rfind(r.diffusers, 0) == 0) return p + r.original + name.substr(std::string(r.diffusers).size());
  // conv_in, conv_out, quant_conv, post_quant_conv keep their names.
  return p + name;
}

// An OpenCLIP text encoder (SD 2.x's cond_stage_model.model.*, SDXL's
// conditioner.embedders.1.model.*): diffusers' CLIPTextModel name -> the OpenCLIP name,
// which third of a fused q/k/v tensor (in_proj_weight [3d, d], in_proj_bias [3d]) it is
// (-1: the whole tensor), and whether it is stored transposed (OpenCLIP's text_projection
// [d, p] multiplies from the right; transformers' text_projection.weight is [p, d]).
struct OpenClipSource {
  std::string name;
  int part = -1;
  bool transposed = false;
};
constexpr Rename kOpenClipLayer[] = {{"layer_norm1.", "ln_1."},   {"layer_norm2.", "ln_2."},
                                     {"self_attn.out_proj.", "attn.out_proj."},
                                     {"mlp.fc1.", "mlp.c_fc."}, {"mlp.fc2.", "mlp.c_proj."}};
OpenClipSource open_clip_source(const std::string& name) {
  if (name == "text_model.embeddings.token_embedding.weight") return {"token_embedding.weight"};
  if (name == "text_model.embeddings.position_embedding.weight") return {"positional_embedding"};
  if (name == "text_projection.weight") return {"text_projection", -1, true};
  const std::string final_norm = "text_model.final_layer_norm.", layers = "text_model.encoder.layers.";
  if (name.rfind(final_norm, 0) == 0) return {"ln_final." + name.substr(final_norm.size())};
  if (name.rfind(layers, 0) == 0) {
    const size_t dot = name.find('.', layers.size());
    HYP_CHECK(dot != std::string::npos, "single-file checkpoint: no rule for tensor {}", name);
    const std::string block = "transformer.resblocks." + name.substr(layers.size(), dot - layers.size()) + ".";
    const std::string rest = name.substr(dot + 1);
    for (int i = 0; i < 3; ++i) {
      const std::string proj = std::string("self_attn.") + "qkv"[i] + "_proj.";
      if (rest.rfind(proj, 0) == 0)
        return {block + "attn.in_proj_" + rest.substr(proj.size()), i};  // in_proj_weight / in_proj_bias
    }
    return {block + rename(rest, kOpenClipLayer, name)};
  }
  fail("single-file checkpoint: no rule for tensor {} in the OpenCLIP layout", name);
}

// Reads every tensor of an OpenCLIP text encoder under `prefix`, slicing the fused q/k/v
// ones and transposing the projection. (SD 2.x's last resblock, which its penultimate-layer
// conditioning never reads, is absent from diffusers' 23-layer config and left unread.)
void load_open_clip(ParamTable& params, const io::WeightFiles& files, const std::string& file,
                    const std::string& prefix) {
  params.allocate(false);
  std::vector<float> fused;
  for (size_t i = 0; i < params.entries().size(); ++i) {
    const ParamEntry& e = params.entries()[i];
    const OpenClipSource src = open_clip_source(e.name);
    const std::string name = prefix + src.name;
    const io::SafetensorsTensor* t = files.find(name);
    HYP_CHECK(t != nullptr, "{}: tensor {} is missing (for the text encoder's {}, shape {})", file, name, e.name,
              e.shape.str());
    Shape want = e.shape;
    if (src.part >= 0) want = want.rank() == 2 ? Shape{3 * e.shape[0], e.shape[1]} : Shape{3 * e.shape[0]};
    if (src.transposed) want = Shape{e.shape[1], e.shape[0]};
    HYP_CHECK(t->shape == want, "{}: tensor {} has shape {} where the config gives {}", file, name, t->shape.str(),
              want.str());
    float* dst = params.data(static_cast<int>(i));
    if (src.transposed) {
      fused.resize(static_cast<size_t>(want.numel()));
      files.file_of(name)->read_into(name, TensorView(fused.data(), DType::kF32, want));
      for (int64_t r = 0; r < e.shape[0]; ++r)
        for (int64_t c = 0; c < e.shape[1]; ++c) dst[r * e.shape[1] + c] = fused[size_t(c * e.shape[0] + r)];
    } else if (src.part < 0) {
      files.file_of(name)->read_into(name, TensorView(dst, DType::kF32, e.shape));
    } else {
      fused.resize(static_cast<size_t>(want.numel()));
      files.file_of(name)->read_into(name, TensorView(fused.data(), DType::kF32, want));
      std::copy_n(fused.data() + src.part * e.numel, e.numel, dst);
    }
    for (int64_t k = 0; k < e.numel; ++k)
      HYP_CHECK(std::isfinite(dst[k]), "{}: tensor {} holds a non-finite value ({}) at element {}", file, name,
                dst[k], k);
  }
  params.mark_written();
}

// The inverse, for the writer: OpenCLIP's tensors of `params` under `prefix`, q/k/v fused
// again and the projection transposed, into `w` (the buffers kept in `keep` until written).
void add_open_clip(io::SafetensorsWriter& w, const ParamTable& params, const std::string& prefix,
                   std::map<std::string, std::vector<float>>& keep) {
  std::map<std::string, int> thirds;  // of each fused tensor, filled so far
  for (size_t i = 0; i < params.entries().size(); ++i) {
    const ParamEntry& e = params.entries()[i];
    const OpenClipSource src = open_clip_source(e.name);
    const float* v = params.data(static_cast<int>(i));
    const std::string name = prefix + src.name;
    if (src.transposed) {
      std::vector<float>& t = keep[name];
      t.resize(size_t(e.numel));
      for (int64_t r = 0; r < e.shape[0]; ++r)
        for (int64_t c = 0; c < e.shape[1]; ++c) t[size_t(c * e.shape[0] + r)] = v[r * e.shape[1] + c];
      w.add(name, DType::kF32, Shape{e.shape[1], e.shape[0]}, t.data());
    } else if (src.part < 0) {
      w.add(name, DType::kF32, e.shape, v);
    } else {
      std::vector<float>& f = keep[name];
      f.resize(size_t(3 * e.numel));
      std::copy_n(v, e.numel, f.data() + src.part * e.numel);
      if (++thirds[name] == 3)
        w.add(name, DType::kF32, e.shape.rank() == 2 ? Shape{3 * e.shape[0], e.shape[1]} : Shape{3 * e.shape[0]},
              f.data());
    }
  }
}

}  // namespace

std::string original_name(Component component, const std::string& name, const UNetConfig& unet, const VaeConfig& vae) {
  switch (component) {
    case Component::kUNet:
      return unet_name(name, unet);
    case Component::kVae:
      return vae_name(name, vae);
    case Component::kTextEncoder:
      return kSdClip + name;
  }
  return name;
}

bool is_single_file_checkpoint(const std::string& path) {
  if (!fs::is_regular_file(path)) return false;
  try {
    const io::SafetensorsFile f = io::SafetensorsFile::open(path);
    for (const io::SafetensorsTensor& t : f.tensors())
      if (t.name.rfind("model.diffusion_model.", 0) == 0) return true;
  } catch (const Error&) {
    return false;
  }
  return false;
}

std::unique_ptr<DiffusionPipeline> load_single_file(const std::string& file, const std::string& config_dir) {
  HYP_CHECK(fs::is_regular_file(file), "{}: not a file", file);
  HYP_CHECK(DiffusionPipeline::is_pipeline_dir(config_dir),
            "{}: the configs and tokenizer of a single-file checkpoint come from a diffusers directory of the same "
            "model (with model_index.json), not found here",
            config_dir);
  auto config_of = [&](const char* component) {
    const std::string path = (fs::path(config_dir) / component / "config.json").string();
    HYP_CHECK(fs::exists(path), "{}: {}/config.json is missing", config_dir, component);
    return std::pair{io::read_file(path, 16 << 20), path};
  };
  const auto [unet_text, unet_path] = config_of("unet");
  const auto [vae_text, vae_path] = config_of("vae");
  const auto [te_text, te_path] = config_of("text_encoder");
  const UNetConfig unet_config = UNetConfig::from_json(unet_text, unet_path);
  const VaeConfig vae_config = VaeConfig::from_json(vae_text, vae_path);
  auto unet = std::make_unique<UNet>(unet_config);
  auto vae = std::make_unique<Vae>(vae_config);
  auto text = std::make_unique<ClipTextModel>(ClipTextConfig::from_json(te_text, te_path));
  const io::WeightFiles files(fs::path(file).parent_path().string(), fs::path(file).filename().string());
  // SD 1.x: OpenAI's CLIP as transformers names it; SD 2.x: OpenCLIP's layout; SDXL: both,
  // as conditioner.embedders.0 (CLIP ViT-L) and .1 (OpenCLIP ViT-bigG).
  const bool xl = files.find(std::string(kSdxlClip) + "text_model.embeddings.token_embedding.weight") != nullptr;
  const bool open_clip = files.find("cond_stage_model.model.token_embedding.weight") != nullptr;
  HYP_CHECK(xl || open_clip ||
                files.find("cond_stage_model.transformer.text_model.embeddings.token_embedding.weight") != nullptr,
            "{}: no text encoder: neither cond_stage_model.transformer.* (SD 1.x's CLIP), cond_stage_model.model.* "
            "(SD 2.x's OpenCLIP) nor conditioner.embedders.* (SDXL's two)",
            file);
  HYP_CHECK(xl == unet_config.text_time,
            "{}: {} but {} describes {} (addition_embed_type {})", file,
            xl ? "an SDXL file (conditioner.embedders.*)" : "an SD 1.x / 2.x file", unet_path,
            unet_config.text_time ? "an SDXL UNet" : "an SD 1.x / 2.x UNet",
            unet_config.text_time ? "text_time" : "none");
  std::unique_ptr<ClipTextModel> text2;
  if (xl) {
    const auto [te2_text, te2_path] = config_of("text_encoder_2");
    text2 = std::make_unique<ClipTextModel>(ClipTextConfig::from_json(te2_text, te2_path));
    load_open_clip(text2->params(), files, file, kSdxlOpenClip);
  } else if (open_clip) {
    load_open_clip(text->params(), files, file, "cond_stage_model.model.");
  }
  struct Part {
    ParamTable* params;
    Component component;
    const char* prefix;
  };
  for (const Part& part : {Part{&unet->params(), Component::kUNet, "model.diffusion_model."},
                           Part{&vae->params(), Component::kVae, "first_stage_model."},
                           Part{&text->params(), Component::kTextEncoder, xl ? kSdxlClip : kSdClip}}) {
    if (part.component == Component::kTextEncoder && open_clip && !xl) continue;
    part.params->allocate(false);
    std::vector<std::string> unused = part.params->load_mapped(
        files, file,
        [&](const std::string& n) {
          return part.component == Component::kTextEncoder ? part.prefix + n
                                                              : original_name(part.component, n, unet_config, vae_config);
        },
        part.prefix);
    std::erase_if(unused, [](const std::string& n) { return n.find("position_ids") != std::string::npos; });
    if (!unused.empty())
      log_warn("{}: {} tensors under {} the config does not use (first: {})", file, unused.size(), part.prefix,
               unused.front());
  }
  auto tokenizer_of = [&](const char* folder) {
    return std::make_unique<text::ClipTokenizer>(text::ClipTokenizer::load((fs::path(config_dir) / folder).string()));
  };
  const std::string sched_path = (fs::path(config_dir) / "scheduler" / "scheduler_config.json").string();
  HYP_CHECK(fs::exists(sched_path), "{}: scheduler/scheduler_config.json is missing", config_dir);
  NoiseSchedule schedule = NoiseSchedule::from_json(io::read_file(sched_path, 1 << 20), sched_path);
  auto pipe = std::make_unique<DiffusionPipeline>("StableDiffusionPipeline", std::move(text), tokenizer_of("tokenizer"),
                                                  std::move(unet), std::move(vae), std::move(schedule));
  if (xl) {
    const std::string index_path = (fs::path(config_dir) / "model_index.json").string();
    const JsonFields index(io::read_file(index_path, 1 << 20), index_path);
    pipe->add_second_text_encoder(std::move(text2), tokenizer_of("tokenizer_2"),
                                  index.boolean("force_zeros_for_empty_prompt", true));
  }
  return pipe;
}

void save_single_file(const DiffusionPipeline& pipeline, const std::string& file) {
  io::SafetensorsWriter w;
  std::map<std::string, std::vector<float>> keep;  // fused and transposed tensors, alive until written
  auto add = [&](Component c, const ParamTable& p) {
    for (size_t i = 0; i < p.entries().size(); ++i) {
      const ParamEntry& e = p.entries()[i];
      Shape shape = e.shape;
      const std::string name = original_name(c, e.name, pipeline.unet().config(), pipeline.vae().config());
      // The original VAE attention's q/k/v/proj_out are 1x1 convolutions.
      if (name.find(".mid.attn_1.") != std::string::npos && shape.rank() == 2) shape = {shape[0], shape[1], 1, 1};
      w.add(name, DType::kF32, shape, p.data(static_cast<int>(i)));
    }
  };
  add(Component::kUNet, pipeline.unet().params());
  add(Component::kVae, pipeline.vae().params());
  if (pipeline.xl()) {
    const ParamTable& te = pipeline.text_encoder().params();
    for (size_t i = 0; i < te.entries().size(); ++i)
      w.add(kSdxlClip + te.entries()[i].name, DType::kF32, te.entries()[i].shape, te.data(static_cast<int>(i)));
    add_open_clip(w, pipeline.text_encoder_2().params(), kSdxlOpenClip, keep);
  } else {
    add(Component::kTextEncoder, pipeline.text_encoder().params());
  }
  w.write(file);
}

}  // namespace hyperion::diffusion
