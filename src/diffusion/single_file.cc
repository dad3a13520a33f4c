#include "diffusion/single_file.h"

#include <filesystem>
#include <regex>

#include "base/error.h"
#include "base/log.h"
#include "diffusion/components.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/weight_files.h"

namespace hyperion::diffusion {

namespace fs = std::filesystem;

namespace {

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

std::string unet_name(const std::string& name, const UNetConfig& c) {
  const std::string p = "model.diffusion_model.";
  const int64_t lpb = c.layers_per_block;
  std::smatch m;
  static const std::regex down_res(R"(down_blocks\.(\d+)\.resnets\.(\d+)\.(.*))");
  static const std::regex down_attn(R"(down_blocks\.(\d+)\.attentions\.(\d+)\.(.*))");
  static const std::regex down_sample(R"(down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*))");
  static const std::regex up_res(R"(up_blocks\.(\d+)\.resnets\.(\d+)\.(.*))");
  static const std::regex up_attn(R"(up_blocks\.(\d+)\.attentions\.(\d+)\.(.*))");
  static const std::regex up_sample(R"(up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.*))");
  static const std::regex mid_res(R"(mid_block\.resnets\.(\d+)\.(.*))");
  static const std::regex mid_attn(R"(mid_block\.attentions\.0\.(.*))");
  auto idx = [&](int k) { return std::stoll(m[k].str()); };
  // input_blocks: [conv_in], then per level lpb (resnet, attention) blocks and a downsampler.
  if (std::regex_match(name, m, down_res))
    return p + "input_blocks." + std::to_string(1 + idx(1) * (lpb + 1) + idx(2)) + ".0." + rename(m[3], kUNetResnet, name);
  if (std::regex_match(name, m, down_attn))
    return p + "input_blocks." + std::to_string(1 + idx(1) * (lpb + 1) + idx(2)) + ".1." + m[3].str();
  if (std::regex_match(name, m, down_sample))
    return p + "input_blocks." + std::to_string(1 + idx(1) * (lpb + 1) + lpb) + ".0.op." + m[2].str();
  // output_blocks: per level lpb + 1 blocks; the upsampler sits in the level's last one,
  // after its attention when the level has one.
  if (std::regex_match(name, m, up_res))
    return p + "output_blocks." + std::to_string(idx(1) * (lpb + 1) + idx(2)) + ".0." + rename(m[3], kUNetResnet, name);
  if (std::regex_match(name, m, up_attn))
    return p + "output_blocks." + std::to_string(idx(1) * (lpb + 1) + idx(2)) + ".1." + m[3].str();
  if (std::regex_match(name, m, up_sample)) {
    const bool attn = c.up_block_types.at(size_t(idx(1))).rfind("CrossAttn", 0) == 0;
    return p + "output_blocks." + std::to_string(idx(1) * (lpb + 1) + lpb) + (attn ? ".2" : ".1") + ".conv." +
           m[2].str();
  }
  if (std::regex_match(name, m, mid_res))
    return p + "middle_block." + (idx(1) == 0 ? "0." : "2.") + rename(m[2], kUNetResnet, name);
  if (std::regex_match(name, m, mid_attn)) return p + "middle_block.1." + m[1].str();
  return p + rename(name, kUNetTop, name);
}

std::string vae_name(const std::string& name, const VaeConfig& c) {
  const std::string p = "first_stage_model.";
  const int64_t levels = int64_t(c.block_out_channels.size());
  std::smatch m;
  static const std::regex enc_res(R"(encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.*))");
  static const std::regex enc_down(R"(encoder\.down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*))");
  static const std::regex dec_res(R"(decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*))");
  static const std::regex dec_up(R"(decoder\.up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.*))");
  static const std::regex mid_res(R"((encoder|decoder)\.mid_block\.resnets\.(\d+)\.(.*))");
  static const std::regex mid_attn(R"((encoder|decoder)\.mid_block\.attentions\.0\.(.*))");
  auto idx = [&](int k) { return std::stoll(m[k].str()); };
  if (std::regex_match(name, m, enc_res))
    return p + "encoder.down." + m[1].str() + ".block." + m[2].str() + "." + rename(m[3], kVaeResnet, name);
  if (std::regex_match(name, m, enc_down)) return p + "encoder.down." + m[1].str() + ".downsample.conv." + m[2].str();
  // The original decoder numbers its levels from the lowest resolution up.
  if (std::regex_match(name, m, dec_res))
    return p + "decoder.up." + std::to_string(levels - 1 - idx(1)) + ".block." + m[2].str() + "." +
           rename(m[3], kVaeResnet, name);
  if (std::regex_match(name, m, dec_up))
    return p + "decoder.up." + std::to_string(levels - 1 - idx(1)) + ".upsample.conv." + m[2].str();
  if (std::regex_match(name, m, mid_res))
    return p + m[1].str() + ".mid.block_" + std::to_string(idx(2) + 1) + "." + rename(m[3], kVaeResnet, name);
  if (std::regex_match(name, m, mid_attn)) return p + m[1].str() + ".mid.attn_1." + rename(m[2], kVaeAttention, name);
  for (const Rename& r : kVaeTop)
    if (name.rfind(r.diffusers, 0) == 0) return p + r.original + name.substr(std::string(r.diffusers).size());
  // conv_in, conv_out, quant_conv, post_quant_conv keep their names.
  return p + name;
}

}  // namespace

std::string original_name(Component component, const std::string& name, const UNetConfig& unet, const VaeConfig& vae) {
  switch (component) {
    case Component::kUNet:
      return unet_name(name, unet);
    case Component::kVae:
      return vae_name(name, vae);
    case Component::kTextEncoder:
      return "cond_stage_model.transformer." + name;
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
  HYP_CHECK(!unet_config.text_time, "{}: SDXL single-file checkpoints are not supported (SD 1.x only)", file);
  auto unet = std::make_unique<UNet>(unet_config);
  auto vae = std::make_unique<Vae>(vae_config);
  auto text = std::make_unique<ClipTextModel>(ClipTextConfig::from_json(te_text, te_path));
  const io::WeightFiles files(fs::path(file).parent_path().string(), fs::path(file).filename().string());
  HYP_CHECK(files.find("cond_stage_model.transformer.text_model.embeddings.token_embedding.weight") != nullptr,
            "{}: no cond_stage_model.transformer.* (an SD 1.x CLIP text encoder); SD 2.x's OpenCLIP layout "
            "(cond_stage_model.model.*) is not supported",
            file);
  struct Part {
    ParamTable* params;
    Component component;
    const char* prefix;
  };
  for (const Part& part : {Part{&unet->params(), Component::kUNet, "model.diffusion_model."},
                           Part{&vae->params(), Component::kVae, "first_stage_model."},
                           Part{&text->params(), Component::kTextEncoder, "cond_stage_model.transformer."}}) {
    part.params->allocate(false);
    std::vector<std::string> unused = part.params->load_mapped(
        files, file, [&](const std::string& n) { return original_name(part.component, n, unet_config, vae_config); },
        part.prefix);
    std::erase_if(unused, [](const std::string& n) { return n.find("position_ids") != std::string::npos; });
    if (!unused.empty())
      log_warn("{}: {} tensors under {} the config does not use (first: {})", file, unused.size(), part.prefix,
               unused.front());
  }
  auto tokenizer = std::make_unique<text::ClipTokenizer>(
      text::ClipTokenizer::load((fs::path(config_dir) / "tokenizer").string()));
  const std::string sched_path = (fs::path(config_dir) / "scheduler" / "scheduler_config.json").string();
  HYP_CHECK(fs::exists(sched_path), "{}: scheduler/scheduler_config.json is missing", config_dir);
  NoiseSchedule schedule = NoiseSchedule::from_json(io::read_file(sched_path, 1 << 20), sched_path);
  return std::make_unique<DiffusionPipeline>("StableDiffusionPipeline", std::move(text), std::move(tokenizer),
                                             std::move(unet), std::move(vae), std::move(schedule));
}

}  // namespace hyperion::diffusion
