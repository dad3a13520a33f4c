#include "diffusion/single_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "base/error.h"
#include "diffusion/architectures.h"
#include "diffusion/sd_tiny.h"
#include "io/safetensors.h"

namespace hyperion::diffusion {
namespace {

namespace fs = std::filesystem;

// Names of Stable Diffusion 1.5's original checkpoint, as the file on the hub spells them.
TEST(SingleFile, NamesFollowTheOriginalLayout) {
  const UNetConfig u = unet_preset("sd15");
  VaeConfig v;  // SD's: 4 levels
  auto unet = [&](const char* n) { return original_name(Component::kUNet, n, u, v); };
  auto vae = [&](const char* n) { return original_name(Component::kVae, n, u, v); };
  const std::string m = "model.diffusion_model.";
  EXPECT_EQ(unet("conv_in.weight"), m + "input_blocks.0.0.weight");
  EXPECT_EQ(unet("time_embedding.linear_1.weight"), m + "time_embed.0.weight");
  EXPECT_EQ(unet("down_blocks.0.resnets.0.norm1.weight"), m + "input_blocks.1.0.in_layers.0.weight");
  EXPECT_EQ(unet("down_blocks.0.attentions.1.proj_in.weight"), m + "input_blocks.2.1.proj_in.weight");
  EXPECT_EQ(unet("down_blocks.0.downsamplers.0.conv.weight"), m + "input_blocks.3.0.op.weight");
  EXPECT_EQ(unet("down_blocks.1.resnets.0.conv_shortcut.bias"), m + "input_blocks.4.0.skip_connection.bias");
  EXPECT_EQ(unet("down_blocks.3.resnets.1.conv2.bias"), m + "input_blocks.11.0.out_layers.3.bias");
  EXPECT_EQ(unet("mid_block.resnets.1.time_emb_proj.weight"), m + "middle_block.2.emb_layers.1.weight");
  EXPECT_EQ(unet("mid_block.attentions.0.transformer_blocks.0.ff.net.2.weight"),
            m + "middle_block.1.transformer_blocks.0.ff.net.2.weight");
  EXPECT_EQ(unet("up_blocks.0.resnets.2.conv1.weight"), m + "output_blocks.2.0.in_layers.2.weight");
  EXPECT_EQ(unet("up_blocks.0.upsamplers.0.conv.weight"), m + "output_blocks.2.1.conv.weight");
  EXPECT_EQ(unet("up_blocks.1.upsamplers.0.conv.weight"), m + "output_blocks.5.2.conv.weight");
  EXPECT_EQ(unet("up_blocks.3.attentions.2.transformer_blocks.0.attn2.to_k.weight"),
            m + "output_blocks.11.1.transformer_blocks.0.attn2.to_k.weight");
  EXPECT_EQ(unet("conv_norm_out.bias"), m + "out.0.bias");
  EXPECT_EQ(unet("conv_out.weight"), m + "out.2.weight");
  const std::string f = "first_stage_model.";
  EXPECT_EQ(vae("encoder.down_blocks.0.downsamplers.0.conv.weight"), f + "encoder.down.0.downsample.conv.weight");
  EXPECT_EQ(vae("encoder.down_blocks.1.resnets.0.conv_shortcut.weight"), f + "encoder.down.1.block.0.nin_shortcut.weight");
  EXPECT_EQ(vae("encoder.mid_block.attentions.0.to_q.weight"), f + "encoder.mid.attn_1.q.weight");
  EXPECT_EQ(vae("encoder.mid_block.attentions.0.to_out.0.bias"), f + "encoder.mid.attn_1.proj_out.bias");
  EXPECT_EQ(vae("decoder.mid_block.resnets.1.norm2.weight"), f + "decoder.mid.block_2.norm2.weight");
  EXPECT_EQ(vae("decoder.up_blocks.0.resnets.0.conv1.weight"), f + "decoder.up.3.block.0.conv1.weight");
  EXPECT_EQ(vae("decoder.up_blocks.1.upsamplers.0.conv.bias"), f + "decoder.up.2.upsample.conv.bias");
  EXPECT_EQ(vae("encoder.conv_norm_out.weight"), f + "encoder.norm_out.weight");
  EXPECT_EQ(vae("post_quant_conv.weight"), f + "post_quant_conv.weight");
  EXPECT_EQ(original_name(Component::kTextEncoder, "text_model.final_layer_norm.weight", u, v),
            "cond_stage_model.transformer.text_model.final_layer_norm.weight");
  // Every tensor of a full SD 1.5 UNet maps to a distinct original name.
  UNet full(u);
  std::set<std::string> seen;
  for (const ParamEntry& e : full.params().entries()) EXPECT_TRUE(seen.insert(unet(e.name.c_str())).second) << e.name;
}

// SDXL's original names (sd_xl_base_1.0.safetensors): three levels, the first without
// attention, ten transformer layers deep at the last, the text_time embedding as label_emb.
TEST(SingleFile, SdxlNamesFollowTheOriginalLayout) {
  const UNetConfig u = unet_preset("sdxl");
  VaeConfig v;
  auto unet = [&](const char* n) { return original_name(Component::kUNet, n, u, v); };
  const std::string m = "model.diffusion_model.";
  EXPECT_EQ(unet("add_embedding.linear_1.weight"), m + "label_emb.0.0.weight");
  EXPECT_EQ(unet("add_embedding.linear_2.bias"), m + "label_emb.0.2.bias");
  EXPECT_EQ(unet("down_blocks.0.resnets.1.conv1.weight"), m + "input_blocks.2.0.in_layers.2.weight");
  EXPECT_EQ(unet("down_blocks.1.attentions.0.transformer_blocks.1.attn2.to_k.weight"),
            m + "input_blocks.4.1.transformer_blocks.1.attn2.to_k.weight");
  EXPECT_EQ(unet("down_blocks.2.attentions.1.transformer_blocks.9.ff.net.2.bias"),
            m + "input_blocks.8.1.transformer_blocks.9.ff.net.2.bias");
  EXPECT_EQ(unet("up_blocks.0.upsamplers.0.conv.weight"), m + "output_blocks.2.2.conv.weight");
  EXPECT_EQ(unet("up_blocks.1.upsamplers.0.conv.weight"), m + "output_blocks.5.2.conv.weight");
  EXPECT_EQ(unet("up_blocks.2.resnets.2.conv2.weight"), m + "output_blocks.8.0.out_layers.3.weight");
  UNet full(u);
  std::set<std::string> seen;
  for (const ParamEntry& e : full.params().entries()) EXPECT_TRUE(seen.insert(unet(e.name.c_str())).second) << e.name;
}

// An SDXL single file: both text encoders under conditioner.embedders (the second in
// OpenCLIP's layout, q/k/v fused and the projection transposed) load to the same images as
// the diffusers directory; a file and a config of different families are refused.
TEST(SingleFile, SdxlLoadsToTheSameImagesAsTheDiffusersDirectory) {
  const auto pipe = make_sd_tiny_xl(22);
  const std::string dir = testing::TempDir() + "/single_file_xl_cfg",
                    file = testing::TempDir() + "/sd_tiny_xl_single.safetensors";
  fs::remove_all(dir);
  pipe->save(dir);
  save_single_file(*pipe, file);
  ASSERT_TRUE(is_single_file_checkpoint(file));
  const io::SafetensorsFile f = io::SafetensorsFile::open(file);
  const int64_t d2 = pipe->text_encoder_2().config().hidden_size, p2 = pipe->text_encoder_2().config().projection_dim;
  EXPECT_EQ(f.get("conditioner.embedders.1.model.text_projection").shape, (Shape{d2, p2}));
  EXPECT_EQ(f.get("conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight").shape,
            (Shape{3 * d2, d2}));
  EXPECT_NE(f.find("conditioner.embedders.0.transformer.text_model.final_layer_norm.weight"), nullptr);
  EXPECT_NE(f.find("model.diffusion_model.label_emb.0.0.weight"), nullptr);
  const auto loaded = load_single_file(file, dir);
  ASSERT_TRUE(loaded->xl());
  ImageRequest r;
  r.prompt = "a photo of a coat";
  r.steps = 3;
  r.seed = 9;
  EXPECT_EQ(loaded->generate(r).pixels, pipe->generate(r).pixels);
  // An SD 1.x config for the SDXL file.
  const std::string sd1 = testing::TempDir() + "/single_file_xl_sd1_cfg";
  fs::remove_all(sd1);
  make_sd_tiny(22)->save(sd1);
  try {
    load_single_file(file, sd1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("an SDXL file"), std::string::npos) << e.what();
  }
}

// The same weights as a diffusers directory and as one original-layout file load to the
// same images.
TEST(SingleFile, LoadsToTheSameImagesAsTheDiffusersDirectory) {
  const auto pipe = make_sd_tiny(21);
  const std::string dir = testing::TempDir() + "/single_file_cfg", file = testing::TempDir() + "/sd_tiny_single.safetensors";
  fs::remove_all(dir);
  pipe->save(dir);
  save_single_file(*pipe, file);
  ASSERT_TRUE(is_single_file_checkpoint(file));
  EXPECT_FALSE(is_single_file_checkpoint(dir));
  const auto loaded = load_single_file(file, dir);
  ImageRequest r;
  r.prompt = "a photo of a coat";
  r.steps = 3;
  r.seed = 9;
  EXPECT_EQ(loaded->generate(r).pixels, pipe->generate(r).pixels);
  try {
    load_single_file(file, testing::TempDir());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("come from a diffusers directory"), std::string::npos);
  }
}

// SD 2.x's layout: the text encoder as OpenCLIP names it (resblocks, ln_1, c_fc, one fused
// in_proj for q, k and v, positional_embedding, ln_final), written here independently of
// the loader's table; it loads to the same images as the diffusers directory.
TEST(SingleFile, OpenClipTextEncodersOfSd2Load) {
  const auto pipe = make_sd_tiny(23);
  const std::string dir = testing::TempDir() + "/single_file_sd2_cfg", file = testing::TempDir() + "/sd2_single.safetensors";
  fs::remove_all(dir);
  pipe->save(dir);
  io::SafetensorsWriter w;
  std::vector<std::vector<float>> keep;
  auto add_table = [&](Component c, const ParamTable& p) {
    for (size_t i = 0; i < p.entries().size(); ++i) {
      const ParamEntry& e = p.entries()[i];
      w.add(original_name(c, e.name, pipe->unet().config(), pipe->vae().config()), DType::kF32, e.shape,
            p.data(int(i)));
    }
  };
  add_table(Component::kUNet, pipe->unet().params());
  add_table(Component::kVae, pipe->vae().params());
  const ParamTable& t = pipe->text_encoder().params();
  auto tensor = [&](const std::string& n) {
    const int i = t.find(n);
    EXPECT_GE(i, 0) << n;
    return std::pair{t.data(i), t.entries()[size_t(i)]};
  };
  const std::string m = "cond_stage_model.model.";
  auto put = [&](const std::string& name, const std::string& from) {
    const auto [data, e] = tensor(from);
    w.add(m + name, DType::kF32, e.shape, data);
  };
  put("token_embedding.weight", "text_model.embeddings.token_embedding.weight");
  put("positional_embedding", "text_model.embeddings.position_embedding.weight");
  put("ln_final.weight", "text_model.final_layer_norm.weight");
  put("ln_final.bias", "text_model.final_layer_norm.bias");
  const int64_t layers = pipe->text_encoder().config().layers;
  for (int64_t l = 0; l < layers; ++l) {
    const std::string d = "text_model.encoder.layers." + std::to_string(l) + ".",
                      o = "transformer.resblocks." + std::to_string(l) + ".";
    for (auto [from, to] : {std::pair<const char*, const char*>{"layer_norm1", "ln_1"}, {"layer_norm2", "ln_2"},
                            {"self_attn.out_proj", "attn.out_proj"}, {"mlp.fc1", "mlp.c_fc"}, {"mlp.fc2", "mlp.c_proj"}})
      for (const char* kind : {".weight", ".bias"}) put(o + to + kind, d + from + kind);
    for (const char* kind : {"weight", "bias"}) {
      std::vector<float> fused;
      Shape shape;
      for (const char* x : {"q", "k", "v"}) {
        const auto [data, e] = tensor(d + "self_attn." + x + "_proj." + kind);
        fused.insert(fused.end(), data, data + e.numel);
        shape = e.shape.rank() == 2 ? Shape{3 * e.shape[0], e.shape[1]} : Shape{3 * e.shape[0]};
      }
      keep.push_back(std::move(fused));
      w.add(m + o + "attn.in_proj_" + kind, DType::kF32, shape, keep.back().data());
    }
  }
  w.write(file);
  const auto loaded = load_single_file(file, dir);
  ImageRequest r;
  r.prompt = "a photo of a dress";
  r.steps = 3;
  r.seed = 4;
  EXPECT_EQ(loaded->generate(r).pixels, pipe->generate(r).pixels);
}

}  // namespace
}  // namespace hyperion::diffusion
