#include "diffusion/pipeline.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "../test_paths.h"
#include "base/error.h"
#include "diffusion/image_dataset.h"
#include "diffusion/sd_tiny.h"
#include "io/atomic_file.h"
#include "io/image_file.h"

namespace hyperion::diffusion {
namespace {

namespace fs = std::filesystem;

ImageRequest small_request(const std::string& prompt, uint64_t seed) {
  ImageRequest r;
  r.prompt = prompt;
  r.steps = 4;
  r.guidance = 3.0;
  r.seed = seed;
  return r;
}

TEST(DiffusionPipeline, SeededGenerationIsRepeatableAndPromptsMatter) {
  const auto pipe = make_sd_tiny(1);
  const GeneratedImages a = pipe->generate(small_request("a photo of a bag", 7));
  ASSERT_EQ(a.count, 1);
  EXPECT_EQ(a.width, kSdTinyImageSize);
  EXPECT_EQ(a.channels, 1);
  EXPECT_EQ(a.pixels, pipe->generate(small_request("a photo of a bag", 7)).pixels);
  EXPECT_NE(a.pixels, pipe->generate(small_request("a photo of a bag", 8)).pixels);
  EXPECT_NE(a.pixels, pipe->generate(small_request("a photo of a coat", 7)).pixels);
  for (float v : a.pixels) ASSERT_TRUE(std::isfinite(v));
}

TEST(DiffusionPipeline, BatchedJobsEqualTheirOneAtATimeImages) {
  const auto pipe = make_sd_tiny(2);
  for (const char* sampler : {"ddim", "euler_a", "dpm++2m"}) {
    SCOPED_TRACE(sampler);
    ImageRequest r1 = small_request("a photo of a sandal", 3), r2 = small_request("a photo of a dress", 4);
    r1.sampler = r2.sampler = sampler;
    r2.count = 2;
    r2.steps = 6;  // a different plan: each job steps at its own timestep
    const GeneratedImages alone1 = pipe->generate(r1), alone2 = pipe->generate(r2);
    auto j1 = pipe->start(r1);
    auto j2 = pipe->start(r2);
    pipe->step({j2.get()});  // job 2 starts first; job 1 joins at job 2's second step
    pipe->step({j2.get()});
    while (!DiffusionPipeline::finished(*j1)) {
      std::vector<DiffusionPipeline::Job*> batch = {j1.get()};
      if (!DiffusionPipeline::finished(*j2)) batch.push_back(j2.get());
      pipe->step(batch);
    }
    while (!DiffusionPipeline::finished(*j2)) pipe->step({j2.get()});
    const GeneratedImages b1 = pipe->finish(*j1), b2 = pipe->finish(*j2);
    ASSERT_EQ(b1.pixels.size(), alone1.pixels.size());
    ASSERT_EQ(b2.count, 2);
    // The same math in a different batch composition: GEMM blocking may differ in the
    // last bits.
    for (size_t i = 0; i < b1.pixels.size(); ++i) ASSERT_NEAR(b1.pixels[i], alone1.pixels[i], 1e-4) << i;
    for (size_t i = 0; i < b2.pixels.size(); ++i) ASSERT_NEAR(b2.pixels[i], alone2.pixels[i], 1e-4) << i;
  }
}

// Sides that are a multiple of the VAE's factor but not of the UNet's downsampling (latents
// 9 x 11 for sd-tiny's two levels): each up block upsamples to its skip's size, as
// diffusers does; the image has the asked size, and batched equals alone there too.
TEST(DiffusionPipeline, SizesTheUNetDownsamplingDoesNotDivideGenerate) {
  const auto pipe = make_sd_tiny(8);
  ImageRequest r = small_request("a photo of a bag", 5);
  r.height = 36;
  r.width = 44;
  const GeneratedImages alone = pipe->generate(r);
  EXPECT_EQ(alone.height, 36);
  EXPECT_EQ(alone.width, 44);
  for (float v : alone.pixels) ASSERT_TRUE(std::isfinite(v));
  ImageRequest two = r;
  two.count = 2;
  const GeneratedImages both = pipe->generate(two);
  for (size_t i = 0; i < alone.pixels.size(); ++i) ASSERT_NEAR(both.pixels[i], alone.pixels[i], 1e-4) << i;
}

TEST(DiffusionPipeline, SavedDirectoryLoadsToTheSameImages) {
  const auto pipe = make_sd_tiny(3);
  const std::string dir = testing::TempDir() + "/sd_tiny_saved";
  fs::remove_all(dir);
  pipe->save(dir);
  for (const char* f : {"model_index.json", "unet/config.json", "unet/diffusion_pytorch_model.safetensors",
                        "vae/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors",
                        "tokenizer/vocab.json", "tokenizer/merges.txt", "scheduler/scheduler_config.json"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << f;
  ASSERT_TRUE(DiffusionPipeline::is_pipeline_dir(dir));
  const auto loaded = DiffusionPipeline::load(dir);
  const ImageRequest r = small_request("a photo of a trouser", 5);
  EXPECT_EQ(loaded->generate(r).pixels, pipe->generate(r).pixels);
  EXPECT_EQ(loaded->tokenizer().encode("a photo of a t-shirt"), pipe->tokenizer().encode("a photo of a t-shirt"));
}

TEST(DiffusionPipeline, SavedSdxlDirectoryLoadsToTheSameImages) {
  const auto pipe = make_sd_tiny_xl(3);
  ASSERT_TRUE(pipe->xl());
  const std::string dir = testing::TempDir() + "/sd_tiny_xl_saved";
  fs::remove_all(dir);
  pipe->save(dir);
  for (const char* f : {"text_encoder_2/config.json", "text_encoder_2/model.safetensors", "tokenizer_2/vocab.json"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << f;
  const auto loaded = DiffusionPipeline::load(dir);
  ASSERT_TRUE(loaded->xl());
  ImageRequest r = small_request("a photo of a coat", 6);
  r.negative_prompt = "";  // SDXL: zeros for the empty negative prompt (force_zeros_for_empty_prompt)
  EXPECT_EQ(loaded->generate(r).pixels, pipe->generate(r).pixels);
}

TEST(DiffusionPipeline, BadRequestsAndDirectoriesAreRefusedByName) {
  const auto pipe = make_sd_tiny(4);
  auto error = [&](ImageRequest r) {
    try {
      pipe->resolve(r);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ImageRequest r = small_request("x", 0);
  r.width = 30;
  EXPECT_NE(error(r).find("image width 30 must be a multiple of 4"), std::string::npos) << error(r);
  // The error names the request's field, for a server to name its own.
  auto field = [&](ImageRequest q) {
    try {
      pipe->resolve(q);
    } catch (const ImageRequestError& e) {
      return e.field;
    }
    return std::string();
  };
  EXPECT_EQ(field(r), "width");
  ImageRequest q = small_request("x", 0);
  q.guidance = -1;
  EXPECT_EQ(field(q), "guidance");
  q = small_request("x", 0);
  q.negative_prompt = "\xff";
  EXPECT_EQ(field(q), "negative_prompt");
  r.width = 4096;
  EXPECT_NE(error(r).find("image width 4096"), std::string::npos);
  r = small_request("x", 0);
  r.steps = 0;
  EXPECT_NE(error(r).find("steps 0"), std::string::npos);
  r = small_request("x", 0);
  r.sampler = "lms";
  EXPECT_NE(error(r).find("scheduler 'lms'"), std::string::npos);
  r = small_request("x", 0);
  r.guidance = -1;
  EXPECT_NE(error(r).find("guidance scale -1"), std::string::npos);
  // A directory missing a component, and one whose index names an unknown class.
  const std::string dir = testing::TempDir() + "/sd_tiny_broken";
  fs::remove_all(dir);
  pipe->save(dir);
  fs::remove_all(fs::path(dir) / "vae");
  try {
    DiffusionPipeline::load(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the vae folder model_index.json names is missing"), std::string::npos)
        << e.what();
  }
  io::write_file_atomic(dir + "/model_index.json", R"({"_class_name": "StableDiffusion3Pipeline"})");
  try {
    DiffusionPipeline::load(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("_class_name \"StableDiffusion3Pipeline\" is not supported"),
              std::string::npos);
  }
}

TEST(DiffusionPipeline, LongPromptsAreTruncatedAndCounted) {
  const auto pipe = make_sd_tiny(6);  // its tokenizer reads 16 tokens: start, 14, end
  ImageRequest r = small_request("a photo of a bag a photo of a bag a photo of a bag a photo of a bag", 1);
  r.steps = 1;
  const GeneratedImages g = pipe->generate(r);
  EXPECT_EQ(g.truncated_tokens, 20 - 14);
  EXPECT_EQ(pipe->generate(small_request("a photo of a bag", 1)).truncated_tokens, 0);
}

TEST(DiffusionPipeline, NonFiniteWeightsAreRefusedNamingTheTensor) {
  const auto pipe = make_sd_tiny(7);
  const_cast<UNet&>(pipe->unet()).params().data(0)[3] = std::nanf("");
  const std::string dir = testing::TempDir() + "/sd_tiny_nan";
  fs::remove_all(dir);
  pipe->save(dir);
  try {
    DiffusionPipeline::load(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor conv_in.weight holds a non-finite value"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hyperion::diffusion
