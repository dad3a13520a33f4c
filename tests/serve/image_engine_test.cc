// The image engine on sd-tiny: concurrent requests share UNet calls, a request joins the
// running ones at their next step, and every image equals the one the pipeline makes
// alone; queue limits, bad requests, cancellation and shutdown.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "../kernels/simulated_device.h"
#include "diffusion/sd_tiny.h"
#include "serve/engine.h"
#include "serve/image_engine.h"

namespace hyperion::serve {
namespace {

using diffusion::GeneratedImages;
using diffusion::ImageRequest;

ImageRequest request(const std::string& prompt, uint64_t seed, int64_t steps = 4) {
  ImageRequest r;
  r.prompt = prompt;
  r.steps = steps;
  r.guidance = 3.0;
  r.seed = seed;
  return r;
}

// Submits and returns the future result.
std::future<ImageResult> submit(ImageEngine& e, const ImageRequest& r) {
  auto p = std::make_shared<std::promise<ImageResult>>();
  auto f = p->get_future();
  e.submit(r, [p](ImageResult&& res) { p->set_value(std::move(res)); });
  return f;
}

void expect_same_images(const GeneratedImages& a, const GeneratedImages& b) {
  ASSERT_EQ(a.count, b.count);
  ASSERT_EQ(a.pixels.size(), b.pixels.size());
  // The same math in another batch composition: GEMM blocking may differ in the last bits.
  for (size_t i = 0; i < a.pixels.size(); ++i) ASSERT_NEAR(a.pixels[i], b.pixels[i], 1e-4) << i;
}

class ImageEngineTest : public testing::Test {
 protected:
  static void SetUpTestSuite() { pipe_ = diffusion::make_sd_tiny(5).release(); }
  static void TearDownTestSuite() { delete pipe_; }
  static diffusion::DiffusionPipeline* pipe_;
};
diffusion::DiffusionPipeline* ImageEngineTest::pipe_ = nullptr;

TEST_F(ImageEngineTest, ConcurrentRequestsShareStepsAndEqualTheirImagesAlone) {
  ImageEngineConfig c;
  c.max_batch_images = 4;
  ImageEngine engine(*pipe_, c);
  ImageRequest a = request("a photo of a bag", 1), b = request("a photo of a dress", 2);
  b.count = 2;
  b.sampler = "euler_a";  // noise per step: still the same alone or batched
  engine.set_paused(true);
  auto fa = submit(engine, a), fb = submit(engine, b);
  EXPECT_EQ(engine.stats().waiting, 2);
  engine.set_paused(false);
  const ImageResult ra = fa.get(), rb = fb.get();
  ASSERT_TRUE(ra.error.empty()) << ra.error;
  ASSERT_TRUE(rb.error.empty()) << rb.error;
  expect_same_images(ra.images, pipe_->generate(a));
  expect_same_images(rb.images, pipe_->generate(b));
  const ImageEngineStats st = engine.stats();
  // Both ran together: 4 UNet calls of 3 images, not 8 calls.
  EXPECT_EQ(st.unet_steps, 4);
  EXPECT_EQ(st.unet_step_images, 12);
  EXPECT_EQ(st.max_step_requests, 2);
  EXPECT_EQ(st.images_generated, 3);
  EXPECT_EQ(st.requests_finished, 2);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(engine.outstanding(), 0);
}

TEST_F(ImageEngineTest, ALaterRequestJoinsAtTheNextStep) {
  ImageEngine engine(*pipe_, {});
  engine.set_step_delay(std::chrono::milliseconds(30));
  const ImageRequest a = request("a photo of a coat", 3, 10), b = request("a photo of a shirt", 4, 3);
  auto fa = submit(engine, a);
  // Once a has stepped, b arrives and runs beside it (its own timesteps).
  for (int i = 0; i < 2000 && engine.stats().unet_steps < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto fb = submit(engine, b);
  const ImageResult rb = fb.get(), ra = fa.get();
  expect_same_images(ra.images, pipe_->generate(a));
  expect_same_images(rb.images, pipe_->generate(b));
  const ImageEngineStats st = engine.stats();
  EXPECT_EQ(st.max_step_requests, 2);
  EXPECT_EQ(st.unet_steps, 10);  // b's three steps rode along a's
  EXPECT_GT(rb.queue_seconds, 0.0);
}

TEST_F(ImageEngineTest, RequestsBeyondTheBatchWaitAndAFullQueueRefuses) {
  ImageEngineConfig c;
  c.max_batch_images = 2;
  c.max_queue = 1;
  ImageEngine engine(*pipe_, c);
  engine.set_paused(true);
  ImageRequest two = request("a photo of a bag", 1);
  two.count = 2;
  auto f1 = submit(engine, two), f2 = submit(engine, request("a photo of a bag", 2));
  auto f3 = submit(engine, request("a photo of a bag", 3));
  EXPECT_THROW(submit(engine, request("a photo of a bag", 4)), QueueFullError);
  engine.set_paused(false);
  for (auto* f : {&f1, &f2, &f3}) EXPECT_TRUE(f->get().error.empty());
  // Two images at most per UNet call: the first request ran alone.
  const ImageEngineStats st = engine.stats();
  EXPECT_EQ(st.images_generated, 4);
  EXPECT_LE(st.unet_step_images, 2 * st.unet_steps);
}

TEST_F(ImageEngineTest, BadRequestsNameTheirField) {
  ImageEngineConfig c;
  c.max_batch_images = 2;
  ImageEngine engine(*pipe_, c);
  auto param_of = [&](ImageRequest r) {
    try {
      engine.submit(std::move(r), [](ImageResult&&) {});
    } catch (const RequestError& e) {
      return e.param;
    }
    return std::string("(accepted)");
  };
  ImageRequest r = request("x", 1);
  r.width = 30;  // not a multiple of the latent factor
  EXPECT_EQ(param_of(r), "size");
  r = request("x", 1);
  r.steps = 100000;
  EXPECT_EQ(param_of(r), "steps");
  r = request("x", 1);
  r.count = 3;  // over max_batch_images
  EXPECT_EQ(param_of(r), "n");
  r = request("x", 1);
  r.sampler = "heun";
  EXPECT_EQ(param_of(r), "scheduler");
  r = request("x", 1);
  r.prompt = "\xff";
  EXPECT_EQ(param_of(r), "prompt");
  EXPECT_EQ(engine.outstanding(), 0);
}

TEST_F(ImageEngineTest, CancelledAndShutDownRequestsAreEndedOnce) {
  ImageEngine engine(*pipe_, {});
  engine.set_paused(true);
  auto waiting = submit(engine, request("a photo of a bag", 1));
  auto other = submit(engine, request("a photo of a bag", 2));
  engine.cancel(1);
  engine.cancel(999);  // unknown: ignored
  const ImageResult cancelled = waiting.get();
  EXPECT_TRUE(cancelled.cancelled);
  EXPECT_EQ(cancelled.images.count, 0);
  engine.stop("going away");
  const ImageResult stopped = other.get();
  EXPECT_EQ(stopped.error, "going away");
  EXPECT_THROW(submit(engine, request("x", 3)), ShuttingDownError);
  EXPECT_EQ(engine.stats().requests_cancelled, 1);
  EXPECT_EQ(engine.outstanding(), 0);
}

// The engine thread on a pipeline whose models are on the device (the simulated one where
// no GPU is usable): concurrent requests batched there equal the host pipeline's images.
TEST(ImageEngineOnDevice, ConcurrentRequestsEqualTheHostsImages) {
  testing_util::simulated_device();
  const auto host = diffusion::make_sd_tiny(5), dev = diffusion::make_sd_tiny(5);
  dev->to_device(Device::kCuda);
  ImageEngineConfig c;
  c.max_batch_images = 4;
  c.hardware = Device::kCuda;
  ImageEngine engine(*dev, c);
  ImageRequest a = request("a photo of a coat", 3), b = request("a photo of a sneaker", 4);
  b.count = 2;
  engine.set_paused(true);
  auto fa = submit(engine, a), fb = submit(engine, b);
  engine.set_paused(false);
  const ImageResult ra = fa.get(), rb = fb.get();
  ASSERT_TRUE(ra.error.empty()) << ra.error;
  ASSERT_TRUE(rb.error.empty()) << rb.error;
  const double tol = testing_util::simulated_device() != nullptr ? 1e-4 : 2e-3;
  for (auto [got, want] : {std::pair(&ra.images, host->generate(a)), std::pair(&rb.images, host->generate(b))}) {
    ASSERT_EQ(got->pixels.size(), want.pixels.size());
    for (size_t i = 0; i < want.pixels.size(); ++i) ASSERT_NEAR(got->pixels[i], want.pixels[i], tol) << i;
  }
  EXPECT_EQ(engine.stats().max_step_requests, 2);
}

TEST(ImageEngineConfigTest, KeysAreCheckedByName) {
  EXPECT_EQ(parse_image_engine_config({"max_batch_images=3"}).max_batch_images, 3);
  EXPECT_EQ(parse_image_engine_config({}).hardware, Device::kHost);
  testing_util::simulated_device();  // registers where no GPU is usable
  EXPECT_EQ(parse_image_engine_config({"hardware=gpu"}).hardware, Device::kCuda);
  for (const char* bad :
       {"max_batch_images=0", "max_queue=-1", "kv_dtype=int8", "max_batch_images=x", "hardware=tpu"}) {
    try {
      parse_image_engine_config({bad});
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace hyperion::serve
