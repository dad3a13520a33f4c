// `hyperion generate` on a diffusers directory and `hyperion diffusion forward`, end to end.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <sstream>

#include <httplib.h>

#include <unistd.h>

#include "cli_test_util.h"
#include "server_process.h"
#include "diffusion/sd_tiny.h"
#include "io/atomic_file.h"
#include "io/image_file.h"
#include "kernels/cuda/cuda_backend.h"
#include "serve/image_api.h"

namespace hyperion {
namespace {

namespace fs = std::filesystem;
using testing_util::run_cli;

std::string saved_sd_tiny() {
  static const std::string dir = [] {
    // One directory per test process: CTest runs this file's tests in parallel processes
    // that share TempDir(), and two of them saving one directory race on its renames.
    const std::string d = testing::TempDir() + "/diffusion_cli_sd_tiny." + std::to_string(::getpid());
    fs::remove_all(d);
    diffusion::make_sd_tiny(11)->save(d);
    return d;
  }();
  return dir;
}

// An image folder (metadata.jsonl with file_name and text) of `count` deterministic RGB
// PNGs of side x side pixels, each captioned `caption`.
void write_image_folder(const std::string& dir, int count, int64_t side, const std::string& caption, size_t salt) {
  fs::create_directories(dir);
  std::string meta;
  for (int i = 0; i < count; ++i) {
    io::Image img;
    img.width = img.height = side;
    img.channels = 3;
    img.pixels.resize(img.bytes());
    for (size_t k = 0; k < img.pixels.size(); ++k) img.pixels[k] = uint8_t((k * salt + size_t(i) * 31) % 256);
    io::write_png(dir + "/" + std::to_string(i) + ".png", img);
    meta += "{\"file_name\": \"" + std::to_string(i) + ".png\", \"text\": \"" + caption + "\"}\n";
  }
  io::write_file_atomic(dir + "/metadata.jsonl", meta);
}

// `hyperion train` fine-tuning `pretrained` on the image folder `images` for `steps` steps
// at batch 2, the VAE kept, no sample grid, into base/run_name (more keys appended).
std::string fine_tune_command(const std::string& pretrained, const std::string& images, int steps,
                              const std::string& base, const std::string& run_name) {
  return "train sd-tiny diffusion.pretrained=" + pretrained + " diffusion.dataset=" + images +
         " diffusion.vae_steps=0 steps=" + std::to_string(steps) +
         " per_device_batch_size=2 diffusion.samples_per_class=0 base_output_directory=" + base +
         " run_name=" + run_name;
}

TEST(DiffusionCli, GenerateWritesSeededPngs) {
  const std::string dir = saved_sd_tiny(), out = testing::TempDir() + "/diffusion_cli_out.png";
  fs::remove(out);
  const auto r = run_cli("generate --checkpoint " + dir + " --prompt 'a photo of a bag' --steps 3 --seed 5 --batch 2 "
                         "--scheduler euler --output " + out + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["files"].size(), 2u);
  EXPECT_EQ(j["files"][1], testing::TempDir() + "/diffusion_cli_out-1.png");
  EXPECT_EQ(j["scheduler"], "euler");
  const io::Image img = io::read_image(out);
  EXPECT_EQ(img.width, 32);
  EXPECT_EQ(img.height, 32);
  // The same seed gives the same file.
  const std::string first = io::read_file(out);
  ASSERT_EQ(run_cli("generate --checkpoint " + dir + " --prompt 'a photo of a bag' --steps 3 --seed 5 --batch 2 "
                    "--scheduler euler --output " + out).code, 0);
  EXPECT_EQ(io::read_file(out), first);
  // Mixed precision (bf16 matmuls and convolutions): the same image size, and it says so.
  const auto mixed = run_cli("generate --checkpoint " + dir + " --prompt 'a photo of a bag' --steps 3 --seed 5 "
                             "--dtype bfloat16 --output " + out + " --json", false);
  ASSERT_EQ(mixed.code, 0) << mixed.out;
  EXPECT_EQ(nlohmann::json::parse(mixed.out)["dtype"], "bfloat16");
  EXPECT_EQ(io::read_image(out).width, 32);
  const auto bad = run_cli("generate --checkpoint " + dir + " --prompt p --dtype float16 --output " + out);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--dtype"), std::string::npos) << bad.out;
}

// `hyperion serve` on the diffusers directory: the image a request gets is, byte for byte,
// the PNG `generate` writes for the same seed and settings.
TEST(DiffusionCli, ServeAnswersImageGenerationsAsGenerateWritesThem) {
  const std::string dir = saved_sd_tiny(), out = testing::TempDir() + "/diffusion_cli_served.png",
                    log = testing::TempDir() + "/diffusion_cli_serve." + std::to_string(::getpid()) + ".log";
  ASSERT_EQ(run_cli("generate --checkpoint " + dir + " --prompt 'a photo of a coat' --steps 3 --seed 9 "
                    "--guidance 4 --scheduler euler_a --output " + out).code, 0);
  testing_util::ServerProcess server(dir, {"max_batch_images=2"}, log);
  ASSERT_GT(server.port(), 0);
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(60, 0);
  const auto r = c.Post("/v1/images/generations",
                        R"({"prompt": "a photo of a coat", "steps": 3, "seed": 9, "guidance_scale": 4,
                            "scheduler": "euler_a", "response_format": "b64_json"})",
                        "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const nlohmann::json j = nlohmann::json::parse(r->body);
  EXPECT_EQ(j["data"][0]["b64_json"], serve::base64_encode(io::read_file(out)));
  const auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_NE(models->body.find(fs::path(dir).filename().string()), std::string::npos) << models->body;
  // bench images against it: every request answered, figures per level.
  const auto b = run_cli("bench images --url http://127.0.0.1:" + std::to_string(server.port()) +
                             " --concurrency 1,2 --requests 2 --steps 2 --json",
                         false);
  ASSERT_EQ(b.code, 0) << b.out;
  const nlohmann::json bj = nlohmann::json::parse(b.out);
  ASSERT_EQ(bj["levels"].size(), 2u);
  EXPECT_EQ(bj["levels"][1]["concurrency"], 2);
  EXPECT_EQ(bj["levels"][1]["images"], 2);
  EXPECT_GT(bj["levels"][1]["images_per_minute"].get<double>(), 0);
  EXPECT_EQ(bj["failed"], 0);
  EXPECT_EQ(server.stop(), 0);
  // Keys of the text engine are refused by name before anything loads.
  const auto bad = run_cli("serve " + dir + " --port 0 kv_dtype=int8");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("kv_dtype"), std::string::npos) << bad.out;
}

TEST(DiffusionCli, UsageErrorsNameTheFlag) {
  const std::string dir = saved_sd_tiny(), out = testing::TempDir() + "/diffusion_cli_bad.png";
  auto r = run_cli("generate --checkpoint " + dir + " --prompt x --output " + out + " --width 30");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("image width 30 must be a multiple of 4"), std::string::npos) << r.out;
  r = run_cli("generate --checkpoint " + dir + " --prompt x --output " + out + " --temperature 0.5");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--temperature does not apply to a diffusion model"), std::string::npos) << r.out;
  r = run_cli("generate --checkpoint " + dir + " --prompt x --output " + testing::TempDir() + "/x.jpg");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("must name a .png file"), std::string::npos) << r.out;
  r = run_cli("generate --checkpoint " + dir + " --prompt x --output " + out + " --scheduler lms");
  EXPECT_EQ(r.code, 2);
  r = run_cli("generate --checkpoint no-such-dir --output " + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--output applies to diffusion models"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
  // Language-model keys the diffusion trainer does not honour are refused by name, before
  // anything is written.
  const std::string runs = testing::TempDir() + "/diffusion_cli_refused." + std::to_string(::getpid());
  for (const char* key : {"remat_policy=minimal", "quantization=int8"}) {
    r = run_cli(std::string("train sd-tiny ") + key + " base_output_directory=" + runs);
    EXPECT_EQ(r.code, 2) << key << ": " << r.out;
    EXPECT_NE(r.out.find(key), std::string::npos) << r.out;
  }
  EXPECT_FALSE(fs::exists(runs)) << "a refused run wrote " << runs;
  r = run_cli("diffusion forward --component transformer --dir " + dir + "/unet --inputs x --output y");
  EXPECT_NE(r.code, 0);
  // The device: a bad value is a usage error; a GPU this process cannot use is refused by
  // name before the checkpoint loads, and nothing is written.
  r = run_cli("generate --checkpoint " + dir + " --prompt x --output " + out + " --hardware tpu");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--hardware must be cpu or gpu"), std::string::npos) << r.out;
  if (!cuda_status().available) {  // (the hyperion binary has no simulated device)
    r = run_cli("generate --checkpoint " + dir + " --prompt x --output " + out + " --hardware gpu");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("no usable GPU"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(out));
    r = run_cli("train sd-tiny hardware=gpu base_output_directory=" + runs);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("diffusion training runs on the CPU"), std::string::npos) << r.out;
  }
}

// A short sd-tiny run: the VAE and then the UNet train (the held-out denoising loss falls
// from ~1.0 for random weights), the run writes a diffusers directory that generates, and
// a sample grid.
TEST(DiffusionCli, SdTinyTrainsAndWritesADiffusersDirectory) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const std::string base = testing::TempDir() + "/diffusion_cli_train";
  fs::remove_all(base);
  const auto r = run_cli("train sd-tiny steps=30 diffusion.vae_steps=20 diffusion.max_images=512 "
                         "per_device_batch_size=32 eval_interval=30 log_period=10 diffusion.samples_per_class=1 "
                         "diffusion.sample_steps=4 base_output_directory=" + base + " run_name=t --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["steps"], 30);
  // Random weights predict the noise with loss ~1; 30 steps bring it below 0.7 (measured
  // 0.53 to 0.60 across seeds and machines).
  EXPECT_LT(j["eval_loss"].get<double>(), 0.7);
  const std::string ckpt = j["checkpoint"];
  EXPECT_TRUE(fs::exists(ckpt + "/model_index.json"));
  EXPECT_TRUE(fs::exists(base + "/t/samples.png"));
  EXPECT_EQ(io::read_image(base + "/t/samples.png").height, 10 * 32);
  const std::string out = testing::TempDir() + "/diffusion_cli_trained.png";
  EXPECT_EQ(run_cli("generate --checkpoint " + ckpt + " --prompt 'a photo of a bag' --steps 4 --output " + out).code, 0);
  EXPECT_TRUE(fs::exists(out));
  // A language-model command on it says what it is.
  const auto eval = run_cli("eval --checkpoint " + ckpt + " --text " + ckpt + "/model_index.json");
  EXPECT_NE(eval.code, 0);
  EXPECT_NE(eval.out.find("is a diffusion checkpoint"), std::string::npos) << eval.out;
}

// A run stopped at step 3 and resumed equals the run made in one go: the same losses and,
// bit for bit, the same UNet, EMA and optimizer state at the end.
TEST(DiffusionCli, ResumedRunEqualsTheRunMadeInOneGo) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const std::string base = testing::TempDir() + "/diffusion_cli_resume." + std::to_string(::getpid());
  fs::remove_all(base);
  const std::string args = "train sd-tiny steps=6 diffusion.vae_steps=2 diffusion.max_images=64 "
                           "per_device_batch_size=8 eval_interval=3 diffusion.samples_per_class=0 log_period=100 "
                           "max_num_checkpoints_to_keep=1 base_output_directory=" + base;
  ASSERT_EQ(run_cli(args + " run_name=whole").code, 0);
  const auto first = run_cli(args + " run_name=split --stop-at 3");
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_TRUE(fs::exists(base + "/split/checkpoints/3/training_state.safetensors"));
  EXPECT_TRUE(fs::exists(base + "/split/checkpoints/3/unet/config.json"));
  // The latent cache: written by the first part, read back (not rewritten) by the second.
  auto cache = [&] {
    std::map<std::string, fs::file_time_type> files;
    for (const auto& e : fs::directory_iterator(base + "/split/dataset_cache"))
      files[e.path().filename().string()] = fs::last_write_time(e.path());
    return files;
  };
  const auto cached = cache();
  EXPECT_EQ(cached.size(), 2u);
  const auto second = run_cli("train --resume " + base + "/split --json", false);
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_EQ(nlohmann::json::parse(second.out)["steps"], 6);
  EXPECT_EQ(cache(), cached);
  auto lines = [](const std::string& run) {
    std::vector<std::string> out;
    std::istringstream in(io::read_file(run + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      out.push_back(std::to_string(j["step"].get<int64_t>()) + " " + j["loss"].dump() + " " + j.value("eval_loss", nlohmann::json()).dump());
    }
    return out;
  };
  EXPECT_EQ(lines(base + "/whole"), lines(base + "/split"));
  for (const char* file : {"/training_state.safetensors", "/unet/diffusion_pytorch_model.safetensors",
                           "/vae/diffusion_pytorch_model.safetensors"})
    EXPECT_EQ(io::read_file(base + "/whole/checkpoints/6" + file), io::read_file(base + "/split/checkpoints/6" + file))
        << file;
  // max_num_checkpoints_to_keep=1: step 3's checkpoint went, components and all.
  EXPECT_FALSE(fs::exists(base + "/split/checkpoints/3"));
}

// The Dreambooth case: a few captioned images fine-tune a diffusers directory; the VAE
// (diffusion.vae_steps=0) and the text encoder stay as they were, the UNet moves.
TEST(DiffusionCli, FineTunesADiffusersDirectoryOnAnImageFolder) {
  const std::string base = testing::TempDir() + "/diffusion_cli_finetune", pretrained = base + "/pretrained",
                    images = base + "/images";
  fs::remove_all(base);
  diffusion::make_sd_tiny(12)->save(pretrained);
  write_image_folder(images, 4, 40, "a photo of a bag", 7);
  const auto r = run_cli(fine_tune_command(pretrained, images, 4, base, "ft") + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string ckpt = nlohmann::json::parse(r.out)["checkpoint"];
  EXPECT_EQ(io::read_file(ckpt + "/vae/diffusion_pytorch_model.safetensors"),
            io::read_file(pretrained + "/vae/diffusion_pytorch_model.safetensors"));
  EXPECT_EQ(io::read_file(ckpt + "/text_encoder/model.safetensors"),
            io::read_file(pretrained + "/text_encoder/model.safetensors"));
  EXPECT_NE(io::read_file(ckpt + "/unet/diffusion_pytorch_model.safetensors"),
            io::read_file(pretrained + "/unet/diffusion_pytorch_model.safetensors"));
  // A resolution the model cannot take is named before any work.
  const auto bad = run_cli("train sd-tiny diffusion.pretrained=" + pretrained + " diffusion.dataset=" + images +
                           " diffusion.resolution=36 base_output_directory=" + base + " run_name=bad");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("diffusion.resolution"), std::string::npos) << bad.out;
}

// SDXL fine-tuning: the second text encoder's pooled embedding and the size ids condition
// the UNet; the checkpoint is an SDXL diffusers directory that generates; the frozen
// encoders are written back unchanged.
TEST(DiffusionCli, FineTunesAnSdxlDirectory) {
  const std::string base = testing::TempDir() + "/diffusion_cli_sdxl." + std::to_string(::getpid()),
                    pretrained = base + "/pretrained", images = base + "/images";
  fs::remove_all(base);
  diffusion::make_sd_tiny_xl(14)->save(pretrained);
  write_image_folder(images, 2, 32, "a photo of a coat", 3);
  const auto r = run_cli(fine_tune_command(pretrained, images, 3, base, "xl") + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string ckpt = nlohmann::json::parse(r.out)["checkpoint"];
  const nlohmann::json index = nlohmann::json::parse(io::read_file(ckpt + "/model_index.json"));
  EXPECT_EQ(index["_class_name"], "StableDiffusionXLPipeline");
  for (const char* file : {"/text_encoder/model.safetensors", "/text_encoder_2/model.safetensors",
                           "/tokenizer_2/vocab.json", "/vae/diffusion_pytorch_model.safetensors"})
    EXPECT_EQ(io::read_file(ckpt + file), io::read_file(pretrained + file)) << file;
  EXPECT_NE(io::read_file(ckpt + "/unet/diffusion_pytorch_model.safetensors"),
            io::read_file(pretrained + "/unet/diffusion_pytorch_model.safetensors"));
  const std::string out = base + "/xl.png";
  const auto g = run_cli("generate --checkpoint " + ckpt + " --prompt 'a photo of a coat' --steps 2 --output " + out);
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_EQ(io::read_image(out).width, 32);
}

// dtype=bfloat16: mixed precision training; the checkpoint records it and a resumed run
// keeps it without being told again.
TEST(DiffusionCli, Bf16RunRecordsItsDtypeAndItsResumeKeepsIt) {
  const std::string base = testing::TempDir() + "/diffusion_cli_bf16." + std::to_string(::getpid()),
                    pretrained = base + "/pretrained", images = base + "/images";
  fs::remove_all(base);
  diffusion::make_sd_tiny(13)->save(pretrained);
  write_image_folder(images, 2, 32, "a photo of a bag", 5);
  const auto first = run_cli(fine_tune_command(pretrained, images, 4, base, "bf") + " dtype=bfloat16 --stop-at 2");
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("bfloat16 mixed precision"), std::string::npos) << first.out;
  auto dtype_at = [&](int step) {
    return nlohmann::json::parse(io::read_file(base + "/bf/checkpoints/" + std::to_string(step) +
                                               "/trainer_state.json"))["compute_dtype"];
  };
  EXPECT_EQ(dtype_at(2), "bfloat16");
  const auto second = run_cli("train --resume " + base + "/bf --json", false);
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_EQ(nlohmann::json::parse(second.out)["steps"], 4);
  EXPECT_EQ(dtype_at(4), "bfloat16");
}

}  // namespace
}  // namespace hyperion
