// The image server's engine: text-to-image requests on a DiffusionPipeline, batched step
// by step. Its own thread runs every compute (the text encoders, the UNet, the VAE); the
// HTTP threads only submit, cancel and encode the finished images.
//
// Each round the engine takes the requests that arrived (a request joins the batch at the
// next denoising step, never waiting for the running ones to finish), then runs one UNet
// call for every running request of one latent size, each request at its own timestep
// (DiffusionPipeline::step). A request whose steps are done is decoded by the VAE and
// handed back. Running requests hold at most max_batch_images images together (the UNet
// batch is twice that with guidance); the rest wait in arrival order, up to max_queue of
// them, past which submit() refuses (HTTP 429).
//
// Because a request's noise depends only on its seed, image index and step, an image
// comes out the same whether it ran alone or batched with others (to GEMM rounding).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "diffusion/pipeline.h"

namespace hyperion::serve {

struct ImageEngineConfig {
  int64_t max_batch_images = 8;  // images denoised together (each request's n counts)
  int64_t max_queue = 64;        // requests waiting to join before 429
  std::string model_name;        // /v1/models id
  DType compute_dtype = DType::kF32;  // kBF16: mixed precision (the caller sets it on the pipeline)
  Device hardware = Device::kHost;     // where the models run (the caller moves the pipeline there)
};

// The `key=value` keys of `hyperion serve` on a diffusion checkpoint.
std::vector<ConfigKey> image_engine_config_schema();
// Errors name the key.
ImageEngineConfig parse_image_engine_config(const std::vector<std::string>& overrides);

// What a finished request gets (on the engine thread): its images, or why there are none.
struct ImageResult {
  diffusion::GeneratedImages images;
  bool cancelled = false;
  std::string error;  // non-empty: failed (or "the server is shutting down")
  double queue_seconds = 0;  // submit -> first step
};
using ImageCallback = std::function<void(ImageResult&&)>;

struct ImageEngineStats {
  int64_t running = 0, waiting = 0;        // requests
  int64_t running_images = 0;              // their images
  int64_t images_generated = 0;            // finished images since start
  int64_t requests_finished = 0, requests_failed = 0, requests_cancelled = 0;
  int64_t unet_steps = 0;                  // UNet calls
  int64_t unet_step_images = 0;            // sum over steps of the images each stepped
  int64_t max_step_requests = 0;           // most requests one UNet call has served
  double step_seconds = 0, encode_seconds = 0, decode_seconds = 0;
};

class ImageEngine {
 public:
  ImageEngine(const diffusion::DiffusionPipeline& pipeline, ImageEngineConfig config);
  ~ImageEngine();  // stop()
  ImageEngine(const ImageEngine&) = delete;
  ImageEngine& operator=(const ImageEngine&) = delete;

  // Checks the request (RequestError naming the field: size, n, steps, guidance_scale,
  // scheduler), queues it and returns its id. QueueFullError when max_batch_images +
  // max_queue requests are unfinished; ShuttingDownError after stop(). The callback runs
  // once, on the engine thread, and should only hand the result on.
  int64_t submit(diffusion::ImageRequest request, ImageCallback callback);
  // Ends a request (waiting or running) at the engine's next round: callback with
  // cancelled. Unknown or finished ids are ignored.
  void cancel(int64_t id);
  ImageEngineStats stats() const;
  int64_t outstanding() const;
  const ImageEngineConfig& config() const { return config_; }
  const diffusion::DiffusionPipeline& pipeline() const { return pipeline_; }
  // Test hooks: a paused engine queues requests but does not step; a step delay sleeps
  // before every UNet call (holds requests in flight, so a later one joins them).
  void set_paused(bool paused);
  void set_step_delay(std::chrono::milliseconds delay);
  // Ends every unfinished request with `reason` as its error, refuses new ones, joins the
  // engine thread. Idempotent.
  void stop(const std::string& reason = "the server is shutting down");

 private:
  struct Request {
    int64_t id = 0;
    diffusion::ImageRequest request;
    ImageCallback callback;
    std::chrono::steady_clock::time_point arrival, started{};
    std::shared_ptr<diffusion::DiffusionPipeline::Job> job;
  };
  void loop();
  void round(std::vector<Request>& arrived, std::vector<int64_t>& cancels);
  void deliver(Request& r, ImageResult&& result);

  const diffusion::DiffusionPipeline& pipeline_;
  ImageEngineConfig config_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Request> inbox_;
  std::vector<int64_t> cancels_;
  bool stop_ = false, paused_ = false;
  std::chrono::milliseconds step_delay_{0};
  std::string stop_reason_;
  int64_t outstanding_ = 0;
  int64_t next_id_ = 1;
  ImageEngineStats stats_;  // under mu_, published after every round
  // Engine thread only.
  std::deque<Request> waiting_;
  std::vector<Request> running_;
  ImageEngineStats work_;
  std::thread thread_;
};

}  // namespace hyperion::serve
