// Runs an Engine on its own thread for the HTTP server: requests and cancellations from
// any thread go into an inbox the engine thread drains before every step; token events
// come back through each request's callback (on the engine thread). The engine thread
// sleeps when there is no work. This and the HTTP server's I/O threads are the only
// threads besides the OpenMP pool, which only the engine thread drives.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "serve/engine.h"

namespace hyperion::serve {

class AsyncEngine {
 public:
  explicit AsyncEngine(Engine& engine);
  ~AsyncEngine();  // stop()
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  // Validates (RequestError) and queues (QueueFullError when max_queue requests already
  // wait); returns the request id at once.
  int64_t submit(GenerationRequest request, TokenCallback callback);
  void cancel(int64_t id);
  // The engine's counters after its last step.
  EngineStats stats() const;
  const Engine& engine() const { return engine_; }
  // Test hooks: a paused engine queues requests but does not step; a step delay sleeps
  // before every step (holds requests in flight for disconnect and queue tests).
  void set_paused(bool paused);
  void set_step_delay(std::chrono::milliseconds delay);
  // Ends every request (abort) and joins the engine thread.
  void stop();

 private:
  struct Pending {
    int64_t id;
    GenerationRequest request;
    TokenCallback callback;
  };
  void loop();
  void snapshot();

  Engine& engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> inbox_;
  std::vector<int64_t> cancels_;
  bool stop_ = false;
  bool paused_ = false;
  std::chrono::milliseconds step_delay_{0};
  int64_t next_id_ = 1;
  EngineStats stats_;
  int64_t capacity_ = 0;  // engine queue capacity after the last step
  std::thread thread_;
};

}  // namespace hyperion::serve
