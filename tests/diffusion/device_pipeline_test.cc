// Diffusion models on a device: a pipeline moved there (DiffusionPipeline::to_device) makes
// the host's images. Where there is no GPU the device is the simulated one
// (tests/kernels/simulated_device.h: host kernels behind memory the host cannot touch
// between ops), so any host read of a device activation or weight crashes the test at the
// offending line, and the images are bit-identical to the host's (the same kernels). On a
// real GPU the CUDA backend's kernels sum in other orders: the tolerance is theirs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../kernels/simulated_device.h"
#include "base/error.h"
#include "diffusion/pipeline.h"
#include "diffusion/sd_tiny.h"
#include "kernels/backend.h"

namespace hyperion::diffusion {
namespace {

ImageRequest request(const std::string& prompt, uint64_t seed) {
  ImageRequest r;
  r.prompt = prompt;
  r.negative_prompt = "";
  r.steps = 4;
  r.guidance = 3.0;
  r.seed = seed;
  return r;
}

bool simulated() {
  return testing_util::simulated_device() != nullptr;
}

void expect_same_images(const GeneratedImages& device, const GeneratedImages& host, double tolerance) {
  ASSERT_EQ(device.count, host.count);
  ASSERT_EQ(device.height, host.height);
  ASSERT_EQ(device.width, host.width);
  ASSERT_EQ(device.pixels.size(), host.pixels.size());
  if (simulated()) {
    EXPECT_EQ(device.pixels, host.pixels);
    return;
  }
  for (size_t i = 0; i < host.pixels.size(); ++i) ASSERT_NEAR(device.pixels[i], host.pixels[i], tolerance) << i;
}

TEST(DevicePipeline, Sd1ImagesEqualTheHosts) {
  const auto host = make_sd_tiny(21), dev = make_sd_tiny(21);
  dev->to_device(Device::kCuda);
  EXPECT_EQ(dev->device(), Device::kCuda);
  EXPECT_EQ(dev->unet().params().device(), Device::kCuda);
  EXPECT_EQ(dev->vae().params().device(), Device::kCuda);
  EXPECT_EQ(dev->text_encoder().params().device(), Device::kCuda);
  for (const char* sampler : {"ddim", "euler_a", "dpm++2m"}) {
    SCOPED_TRACE(sampler);
    ImageRequest r = request("a photo of a sandal", 5);
    r.sampler = sampler;
    r.count = 2;
    expect_same_images(dev->generate(r), host->generate(r), 2e-3);
  }
}

// SDXL's paths: two text encoders (the second with its projection), the pooled embedding
// and the size/crop time ids gathered into the UNet's added embedding on the device.
TEST(DevicePipeline, SdxlImagesEqualTheHosts) {
  const auto host = make_sd_tiny_xl(22), dev = make_sd_tiny_xl(22);
  dev->to_device(Device::kCuda);
  EXPECT_EQ(dev->text_encoder_2().params().device(), Device::kCuda);
  const ImageRequest r = request("a photo of a coat", 6);
  expect_same_images(dev->generate(r), host->generate(r), 2e-3);
}

// Mixed precision: the bf16 weight copies are made on the device from its f32 values.
TEST(DevicePipeline, Bf16ImagesEqualTheHosts) {
  const auto host = make_sd_tiny(23), dev = make_sd_tiny(23);
  host->set_compute_dtype(DType::kBF16);
  dev->to_device(Device::kCuda);
  dev->set_compute_dtype(DType::kBF16);
  const ImageRequest r = request("a photo of a bag", 7);
  expect_same_images(dev->generate(r), host->generate(r), 2e-2);
}

// Latent sides the UNet's downsampling does not divide: the sized upsampling on the device.
TEST(DevicePipeline, OddLatentSizesEqualTheHosts) {
  const auto host = make_sd_tiny(24), dev = make_sd_tiny(24);
  dev->to_device(Device::kCuda);
  ImageRequest r = request("a photo of a dress", 8);
  r.height = 36;
  r.width = 44;
  expect_same_images(dev->generate(r), host->generate(r), 2e-3);
}

// The jobs of a server's batch step together on the device as on the host.
TEST(DevicePipeline, BatchedStepsEqualTheHosts) {
  const auto host = make_sd_tiny(25), dev = make_sd_tiny(25);
  dev->to_device(Device::kCuda);
  auto run = [](const DiffusionPipeline& p) {
    ImageRequest a = request("a photo of a shirt", 1), b = request("a photo of a sneaker", 2);
    b.steps = 6;
    auto ja = p.start(a), jb = p.start(b);
    p.step({jb.get()});
    while (!DiffusionPipeline::finished(*ja)) {
      std::vector<DiffusionPipeline::Job*> batch = {ja.get()};
      if (!DiffusionPipeline::finished(*jb)) batch.push_back(jb.get());
      p.step(batch);
    }
    while (!DiffusionPipeline::finished(*jb)) p.step({jb.get()});
    return std::pair(p.finish(*ja), p.finish(*jb));
  };
  const auto [da, db] = run(*dev);
  const auto [ha, hb] = run(*host);
  expect_same_images(da, ha, 2e-3);
  expect_same_images(db, hb, 2e-3);
}

// The VAE's encoder (training's latents, image-to-image): the one-pixel padding before
// each downsampling is made on the device.
TEST(DevicePipeline, VaeEncodingEqualsTheHosts) {
  const auto host = make_sd_tiny(26), dev = make_sd_tiny(26);
  dev->to_device(Device::kCuda);
  const VaeConfig& c = host->vae().config();
  Act images(2, kSdTinyImageSize, kSdTinyImageSize, c.in_channels);
  for (int64_t i = 0; i < images.numel(); ++i) images.data()[i] = std::sin(0.37f * float(i));
  const Act h = host->vae().encode_latents(images, nullptr);
  const Act d = dev->vae().encode_latents(images, nullptr);
  ASSERT_EQ(d.v.device(), Device::kHost);
  ASSERT_EQ(d.numel(), h.numel());
  for (int64_t i = 0; i < h.numel(); ++i)
    if (simulated()) ASSERT_EQ(d.data()[i], h.data()[i]) << i;
    else ASSERT_NEAR(d.data()[i], h.data()[i], 1e-3) << i;
}

// A device model is for inference: writing, saving or training its weights is refused by
// name; moved back to the host it has its values again and makes the same images.
TEST(DevicePipeline, DeviceModelsRefuseHostWorkAndComeBack) {
  const auto host = make_sd_tiny(27), dev = make_sd_tiny(27);
  dev->to_device(Device::kCuda);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message([&] { dev->save(testing::TempDir() + "/device_pipeline_saved"); }).find("cuda"),
            std::string::npos);
  ParamTable& p = const_cast<UNet&>(dev->unet()).params();
  EXPECT_NE(message([&] { p.data(0); }).find("writing a parameter"), std::string::npos);
  EXPECT_NE(message([&] { p.set_grads(true); }).find("gradients"), std::string::npos);
  dev->to_device(Device::kHost);
  EXPECT_EQ(dev->device(), Device::kHost);
  const ParamTable& hp = host->unet().params();
  EXPECT_TRUE(std::equal(hp.all(), hp.all() + hp.size(), p.all()));
  const ImageRequest r = request("a photo of a pullover", 9);
  EXPECT_EQ(dev->generate(r).pixels, host->generate(r).pixels);
}

}  // namespace
}  // namespace hyperion::diffusion
