#include "serve/image_engine.h"

#include <algorithm>

#include "base/error.h"
#include "base/log.h"
#include "kernels/hardware.h"
#include "serve/engine.h"

namespace hyperion::serve {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The request field a DiffusionPipeline::resolve message is about (its messages name the
// pipeline's fields; the API's are OpenAI's).
// The API field of a refused ImageRequest field (image_api.cc reads size, n,
// guidance_scale and scheduler into width/height, count, guidance and sampler/karras).
std::string api_field(const std::string& field) {
  for (auto [ours, api] : {std::pair<const char*, const char*>{"width", "size"},
                           {"height", "size"},
                           {"count", "n"},
                           {"guidance", "guidance_scale"},
                           {"sampler", "scheduler"},
                           {"karras", "karras"}})
    if (field == ours) return api;
  return field;  // steps, prompt, negative_prompt
}

}  // namespace

std::vector<ConfigKey> image_engine_config_schema() {
  return {
      {"max_batch_images", ConfigType::kInt, "8",
       "images denoised together, each request's n counting (the UNet batch is twice this "
       "with guidance)"},
      {"max_queue", ConfigType::kInt, "64", "requests waiting to join before 429"},
      {"model_name", ConfigType::kString, "", "model id for /v1/models"},
      {"dtype", ConfigType::kString, "float32",
       "compute: float32 | bfloat16 (mixed precision: convolutions and linear layers in bf16, f32 "
       "accumulation)"},
      {"hardware", ConfigType::kString, "cpu",
       "cpu | gpu: where the UNet, VAE and text encoders run (docs/GPU.md)"},
  };
}

ImageEngineConfig parse_image_engine_config(const std::vector<std::string>& overrides) {
  Config cfg(image_engine_config_schema());
  for (const std::string& o : overrides) cfg.apply_override(o);
  ImageEngineConfig c;
  c.max_batch_images = cfg.get_int("max_batch_images");
  c.max_queue = cfg.get_int("max_queue");
  c.model_name = cfg.get_string("model_name");
  const std::string dtype = cfg.get_string("dtype");
  HYP_USAGE_CHECK(dtype == "float32" || dtype == "bfloat16", "serve: dtype must be float32 or bfloat16, got '{}'",
                  dtype);
  c.compute_dtype = dtype == "bfloat16" ? DType::kBF16 : DType::kF32;
  c.hardware = parse_hardware(cfg.get_string("hardware"), "serve: hardware");
  require_hardware(c.hardware, "hardware");
  HYP_USAGE_CHECK(c.max_batch_images >= 1 && c.max_batch_images <= 256,
                  "serve: max_batch_images must be in [1, 256], got {}", c.max_batch_images);
  HYP_USAGE_CHECK(c.max_queue >= 0 && c.max_queue <= 100000, "serve: max_queue must be in [0, 100000], got {}",
                  c.max_queue);
  return c;
}

ImageEngine::ImageEngine(const diffusion::DiffusionPipeline& pipeline, ImageEngineConfig config)
    : pipeline_(pipeline), config_(std::move(config)) {
  thread_ = std::thread([this] { loop(); });
}

ImageEngine::~ImageEngine() {
  stop();
}

int64_t ImageEngine::submit(diffusion::ImageRequest request, ImageCallback callback) {
  try {
    request = pipeline_.resolve(std::move(request));
  } catch (const diffusion::ImageRequestError& e) {
    throw RequestError(api_field(e.field), e.what());
  }
  if (request.count > config_.max_batch_images)
    throw RequestError("n", fmt::format("n {} is more than the server's max_batch_images={}", request.count,
                                        config_.max_batch_images));
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) throw ShuttingDownError("the server is shutting down");
  if (outstanding_ >= config_.max_batch_images + config_.max_queue)
    throw QueueFullError(fmt::format("the queue is full ({} requests running or waiting; max_batch_images={}, "
                                     "max_queue={})",
                                     outstanding_, config_.max_batch_images, config_.max_queue));
  Request r;
  r.id = next_id_++;
  r.request = std::move(request);
  r.callback = std::move(callback);
  r.arrival = Clock::now();
  inbox_.push_back(std::move(r));
  ++outstanding_;
  ++stats_.waiting;
  cv_.notify_one();
  return inbox_.back().id;
}

void ImageEngine::cancel(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
  cv_.notify_one();
}

ImageEngineStats ImageEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int64_t ImageEngine::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outstanding_;
}

void ImageEngine::set_paused(bool paused) {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = paused;
  cv_.notify_one();
}

void ImageEngine::set_step_delay(std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  step_delay_ = delay;
}

void ImageEngine::stop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      stop_ = true;
      stop_reason_ = reason;
    }
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void ImageEngine::deliver(Request& r, ImageResult&& result) {
  if (r.started != Clock::time_point{}) result.queue_seconds = std::chrono::duration<double>(r.started - r.arrival).count();
  if (result.cancelled)
    ++work_.requests_cancelled;
  else if (!result.error.empty())
    ++work_.requests_failed;
  else {
    ++work_.requests_finished;
    work_.images_generated += result.images.count;
  }
  {
    // Counted and published before the callback: whoever the result wakes sees it in
    // stats() and outstanding(). (The request has left running_ / waiting_ already.)
    work_.running = int64_t(running_.size());
    work_.waiting = int64_t(waiting_.size());
    work_.running_images = 0;
    for (const Request& q : running_) work_.running_images += q.request.count;
    std::lock_guard<std::mutex> lock(mu_);
    --outstanding_;
    stats_ = work_;
    stats_.waiting += int64_t(inbox_.size());
  }
  try {
    r.callback(std::move(result));
  } catch (const std::exception& e) {
    log_warn("serve: image request {}: its callback failed: {}", r.id, e.what());
  }
}

void ImageEngine::loop() {
  for (;;) {
    std::vector<Request> arrived;
    std::vector<int64_t> cancels;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !cancels_.empty() ||
               (!paused_ && (!inbox_.empty() || !waiting_.empty() || !running_.empty()));
      });
      if (stop_) break;
      arrived.swap(inbox_);
      cancels.swap(cancels_);
    }
    round(arrived, cancels);
  }
  // Stopped: whatever is left ends with the reason.
  std::vector<Request> left;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Request& r : inbox_) left.push_back(std::move(r));
    inbox_.clear();
    reason = stop_reason_;
  }
  for (Request& r : waiting_) left.push_back(std::move(r));
  for (Request& r : running_) left.push_back(std::move(r));
  waiting_.clear();
  running_.clear();
  for (Request& r : left) {
    ImageResult res;
    res.error = reason;
    deliver(r, std::move(res));
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = work_;
}

void ImageEngine::round(std::vector<Request>& arrived, std::vector<int64_t>& cancels) {
  for (Request& r : arrived) waiting_.push_back(std::move(r));
  // Cancellations, waiting or running.
  for (int64_t id : cancels) {
    auto cancel_in = [&](auto& list) {
      for (auto it = list.begin(); it != list.end(); ++it)
        if (it->id == id) {
          ImageResult res;
          res.cancelled = true;
          Request r = std::move(*it);
          list.erase(it);
          deliver(r, std::move(res));
          return true;
        }
      return false;
    };
    if (!cancel_in(waiting_)) cancel_in(running_);
  }
  bool paused;
  std::chrono::milliseconds delay;
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused = paused_;
    delay = step_delay_;
  }
  if (!paused) {
    // Admit in arrival order while the images fit (a request larger than the batch alone
    // runs alone; submit() refuses those over max_batch_images).
    int64_t images = 0;
    for (const Request& r : running_) images += r.request.count;
    while (!waiting_.empty() && images + waiting_.front().request.count <= config_.max_batch_images) {
      Request r = std::move(waiting_.front());
      waiting_.pop_front();
      try {
        const auto t0 = Clock::now();
        r.started = t0;
        r.job = pipeline_.start(r.request);
        work_.encode_seconds += seconds_since(t0);
      } catch (const std::exception& e) {
        ImageResult res;
        res.error = e.what();
        deliver(r, std::move(res));
        continue;
      }
      images += r.request.count;
      running_.push_back(std::move(r));
    }
    // One UNet call: the oldest running request's size, and every request of that size.
    if (!running_.empty()) {
      const int64_t size = diffusion::DiffusionPipeline::latent_pixels(*running_.front().job);
      std::vector<diffusion::DiffusionPipeline::Job*> batch;
      int64_t batch_images = 0;
      for (Request& r : running_)
        if (diffusion::DiffusionPipeline::latent_pixels(*r.job) == size) {
          batch.push_back(r.job.get());
          batch_images += r.request.count;
        }
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      const auto t0 = Clock::now();
      std::string failure;
      try {
        pipeline_.step(batch);
      } catch (const std::exception& e) {
        failure = e.what();
        log_error("serve: a denoising step of {} requests failed: {}", batch.size(), failure);
      }
      work_.step_seconds += seconds_since(t0);
      ++work_.unet_steps;
      work_.unet_step_images += batch_images;
      work_.max_step_requests = std::max<int64_t>(work_.max_step_requests, int64_t(batch.size()));
      // Finished (decoded) or failed requests leave.
      for (size_t i = 0; i < running_.size();) {
        Request& r = running_[i];
        const bool stepped = std::find(batch.begin(), batch.end(), r.job.get()) != batch.end();
        if (!(stepped && (!failure.empty() || diffusion::DiffusionPipeline::finished(*r.job)))) {
          ++i;
          continue;
        }
        ImageResult res;
        if (!failure.empty()) {
          res.error = failure;
        } else {
          try {
            const auto d0 = Clock::now();
            res.images = pipeline_.finish(*r.job);
            work_.decode_seconds += seconds_since(d0);
          } catch (const std::exception& e) {
            res.error = e.what();
          }
        }
        Request done = std::move(r);
        running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
        deliver(done, std::move(res));
      }
    }
  }
  work_.running = int64_t(running_.size());
  work_.waiting = int64_t(waiting_.size());
  work_.running_images = 0;
  for (const Request& r : running_) work_.running_images += r.request.count;
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = work_;
  stats_.waiting += int64_t(inbox_.size());
}

}  // namespace hyperion::serve
