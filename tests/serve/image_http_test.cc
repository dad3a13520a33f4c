// POST /v1/images/generations over a real loopback socket on sd-tiny: PNGs as base64 that
// decode to the pipeline's own images, concurrent requests batched and each equal to its
// one-at-a-time image, every bad field a 400 naming it, a full queue a 429, metrics.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "diffusion/image_dataset.h"
#include "diffusion/sd_tiny.h"
#include "io/image_file.h"
#include "monitor/metrics_registry.h"
#include "serve/http_server.h"
#include "serve/image_api.h"
#include "serve/image_engine.h"

namespace hyperion::serve {
namespace {

using nlohmann::json;

std::string base64_decode(const std::string& s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    const int v = value(c);
    if (v < 0) break;  // '=' padding
    acc = acc << 6 | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xff);
    }
  }
  return out;
}

class ImageHttpTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    pipe_ = diffusion::make_sd_tiny(6).release();
    ImageEngineConfig c;
    c.max_batch_images = 4;
    c.max_queue = 1;
    engine_ = new ImageEngine(*pipe_, c);
    ApiContext ctx;
    ctx.model_name = "sd-tiny";
    server_ = new HttpServer(*engine_, ctx);
    port_ = server_->bind("127.0.0.1", 0);
    thread_ = new std::thread([] { server_->run(); });
  }
  static void TearDownTestSuite() {
    server_->stop();
    thread_->join();
    engine_->stop();
    delete thread_;
    delete server_;
    delete engine_;
    delete pipe_;
  }
  void TearDown() override { engine_->set_paused(false); }
  static httplib::Result post(const json& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c.Post("/v1/images/generations", body.dump(), "application/json");
  }
  // The 8-bit image the pipeline makes alone for this body's prompt, seed and steps.
  static io::Image alone(const std::string& prompt, uint64_t seed, int64_t index = 0, int64_t count = 1) {
    diffusion::ImageRequest r;
    r.prompt = prompt;
    r.seed = seed;
    r.steps = 4;
    r.guidance = 3.0;
    r.count = count;
    const diffusion::GeneratedImages g = pipe_->generate(r);
    const int64_t per = g.height * g.width * g.channels;
    return diffusion::to_image(g.pixels.data() + index * per, g.height, g.width, g.channels);
  }
  static json body(const std::string& prompt, uint64_t seed) {
    return {{"prompt", prompt}, {"seed", seed}, {"steps", 4}, {"guidance_scale", 3.0}, {"response_format", "b64_json"}};
  }
  // The decoded PNG of data[index]; expects its pixels within one 8-bit step of `want`
  // (float rounding of another batch composition may flip a rounding).
  static void expect_image(const json& reply, int64_t index, const io::Image& want) {
    const io::Image got =
        io::decode_image(base64_decode(reply["data"][index]["b64_json"].get<std::string>()), "b64_json");
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    // Gray sd-tiny images decode as RGB: compare the first channel.
    for (int64_t y = 0; y < got.height; ++y)
      for (int64_t x = 0; x < got.width; ++x) {
        const int g = got.pixels[size_t((y * got.width + x) * got.channels)];
        const int w = want.pixels[size_t((y * want.width + x) * want.channels)];
        ASSERT_LE(std::abs(g - w), 1) << x << "," << y;
      }
  }
  static double metric(const std::string& name, const monitor::Labels& labels = {}) {
    httplib::Client c("127.0.0.1", port_);
    auto r = c.Get("/metrics");
    EXPECT_TRUE(r);
    return monitor::parse_prometheus_value(r->body, name, labels).value_or(-1);
  }
  static diffusion::DiffusionPipeline* pipe_;
  static ImageEngine* engine_;
  static HttpServer* server_;
  static std::thread* thread_;
  static int port_;
};
diffusion::DiffusionPipeline* ImageHttpTest::pipe_ = nullptr;
ImageEngine* ImageHttpTest::engine_ = nullptr;
HttpServer* ImageHttpTest::server_ = nullptr;
std::thread* ImageHttpTest::thread_ = nullptr;
int ImageHttpTest::port_ = 0;

TEST_F(ImageHttpTest, GeneratesBase64PngsOfTheSeededImages) {
  json b = body("a photo of a sneaker", 21);
  b["n"] = 2;
  b["size"] = "32x32";
  const auto r = post(b);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["seed"], 21);
  EXPECT_EQ(j["size"], "32x32");
  EXPECT_GT(j["created"].get<int64_t>(), 0);
  for (int64_t i = 0; i < 2; ++i) expect_image(j, i, alone("a photo of a sneaker", 21, i, 2));
  // Without a seed each call draws one and says which.
  json unseeded = body("a photo of a sneaker", 0);
  unseeded.erase("seed");
  const auto u = post(unseeded);
  ASSERT_EQ(u->status, 200) << u->body;
  const json uj = json::parse(u->body);
  expect_image(uj, 0, alone("a photo of a sneaker", uj["seed"].get<uint64_t>()));

  httplib::Client c("127.0.0.1", port_);
  const auto models = c.Get("/v1/models");
  ASSERT_EQ(models->status, 200);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["data"][0]["id"], "sd-tiny");
  EXPECT_EQ(m["data"][0]["default_size"], "32x32");
  EXPECT_GE(metric("hyperion_images_generated_total"), 3);
  EXPECT_GE(metric("hyperion_diffusion_steps_total"), 8);
}

TEST_F(ImageHttpTest, TwoConcurrentRequestsAreBatchedAndEachEqualsItsImageAlone) {
  const double steps_before = metric("hyperion_diffusion_steps_total");
  engine_->set_paused(true);  // both are queued before either steps
  json replies[2];
  int status[2] = {0, 0};
  std::thread t0([&] {
    const auto r = post(body("a photo of a bag", 31));
    status[0] = r ? r->status : -1;
    if (r) replies[0] = json::parse(r->body);
  });
  std::thread t1([&] {
    const auto r = post(body("a photo of a trouser", 32));
    status[1] = r ? r->status : -1;
    if (r) replies[1] = json::parse(r->body);
  });
  for (int i = 0; i < 2000 && engine_->outstanding() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  engine_->set_paused(false);
  t0.join();
  t1.join();
  ASSERT_EQ(status[0], 200) << replies[0];
  ASSERT_EQ(status[1], 200) << replies[1];
  expect_image(replies[0], 0, alone("a photo of a bag", 31));
  expect_image(replies[1], 0, alone("a photo of a trouser", 32));
  // Four steps served both.
  EXPECT_EQ(metric("hyperion_diffusion_steps_total") - steps_before, 4);
}

TEST_F(ImageHttpTest, BadFieldsAre400sNamingThemAndAFullQueueIs429) {
  auto expect_error = [](const json& b, int status, const std::string& param) {
    const auto r = post(b);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << b << " -> " << r->body;
    const json e = json::parse(r->body)["error"];
    if (!param.empty()) {
      EXPECT_EQ(e["param"], param) << r->body;
    }
  };
  expect_error(json{{"n", 1}}, 400, "prompt");
  expect_error(json{{"prompt", 3}}, 400, "prompt");
  json b = body("x", 1);
  b["size"] = "102x102";  // not a multiple of the VAE factor 4
  expect_error(b, 400, "size");
  b["size"] = "big";
  expect_error(b, 400, "size");
  b = body("x", 1);
  b["response_format"] = "url";
  expect_error(b, 400, "response_format");
  b = body("x", 1);
  b["n"] = 11;
  expect_error(b, 400, "n");
  b["n"] = 5;  // over the server's max_batch_images=4
  expect_error(b, 400, "n");
  b = body("x", 1);
  b["steps"] = 0;
  expect_error(b, 400, "steps");
  b = body("x", 1);
  b["guidance_scale"] = "high";
  expect_error(b, 400, "guidance_scale");
  b = body("x", 1);
  b["scheduler"] = "heun";
  expect_error(b, 400, "scheduler");
  b = body("x", 1);
  b["colour"] = "red";
  expect_error(b, 400, "colour");
  b = body("x", 1);
  b["model"] = "sdxl";
  expect_error(b, 404, "model");
  b = body(std::string(20000, 'a'), 1);
  expect_error(b, 400, "prompt");
  httplib::Client c("127.0.0.1", port_);
  const auto text = c.Post("/v1/completions", "{}", "application/json");
  EXPECT_EQ(text->status, 404);
  EXPECT_NE(text->body.find("/v1/images/generations"), std::string::npos);
  const auto bad_json = c.Post("/v1/images/generations", "{\"prompt\": ", "application/json");
  EXPECT_EQ(bad_json->status, 400);

  // max_batch_images=4 + max_queue=1: five requests wait, the sixth is refused.
  engine_->set_paused(true);
  std::vector<std::thread> held;
  std::vector<int> codes(5, 0);
  for (int i = 0; i < 5; ++i)
    held.emplace_back([&, i] {
      const auto r = post(body("a photo of a bag", uint64_t(40 + i)));
      codes[size_t(i)] = r ? r->status : -1;
    });
  for (int i = 0; i < 2000 && engine_->outstanding() < 5; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto full = post(body("a photo of a bag", 50));
  ASSERT_TRUE(full);
  EXPECT_EQ(full->status, 429) << full->body;
  EXPECT_EQ(full->get_header_value("Retry-After"), "1");
  engine_->set_paused(false);
  for (auto& t : held) t.join();
  for (int code : codes) EXPECT_EQ(code, 200);
  EXPECT_EQ(metric("hyperion_requests_rejected_total", {{"reason", "queue_full"}}), 1);
  EXPECT_GE(metric("hyperion_requests_rejected_total", {{"reason", "invalid"}}), 13);
}

TEST(ImageApi, Base64MatchesRfc4648) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_encode(std::string("\xff\x00\x80", 3)), "/wCA");
}

}  // namespace
}  // namespace hyperion::serve
